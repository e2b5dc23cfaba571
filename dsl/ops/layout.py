"""Layout ops: signatures, shape rules and VJP rules of transpose, reshape, slice and concatenate."""

from __future__ import annotations

import math

from dsl.diagnostics import RuleError
from dsl.ops.base import Ctx, Family, OpSig, Out, Recompute, Rule, by_name, row_major
from dsl.types import fmt_shape, stride_order
from dsl.values import REQUIRED, Attr

FAMILY = Family(
    "layout", ("reshape", "transpose", "slice", "concat"), "layout ops need a newer cuDNN, or a graph of their own"
)


# ---- shape rules -------------------------------------------------------------------


def infer_concatenate(ctx: Ctx) -> list[Out]:
    ts = ctx.inputs
    axis = ctx.attrs["axis"]
    x = ts[0]
    if axis >= len(x.shape):
        raise RuleError(f"{ctx.op}: axis {axis} is out of range for rank {len(x.shape)}", "axis")
    for i, t in enumerate(ts[1:], 1):
        if t.dtype != x.dtype:
            raise RuleError(f"{ctx.op}: dtype conflict: input 1 is {x.dtype}, input {i + 1} is {t.dtype}", i)
        if len(t.shape) != len(x.shape) or any(a != b for k, (a, b) in enumerate(zip(t.shape, x.shape)) if k != axis):
            raise RuleError(
                f"{ctx.op}: input {i + 1} {fmt_shape(t.shape)} differs from input 1 {fmt_shape(x.shape)} "
                f"off axis {axis}",
                i,
            )
    shape = tuple(sum(t.shape[axis] for t in ts) if k == axis else d for k, d in enumerate(x.shape))
    return [Out(shape, stride_order(x.strides))]


def infer_transpose(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    perm = ctx.attrs["perm"]
    if sorted(perm) != list(range(len(x.shape))):
        raise RuleError(f"{ctx.op}: perm {list(perm)} is not a permutation of the {len(x.shape)} axes", "perm")
    shape = tuple(x.shape[p] for p in perm)
    return [Out(shape, row_major(len(shape)))]


def infer_reshape(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    shape = tuple(ctx.attrs["shape"])
    if any(d < 1 for d in shape) or math.prod(shape) != math.prod(x.shape):
        raise RuleError(
            f"{ctx.op}: cannot reshape {fmt_shape(x.shape)} ({math.prod(x.shape)} elements) to {fmt_shape(shape)}",
            "shape",
        )
    return [Out(shape, _packed_order(shape))]


def _packed_order(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A reshape's result is packed row-major, its trailing unit axes laid outside its last real axis: the
    same memory, and a [tokens, C, 1, 1] result channels-last, the only layout cuDNN sums tokens in."""
    real = [a for a, d in enumerate(shape) if d != 1]
    if not real:
        return row_major(len(shape))
    last = real[-1]
    return (*range(last), *range(last + 1, len(shape)), last)


def infer_slice(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    start, end = ctx.attrs["start"], ctx.attrs["end"]
    rank = len(x.shape)
    if len(start) != rank or len(end) != rank:
        raise RuleError(f"{ctx.op}: start and end need {rank} values each", "start")
    for i, (s, e) in enumerate(zip(start, end)):
        if not 0 <= s < e <= x.shape[i]:
            raise RuleError(f"{ctx.op}: axis {i}: [{s}, {e}) is not inside [0, {x.shape[i]})", "end")
    return [Out(tuple(e - s for s, e in zip(start, end)), stride_order(x.strides))]


# ---- the rows ----------------------------------------------------------------------

OPS = by_name(
    FAMILY.op(
        "concatenate",
        ("x",),
        infer_concatenate,
        attrs=(Attr("axis", "int", REQUIRED, lo=0, doc="the axis the inputs are joined along"),),
        variadic=True,
        keeps_dtype=True,
        doc="the inputs joined along `axis` (equal dtypes; equal dims off the axis)",
    ),
    FAMILY.op(
        "transpose",
        ("x",),
        infer_transpose,
        attrs=(Attr("perm", "ints", REQUIRED, doc="the new order of the axes", lo=0),),
        doc="permute the axes",
        keeps_dtype=True,
    ),
    FAMILY.op(
        "reshape",
        ("x",),
        infer_reshape,
        attrs=(Attr("shape", "ints", REQUIRED, doc="the new dims", lo=1),),
        doc="same elements, new shape (packed; a [N, C, 1, 1] result channels-last)",
        keeps_dtype=True,
    ),
    FAMILY.op(
        "slice",
        ("x",),
        infer_slice,
        attrs=(
            Attr("start", "ints", REQUIRED, doc="first index per axis", lo=0),
            Attr("end", "ints", REQUIRED, doc="one past the last index per axis", lo=0),
        ),
        doc="the box [start, end) per axis",
        keeps_dtype=True,
    ),
)
BACKWARD_OPS: dict[str, OpSig] = {}


# ---- VJP rules ---------------------------------------------------------------------


def _transpose(e, n):
    perm = n.attrs["perm"]
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return (e.call("transpose", n.dy, perm=inverse),)


def _concatenate(e, n):
    """Each input's gradient is its slice of dy along the axis."""
    axis, start, grads = n.attrs["axis"], 0, []
    for t, want in zip(n.ins, n.need):
        lo = tuple(start if i == axis else 0 for i in range(len(t.shape)))
        hi = tuple(start + d if i == axis else n.outs[0].shape[i] for i, d in enumerate(t.shape))
        grads.append(e.call("slice", n.dy, start=lo, end=hi) if want else None)
        start += t.shape[axis]
    return tuple(grads)


VJPS: dict[str, Rule] = {
    "transpose": _transpose,
    "concatenate": _concatenate,
    "reshape": lambda e, n: (e.reshape(n.dy, n.ins[0].shape),),
}
RECOMPUTE: dict[str, Recompute] = {}
NO_VJP = {"slice": "its gradient pads with zeros, which no registry op does"}
