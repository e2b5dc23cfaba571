"""Block-scale quantization (MXFP8): the torch references and cuDNN lowerings of block_scale_quantize and
block_scale_dequantize."""

from __future__ import annotations

from cudnn_dsl.ops.base import OpImpl
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.lazy_torch import torch
from dsl.ops.quantize import BLOCK
from dsl.types import DTYPE_RANGE


def power_of_two_above(r: torch.Tensor) -> torch.Tensor:
    """The least power of two >= r, within fp8_e8m0's range (a zero block gets the least scale). frexp's
    exponent is exact (r = m 2^e, m in [0.5, 1)), where a log2 rounded up can step past a power of two."""
    mantissa, exponent = torch.frexp(r)
    up = torch.ldexp(torch.ones_like(r), exponent - (mantissa == 0.5).to(exponent.dtype))
    lo, hi = DTYPE_RANGE["fp8_e8m0"]
    return torch.where(r == 0, lo, up).clamp(lo, hi)


def ref_block_scale_quantize(ins, a, outs):
    """scale = amax(block) / vmax(y's dtype), rounded up to a power of two; y = x / scale, rounded to nearest even
    in y's dtype (cuDNN's BlockScaling equations)."""
    x = ins[0]
    b, m, n = x.shape
    blocks = x.reshape(b, m, n // BLOCK, BLOCK)
    scale = power_of_two_above(blocks.abs().amax(-1) / DTYPE_RANGE[outs[0].dtype][1])
    y = (blocks / scale[..., None]).to(torch_dtype(outs[0].dtype)).to(x.dtype)
    return [y.reshape(x.shape), scale]


def ref_block_scale_dequantize(ins, a, outs):
    x, scale = ins
    return [x * scale.repeat_interleave(BLOCK, dim=a["axis"])]


def tile_order_refusal(graph, inst) -> str:
    """Why a graph is not run on a GPU that runs block-scaled formats ('' : it is): scales it reads or writes are
    in cuDNN's F8_128x4 tile order in memory, which the run time does not yet lay them out in, so cuDNN would read
    them (or the caller would read them) in another order than the reference's. Planning is not affected."""
    ends = [v.name for v in graph.values if v.kind in ("input", "output")]
    scales = [name for name in ends if inst.type(name).dtype == "fp8_e8m0"]
    if not scales:
        return ""
    return (
        f"graph '{graph.name}' reads or writes block scales ({', '.join(scales)}) that cuDNN keeps in its F8_128x4 "
        "tile order, and cudnn-dsl does not yet lay scales out in that order: it plans such graphs (`--target "
        "b200`, `support`) but does not run them, since cuDNN would read or write the scales in another order than "
        "the reference's"
    )


def f8_128x4(ctx, t):
    """t, a tensor of scales, in cuDNN's F8_128x4 order: its quantize writes no other for a rank-3 tensor, and
    its dequantize reads what the quantize writes."""
    t.set_reordering_type(ctx.cudnn.tensor_reordering.F8_128x4)
    return t


def lower_block_scale_quantize(ctx, ins, a):
    out = ctx.g.block_scale_quantize(ins[0], block_size=BLOCK, axis=2, transpose=False, **ctx.kw)
    return [out[0], f8_128x4(ctx, out[1])]


def lower_block_scale_dequantize(ctx, ins, a):
    block = [1, BLOCK] if a["axis"] == -1 else [BLOCK, 1]
    return [ctx.g.block_scale_dequantize(ins[0], f8_128x4(ctx, ins[1]), block_size=block, **ctx.kw)]


IMPLS: dict[str, OpImpl] = {
    "block_scale_quantize": OpImpl(ref_block_scale_quantize, lower_block_scale_quantize),
    "block_scale_dequantize": OpImpl(ref_block_scale_dequantize, lower_block_scale_dequantize),
}
