"""Block-scale quantization (MXFP8): signatures and shape rules of block_scale_quantize and block_scale_dequantize.

MXFP8 holds fp8 values (e4m3 or e5m2) with one fp8_e8m0 scale (a power of two) per block of 32 consecutive
elements of one axis. cuDNN keeps the scales in its F8_128x4 order, tiles of 128 rows by 4 blocks over the last
two axes; a scale tensor whose dims are whole tiles needs no padding, so its buffer is exactly its elements
(block_scales checks it, for this family and for sdpa_mxfp8).
"""

from __future__ import annotations

from dsl.diagnostics import RuleError
from dsl.ops.base import Ctx, Family, OpSig, Out, Recompute, Rule, by_name
from dsl.types import fmt_shape, stride_order
from dsl.values import Attr

FAMILY = Family(
    "quantize",
    ("block scale", "block_scale", "quantize", "dequantize"),
    "block-scaled (MXFP8) formats need sm_100+ (Blackwell; `--target b200`): cuDNN runs them only there, "
    "dequantized as both operands of a matmul and quantized after one",
)

BLOCK = 32
"""MXFP8's block: the elements that share one scale"""
TILE = (128, 4)
"""F8_128x4: the rows by blocks of one tile of the scales' layout"""
VALUES = ("fp8_e4m3", "fp8_e5m2")
"""the dtypes of MXFP8's values"""
SCALE = "fp8_e8m0"
"""the dtype of MXFP8's scales"""


def _rank3(ctx: Ctx, i: int, what: str) -> None:
    t = ctx.inputs[i]
    if len(t.shape) != 3:
        raise RuleError(
            f"{ctx.op}: {what} must be of rank 3, [B, R, C] (cuDNN's block-scaled layout), got {fmt_shape(t.shape)}", i
        )


def scale_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """The scales of a tensor of `shape` in blocks of BLOCK along `axis` (-1 or -2)."""
    out = list(shape)
    out[axis] //= BLOCK
    return tuple(out)


def _whole_tiles(ctx: Ctx, i: int, name: str, rows: int, blocks: int) -> None:
    if rows % TILE[0] or blocks % TILE[1]:
        raise RuleError(
            f"{ctx.op}: {name} has {rows} rows of {blocks} blocks; the scales' F8_128x4 layout needs rows in "
            f"multiples of {TILE[0]} and blocks in multiples of {TILE[1]} ({TILE[1] * BLOCK} elements)",
            i,
        )


def block_scales(ctx: Ctx, i: int, name: str, values: tuple[int, ...], axis: int) -> None:
    """Input i, `name`, holds the scales of values of shape `values` in blocks along `axis` (-1 or -2): fp8_e8m0,
    one per block, the axis the blocks do not run along (rows) and the blocks per row in whole F8_128x4 tiles."""
    t, want = ctx.inputs[i], scale_shape(values, axis)
    if t.shape != want:
        raise RuleError(
            f"{ctx.op}: {name} {fmt_shape(t.shape)} must be {fmt_shape(want)} (one scale per block of {BLOCK} "
            f"along axis {axis} of {fmt_shape(values)})",
            i,
        )
    if t.dtype != SCALE:
        raise RuleError(f"{ctx.op}: {name} must be {SCALE}, got {t.dtype}", i)
    _whole_tiles(ctx, i, name, want[-1 if axis == -2 else -2], want[axis])


def infer_block_scale_quantize(ctx: Ctx) -> list[Out]:
    """x [B, M, N] (half, bf16 or float), N in blocks of 32 along the last axis; y like x, in fp8_e4m3 unless
    declared fp8_e5m2; scale [B, M, N / 32] fp8_e8m0."""
    _rank3(ctx, 0, "x")
    x = ctx.inputs[0]
    if x.dtype not in ("half", "bf16", "float"):
        raise RuleError(f"{ctx.op}: x must be half, bf16 or float, got {x.dtype}", 0)
    if x.shape[-1] % BLOCK:
        raise RuleError(f"{ctx.op}: x {fmt_shape(x.shape)} has {x.shape[-1]} columns, not blocks of {BLOCK}", 0)
    _whole_tiles(ctx, 0, "x", x.shape[1], x.shape[2] // BLOCK)
    order = stride_order(x.strides)
    return [Out(x.shape, order), Out(scale_shape(x.shape, -1), order, SCALE)]


def infer_block_scale_dequantize(ctx: Ctx) -> list[Out]:
    """x [B, R, C] fp8 in blocks of 32 along `axis`; scale its blocks' scales, fp8_e8m0: [B, R, C / 32] (axis -1)
    or [B, R / 32, C] (axis -2). The result is x * its block's scale, like x in the graph's dtype."""
    _rank3(ctx, 0, "x")
    x, axis = ctx.inputs[0], ctx.attrs["axis"]
    if x.dtype not in VALUES:
        raise RuleError(f"{ctx.op}: x must be {' or '.join(VALUES)}, got {x.dtype}", 0)
    if x.shape[axis] % BLOCK:
        raise RuleError(
            f"{ctx.op}: x {fmt_shape(x.shape)} has {x.shape[axis]} along axis {axis}, not blocks of {BLOCK}", 0
        )
    block_scales(ctx, 1, "scale", x.shape, axis)
    return [Out(x.shape, stride_order(x.strides))]


OPS = by_name(
    FAMILY.op(
        "block_scale_quantize",
        ("x",),
        infer_block_scale_quantize,
        outputs=("y", "scale"),
        results=lambda a: 2,
        result_dtype="fp8_e4m3",
        doc="MXFP8 quantization of x [B, M, N] in blocks of 32 along its last axis: each block's scale is its "
        "amax / the largest value of y's dtype, rounded up to a power of two (fp8_e8m0, [B, M, N/32]); y = x / "
        "scale, rounded to nearest even in fp8_e4m3 (or a declared fp8_e5m2). M a multiple of 128, N of 128",
        alone="quantize the result of a matmul in its graph, on sm_100+",
    ),
    FAMILY.op(
        "block_scale_dequantize",
        ("x", "scale"),
        infer_block_scale_dequantize,
        attrs=(
            Attr(
                "axis",
                "int",
                -1,
                lo=-2,
                hi=-1,
                doc="the axis the blocks of 32 run along: -1 (an A operand [B, M, K]) or -2 (a B operand [B, K, N])",
            ),
        ),
        positive=(1,),
        doc="x (fp8) times the fp8_e8m0 scale of its block of 32 along `axis`; cuDNN computes it only into a "
        "matmul whose operands are both dequantized",
        alone="dequantize both operands of a matmul in its graph, on sm_100+",
    ),
)
BACKWARD_OPS: dict[str, OpSig] = {}

VJPS: dict[str, Rule] = {}
RECOMPUTE: dict[str, Recompute] = {}
NO_VJP = {
    "block_scale_quantize": "rounding to a block-scaled format has no derivative; a training recipe quantizes "
    "the gradient in a graph of its own",
    "block_scale_dequantize": "its inputs are quantized data and their scales, which training does not "
    "differentiate (the gradient flows to the value that was quantized)",
}
