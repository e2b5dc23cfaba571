"""Reduction: signature, attributes, shape rule and VJP rule of the reduction of axes to size 1."""

from __future__ import annotations

import math

from dsl.diagnostics import RuleError
from dsl.ops.base import Ctx, Family, OpSig, Out, Recompute, Rule, by_name, x_of, y_of
from dsl.types import stride_order
from dsl.values import DERIVED, REQUIRED, Attr

FAMILY = Family(
    "reduction",
    ("reduction",),
    "a reduction fuses after a matmul or conv over its output; alone it may need a graph of its own",
)

REDUCTION_MODES = ("sum", "mul", "min", "max", "amax", "avg", "norm1", "norm2", "mul_no_zeros")


def derive_reduction(ctx: Ctx) -> dict:
    rank = len(ctx.inputs[0].shape)
    axes = ctx.attrs["axes"]
    if axes is DERIVED:
        return {"axes": tuple(range(rank))}
    if any(not -rank <= a < rank for a in axes):
        raise RuleError(f"{ctx.op}: axes {list(axes)} out of range for rank {rank}", "axes")
    return {"axes": tuple(sorted({a % rank for a in axes}))}


def infer_reduction(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    axes = ctx.attrs["axes"]
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return [Out(shape, stride_order(x.strides))]


OPS = by_name(
    FAMILY.op(
        "reduction",
        ("x",),
        infer_reduction,
        derive=derive_reduction,
        attrs=(
            Attr("mode", "enum", REQUIRED, REDUCTION_MODES, doc="how to combine elements"),
            Attr(
                "axes", "ints", DERIVED, doc="axes reduced to 1 (default: all); negative counts from the end", lo=None
            ),
        ),
        doc="reduce axes to size 1, keeping the rank",
    ),
)
BACKWARD_OPS: dict[str, OpSig] = {}


def _reduction(e, n):
    mode, x = n.attrs["mode"], n.ins[0]
    if mode == "sum":
        return (e.expand(n.dy, n.inputs[0]),)
    if mode == "avg":
        count = math.prod(x.shape[a] for a in n.attrs["axes"])
        return (e.expand(e.call("mul", n.dy, 1 / count), n.inputs[0]),)
    if mode in ("max", "min"):
        return (e.call("mul", n.dy, e.call("cmp_eq", x_of(e, n), y_of(e, n))),)
    if mode == "amax":
        xs = x_of(e, n)
        g = e.call("mul", n.dy, e.call("cmp_eq", e.call("abs", xs), y_of(e, n)))
        return (e.call("binary_select", g, e.call("neg", g), e.call("cmp_ge", xs, 0.0)),)
    raise RuleError(f"reduction: mode={mode} has no derived backward (sum, avg, max, min and amax have)")


VJPS: dict[str, Rule] = {"reduction": _reduction}
RECOMPUTE: dict[str, Recompute] = {}
NO_VJP: dict[str, str] = {}
