"""Matmuls: the torch references and cuDNN lowerings of the batched matrix product and of the mixture-of-experts
grouped GEMM (moe_grouped_matmul) and its weight gradient (moe_grouped_matmul_bwd)."""

from __future__ import annotations

from cudnn_dsl.ops.base import OpImpl
from cudnn_dsl.target.lazy_torch import torch


def ref_matmul(ins, a, outs):
    return [torch.matmul(ins[0], ins[1])]


def lower_matmul(ctx, ins, a):
    return [ctx.g.matmul(ins[0], ins[1], **ctx.kw)]


def expert_rows(offsets: torch.Tensor, rows: int) -> list[tuple[int, int, int]]:
    """(expert, first row, end) of each expert's token rows: from its offset to the next expert's (the last's to
    `rows`); an expert whose next offset is below its own has none."""
    starts = [int(o) for o in offsets.reshape(-1)]
    ends = starts[1:] + [rows]
    return [(e, lo, max(lo, hi)) for e, (lo, hi) in enumerate(zip(starts, ends))]


def ref_moe_grouped_matmul(ins, a, outs):
    token, weight, offsets = ins
    out = torch.zeros(outs[0].shape, dtype=token.dtype, device=token.device)
    for e, lo, hi in expert_rows(offsets, token.shape[1]):
        out[0, lo:hi] = token[0, lo:hi] @ weight[e]
    return [out]


def undefined_moe_grouped_matmul(ins, a, outs):
    """The rows before the first expert's: no expert writes them."""
    first = int(ins[2].reshape(-1)[0])
    mask = torch.zeros(outs[0].shape, dtype=torch.bool, device=ins[0].device)
    mask[0, :first] = True
    return [mask]


def lower_moe_grouped_matmul(ctx, ins, a):
    none = ctx.cudnn.moe_grouped_matmul_mode.NONE  # no gather of token rows, no combine by top-k scores
    return [ctx.g.moe_grouped_matmul(ins[0], ins[1], ins[2], mode=none, **ctx.kw)]


def ref_moe_grouped_matmul_bwd(ins, a, outs):
    dout, token, offsets = ins
    dweight = torch.zeros(outs[0].shape, dtype=token.dtype, device=token.device)
    for e, lo, hi in expert_rows(offsets, token.shape[1]):
        dweight[e] = token[0, lo:hi].transpose(0, 1) @ dout[0, lo:hi]
    return [dweight]


def lower_moe_grouped_matmul_bwd(ctx, ins, a):
    return [ctx.g.moe_grouped_matmul_bwd(ins[0], ins[1], ins[2], **ctx.kw)]


IMPLS = {
    "matmul": OpImpl(ref_matmul, lower_matmul),
    "moe_grouped_matmul": OpImpl(ref_moe_grouped_matmul, lower_moe_grouped_matmul, undefined_moe_grouped_matmul),
    "moe_grouped_matmul_bwd": OpImpl(ref_moe_grouped_matmul_bwd, lower_moe_grouped_matmul_bwd),
}
