"""Pointwise ops: signatures, shape rules and VJP rules of the elementwise math, comparisons, logic and the
frontend's backward modes (relu_backward, ...), and the infix operators."""

from __future__ import annotations

import math
from collections.abc import Callable

from dsl.diagnostics import RuleError
from dsl.ops.base import (
    SECOND_ORDER,
    Ctx,
    Family,
    OpSig,
    Out,
    Recompute,
    Rule,
    by_name,
    recompute_as_itself,
    same_kind,
    x_of,
    y_of,
)
from dsl.types import TensorType, broadcast, fmt_shape, stride_order
from dsl.values import REQUIRED, Attr

FAMILY = Family(
    "pointwise",
    ("pointwise",),
    "pointwise ops fuse as the epilogue of a matmul, conv or norm; a chain of pointwise ops alone may need a "
    "graph of its own",
)

#: infix operators -> pointwise op
INFIX = {"+": "add", "-": "sub", "*": "mul", "/": "div"}


# ---- shape rules -------------------------------------------------------------------


def infer_unary(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    return [Out(x.shape, stride_order(x.strides))]


def one_element(t: TensorType) -> bool:
    """A tensor of one element ([1], [1, 1]): it broadcasts onto an operand of any rank (an input of it reaches
    cuDNN at that operand's rank: build.lower.lifted_ranks), as the frontend's C++ samples write a scale."""
    return all(d == 1 for d in t.shape)


def _lifted(ts: list[TensorType]) -> list[TensorType]:
    """The operands, each one-element operand of a lower rank than the highest taken at that rank."""
    rank = max(len(t.shape) for t in ts)
    return [TensorType(t.dtype, (1,) * rank, (1,) * rank) if one_element(t) and len(t.shape) < rank else t for t in ts]


def infer_binary(ctx: Ctx) -> list[Out]:
    a, b = _lifted([ctx.inputs[0], ctx.inputs[1]])
    same_kind(ctx, 0, 1)
    if len(a.shape) != len(b.shape):
        raise RuleError(
            f"{ctx.op}: inputs have ranks {len(a.shape)} and {len(b.shape)} ({fmt_shape(a.shape)} and "
            f"{fmt_shape(b.shape)}); cuDNN pointwise ops need equal ranks, with 1 where an axis broadcasts",
            1,
        )
    shape = broadcast(a.shape, b.shape)
    if shape is None:
        raise RuleError(f"{ctx.op}: shapes {fmt_shape(a.shape)} and {fmt_shape(b.shape)} do not broadcast", 1)
    full = a if a.shape == shape else b if b.shape == shape else a
    return [Out(shape, stride_order(full.strides))]


def infer_bias(ctx: Ctx) -> list[Out]:
    """bias/scale: the second input broadcasts onto the first, whose shape is kept."""
    x, b = ctx.inputs[0], ctx.inputs[1]
    out = infer_binary(ctx)
    if out[0].shape != x.shape:
        raise RuleError(
            f"{ctx.op}: {fmt_shape(b.shape)} must broadcast onto the input {fmt_shape(x.shape)} without growing it",
            1,
        )
    return out


def _broadcast_all(ctx: Ctx) -> list[Out]:
    """Every input broadcast to one shape (equal ranks, a one-element input aside); the result takes the full
    input's layout."""
    ts = _lifted([t for t in ctx.inputs if t is not None])
    shape = ts[0].shape
    for i, t in enumerate(ts[1:], 1):
        if len(t.shape) != len(shape):
            raise RuleError(
                f"{ctx.op}: input {i + 1} has rank {len(t.shape)}, input 1 has rank {len(shape)}; cuDNN pointwise "
                f"ops need equal ranks, with 1 where an axis broadcasts",
                i,
            )
        shape = broadcast(shape, t.shape)
        if shape is None:
            raise RuleError(
                f"{ctx.op}: shapes {', '.join(fmt_shape(t.shape) for t in ts[: i + 1])} do not broadcast", i
            )
    full = next((t for t in ts if t.shape == shape), ts[0])
    return [Out(shape, stride_order(full.strides))]


def _bool_inputs(ctx: Ctx, *idx: int) -> None:
    for i in idx:
        if ctx.inputs[i].dtype != "bool":
            raise RuleError(
                f"{ctx.op}: input {i + 1} is {ctx.inputs[i].dtype}; it must be bool (a comparison gives one: "
                f"cmp_neq(x, 0))",
                i,
            )


def infer_compare(ctx: Ctx) -> list[Out]:
    """Comparisons compare in the compute dtype, so integers and floats mix (an int32 gen_index
    against a float literal); deviceless planning with cuDNN 9.28 accepts it."""
    return _broadcast_all(ctx)


def infer_logic(ctx: Ctx) -> list[Out]:
    """logical_and/or/not: bool in, bool out."""
    _bool_inputs(ctx, *range(len(ctx.inputs)))
    return _broadcast_all(ctx)


def infer_select(ctx: Ctx) -> list[Out]:
    """binary_select(a, b, mask): a where mask, else b."""
    same_kind(ctx, 0, 1)
    _bool_inputs(ctx, 2)
    return _broadcast_all(ctx)


def infer_gen_index(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    if ctx.attrs["axis"] >= len(x.shape):
        raise RuleError(f"{ctx.op}: axis {ctx.attrs['axis']} is out of range for rank {len(x.shape)}", "axis")
    return [Out(x.shape, stride_order(x.strides))]


def infer_pointwise_backward(ctx: Ctx) -> list[Out]:
    """dy and the forward input x broadcast as a binary op's inputs do; dx takes their shape."""
    return infer_binary(ctx)


# ---- the rows ----------------------------------------------------------------------

_POSITIVE = {
    "log": (0,),
    "sqrt": (0,),
    "rsqrt": (0,),
    "reciprocal": (0,),
    "div": (1,),
    "pow": (0,),
    "mod": (1,),
}


def _pointwise_unary(name: str, doc: str, *attrs_: Attr) -> OpSig:
    return FAMILY.op(name, ("x",), infer_unary, attrs=attrs_, doc=doc, positive=_POSITIVE.get(name, ()))


def _pointwise_binary(name: str, doc: str) -> OpSig:
    return FAMILY.op(name, ("a", "b"), infer_binary, doc=doc, positive=_POSITIVE.get(name, ()))


def _compare(name: str, doc: str) -> OpSig:
    return FAMILY.op(name, ("a", "b"), infer_compare, doc=doc, result_dtype="bool")


def _logic(name: str, inputs: tuple[str, ...], doc: str) -> OpSig:
    # cuDNN's own samples compute logic ops in bool (compute_data_type=BOOLEAN)
    return FAMILY.op(name, inputs, infer_logic, doc=doc, result_dtype="bool", compute="bool")


_UNARY = {
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
    "tan": "tangent",
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
    "mod": "remainder of a / b with the sign of a (C's fmod)",
    "add_square": "a + b * b",
}
_COMPARE = {
    "cmp_eq": "a == b",
    "cmp_neq": "a != b",
    "cmp_gt": "a > b",
    "cmp_ge": "a >= b",
    "cmp_lt": "a < b",
    "cmp_le": "a <= b",
}

OPS = by_name(
    _pointwise_unary(
        "relu",
        "x, clipped to [lower_clip, upper_clip]; below lower_clip, lower_clip + negative_slope * (x - lower_clip)",
        Attr("negative_slope", "float", 0.0, lo=None, hi=None, doc="slope below lower_clip (leaky)"),
        Attr("lower_clip", "float", 0.0, lo=None, hi=None, doc="where the slope starts"),
        Attr("upper_clip", "float", None, lo=None, hi=None, optional=True, doc="the ceiling (default: none)"),
    ),
    *(_pointwise_unary(n, d) for n, d in _UNARY.items()),
    FAMILY.op(
        "gen_index",
        ("x",),
        infer_gen_index,
        attrs=(Attr("axis", "int", REQUIRED, lo=0, doc="the axis whose index each element gets"),),
        result_dtype="int32",
        doc="each element's index along `axis` (x gives only the shape)",
    ),
    _pointwise_unary(
        "leaky_relu", "x if x > 0 else slope * x", Attr("slope", "float", 0.01, hi=None, doc="slope for x < 0")
    ),
    _pointwise_unary("swish", "x * sigmoid(beta * x)", Attr("beta", "float", 1.0, hi=None, doc="the sigmoid's scale")),
    *(_pointwise_binary(n, d) for n, d in _BINARY.items()),
    FAMILY.op("bias", ("x", "bias"), infer_bias, doc="x + bias, bias broadcast onto x"),
    FAMILY.op("scale", ("x", "scale"), infer_bias, doc="x * scale, scale broadcast onto x"),
    # comparisons and logic: results are bool unless declared otherwise
    *(_compare(n, d) for n, d in _COMPARE.items()),
    _logic("logical_and", ("a", "b"), "a and b (bool inputs)"),
    _logic("logical_or", ("a", "b"), "a or b (bool inputs)"),
    _logic("logical_not", ("x",), "not x (a bool input)"),
    FAMILY.op("binary_select", ("a", "b", "mask"), infer_select, doc="a where mask (bool) is true, else b"),
)


def _pointwise_backward(of: str) -> OpSig:
    return FAMILY.op(
        f"{of}_backward",
        ("dy", "x"),
        infer_pointwise_backward,
        attrs=OPS[of].attrs,
        doc=f"dy * {of}'(x): the gradient of `{of}` at its input x, given the gradient dy of its result",
    )


BACKWARD_OPS = by_name(
    *(
        _pointwise_backward(of)
        for of in ("relu", "leaky_relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "elu", "softplus", "swish")
    )
)
"""the frontend's backward modes: the loss gradient dy and the forward op's input x"""
OPS |= BACKWARD_OPS


# ---- VJP rules ---------------------------------------------------------------------


def _unary(deriv: Callable) -> Rule:
    """dx = dy * f'(x), f' from deriv(e, n)."""
    return lambda e, n: (e.call("mul", n.dy, deriv(e, n)),)


def _binary(da: Callable | None, db: Callable | None) -> Rule:
    """Each gradient computed only where wanted."""

    def rule(e, n):
        return tuple(f(e, n) if f is not None and want else None for f, want in zip((da, db), n.need))

    return rule


def _stop(e, n):
    """A bool or integer result: no gradient flows through it."""
    return (None,) * len(n.inputs)


def _relu(e, n):
    """relu_backward. With a slope >= 0 the result is above lower_clip (below upper_clip) exactly where x is:
    the mode reads the result, which the forward writes anyway, rather than a saved input."""
    x = y_of(e, n) if n.attrs["negative_slope"] >= 0 else x_of(e, n)
    return (e.call("relu_backward", n.dy, x, **n.attrs),)


def _backward_mode(op: str) -> Rule:
    """The frontend's backward mode of a pointwise op: dy * f'(x) in one op, read at the op's input."""
    return lambda e, n: (e.call(f"{op}_backward", n.dy, x_of(e, n), **n.attrs),)


VJPS: dict[str, Rule] = {
    "relu": _relu,
    **{
        op: _backward_mode(op)
        for op in ("leaky_relu", "elu", "gelu", "gelu_tanh", "swish", "sigmoid", "tanh", "softplus")
    },
    "exp": _unary(y_of),
    "log": lambda e, n: (e.call("div", n.dy, x_of(e, n)),),
    "sqrt": lambda e, n: (e.call("div", e.call("mul", n.dy, 0.5), y_of(e, n)),),
    "rsqrt": lambda e, n: (
        e.call(
            "neg",
            e.call("mul", e.call("mul", n.dy, 0.5), e.call("mul", y_of(e, n), e.call("mul", y_of(e, n), y_of(e, n)))),
        ),
    ),
    "reciprocal": lambda e, n: (e.call("neg", e.call("mul", n.dy, e.call("mul", y_of(e, n), y_of(e, n)))),),
    "abs": lambda e, n: (e.call("binary_select", n.dy, e.call("neg", n.dy), e.call("cmp_ge", x_of(e, n), 0.0)),),
    "neg": lambda e, n: (e.call("neg", n.dy),),
    "erf": _unary(
        lambda e, n: e.call(
            "mul", e.call("exp", e.call("neg", e.call("mul", x_of(e, n), x_of(e, n)))), 2 / math.sqrt(math.pi)
        )
    ),
    "sin": _unary(lambda e, n: e.call("cos", x_of(e, n))),
    "cos": lambda e, n: (e.call("neg", e.call("mul", n.dy, e.call("sin", x_of(e, n)))),),
    "tan": _unary(lambda e, n: e.call("add", e.call("mul", y_of(e, n), y_of(e, n)), 1.0)),
    "identity": lambda e, n: (n.dy,),
    "floor": lambda e, n: (None,),  # zero almost everywhere
    "ceil": lambda e, n: (None,),
    "add": _binary(lambda e, n: n.dy, lambda e, n: n.dy),
    "sub": _binary(lambda e, n: n.dy, lambda e, n: e.call("neg", n.dy)),
    "mul": _binary(
        lambda e, n: e.call("mul", n.dy, e.fwd(n.inputs[1])), lambda e, n: e.call("mul", n.dy, e.fwd(n.inputs[0]))
    ),
    "div": _binary(
        lambda e, n: e.call("div", n.dy, e.fwd(n.inputs[1])),
        lambda e, n: e.call("neg", e.call("div", e.call("mul", n.dy, y_of(e, n)), e.fwd(n.inputs[1]))),
    ),
    "max": _binary(
        lambda e, n: e.call("mul", n.dy, e.call("cmp_ge", x_of(e, n), e.fwd(n.inputs[1]))),
        lambda e, n: e.call("mul", n.dy, e.call("cmp_lt", x_of(e, n), e.fwd(n.inputs[1]))),
    ),
    "min": _binary(
        lambda e, n: e.call("mul", n.dy, e.call("cmp_le", x_of(e, n), e.fwd(n.inputs[1]))),
        lambda e, n: e.call("mul", n.dy, e.call("cmp_gt", x_of(e, n), e.fwd(n.inputs[1]))),
    ),
    "pow": _binary(  # a > 0 (the registry's domain): a^(b-1) = y / a
        lambda e, n: e.call("div", e.call("mul", e.call("mul", n.dy, e.fwd(n.inputs[1])), y_of(e, n)), x_of(e, n)),
        lambda e, n: e.call("mul", e.call("mul", n.dy, y_of(e, n)), e.call("log", x_of(e, n))),
    ),
    "mod": _binary(  # C's fmod: a = trunc(a / b) * b + y, so dy/db = -trunc(a / b) = -(a - y) / b
        lambda e, n: n.dy,
        lambda e, n: e.call(
            "neg", e.call("mul", n.dy, e.call("div", e.call("sub", x_of(e, n), y_of(e, n)), e.fwd(n.inputs[1])))
        ),
    ),
    "add_square": _binary(lambda e, n: n.dy, lambda e, n: e.call("mul", e.call("mul", n.dy, e.fwd(n.inputs[1])), 2.0)),
    "bias": _binary(lambda e, n: n.dy, lambda e, n: n.dy),
    "scale": _binary(
        lambda e, n: e.call("mul", n.dy, e.fwd(n.inputs[1])), lambda e, n: e.call("mul", n.dy, e.fwd(n.inputs[0]))
    ),
    "binary_select": lambda e, n: (
        e.call("mul", n.dy, e.fwd(n.inputs[2])) if n.need[0] else None,
        e.call("mul", n.dy, e.call("logical_not", e.fwd(n.inputs[2]))) if n.need[1] else None,
        None,
    ),
    **{op: _stop for op in ("cmp_eq", "cmp_neq", "cmp_gt", "cmp_ge", "cmp_lt", "cmp_le", "gen_index")},
    **{op: _stop for op in ("logical_and", "logical_or", "logical_not")},
}

RECOMPUTE: dict[str, Recompute] = {op: recompute_as_itself for op in OPS}
"""every pointwise op recomputes as itself"""
NO_VJP: dict[str, str] = {
    **{op: SECOND_ORDER for op in BACKWARD_OPS},
}
