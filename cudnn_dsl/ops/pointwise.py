"""Pointwise ops: the torch references and cuDNN lowerings of the elementwise math, comparisons, logic and the
frontend's backward modes (relu_backward, ...)."""

from __future__ import annotations

import math

from cudnn_dsl.ops.base import OpImpl
from cudnn_dsl.target.lazy_torch import F, torch

# Each reference a lambda, so that torch is imported when one first runs, not when a lowering reads a table.
_UNARY_REF = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "sigmoid": lambda x: torch.sigmoid(x),
    "tanh": lambda x: torch.tanh(x),
    "elu": lambda x: F.elu(x),
    "softplus": lambda x: F.softplus(x),
    "exp": lambda x: torch.exp(x),
    "log": lambda x: torch.log(x),
    "sqrt": lambda x: torch.sqrt(x),
    "rsqrt": lambda x: torch.rsqrt(x),
    "abs": lambda x: torch.abs(x),
    "neg": lambda x: torch.neg(x),
    "reciprocal": lambda x: torch.reciprocal(x),
    "erf": lambda x: torch.erf(x),
    "sin": lambda x: torch.sin(x),
    "cos": lambda x: torch.cos(x),
    "floor": lambda x: torch.floor(x),
    "ceil": lambda x: torch.ceil(x),
    "tan": lambda x: torch.tan(x),
    "identity": lambda x: x.clone(),
}
_BINARY_REF = {
    "add": lambda a, b: torch.add(a, b),
    "sub": lambda a, b: torch.sub(a, b),
    "mul": lambda a, b: torch.mul(a, b),
    "div": lambda a, b: torch.div(a, b),
    "max": lambda a, b: torch.maximum(a, b),
    "min": lambda a, b: torch.minimum(a, b),
    "pow": lambda a, b: torch.pow(a, b),
    "mod": lambda a, b: torch.fmod(a, b),
    "add_square": lambda a, b: a + b * b,
    "bias": lambda a, b: torch.add(a, b),
    "scale": lambda a, b: torch.mul(a, b),
}
#: language name -> cuDNN Frontend builder name, where they differ
CUDNN_NAME = {"gelu_tanh": "gelu_approx_tanh", "gelu_tanh_backward": "gelu_approx_tanh_backward"}


def _unary(op: str) -> OpImpl:
    fn = _UNARY_REF[op]
    builder = CUDNN_NAME.get(op, op)
    return OpImpl(
        ref=lambda ins, a, outs: [fn(ins[0])],
        lower=lambda ctx, ins, a: [getattr(ctx.g, builder)(ins[0], **ctx.kw)],
    )


def _binary(op: str) -> OpImpl:
    fn = _BINARY_REF[op]
    return OpImpl(
        ref=lambda ins, a, outs: [fn(ins[0], ins[1])],
        lower=lambda ctx, ins, a: [getattr(ctx.g, op)(ins[0], ins[1], **ctx.kw)],
    )


#: relu's attributes at cuDNN's own defaults (no ceiling, no slope): left out of the call
_RELU_DEFAULTS = {"negative_slope": 0.0, "lower_clip": 0.0, "upper_clip": None}


def ref_relu(ins, a, outs):
    x, lo, hi = ins[0], a["lower_clip"], a["upper_clip"]
    if all(
        a[k] == v for k, v in _RELU_DEFAULTS.items()
    ):  # what a PyTorch user writes (a pattern's search: patterns.py)
        return [torch.relu(x)]
    y = torch.where(x <= lo, lo + a["negative_slope"] * (x - lo), x)
    return [y if hi is None else torch.where(x >= hi, torch.full_like(x, hi), y)]


def lower_relu(ctx, ins, a):
    given = {k: v for k, v in a.items() if v != _RELU_DEFAULTS[k]}
    return [ctx.g.relu(ins[0], **given, **ctx.kw)]


def ref_leaky_relu(ins, a, outs):
    return [F.leaky_relu(ins[0], a["slope"])]


def lower_leaky_relu(ctx, ins, a):
    return [ctx.g.leaky_relu(ins[0], negative_slope=a["slope"], **ctx.kw)]


def ref_swish(ins, a, outs):
    return [ins[0] * torch.sigmoid(a["beta"] * ins[0])]


def lower_swish(ctx, ins, a):
    return [ctx.g.swish(ins[0], swish_beta=a["beta"], **ctx.kw)]


def ref_gen_index(ins, a, outs):
    x, axis = ins[0], a["axis"]
    shape = [1] * x.dim()
    shape[axis] = x.shape[axis]
    index = torch.arange(x.shape[axis], dtype=x.dtype, device=x.device).reshape(shape)
    return [index.expand(x.shape).clone()]


def lower_gen_index(ctx, ins, a):
    return [ctx.g.gen_index(ins[0], axis=a["axis"] + ctx.lead, **ctx.kw)]


# ---- comparisons and logic ---------------------------------------------------------
# The reference holds every value widened (bool as 0/1 in float32); a bool result is 0/1 in the
# dtype of its first input, rounded to bool when it is an output.

_COMPARE_REF = {
    "cmp_eq": lambda a, b: torch.eq(a, b),
    "cmp_neq": lambda a, b: torch.ne(a, b),
    "cmp_gt": lambda a, b: torch.gt(a, b),
    "cmp_ge": lambda a, b: torch.ge(a, b),
    "cmp_lt": lambda a, b: torch.lt(a, b),
    "cmp_le": lambda a, b: torch.le(a, b),
    "logical_and": lambda a, b: torch.logical_and(a != 0, b != 0),
    "logical_or": lambda a, b: torch.logical_or(a != 0, b != 0),
}


def _as_tensors(ins) -> list:
    """The inputs as tensors: the eager baseline passes host scalars as Python numbers."""
    like = next(t for t in ins if isinstance(t, torch.Tensor))
    return [t if isinstance(t, torch.Tensor) else torch.tensor(t, dtype=like.dtype, device=like.device) for t in ins]


def _compare(op: str) -> OpImpl:
    fn = _COMPARE_REF[op]

    def ref(ins, a, outs):
        x, y = _as_tensors(ins)
        return [fn(x, y).to(x.dtype)]

    return OpImpl(
        ref=ref,
        lower=lambda ctx, ins, a: [getattr(ctx.g, op)(ins[0], ins[1], **ctx.kw)],
    )


def ref_logical_not(ins, a, outs):
    return [(ins[0] == 0).to(ins[0].dtype)]


def lower_logical_not(ctx, ins, a):
    return [ctx.g.logical_not(ins[0], **ctx.kw)]


def ref_binary_select(ins, a, outs):
    x, y, mask = _as_tensors(ins)
    return [torch.where(mask != 0, x, y)]


def lower_binary_select(ctx, ins, a):
    return [ctx.g.binary_select(*ins, **ctx.kw)]


# ---- backward modes ----------------------------------------------------------------
# Closed forms (the reference runs under no_grad, and `emit --format torch` traces it); the CPU tests
# hold each against torch autograd of the forward op's reference.


def _gelu_tanh_grad(x):
    k = math.sqrt(2.0 / math.pi)
    t = torch.tanh(k * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)


#: forward op -> its derivative at x, given the canonical attributes
_DERIVATIVE = {
    "relu": lambda x, a: torch.where(
        x <= a["lower_clip"],
        torch.full_like(x, a["negative_slope"]),
        torch.ones_like(x) if a["upper_clip"] is None else (x < a["upper_clip"]).to(x.dtype),
    ),
    "leaky_relu": lambda x, a: torch.where(x > 0, torch.ones_like(x), torch.full_like(x, a["slope"])),
    "gelu": lambda x, a: (
        0.5 * (1 + torch.erf(x / math.sqrt(2.0))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    ),
    "gelu_tanh": lambda x, a: _gelu_tanh_grad(x),
    "sigmoid": lambda x, a: torch.sigmoid(x) * (1 - torch.sigmoid(x)),
    "tanh": lambda x, a: 1 - torch.tanh(x) ** 2,
    "elu": lambda x, a: torch.where(x > 0, torch.ones_like(x), torch.exp(x)),
    "softplus": lambda x, a: torch.sigmoid(x),
    "swish": lambda x, a: torch.sigmoid(a["beta"] * x) * (1 + a["beta"] * x * (1 - torch.sigmoid(a["beta"] * x))),
}


def _pointwise_backward(op: str) -> OpImpl:
    """dy * f'(x); cuDNN's modes take the gradient and the forward op's input (loss, input)."""
    forward = op.removesuffix("_backward")
    derivative = _DERIVATIVE[forward]
    builder = CUDNN_NAME.get(op, op)
    extra = {
        "relu": lambda a: {k: v for k, v in a.items() if v != _RELU_DEFAULTS[k]},
        "leaky_relu": lambda a: {"negative_slope": a["slope"]},
        "swish": lambda a: {"swish_beta": a["beta"]},
    }.get(forward, lambda a: {})

    def ref(ins, a, outs):
        dy, x = _as_tensors(ins)
        return [dy * derivative(x, a)]

    def lower(ctx, ins, a):
        return [getattr(ctx.g, builder)(ins[0], ins[1], **extra(a), **ctx.kw)]

    return OpImpl(ref, lower)


IMPLS: dict[str, OpImpl] = {
    **{op: _unary(op) for op in _UNARY_REF},
    **{op: _binary(op) for op in _BINARY_REF},
    **{op: _compare(op) for op in _COMPARE_REF},
    "relu": OpImpl(ref_relu, lower_relu),
    "gen_index": OpImpl(ref_gen_index, lower_gen_index),
    "logical_not": OpImpl(ref_logical_not, lower_logical_not),
    "binary_select": OpImpl(ref_binary_select, lower_binary_select),
    "leaky_relu": OpImpl(ref_leaky_relu, lower_leaky_relu),
    "swish": OpImpl(ref_swish, lower_swish),
    **{f"{op}_backward": _pointwise_backward(f"{op}_backward") for op in _DERIVATIVE},
}
