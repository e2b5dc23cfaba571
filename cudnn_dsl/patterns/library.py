"""The bundled pattern library: the regions real models are made of (ResNets, GPT-2, Llama-style decoders) as
.cdg graphs over symbolic dims, so that one graph serves a region at every size a model has.

    with cudnn_dsl.patterns.install_library(dtype="half", device="cuda") as installed:
        y = torch.compile(model, fullgraph=True)(x)

Each family's graphs are written once, in text, with the dtype a parameter (`{t}`): a model after `.half()` or
`.to(torch.bfloat16)` holds its tensors so, and channels-last models their activations `nhwc`; a BatchNorm's
parameters take `{a}`, float for a model under autocast (`{amp}` names those graphs). A graph's dims
are ranges: the shapes a region has are checked and planned on first use (a conv over a symbolic H specializes
its op per input size). Convolutions carry their stride and padding, which Inductor's patterns do not compare:
a match is replaced by the graph whose output shape is the region's too (patterns.matching).
"""

from __future__ import annotations

import numbers

import attrs

DTYPES = ("float", "half", "bf16")

#: torch's BatchNorm defaults, which torchvision's ResNets keep: an eval BatchNorm is searched with its eps where
#: gradients flow (search.PerChannel), and the training-mode graphs are written with both
BATCHNORM_EPS, BATCHNORM_MOMENTUM = 1e-5, 0.1

_DIMS = """\
  dim N in 1..4096
  dim C in 1..8192
  dim H in 1..2048
  dim W in 1..2048
  dim K in 1..8192
"""

#: a batch's statistics need two values per channel
_TRAIN_DIMS = _DIMS.replace("dim N in 1..", "dim N in 2..")

_BN = """\
  input mean : float[1, K, 1, 1]
  input inv_variance : float[1, K, 1, 1]
  input scale : {a}[1, K, 1, 1]
  input bias : {a}[1, K, 1, 1]
"""


def _conv(name: str, r: int, stride: int, pad: int, tail: str) -> str:
    """conv(r x r, stride, padding) -> BatchNorm (eval) -> tail, in the model's dtype, channels-last. A half or
    bf16 BatchNorm widens its statistics to float and rounds its result to the model's dtype (`z : {t}`)."""
    residual = "  input residual : {t}[N, K, H, W] nhwc\n"  # a residual tail's convolution keeps the size
    out = {
        "relu": "  output out = relu(z)\n",
        "add_relu": "  output out = relu(z + residual)\n",
        "none": "",
    }[tail]
    z = "  output z : {t} = " if tail == "none" else "  z : {t} = "
    return (
        f"graph {name}_{{t}}{{amp}} {{\n  io {{t}}\n  compute float\n{_DIMS}\n"
        "  input x : {t}[N, C, H, W] nhwc\n"
        f"  input w : {{t}}[K, C, {r}, {r}] nhwc\n" + _BN + (residual if tail == "add_relu" else "") + "\n"
        f"  y = conv_fprop(x, w, stride=[{stride}, {stride}], padding=[{pad}, {pad}])\n"
        + z
        + "(y - mean) * inv_variance * scale + bias\n"
        + out
        + "}\n"
    )


def _conv_train(name: str, r: int, stride: int, pad: int, tail: str) -> str:
    """conv(r x r, stride, padding) -> BatchNorm in training mode (its batch's statistics; the next running
    statistics are outputs too, which the model writes over its buffers) -> tail, of a float model or one under
    autocast (its BatchNorm's parameters and running statistics float), channels-last."""
    residual = "  input residual : {t}[N, K, H, W] nhwc\n"
    out = {
        "relu": "  output out = relu(z)\n",
        "add_relu": "  output out = relu(z + residual)\n",
        "none": "  output z\n",
    }[tail]
    return (
        f"graph {name}_train_{{t}}{{amp}} {{\n  io {{t}}\n  compute float\n{_TRAIN_DIMS}\n"
        "  input x : {t}[N, C, H, W] nhwc\n"
        f"  input w : {{t}}[K, C, {r}, {r}] nhwc\n"
        "  input scale : {a}[1, K, 1, 1]\n  input bias : {a}[1, K, 1, 1]\n"
        "  input running_mean : float[1, K, 1, 1]\n  input running_var : float[1, K, 1, 1]\n"
        + (residual if tail == "add_relu" else "")
        + "\n"
        f"  y = conv_fprop(x, w, stride=[{stride}, {stride}], padding=[{pad}, {pad}])\n"
        f"  z, _mean, _inv_variance, next_mean, next_var = batchnorm(y, scale, bias, running_mean, running_var, "
        f"epsilon={BATCHNORM_EPS}, momentum={BATCHNORM_MOMENTUM})\n"
        + out
        + "  output next_mean\n  output next_var\n}\n"
    )


NORM_EPS = 1e-5
"""the norms' eps unless install_library is given another: torch's LayerNorm default, which nanoGPT keeps, and
the Llama reference's norm_eps"""

#: the graphs taken for inference only (by name): a residual add with its norm. Their derived backward sums the
#: residual's gradient into the norm's, which as one graph faulted (an illegal address) on an H100 with cuDNN 9.19
#: and as the chain of registry ops runs in many parts; in training the norm is taken alone (its backward one
#: graph), the add left to Inductor
INFERENCE_ONLY = ("add_layernorm_", "add_rmsnorm_")

_TOKENS = """\
  dim B in 1..1024
  dim T in 1..32768
  dim D in 2..16384
"""


def _linear_act(act: str, name: str | None = None, conv1d: bool = False, bias: bool = True) -> str:
    """A Linear and the activation that reads it (`act` an op's name, the graph named for `name`): nn.Linear's weight
    [F, D] (col_major [1, D, F]), with its bias or without (`linear_nobias_...`: T5's, nanoGPT's with bias=False),
    or HF transformers' Conv1D's [D, F] (GPT-2's, which always has one: `linear_kn_...`)."""
    kind = "_kn" if conv1d else "" if bias else "_nobias"
    b = "  input b : {t}[1, 1, F]\n" if bias else ""
    return (
        f"graph linear{kind}_{name or act}_{{t}} {{\n  io {{t}}\n  compute float\n{_TOKENS}  dim F in 1..65536\n\n"
        f"  input x : {{t}}[B, T, D]\n  input w : {{t}}[1, D, F]{'' if conv1d else ' col_major'}\n{b}\n"
        f"  output y = {act}(matmul(x, w){' + b' if bias else ''})\n}}\n"
    )


# HF's Conv1D under autocast: the float input viewed [B*T, D], then cast by autocast's addmm (the cast is the
# graph's); its spelled-out GELU (gelu_new) as autocast computes it: in `{t}` where autocast leaves `pow` alone (the
# CPU's), from a float cube where it takes `pow` in float (CUDA's), and so in float to the end (`_float`)
_LINEAR_KN_GELU_AUTOCAST = """\
graph linear_kn_gelu_tanh_{{t}}_autocast{wide} {{
  io {{t}}
  compute float
{dims}  dim F in 1..65536

  input x : float[B, T, D]
  input w : {{t}}[1, D, F]
  input b : {{t}}[1, 1, F]

  xt : {{t}} = identity(x)
  h : {{t}} = matmul(xt, w) + b
  output y : {out} = gelu_tanh(h)
}}
"""


def _gated(name: str, act: str, autocast: bool = False) -> str:
    """A gated MLP's two Linears (no bias) and its activation: SwiGLU (Llama's), GeGLU with the tanh GELU (Gemma's).
    Under autocast a float input is cast by each Linear that reads it: the graph casts it once, the search per
    reader."""
    x, amp, read = ("float", "_autocast", "xt") if autocast else ("{t}", "", "x")
    cast = "  xt : {t} = identity(x)\n" if autocast else ""
    return (
        f"graph {name}_{{t}}{amp} {{\n  io {{t}}\n  compute float\n{_TOKENS}  dim F in 1..65536\n\n"
        f"  input x : {x}[B, T, D]\n  input w1 : {{t}}[1, D, F] col_major\n  input w3 : {{t}}[1, D, F] col_major\n\n"
        f"{cast}  output y = {act}(matmul({read}, w1)) * matmul({read}, w3)\n}}\n"
    )


_LAYERNORM = """\
graph layernorm_{{t}} {{
  io {{t}}
  compute float
{dims}
  input x : {{t}}[B, T, D]
  input scale : {{t}}[1, 1, D]
  input bias : {{t}}[1, 1, D]

  output y = layernorm(x, scale, bias, epsilon={eps})
}}
"""

_RMSNORM = """\
graph rmsnorm_{{t}} {{
  io {{t}}
  compute float
{dims}
  input x : {{t}}[B, T, D]
  input scale : {{t}}[1, 1, D]

  output y = rmsnorm(x, scale, epsilon={eps})
}}
"""


def _add_norm(norm: str, autocast: bool = False) -> str:
    """A residual add and the norm that reads its sum, both outputs (the next residual add reads the sum too). Under
    autocast the residual stream is float and the sublayer's result (a Linear's) is `{t}`: the sum and norm float.
    The norm's output comes first: Inductor anchors a pattern at its first output, and there the norm's own pattern
    must not be tried before this one."""
    x = "float" if autocast else "{t}"
    bias = f"  input bias : {x}[1, 1, D]\n" if norm == "layernorm" else ""
    args = "s, scale, bias" if norm == "layernorm" else "s, scale"
    return (
        f"graph add_{norm}_{{t}}{'_autocast' if autocast else ''} {{\n  io {x}\n  compute float\n{_TOKENS}\n"
        f"  input x : {x}[B, T, D]\n  input r : {{t}}[B, T, D]\n  input scale : {x}[1, 1, D]\n{bias}\n"
        f"  s = x + r\n  output y = {norm}({args}, epsilon={{eps}})\n  output s\n}}\n"
    )


# q, k and v as a fused projection's split gives them: [B, T, 3, H, Dh] in memory, viewed [B, H, T, Dh]
_ATTENTION_PACKED = """\
graph causal_attention_packed_{t} {
  io {t}
  compute float
  dim B in 1..1024
  dim T in 1..32768
  dim H in 1..256
  dim E in 1..256

  input q : {t}[B, H, T, E] strides [T*H*E*3, E, H*E*3, 1]
  input k : {t}[B, H, T, E] strides [T*H*E*3, E, H*E*3, 1]
  input v : {t}[B, H, T, E] strides [T*H*E*3, E, H*E*3, 1]

  output o = sdpa(q, k, v, causal=true)
}
"""

# grouped-query attention over separate projections viewed as heads: q [B, T, H, Dh] in memory viewed [B, H, T, Dh],
# k and v with G heads (every H a multiple of every G)
_ATTENTION_GQA = """\
graph causal_attention_gqa_{t} {
  io {t}
  compute float
  dim B in 1..1024
  dim T in 1..32768
  dim H in 8..256 step 8
  dim G in {1, 2, 4, 8}
  dim E in 1..256

  input q : {t}[B, H, T, E] strides [T*H*E, E, H*E, 1]
  input k : {t}[B, G, T, E] strides [T*G*E, E, G*E, 1]
  input v : {t}[B, G, T, E] strides [T*G*E, E, G*E, 1]

  output o = sdpa(q, k, v, causal=true)
}
"""


#: torchvision's BasicBlock and Bottleneck convolutions: name, kernel size, stride, padding, what follows the norm
_RESNET_CONVS = (
    ("conv1x1_bn_relu", 1, 1, 0, "relu"),
    ("conv1x1_bn_add_relu", 1, 1, 0, "add_relu"),
    ("conv1x1_bn", 1, 1, 0, "none"),
    ("conv1x1s2_bn", 1, 2, 0, "none"),
    ("conv3x3_bn_relu", 3, 1, 1, "relu"),
    ("conv3x3s2_bn_relu", 3, 2, 1, "relu"),
    ("conv3x3_bn_add_relu", 3, 1, 1, "add_relu"),
    ("conv3x3_bn", 3, 1, 1, "none"),
)


@attrs.frozen
class Family:
    """Graphs that serve one kind of model."""

    name: str
    doc: str
    templates: tuple[str, ...]
    training: tuple[str, ...] = ()
    """graphs of a model in training mode whose parameters are float (a float model, or one under autocast)"""
    autocast: tuple[str, ...] = ()
    """graphs of a float model under autocast only (in a narrower dtype): regions autocast writes otherwise"""


FAMILIES = {
    f.name: f
    for f in (
        Family(
            "resnet",
            "convolutions (1x1, 3x3; stride 1 and 2) with their BatchNorm (eval, or in training mode), then ReLU, a "
            "residual add and ReLU, or nothing (a downsample): torchvision's BasicBlock and Bottleneck, channels-last. "
            "The stem's 7x7 convolution over 3 channels is left to torch: cuDNN's dedicated first-layer kernel, which "
            "torch calls, outruns a fused graph's",
            tuple(_conv(*c) for c in _RESNET_CONVS),
            tuple(_conv_train(*c) for c in _RESNET_CONVS),
        ),
        Family(
            "gpt",
            "GPT-2 as nanoGPT writes it: LayerNorm (alone, or for inference with the residual add it reads), the "
            "MLP's Linear (with its bias or without) + GELU (erf, nanoGPT's; or tanh, llm.c's), causal attention "
            "over a fused projection's q, k and v",
            (
                _add_norm("layernorm"),
                _LAYERNORM.format(dims=_TOKENS, eps="{eps}"),
                *(_linear_act(act, bias=bias) for bias in (True, False) for act in ("gelu", "gelu_tanh")),
                _linear_act("gelu_tanh", conv1d=True),
                _ATTENTION_PACKED,
            ),
            autocast=(
                _add_norm("layernorm", autocast=True),
                _LINEAR_KN_GELU_AUTOCAST.format(dims=_TOKENS, wide="", out="{t}"),
                _LINEAR_KN_GELU_AUTOCAST.format(dims=_TOKENS, wide="_float", out="float"),
            ),
        ),
        Family(
            "llama",
            "Llama-style decoders: RMSNorm (alone, or for inference with the residual add it reads), the gated MLP "
            "(SwiGLU, silu(x W1) * x W3, or Gemma's GeGLU with the tanh GELU), causal grouped-query attention",
            (
                _add_norm("rmsnorm"),
                _RMSNORM.format(dims=_TOKENS, eps="{eps}"),
                _gated("swiglu", "swish"),
                _gated("geglu", "gelu_tanh"),
                _ATTENTION_GQA,
            ),
            autocast=(
                _gated("swiglu", "swish", autocast=True),
                _gated("geglu", "gelu_tanh", autocast=True),
                _add_norm("rmsnorm", autocast=True),
            ),
        ),
        Family(
            "mlp",
            "a Linear (with its bias or without) and the activation that reads it, as MLPs write them: GELU (erf: "
            "BERT's, ViT's), ReLU (T5's, without a bias), SiLU",
            tuple(
                _linear_act(act, name, bias=bias)
                for bias in (True, False)
                for act, name in (("gelu", None), ("relu", None), ("swish", "silu"))
            ),
        ),
    )
}


TRAINING_ON_CUDA = False
"""whether the training-mode BatchNorm graphs (Family.training) are installed for CUDA by default: not while their
cuDNN runs are wrong. On an H100 with cuDNN 9.19, under bf16 autocast, their derived backward gave NaN weight
gradients (tests/test_pattern_library.py, its CUDA check in training mode) and ResNet-50 at batch 64 faulted (an
illegal address); on the CPU they train as torch does"""


def source(
    families: tuple[str, ...],
    dtype: str,
    channels_last: bool = True,
    autocast: bool = False,
    training: bool = True,
    norm_eps: float = NORM_EPS,
) -> str:
    """The .cdg text of the families' graphs in one dtype, convolutions' activations and weights channels-last
    or not. `autocast`: as a float model computes them under torch.autocast to `dtype`: its BatchNorms' affine
    parameters stay float (graphs named `..._autocast`). `training`: with the graphs of a model in training mode
    (Family.training), where the dtype has them. `norm_eps`: the LayerNorms' and RMSNorms' eps (a search matches a
    norm of its own eps only)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: the library's graphs are {', '.join(DTYPES)}")
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, numbers.Real) or not 0 < norm_eps < 1:
        raise ValueError(f"norm_eps {norm_eps!r}: a norm's eps is a number between 0 and 1")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"no pattern family {unknown[0]!r}; the families are {', '.join(FAMILIES)}")
    parts = []
    amp = autocast and dtype != "float"
    templates = []
    for f in families:
        trained = FAMILIES[f].training if training and (dtype == "float" or autocast) else ()
        templates += FAMILIES[f].templates + trained + (FAMILIES[f].autocast if amp else ())
    for template in dict.fromkeys(templates):  # a graph of two families installed once
        text = template.replace("{t}", dtype).replace("{a}", "float" if amp else dtype)
        text = text.replace("{amp}", "_autocast" if amp else "").replace("{eps}", repr(float(norm_eps)))
        parts.append(text if channels_last else text.replace(" nhwc", ""))
    return "\n".join(parts)
