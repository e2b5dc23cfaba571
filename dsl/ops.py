"""Semantic layer: the op registry of the language — signatures, attributes, shape and dtype rules.

One entry per op. The checker reads it; so do the backend tables in ``cudnn_dsl/ops.py``
(torch reference and cuDNN lowering), which hold exactly the same keys (a test proves it).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs

from dsl.types import TensorType, broadcast, fmt_shape, is_float, stride_order

REQUIRED = object()


class OpError(Exception):
    """A shape/dtype rule failed; ``at`` names the culprit (an input index or an attribute)."""

    def __init__(self, message: str, at: int | str | None = None):
        super().__init__(message)
        self.at = at


@attrs.frozen
class Attr:
    name: str
    kind: str
    """int, float, bool, ints, enum, dtype."""
    default: Any = REQUIRED
    choices: tuple[str, ...] = ()
    doc: str = ""


@attrs.frozen
class Out:
    """One inferred result of an op: shape, stride order, and a dtype when the op fixes it."""

    shape: tuple[int, ...]
    order: tuple[int, ...]
    dtype: str | None = None
    """set when the op fixes its result's dtype (cuDNN's layout ops keep the input's)"""


@attrs.frozen
class Ctx:
    """What a shape rule sees: the input types (None for absent optionals) and the attributes."""

    op: str
    inputs: tuple[TensorType | None, ...]
    attrs: dict


@attrs.frozen
class OpSig:
    name: str
    family: str
    inputs: tuple[str, ...]
    infer: Callable[[Ctx], list[Out]]
    optional: tuple[str, ...] = ()
    attrs: tuple[Attr, ...] = ()
    outputs: tuple[str, ...] = ("out",)
    doc: str = ""
    positive: tuple[int, ...] = ()
    """inputs whose domain is positive (generated test data avoids 0 and negatives there)"""
    flops: Callable[[Ctx, list], int] | None = None
    """floating-point operations for these input and output types (default: one per output element)"""
    results: Callable[[dict], int] | None = None
    """how many of `outputs` a call returns, given its attributes (default: one)"""

    def count_results(self, attrs_: dict) -> int:
        return self.results(attrs_) if self.results is not None else 1

    def count_flops(self, ctx: Ctx, outs: list[TensorType]) -> int:
        if self.flops is not None:
            return self.flops(ctx, outs)
        return sum(math.prod(o.shape) for o in outs)

    def attr(self, name: str) -> Attr | None:
        for a in self.attrs + COMMON_ATTRS:
            if a.name == name:
                return a
        return None

    @property
    def all_attrs(self) -> tuple[Attr, ...]:
        return self.attrs + COMMON_ATTRS


COMMON_ATTRS = (Attr("compute", "dtype", None, doc="compute data type of this op (default: the graph's)"),)

REDUCTION_MODES = ("sum", "mul", "min", "max", "amax", "avg", "norm1", "norm2", "mul_no_zeros")


# ---- shape rules -------------------------------------------------------------------


def _row_major(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


def _same_kind(ctx: Ctx, *idx: int) -> None:
    ts = [(i, ctx.inputs[i]) for i in idx if ctx.inputs[i] is not None]
    for i, t in ts[1:]:
        if is_float(t.dtype) != is_float(ts[0][1].dtype):
            raise OpError(
                f"{ctx.op}: dtype conflict: input {ts[0][0] + 1} is {ts[0][1].dtype}, input {i + 1} is {t.dtype}",
                i,
            )


def infer_unary(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    return [Out(x.shape, stride_order(x.strides))]


def infer_binary(ctx: Ctx) -> list[Out]:
    a, b = ctx.inputs[0], ctx.inputs[1]
    _same_kind(ctx, 0, 1)
    if len(a.shape) != len(b.shape):
        raise OpError(
            f"{ctx.op}: inputs have ranks {len(a.shape)} and {len(b.shape)} ({fmt_shape(a.shape)} and "
            f"{fmt_shape(b.shape)}); cuDNN pointwise ops need equal ranks, with 1 where an axis broadcasts",
            1,
        )
    shape = broadcast(a.shape, b.shape)
    if shape is None:
        raise OpError(f"{ctx.op}: shapes {fmt_shape(a.shape)} and {fmt_shape(b.shape)} do not broadcast", 1)
    full = a if a.shape == shape else b if b.shape == shape else a
    return [Out(shape, stride_order(full.strides))]


def infer_bias(ctx: Ctx) -> list[Out]:
    """bias/scale: the second input broadcasts onto the first, whose shape is kept."""
    x, b = ctx.inputs[0], ctx.inputs[1]
    out = infer_binary(ctx)
    if out[0].shape != x.shape:
        raise OpError(
            f"{ctx.op}: {fmt_shape(b.shape)} must broadcast onto the input {fmt_shape(x.shape)} "
            f"without growing it",
            1,
        )
    return out


def _spatial(ctx: Ctx, name: str, n: int, default: int) -> tuple[int, ...]:
    v = ctx.attrs.get(name)
    if v is None:
        return (default,) * n
    if isinstance(v, int):
        return (v,) * n
    if len(v) != n:
        raise OpError(f"{ctx.op}: '{name}' has {len(v)} values, the convolution has {n} spatial dims", name)
    return tuple(v)


def _conv_params(ctx: Ctx, rank: int):
    n = rank - 2
    pad = _spatial(ctx, "padding", n, 0)
    stride = _spatial(ctx, "stride", n, 1)
    dil = _spatial(ctx, "dilation", n, 1)
    for name, vals, lo in (("padding", pad, 0), ("stride", stride, 1), ("dilation", dil, 1)):
        if any(v < lo for v in vals):
            raise OpError(f"{ctx.op}: '{name}' values must be >= {lo}, got {list(vals)}", name)
    return pad, stride, dil


def _conv_rank(ctx: Ctx, t: TensorType, i: int, what: str) -> None:
    if len(t.shape) not in (3, 4, 5):
        raise OpError(f"{ctx.op}: {what} must have rank 3, 4 or 5 (N, C, spatial...), got {fmt_shape(t.shape)}", i)


def infer_conv_fprop(ctx: Ctx) -> list[Out]:
    x, w = ctx.inputs
    _conv_rank(ctx, x, 0, "image")
    if len(w.shape) != len(x.shape):
        raise OpError(f"{ctx.op}: weight {fmt_shape(w.shape)} and image {fmt_shape(x.shape)} differ in rank", 1)
    if x.dtype != w.dtype:
        raise OpError(f"{ctx.op}: dtype conflict: image is {x.dtype}, weight is {w.dtype}", 1)
    c, wc, k = x.shape[1], w.shape[1], w.shape[0]
    if wc == 0 or c % wc:
        raise OpError(
            f"{ctx.op}: image has {c} channels, weight expects {wc} (channels must be a multiple of the "
            f"weight's for a grouped convolution)",
            1,
        )
    groups = c // wc
    if k % groups:
        raise OpError(f"{ctx.op}: {k} output channels do not divide into {groups} groups", 1)
    pad, stride, dil = _conv_params(ctx, len(x.shape))
    spatial = []
    for i, (h, r) in enumerate(zip(x.shape[2:], w.shape[2:])):
        o = (h + 2 * pad[i] - dil[i] * (r - 1) - 1) // stride[i] + 1
        if o < 1:
            raise OpError(f"{ctx.op}: filter {r} (dilation {dil[i]}) is larger than the padded input {h}", 1)
        spatial.append(o)
    return [Out((x.shape[0], k, *spatial), stride_order(x.strides))]


def infer_conv_dgrad(ctx: Ctx) -> list[Out]:
    dy, w = ctx.inputs
    _conv_rank(ctx, dy, 0, "gradient")
    if len(w.shape) != len(dy.shape):
        raise OpError(f"{ctx.op}: filter {fmt_shape(w.shape)} and gradient {fmt_shape(dy.shape)} differ in rank", 1)
    if dy.shape[1] != w.shape[0]:
        raise OpError(f"{ctx.op}: gradient has {dy.shape[1]} channels, filter has {w.shape[0]} outputs", 1)
    pad, stride, dil = _conv_params(ctx, len(dy.shape))
    spatial = [
        (o - 1) * stride[i] - 2 * pad[i] + dil[i] * (r - 1) + 1 for i, (o, r) in enumerate(zip(dy.shape[2:], w.shape[2:]))
    ]
    if any(s < 1 for s in spatial):
        raise OpError(f"{ctx.op}: no input size gives gradient {fmt_shape(dy.shape)}", 0)
    return [Out((dy.shape[0], w.shape[1], *spatial), stride_order(dy.strides))]


def infer_conv_wgrad(ctx: Ctx) -> list[Out]:
    x, dy = ctx.inputs
    _conv_rank(ctx, x, 0, "image")
    if len(x.shape) != len(dy.shape) or x.shape[0] != dy.shape[0]:
        raise OpError(f"{ctx.op}: image {fmt_shape(x.shape)} and gradient {fmt_shape(dy.shape)} do not match", 1)
    pad, stride, dil = _conv_params(ctx, len(x.shape))
    filt = ctx.attrs.get("filter")
    if filt is None:
        filt = [(h + 2 * pad[i] - (o - 1) * stride[i] - 1) // dil[i] + 1 for i, (h, o) in enumerate(zip(x.shape[2:], dy.shape[2:]))]
    if len(filt) != len(x.shape) - 2 or any(r < 1 for r in filt):
        raise OpError(f"{ctx.op}: cannot infer a filter size from {fmt_shape(x.shape)} and {fmt_shape(dy.shape)}", "filter")
    return [Out((dy.shape[1], x.shape[1], *filt), stride_order(x.strides))]


def infer_matmul(ctx: Ctx) -> list[Out]:
    a, b = ctx.inputs
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise OpError(f"{ctx.op}: inputs need rank >= 2, got {fmt_shape(a.shape)} and {fmt_shape(b.shape)}", 0)
    if len(a.shape) != len(b.shape):
        raise OpError(f"{ctx.op}: inputs have ranks {len(a.shape)} and {len(b.shape)}; use 1 for broadcast batch dims", 1)
    if a.dtype != b.dtype:
        raise OpError(f"{ctx.op}: dtype conflict: A is {a.dtype}, B is {b.dtype}", 1)
    if a.shape[-1] != b.shape[-2]:
        raise OpError(
            f"{ctx.op}: inner dimensions differ: A {fmt_shape(a.shape)} has K={a.shape[-1]}, "
            f"B {fmt_shape(b.shape)} has K={b.shape[-2]}",
            1,
        )
    batch = broadcast(a.shape[:-2], b.shape[:-2])
    if batch is None:
        raise OpError(f"{ctx.op}: batch dims {fmt_shape(a.shape[:-2])} and {fmt_shape(b.shape[:-2])} do not broadcast", 1)
    shape = (*batch, a.shape[-2], b.shape[-1])
    return [Out(shape, _row_major(len(shape)))]


def infer_reduction(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    axes = ctx.attrs.get("axes")
    rank = len(x.shape)
    axes = list(range(rank)) if axes is None else [a + rank if a < 0 else a for a in axes]
    if any(a < 0 or a >= rank for a in axes):
        raise OpError(f"{ctx.op}: axes {ctx.attrs['axes']} out of range for rank {rank}", "axes")
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return [Out(shape, stride_order(x.strides))]


def infer_sdpa(ctx: Ctx) -> list[Out]:
    q, k, v, bias = ctx.inputs
    for i, t in enumerate((q, k, v)):
        if len(t.shape) != 4:
            raise OpError(f"{ctx.op}: {'qkv'[i]} must be [B, H, S, D], got {fmt_shape(t.shape)}", i)
    if not (q.dtype == k.dtype == v.dtype):
        raise OpError(f"{ctx.op}: dtype conflict: q {q.dtype}, k {k.dtype}, v {v.dtype}", 1)
    b, h, s, d = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise OpError(f"{ctx.op}: batch differs: q {fmt_shape(q.shape)}, k {fmt_shape(k.shape)}, v {fmt_shape(v.shape)}", 1)
    if k.shape[3] != d:
        raise OpError(f"{ctx.op}: head dim differs: q has D={d}, k has D={k.shape[3]}", 1)
    if k.shape[1] != v.shape[1] or h % k.shape[1]:
        raise OpError(f"{ctx.op}: k/v heads ({k.shape[1]}, {v.shape[1]}) must be equal and divide q heads ({h})", 1)
    if k.shape[2] != v.shape[2]:
        raise OpError(f"{ctx.op}: k has {k.shape[2]} keys, v has {v.shape[2]}", 2)
    if bias is not None and broadcast(bias.shape, (b, h, s, k.shape[2])) != (b, h, s, k.shape[2]):
        raise OpError(f"{ctx.op}: bias {fmt_shape(bias.shape)} does not broadcast to {fmt_shape((b, h, s, k.shape[2]))}", 3)
    outs = [Out((b, h, s, v.shape[3]), stride_order(q.strides))]
    if ctx.attrs.get("stats"):
        outs.append(Out((b, h, s, 1), _row_major(4), "float"))
    return outs


def _norm_params(ctx: Ctx, first: int) -> None:
    x = ctx.inputs[0]
    want = (1,) + x.shape[1:]
    for i in range(first, len(ctx.inputs)):
        t = ctx.inputs[i]
        if t is not None and t.shape != want:
            raise OpError(f"{ctx.op}: {OPS[ctx.op].inputs[i] if i < len(OPS[ctx.op].inputs) else 'bias'} must be "
                          f"{fmt_shape(want)} (input {fmt_shape(x.shape)} with batch 1), got {fmt_shape(t.shape)}", i)


def infer_norm(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    if len(x.shape) < 2:
        raise OpError(f"{ctx.op}: input needs rank >= 2, got {fmt_shape(x.shape)}", 0)
    _norm_params(ctx, 1)
    return [Out(x.shape, stride_order(x.strides))]


def infer_batchnorm(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    if len(x.shape) < 2:
        raise OpError(f"{ctx.op}: input needs rank >= 2, got {fmt_shape(x.shape)}", 0)
    want = tuple(d if i == 1 else 1 for i, d in enumerate(x.shape))
    for i, t in enumerate(ctx.inputs[1:], 1):
        if t.shape != want:
            raise OpError(f"{ctx.op}: {OPS[ctx.op].inputs[i]} must be {fmt_shape(want)}, got {fmt_shape(t.shape)}", i)
    return [Out(x.shape, stride_order(x.strides))]


def infer_transpose(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    perm = ctx.attrs["perm"]
    if sorted(perm) != list(range(len(x.shape))):
        raise OpError(f"{ctx.op}: perm {list(perm)} is not a permutation of the {len(x.shape)} axes", "perm")
    shape = tuple(x.shape[p] for p in perm)
    return [Out(shape, _row_major(len(shape)), x.dtype)]


def infer_reshape(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    shape = tuple(ctx.attrs["shape"])
    if any(d < 1 for d in shape) or math.prod(shape) != math.prod(x.shape):
        raise OpError(f"{ctx.op}: cannot reshape {fmt_shape(x.shape)} ({math.prod(x.shape)} elements) to {fmt_shape(shape)}", "shape")
    return [Out(shape, _row_major(len(shape)), x.dtype)]


def infer_slice(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    start, end = ctx.attrs["start"], ctx.attrs["end"]
    rank = len(x.shape)
    if len(start) != rank or len(end) != rank:
        raise OpError(f"{ctx.op}: start and end need {rank} values each", "start")
    for i, (s, e) in enumerate(zip(start, end)):
        if not 0 <= s < e <= x.shape[i]:
            raise OpError(f"{ctx.op}: axis {i}: [{s}, {e}) is not inside [0, {x.shape[i]})", "end")
    return [Out(tuple(e - s for s, e in zip(start, end)), stride_order(x.strides), x.dtype)]


# ---- arithmetic counts (for TFLOP/s in tune and bench) ------------------------------------


def flops_conv(ctx: Ctx, outs) -> int:
    """2 * (elements of the forward output) * (C/groups * filter volume), for fprop, dgrad and wgrad."""
    y = {"conv_fprop": outs[0], "conv_dgrad": ctx.inputs[0], "conv_wgrad": ctx.inputs[1]}[ctx.op]
    w = {"conv_fprop": ctx.inputs[1], "conv_dgrad": ctx.inputs[1], "conv_wgrad": outs[0]}[ctx.op]
    return 2 * math.prod(y.shape) * math.prod(w.shape[1:])


def flops_matmul(ctx: Ctx, outs) -> int:
    return 2 * math.prod(outs[0].shape) * ctx.inputs[0].shape[-1]


def flops_sdpa(ctx: Ctx, outs) -> int:
    q, k, v = ctx.inputs[:3]
    b, h, s, d = q.shape
    full = 2 * b * h * s * k.shape[2] * (d + v.shape[3])
    return full // 2 if ctx.attrs.get("causal") else full


# ---- the registry ----------------------------------------------------------------


_POSITIVE = {"log": (0,), "sqrt": (0,), "rsqrt": (0,), "reciprocal": (0,), "div": (1,), "pow": (0,)}


def _pointwise_unary(name: str, doc: str, *attrs_: Attr) -> OpSig:
    return OpSig(name, "pointwise", ("x",), infer_unary, attrs=attrs_, doc=doc, positive=_POSITIVE.get(name, ()))


def _pointwise_binary(name: str, doc: str) -> OpSig:
    return OpSig(name, "pointwise", ("a", "b"), infer_binary, doc=doc, positive=_POSITIVE.get(name, ()))


_UNARY = {
    "relu": "max(x, 0)",
    "gelu": "x * Phi(x) (erf form)",
    "gelu_tanh": "GELU, tanh approximation",
    "sigmoid": "1 / (1 + exp(-x))",
    "tanh": "tanh(x)",
    "elu": "x if x > 0 else exp(x) - 1",
    "softplus": "log(1 + exp(x))",
    "exp": "e^x",
    "log": "natural logarithm",
    "sqrt": "square root",
    "rsqrt": "1 / sqrt(x)",
    "abs": "absolute value",
    "neg": "-x",
    "reciprocal": "1 / x",
    "erf": "the error function",
    "sin": "sine",
    "cos": "cosine",
    "floor": "round down",
    "ceil": "round up",
    "identity": "x (a copy, e.g. to change dtype)",
}
_BINARY = {
    "add": "a + b (infix +)",
    "sub": "a - b (infix -)",
    "mul": "a * b (infix *)",
    "div": "a / b (infix /)",
    "max": "elementwise maximum",
    "min": "elementwise minimum",
    "pow": "a ** b",
}

_SPATIAL_ATTRS = (
    Attr("padding", "ints", None, doc="zero padding per spatial dim (default 0)"),
    Attr("stride", "ints", None, doc="stride per spatial dim (default 1)"),
    Attr("dilation", "ints", None, doc="dilation per spatial dim (default 1)"),
)

OPS: dict[str, OpSig] = {
    **{n: _pointwise_unary(n, d) for n, d in _UNARY.items()},
    "leaky_relu": _pointwise_unary("leaky_relu", "x if x > 0 else slope * x", Attr("slope", "float", 0.01)),
    "swish": _pointwise_unary("swish", "x * sigmoid(beta * x)", Attr("beta", "float", 1.0)),
    **{n: _pointwise_binary(n, d) for n, d in _BINARY.items()},
    "bias": OpSig("bias", "pointwise", ("x", "bias"), infer_bias, doc="x + bias, bias broadcast onto x"),
    "scale": OpSig("scale", "pointwise", ("x", "scale"), infer_bias, doc="x * scale, scale broadcast onto x"),
    "conv_fprop": OpSig(
        "conv_fprop", "conv", ("image", "weight"), infer_conv_fprop, attrs=_SPATIAL_ATTRS, flops=flops_conv,
        doc="convolution forward: image [N,C,H,W] * weight [K,C/groups,R,S] -> [N,K,P,Q]",
    ),
    "conv_dgrad": OpSig(
        "conv_dgrad", "conv", ("grad", "weight"), infer_conv_dgrad, attrs=_SPATIAL_ATTRS, flops=flops_conv,
        doc="convolution data gradient: dy [N,K,P,Q], weight [K,C,R,S] -> dx [N,C,H,W]",
    ),
    "conv_wgrad": OpSig(
        "conv_wgrad", "conv", ("image", "grad"), infer_conv_wgrad, flops=flops_conv,
        attrs=_SPATIAL_ATTRS + (Attr("filter", "ints", None, doc="filter spatial size (inferred when omitted)"),),
        doc="convolution weight gradient: x [N,C,H,W], dy [N,K,P,Q] -> dw [K,C,R,S]",
    ),
    "matmul": OpSig("matmul", "matmul", ("a", "b"), infer_matmul, flops=flops_matmul,
                    doc="batched [..., M, K] @ [..., K, N] -> [..., M, N]"),
    "reduction": OpSig(
        "reduction", "reduction", ("x",), infer_reduction,
        attrs=(
            Attr("mode", "enum", REQUIRED, REDUCTION_MODES, doc="how to combine elements"),
            Attr("axes", "ints", None, doc="axes reduced to 1 (default: all)"),
        ),
        doc="reduce axes to size 1, keeping the rank",
    ),
    "sdpa": OpSig(
        "sdpa", "attention", ("q", "k", "v"), infer_sdpa, optional=("bias",), flops=flops_sdpa,
        attrs=(
            Attr("scale", "float", None, doc="softmax scale (default 1/sqrt(D))"),
            Attr("causal", "bool", False, doc="causal mask (top-left aligned)"),
            Attr("stats", "bool", False, doc="also return the softmax stats [B,H,S,1] float (training)"),
        ),
        outputs=("o", "stats"),
        results=lambda a: 2 if a.get("stats") else 1,
        doc="scaled dot-product attention: softmax(q k^T * scale + bias) v",
    ),
    "layernorm": OpSig(
        "layernorm", "norm", ("x", "scale", "bias"), infer_norm,
        attrs=(Attr("epsilon", "float", 1e-5),),
        doc="layer norm (inference) over all axes but the first; scale and bias are [1, ...]",
    ),
    "rmsnorm": OpSig(
        "rmsnorm", "norm", ("x", "scale"), infer_norm, optional=("bias",),
        attrs=(Attr("epsilon", "float", 1e-5),),
        doc="RMS norm (inference) over all axes but the first; scale (and bias) are [1, ...]",
    ),
    "batchnorm_inference": OpSig(
        "batchnorm_inference", "norm", ("x", "mean", "inv_variance", "scale", "bias"), infer_batchnorm,
        doc="(x - mean) * inv_variance * scale + bias, per channel (axis 1)", positive=(2,),
    ),
    "transpose": OpSig(
        "transpose", "layout", ("x",), infer_transpose, attrs=(Attr("perm", "ints", REQUIRED),),
        doc="permute the axes",
    ),
    "reshape": OpSig(
        "reshape", "layout", ("x",), infer_reshape, attrs=(Attr("shape", "ints", REQUIRED),),
        doc="same elements, new shape",
    ),
    "slice": OpSig(
        "slice", "layout", ("x",), infer_slice,
        attrs=(Attr("start", "ints", REQUIRED), Attr("end", "ints", REQUIRED)),
        doc="the box [start, end) per axis",
    ),
}

#: infix operators -> pointwise op
INFIX = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
