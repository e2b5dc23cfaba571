"""The frontend's backward ops on the GPU, each output against the reference (whose closed forms the CPU
tests hold against torch autograd).

The saved values a backward op reads (a norm's mean and inv_variance, attention's o and stats) come from
the forward op's reference on the same inputs, as a training step would hand them over: cuDNN's backward
kernels may assume the statistics are x's own. Every graph is compiled whole (split=False): the test is
what cuDNN computes for it. Where no one could know before running whether cuDNN 9.19 has an engine for a
graph on the H200, RECORDED holds what it did: ran the graph and matched, or refused it at the graph or an
op. A change either way fails.
"""

import pytest

from dsl.ops import BACKWARD_OPS
from tests.graphs import graph_text
from tests.helpers import ACCEPTED, DECLINED, check, check_as_recorded

pytestmark = pytest.mark.gpu


def saved(forward: str, io: str, names: tuple[str, ...]) -> dict:
    """The forward graph's seeded inputs and the outputs `names` of its reference, on the GPU."""
    import cudnn_dsl

    cg = cudnn_dsl.compile(graph_text(forward, io))
    inputs = cg.allocate_inputs(seed=11)
    out = cg.reference(inputs)
    return {**inputs, **{n: out[n] for n in names}}


# ---- pointwise ------------------------------------------------------------------------------------------

POINTWISE = {
    n: {"relu_backward": ", upper_clip=2.5", "leaky_relu_backward": ", slope=0.2", "swish_backward": ", beta=1.5"}.get(
        n, ""
    )
    for n, s in BACKWARD_OPS.items()
    if s.family == "pointwise"
}

#: what cuDNN did with each graph whose support no one knew before running it (where: helpers.SEEN_ON)
RECORDED = {
    **{f"{op} after a matmul": ACCEPTED for op in POINTWISE},
    **{f"{op} alone": ACCEPTED for op in POINTWISE},
    "relu_backward after conv_dgrad": ACCEPTED,
    "rope_backward alone": DECLINED,  # the ROPE_BWD operation is cuDNN 9.24's
    "rmsnorm_dbias backward": ACCEPTED,
    "instancenorm backward": ACCEPTED,
    "layernorm_tokens backward": DECLINED,  # no engine for layernorm_backward over [B, S, D]
    "adalayernorm backward": DECLINED,  # no engine for adalayernorm_backward
    "sdpa_backward sliding_window": ACCEPTED,
    "sdpa_backward bias": ACCEPTED,
    "sdpa_backward alibi": ACCEPTED,
    "sdpa_backward padding": ACCEPTED,
    "sdpa_backward dropout": ACCEPTED,
    "sdpa_backward deterministic": ACCEPTED,
    "sdpa_backward dbias": ACCEPTED,
    "rope_backward after sdpa_backward": DECLINED,  # the ROPE_BWD operation is cuDNN 9.24's
}


@pytest.mark.parametrize("op", list(POINTWISE))
def test_pointwise_backward_after_matmul(op):
    # The gradient flowing out of a matmul's dgrad, times the activation's derivative at the saved input.
    body = (
        "  input a : half[4, 64, 64]\n  input b : half[4, 64, 32]\n  input x : half[4, 64, 32]\n"
        f"  output dx : float = {op}(matmul(a, b) * 0.125, x{POINTWISE[op]})"
    )
    check_as_recorded(RECORDED, f"{op} after a matmul", graph_text(body))


@pytest.mark.parametrize("op", list(POINTWISE))
def test_pointwise_backward_alone(op):
    body = f"  input dy : half[8, 64, 128]\n  input x : half[8, 64, 128]\n  output dx = {op}(dy, x{POINTWISE[op]})"
    check_as_recorded(RECORDED, f"{op} alone", graph_text(body))


def test_relu_backward_after_conv_dgrad():
    # dgrad + drelu, the fusion of the frontend's own convolution backward samples.
    body = (
        "  input dy : half[8, 64, 16, 16] nhwc\n  input w : half[64, 32, 3, 3] nhwc\n"
        "  input x : half[8, 32, 16, 16] nhwc\n  output dx = relu_backward(conv_dgrad(dy, w, padding=1), x)"
    )
    check_as_recorded(RECORDED, "relu_backward after conv_dgrad", graph_text(body))


def test_rope_backward_alone():
    # rope alone finds no engine with cuDNN 9.28 planning for an H200 (it is attention's prologue), nor its
    # gradient; the fused form is test_rope_backward_after_sdpa_backward below
    body = (
        "  input dy : bf16[2, 4, 128, 64]\n  input f : float[128, 1, 1, 64]\n"
        "  output dx = rope_backward(dy, f, rope_dim=32, output_scale=0.5)"
    )
    check_as_recorded(RECORDED, "rope_backward alone", graph_text(body, "bf16"))


# ---- norms ------------------------------------------------------------------------------------------------

NORMS = {
    "layernorm": (
        "  input x : bf16[512, 256, 1, 1]\n  input g : float[1, 256, 1, 1]\n  input b : float[1, 256, 1, 1]\n"
        "  y, m, iv = layernorm(x, g, b, phase=training)\n  output y\n  output m\n  output iv",
        "  input dy : bf16[512, 256, 1, 1]\n  input x : bf16[512, 256, 1, 1]\n  input g : float[1, 256, 1, 1]\n"
        "  input m : float[512, 1, 1, 1]\n  input iv : float[512, 1, 1, 1]\n"
        "  dx, dg, db = layernorm_backward(dy, x, g, m, iv)\n  output dx\n  output dg : float\n  output db : float",
        "bf16",
        ("m", "iv"),
    ),
    "layernorm_tokens": (
        "  input x : bf16[4, 256, 1024]\n  input g : bf16[1, 1, 1024]\n  input b : bf16[1, 1, 1024]\n"
        "  y, m, iv = layernorm(x, g, b, phase=training)\n  output y\n  output m\n  output iv",
        "  input dy : bf16[4, 256, 1024]\n  input x : bf16[4, 256, 1024]\n  input g : bf16[1, 1, 1024]\n"
        "  input m : float[4, 256, 1]\n  input iv : float[4, 256, 1]\n"
        "  dx, dg, db = layernorm_backward(dy, x, g, m, iv)\n  output dx\n  output dg : float\n  output db : float",
        "bf16",
        ("m", "iv"),
    ),
    "rmsnorm": (
        "  input x : bf16[512, 256, 1, 1]\n  input g : float[1, 256, 1, 1]\n"
        "  y, iv = rmsnorm(x, g, phase=training)\n  output y\n  output iv",
        "  input dy : bf16[512, 256, 1, 1]\n  input x : bf16[512, 256, 1, 1]\n  input g : float[1, 256, 1, 1]\n"
        "  input iv : float[512, 1, 1, 1]\n"
        "  dx, dg = rmsnorm_backward(dy, x, g, iv)\n  output dx\n  output dg : float",
        "bf16",
        ("iv",),
    ),
    "rmsnorm_dbias": (
        "  input x : bf16[512, 256, 1, 1]\n  input g : float[1, 256, 1, 1]\n  input b : float[1, 256, 1, 1]\n"
        "  y, iv = rmsnorm(x, g, b, phase=training)\n  output y\n  output iv",
        "  input dy : bf16[512, 256, 1, 1]\n  input x : bf16[512, 256, 1, 1]\n  input g : float[1, 256, 1, 1]\n"
        "  input iv : float[512, 1, 1, 1]\n"
        "  dx, dg, db = rmsnorm_backward(dy, x, g, iv, dbias=true)\n  output dx\n  output dg : float\n"
        "  output db : float",
        "bf16",
        ("iv",),
    ),
    "batchnorm": (
        "  input x : half[8, 32, 16, 16] nhwc\n"
        + "".join(f"  input {n} : float[1, 32, 1, 1] nhwc\n" for n in ("g", "b", "rm", "rv"))
        + "  y, m, iv, rm2, rv2 = batchnorm(x, g, b, rm, rv)\n  output y\n  output m\n  output iv\n"
        "  output rm2\n  output rv2",
        "  input dy : half[8, 32, 16, 16] nhwc\n  input x : half[8, 32, 16, 16] nhwc\n"
        + "".join(f"  input {n} : float[1, 32, 1, 1] nhwc\n" for n in ("g", "m", "iv"))
        + "  dx, dg, db = batchnorm_backward(dy, x, g, m, iv)\n  output dx\n  output dg : float\n  output db : float",
        "half",
        ("m", "iv"),
    ),
    "instancenorm": (
        "  input x : half[8, 32, 16, 16] nhwc\n  input g : float[1, 32, 1, 1] nhwc\n"
        "  input b : float[1, 32, 1, 1] nhwc\n"
        "  y, m, iv = instancenorm(x, g, b, phase=training)\n  output y\n  output m\n  output iv",
        "  input dy : half[8, 32, 16, 16] nhwc\n  input x : half[8, 32, 16, 16] nhwc\n"
        "  input g : float[1, 32, 1, 1] nhwc\n  input m : float[8, 32, 1, 1] nhwc\n"
        "  input iv : float[8, 32, 1, 1] nhwc\n"
        "  dx, dg, db = instancenorm_backward(dy, x, g, m, iv)\n  output dx\n  output dg : float\n  output db : float",
        "half",
        ("m", "iv"),
    ),
    "adalayernorm": (
        "  input x : half[4, 128, 256]\n  input g : half[4, 1, 256]\n  input b : half[4, 1, 256]\n"
        "  y, m, iv = adalayernorm(x, g, b, phase=training)\n  output y\n  output m\n  output iv",
        "  input dy : half[4, 128, 256]\n  input x : half[4, 128, 256]\n  input g : half[4, 1, 256]\n"
        "  input m : float[4, 128, 1]\n  input iv : float[4, 128, 1]\n"
        "  dx, dg, db = adalayernorm_backward(dy, x, g, m, iv)\n  output dx\n  output dg : float\n  output db : float",
        "half",
        ("m", "iv"),
    ),
}
#: dscale and dbias sum dy over every normalized row: 512 to 2048 terms of half/bf16 products
NORM_ATOL = {"dg": 5e-2, "db": 5e-2}


@pytest.mark.parametrize("case", list(NORMS))
def test_norm_backward_from_the_forward_statistics(case):
    forward, backward, io, stats = NORMS[case]
    given = saved(forward, io, stats)
    given = {k: v for k, v in given.items() if k in {"x", "g", *stats}}
    text = graph_text(backward, io)
    if case in ("layernorm", "rmsnorm", "batchnorm"):
        check(text, "cuda", given=given, atol=NORM_ATOL, split=False)  # the frontend's own tests run these
    else:
        check_as_recorded(RECORDED, f"{case} backward", text, given=given, atol=NORM_ATOL)


# ---- attention ----------------------------------------------------------------------------------------

SDPA_DECLS = {
    "q": "bf16[2, 4, 256, 64]",
    "k": "bf16[2, 2, 256, 64]",
    "v": "bf16[2, 2, 256, 64]",
    "b": "bf16[1, 4, 256, 256]",
    "lq": "int32[2, 1, 1, 1]",
    "lkv": "int32[2, 1, 1, 1]",
    "dm": "bf16[2, 4, 256, 256]",
    "ds": "float[1, 1, 1, 1]",
    "dsi": "float[1, 1, 1, 1]",
}
#: bf16 tolerances; dq's is tighter than bf16's default (the frontend's own tests allow 2e-2 for dq and 7e-2
#: for dk and dv, test/python/sdpa/fp16.py): here dq's largest values are about 0.06 (plain) to 0.4 (causal)
SDPA_ATOL = {"dq": 1e-2, "dk": 3e-2, "dv": 3e-2, "db": 3e-2}


def _sdpa_texts(extra: str) -> tuple[str, str]:
    used = [n for n in SDPA_DECLS if n in "qkv" or f"={n}" in extra]
    decls = "".join(f"  input {n} : {SDPA_DECLS[n]}\n" for n in used)
    more = f", {extra}" if extra else ""
    forward_more = more.replace(", deterministic=true", "").replace(", dbias=true", "")  # backward only
    forward = decls + f"  o, st = sdpa(q, k, v, stats=true{forward_more})\n  output o\n  output st"
    if "dropout" in extra:  # the frontend's backward also takes 1 / dropout_scale
        decls += f"  input dsi : {SDPA_DECLS['dsi']}\n"
        more += ", dropout_scale_inv=dsi"
    backward = (
        decls
        + "  input o : bf16[2, 4, 256, 64]\n  input do : bf16[2, 4, 256, 64]\n  input st : float[2, 4, 256, 1]\n"
        + f"  dq, dk, dv{', db' * ('dbias' in extra)} = sdpa_backward(q, k, v, o, do, st{more})\n"
        + "  output dq\n  output dk\n  output dv"
        + "\n  output db" * ("dbias" in extra)
    )
    return forward, backward


def _sdpa_given(extra: str) -> dict:
    import torch

    given = {}
    if "lq" in extra:
        given["lq"] = torch.tensor([200, 256], dtype=torch.int32, device="cuda").view(2, 1, 1, 1)
        given["lkv"] = torch.tensor([150, 256], dtype=torch.int32, device="cuda").view(2, 1, 1, 1)
    if "dm" in extra:
        g = torch.Generator(device="cuda").manual_seed(3)
        given["dm"] = (torch.rand(2, 4, 256, 256, device="cuda", generator=g) > 0.1).to(torch.bfloat16)
        given["ds"] = torch.full((1, 1, 1, 1), 1 / 0.9, device="cuda")
        given["dsi"] = torch.full((1, 1, 1, 1), 0.9, device="cuda")
    return given


def _sdpa_backward(extra: str, form: str | None) -> None:
    """`form`: the graph's row in RECORDED; None for a form the frontend's own tests run."""
    import cudnn_dsl

    forward, backward = _sdpa_texts(extra)
    fwd = cudnn_dsl.compile(graph_text(forward, "bf16"))
    extra_inputs = _sdpa_given(extra)
    inputs = {**fwd.allocate_inputs(seed=11), **{k: v for k, v in extra_inputs.items() if k != "dsi"}}
    out = fwd.reference(inputs)
    given = {**inputs, **extra_inputs, "o": out["o"], "st": out["st"]}
    if form is None:
        check(graph_text(backward, "bf16"), "cuda", given=given, atol=SDPA_ATOL, split=False)
    else:
        check_as_recorded(RECORDED, form, graph_text(backward, "bf16"), given=given, atol=SDPA_ATOL)


@pytest.mark.parametrize(
    "extra",
    ["", "causal=true", "scale=0.2, causal_bottom_right=true"],
    ids=["plain", "causal", "scale_bottom_right"],
)
def test_sdpa_backward(extra):
    # The frontend's own training tests run these forms on Hopper.
    _sdpa_backward(extra, None)


SDPA_FORMS = {
    "sliding_window": "causal=true, left_bound=64",
    "bias": "bias=b",
    "alibi": "alibi=true, causal=true",
    "padding": "seq_len_q=lq, seq_len_kv=lkv",
    "dropout": "dropout_mask=dm, dropout_scale=ds",
    "deterministic": "causal=true, deterministic=true",
    "dbias": "bias=b, dbias=true",
}


@pytest.mark.parametrize("form", list(SDPA_FORMS))
def test_sdpa_backward_forms_whose_support_was_not_known(form):
    _sdpa_backward(SDPA_FORMS[form], f"sdpa_backward {form}")


def test_rope_backward_after_sdpa_backward():
    # The gradient of sdpa(rope(q), ...) at the un-rotated q: rope_backward as dq's epilogue (planned by
    # cuDNN 9.28 for an H200 without a GPU).
    import cudnn_dsl

    forward, backward = _sdpa_texts("causal=true")
    fwd = cudnn_dsl.compile(graph_text(forward, "bf16"))
    inputs = fwd.allocate_inputs(seed=11)
    out = fwd.reference(inputs)
    backward = backward.replace("dq, dk, dv = sdpa_backward", "dqr, dk, dv = sdpa_backward").replace(
        "output dq\n", "output dq = rope_backward(dqr, f)\n"
    )
    text = graph_text("  input f : float[256, 1, 1, 64]\n" + backward, "bf16")
    given = {**inputs, "o": out["o"], "st": out["st"]}
    check_as_recorded(RECORDED, "rope_backward after sdpa_backward", text, given=given, atol=SDPA_ATOL)
