"""Matmul: signature, shape rule, flop count and VJP rule of the batched matrix product."""

from __future__ import annotations

import math

from dsl.diagnostics import RuleError
from dsl.ops.base import Ctx, Family, OpSig, Out, Recompute, Rule, by_name, row_major
from dsl.types import broadcast, fmt_shape

FAMILY = Family("matmul", ("matmul",), "half/bf16 data with float compute, and inner dims that are multiples of 8")


def infer_matmul(ctx: Ctx) -> list[Out]:
    a, b = ctx.inputs
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise RuleError(f"{ctx.op}: inputs need rank >= 2, got {fmt_shape(a.shape)} and {fmt_shape(b.shape)}", 0)
    if len(a.shape) != len(b.shape):
        raise RuleError(
            f"{ctx.op}: inputs have ranks {len(a.shape)} and {len(b.shape)}; use 1 for broadcast batch dims", 1
        )
    if a.dtype != b.dtype:
        raise RuleError(f"{ctx.op}: dtype conflict: A is {a.dtype}, B is {b.dtype}", 1)
    if a.shape[-1] != b.shape[-2]:
        raise RuleError(
            f"{ctx.op}: inner dimensions differ: A {fmt_shape(a.shape)} has K={a.shape[-1]}, "
            f"B {fmt_shape(b.shape)} has K={b.shape[-2]}",
            1,
        )
    batch = broadcast(a.shape[:-2], b.shape[:-2])
    if batch is None:
        raise RuleError(
            f"{ctx.op}: batch dims {fmt_shape(a.shape[:-2])} and {fmt_shape(b.shape[:-2])} do not broadcast", 1
        )
    shape = (*batch, a.shape[-2], b.shape[-1])
    return [Out(shape, row_major(len(shape)))]


def flops_matmul(ctx: Ctx, outs) -> int:
    return 2 * math.prod(outs[0].shape) * ctx.inputs[0].shape[-1]


OPS = by_name(
    FAMILY.op(
        "matmul",
        ("a", "b"),
        infer_matmul,
        flops=flops_matmul,
        doc="batched [..., M, K] @ [..., K, N] -> [..., M, N]",
    ),
)
BACKWARD_OPS: dict[str, OpSig] = {}


def _matmul(e, n):
    """dA = dC B^T, dB = A^T dC; the transposes are views of the saved operands."""
    a, b = n.ins
    da = e.call("matmul", e.cast(n.dy, b.dtype), e.fwd_t(n.inputs[1])) if n.need[0] else None
    db = _weight_grad(e, n) if n.need[1] else None
    return da, db


def _weight_grad(e, n):
    """dB = A^T dC. Where B is broadcast over A's batch (a weight), one matmul over every row of the batch:
    A viewed as [1.., K, B*M] (no copy) times dC reshaped to [1.., B*M, N] gives B's [1.., K, N] directly,
    where the batched product would write [B.., K, N] for a sum over B. A whose rows make no view keeps the
    batched form. (Where A is the broadcast one, dA sums over B and N together, which a packed dC [B, M, N]
    holds apart, M between them: no view merges them, so dA stays the batched product and its sum.)"""
    a, b = n.ins
    dy = e.cast(n.dy, a.dtype)
    broadcast = all(d == 1 for d in b.shape[:-2]) and math.prod(a.shape[:-2]) > 1
    a_t = e.fwd_flat_t(n.inputs[0]) if broadcast else None
    if a_t is None:
        return e.call("matmul", e.fwd_t(n.inputs[0]), dy)
    rows = (1,) * (len(a.shape) - 2) + (math.prod(a.shape[:-1]), b.shape[-1])
    return e.call("matmul", a_t, e.reshape(dy, rows))


VJPS: dict[str, Rule] = {"matmul": _matmul}
RECOMPUTE: dict[str, Recompute] = {}
NO_VJP: dict[str, str] = {}
