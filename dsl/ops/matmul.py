"""Matmuls: signatures, shape rules, flop counts and VJP rules of the batched matrix product and of the
mixture-of-experts grouped GEMM (moe_grouped_matmul) and its weight gradient (moe_grouped_matmul_bwd)."""

from __future__ import annotations

import math

from dsl.diagnostics import RuleError
from dsl.ops.base import SECOND_ORDER, Ctx, Family, OpSig, Out, Recompute, Rule, by_name, row_major
from dsl.types import broadcast, fmt_shape, is_float

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


# ---- mixture of experts --------------------------------------------------------------------------------------


def _moe_rows(ctx: Ctx, rows: int, names: tuple[int, ...]) -> None:
    """Inputs `names` are [1, T, *] token rows of one float dtype (the first's), and the offsets [E, 1, 1] int32."""
    sig, first = OPS_MOE[ctx.op], ctx.inputs[names[0]]
    for i in names:
        t = ctx.inputs[i]
        if len(t.shape) != 3 or t.shape[0] != 1 or t.shape[1] != rows:
            raise RuleError(f"{ctx.op}: {sig.inputs[i]} {fmt_shape(t.shape)} must be [1, T, *]: T={rows} token rows", i)
        if t.dtype != first.dtype or not is_float(t.dtype):
            raise RuleError(f"{ctx.op}: {sig.inputs[i]} is {t.dtype}; the token rows are {first.dtype}", i)
    off = ctx.inputs[2]
    if len(off.shape) != 3 or off.shape[1:] != (1, 1) or off.dtype != "int32":
        raise RuleError(f"{ctx.op}: first_token_offset must be int32[E, 1, 1], got {off}", 2)


def infer_moe_grouped_matmul(ctx: Ctx) -> list[Out]:
    """token [1, T, H], weight [E, H, N] of token's dtype, first_token_offset int32[E, 1, 1]: out [1, T, N]."""
    token, weight, off = ctx.inputs
    _moe_rows(ctx, token.shape[1], (0,))
    e, h = off.shape[0], token.shape[2]
    if len(weight.shape) != 3 or weight.shape[:2] != (e, h):
        raise RuleError(
            f"{ctx.op}: weight {fmt_shape(weight.shape)} must be [E, H, N] = [{e}, {h}, N] (one [H, N] per expert of "
            "first_token_offset, H token's last dim)",
            1,
        )
    if weight.dtype != token.dtype:
        raise RuleError(f"{ctx.op}: dtype conflict: token is {token.dtype}, weight is {weight.dtype}", 1)
    return [Out((1, token.shape[1], weight.shape[2]), row_major(3))]


def infer_moe_grouped_matmul_bwd(ctx: Ctx) -> list[Out]:
    """doutput [1, T, N], token [1, T, H] of its dtype, first_token_offset int32[E, 1, 1]: dweight [E, H, N]."""
    dout, token, off = ctx.inputs
    _moe_rows(ctx, dout.shape[1], (0, 1))
    return [Out((off.shape[0], token.shape[2], dout.shape[2]), row_major(3))]


def domains_moe(ctx: Ctx) -> dict[int, tuple[int, int]]:
    """Expert e's rows start at first_token_offset[e], one of the T token rows or T itself (no rows)."""
    return {2: (0, ctx.inputs[0].shape[1])}


def flops_moe(ctx: Ctx, outs) -> int:
    """2 T H N: every token row times one expert's [H, N]."""
    a, b = ctx.inputs[0].shape, outs[0].shape
    return 2 * a[1] * a[2] * b[2] if ctx.op == "moe_grouped_matmul" else 2 * a[1] * a[2] * b[1]


_MOE_ROWS = (
    "expert e takes the token rows [first_token_offset[e], first_token_offset[e + 1]) (the last expert to T); "
    "the offsets ascend"
)
OPS_MOE = by_name(
    FAMILY.op(
        "moe_grouped_matmul",
        ("token", "weight", "first_token_offset"),
        infer_moe_grouped_matmul,
        flops=flops_moe,
        domains=domains_moe,
        doc=f"mixture-of-experts grouped GEMM: [1, T, H] token rows times their expert's [H, N] of weight "
        f"[E, H, N] -> [1, T, N]; {_MOE_ROWS}, and a row before the first is left unwritten",
    ),
    FAMILY.op(
        "moe_grouped_matmul_bwd",
        ("doutput", "token", "first_token_offset"),
        infer_moe_grouped_matmul_bwd,
        flops=flops_moe,
        domains=domains_moe,
        doc=f"moe_grouped_matmul's weight gradient: dweight[e] = token_e^T doutput_e [E, H, N] over expert e's rows "
        f"({_MOE_ROWS}; an expert with none gets zeros)",
    ),
)
OPS |= OPS_MOE
BACKWARD_OPS: dict[str, OpSig] = {"moe_grouped_matmul_bwd": OPS["moe_grouped_matmul_bwd"]}


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


def _moe_grouped_matmul(e, n):
    """d token = the same grouped GEMM of dy by each expert's weight transposed (a view); d weight =
    moe_grouped_matmul_bwd; the offsets are indices, with no gradient."""
    token, weight, offsets = n.inputs
    dy = e.cast(n.dy, n.ins[0].dtype)
    d_token = e.call("moe_grouped_matmul", dy, e.fwd_t(weight), e.fwd(offsets)) if n.need[0] else None
    d_weight = e.call("moe_grouped_matmul_bwd", dy, e.fwd(token), e.fwd(offsets)) if n.need[1] else None
    return d_token, d_weight, None


VJPS: dict[str, Rule] = {"matmul": _matmul, "moe_grouped_matmul": _moe_grouped_matmul}
RECOMPUTE: dict[str, Recompute] = {}
NO_VJP: dict[str, str] = {"moe_grouped_matmul_bwd": SECOND_ORDER}
