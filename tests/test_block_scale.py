"""MXFP8 block-scale quantization (block_scale_quantize, block_scale_dequantize): the references against cuDNN's
BlockScaling equations written out block by block, their shape rules, and cuDNN's deviceless planning for a B200
(both fused into a matmul) and for the H200 (which has no engine for block-scaled formats)."""

import math
import re

import pytest
import torch

from dsl.diagnostics import DslError
from dsl.pipeline import program
from tests.helpers import reference

QUANTIZE = """graph q {{
  io bf16
  input x : {x}
  y, s = block_scale_quantize(x)
  output y{y}
  output s
}}
"""

DEQUANTIZE = """graph d {{
  io bf16
  input x : {x}
  input s : {s}
  y = block_scale_dequantize(x, s{axis})
  output y
}}
"""


def _power_of_two_at_least(r: float) -> float:
    """2^k for the least integer k with 2^k >= r (r > 0), found by stepping from log2's guess."""
    k = math.ceil(math.log2(r))
    while 2.0 ** (k - 1) >= r:
        k -= 1
    while 2.0**k < r:
        k += 1
    return 2.0**k


def by_hand(x: torch.Tensor, vmax: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cuDNN's equations, one block of 32 at a time in float64: scale = amax / vmax rounded up to a power of two
    (the least e8m0 one for a zero block), y = x / scale rounded to nearest even in `dtype`."""
    b, m, n = x.shape
    y = torch.zeros(b, m, n, dtype=torch.float64)
    scale = torch.zeros(b, m, n // 32, dtype=torch.float64)
    for i in range(b):
        for r in range(m):
            for k in range(n // 32):
                block = x[i, r, 32 * k : 32 * (k + 1)].double()
                amax = block.abs().max().item()
                s = _power_of_two_at_least(amax / vmax) if amax else 2.0**-127
                scale[i, r, k] = s
                y[i, r, 32 * k : 32 * (k + 1)] = (block / s).to(dtype).double()
    return y, scale


def blocks_of_many_sizes(shape, seed: int, vmax: float = 448.0) -> torch.Tensor:
    """Each block of 32 at its own magnitude (2^-20 to 2^20), one block all zeros and one whose amax is vmax times
    2^-3 (its scale that power exactly: a rounding up that steps past it shows)."""
    g = torch.Generator().manual_seed(seed)
    b, m, n = shape
    x = torch.randn(b, m, n // 32, 32, generator=g) * torch.exp2(
        torch.randint(-20, 20, (b, m, n // 32, 1), generator=g)
    )
    x[0, 0, 0] = 0.0
    x[0, 1, 1] = x[0, 1, 1] / x[0, 1, 1].abs().max() * vmax * 2.0**-3
    return x.reshape(shape)


@pytest.mark.parametrize(
    "y,vmax,dtype", [("", 448.0, torch.float8_e4m3fn), (" : fp8_e5m2", 57344.0, torch.float8_e5m2)]
)
def test_the_quantize_reference_is_cudnns_equations_by_hand(y, vmax, dtype):
    x = blocks_of_many_sizes((2, 128, 128), seed=0, vmax=vmax)
    _, out = reference(QUANTIZE.format(x="float[2, 128, 128]", y=y), seed=0, x=x)
    assert out["y"].dtype == dtype and out["s"].dtype == torch.float8_e8m0fnu
    want_y, want_s = by_hand(x, vmax, dtype)
    assert out["s"][0, 0, 0].item() == 2.0**-127 and out["s"][0, 1, 1].item() == 2.0**-3
    torch.testing.assert_close(out["s"].double(), want_s, atol=0, rtol=0)
    torch.testing.assert_close(out["y"].double(), want_y, atol=0, rtol=0)


def test_a_quantized_tensor_dequantizes_to_within_its_dtypes_rounding():
    """quantize then dequantize (in one .cdg graph): every element within half an e4m3 step (2^-4 relative) of
    its block's amax-scaled value."""
    text = """graph r {
  io bf16
  input x : float[1, 128, 256]
  y, s = block_scale_quantize(x)
  back = block_scale_dequantize(y, s)
  output back : float
}
"""
    x = blocks_of_many_sizes((1, 128, 256), seed=1)
    _, out = reference(text, seed=0, x=x)
    err = (out["back"] - x).abs()
    bound = x.abs().reshape(1, 128, 8, 32).amax(-1, keepdim=True).expand(1, 128, 8, 32).reshape(x.shape)
    assert (err <= x.abs() * 2.0**-4 + bound * 2.0**-9).all()  # below e4m3's normals, its subnormal step
    assert (err > 0).any()


@pytest.mark.parametrize("axis", [-1, -2])
def test_the_dequantize_reference_scales_each_block_of_32_along_its_axis(axis):
    x_shape, s_shape = ([1, 128, 128], [1, 128, 4]) if axis == -1 else ([1, 128, 128], [1, 4, 128])
    text = DEQUANTIZE.format(x=f"fp8_e4m3{x_shape}", s=f"fp8_e8m0{s_shape}", axis="" if axis == -1 else ", axis=-2")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(x_shape, generator=g).to(torch.float8_e4m3fn)
    s = torch.exp2(torch.randint(-8, 8, s_shape, generator=g).float()).to(torch.float8_e8m0fnu)
    _, out = reference(text, seed=0, x=x, s=s)
    want = torch.zeros(x_shape, dtype=torch.float64)
    for r in range(128):
        for c in range(128):
            block = (0, r, c // 32) if axis == -1 else (0, r // 32, c)
            want[0, r, c] = x[0, r, c].double() * s[block].double()
    torch.testing.assert_close(out["y"].double(), want.to(torch.bfloat16).double(), atol=0, rtol=0)


@pytest.mark.parametrize(
    "text,words,at",
    [
        (QUANTIZE.format(x="bf16[128, 128]", y=""), "x must be of rank 3, [B, R, C]", "4:31"),
        (QUANTIZE.format(x="int32[1, 128, 128]", y=""), "x must be half, bf16 or float, got int32", "4:31"),
        (QUANTIZE.format(x="bf16[1, 128, 100]", y=""), "has 100 columns, not blocks of 32", "4:31"),
        (QUANTIZE.format(x="bf16[1, 64, 128]", y=""), "x has 64 rows of 4 blocks; the scales' F8_128x4 layout", "4:31"),
        (QUANTIZE.format(x="bf16[1, 128, 64]", y=""), "rows of 2 blocks", "4:31"),
        (DEQUANTIZE.format(x="bf16[1, 128, 128]", s="fp8_e8m0[1, 128, 4]", axis=""), "x must be fp8_e4m3 or", "5:30"),
        (DEQUANTIZE.format(x="fp8_e4m3[1, 128, 128]", s="fp8_e8m0[1, 4, 128]", axis=""), "must be [1, 128, 4]", "5:33"),
        (DEQUANTIZE.format(x="fp8_e4m3[1, 128, 128]", s="half[1, 128, 4]", axis=""), "scale must be fp8_e8m0", "5:33"),
        (DEQUANTIZE.format(x="fp8_e4m3[1, 128, 128]", s="fp8_e8m0[1, 4, 128]", axis=", axis=-3"), "axis", "5:41"),
    ],
)
def test_a_form_the_format_cannot_hold_is_refused_at_the_op(text, words, at):
    with pytest.raises(DslError, match=re.escape(words)) as e:
        program(text=text, file="q.cdg")
    assert str(e.value).startswith(f"q.cdg:{at}:")


# ---- deviceless planning ------------------------------------------------------------------------------------

FUSED = """graph f {
  io bf16
  input x : bf16[1, 128, 256]
  input w : bf16[1, 256, 128]
  y, s = block_scale_quantize(matmul(x, w))
  output y
  output s
}
"""

MXFP8_MATMUL = """graph m {
  io bf16
  input a : fp8_e4m3[1, 128, 256]
  input sa : fp8_e8m0[1, 128, 8]
  input b : fp8_e4m3[1, 256, 128] strides [32768, 1, 256]
  input sb : fp8_e8m0[1, 8, 128] strides [1024, 1, 8]
  c = matmul(block_scale_dequantize(a, sa), block_scale_dequantize(b, sb, axis=-2))
  output c
}
"""


def _compile(text: str, target: str, **options):
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target, load_cudnn

    load_cudnn()
    g = program(text=text, file="f.cdg").graphs[0]
    return compile_shape(g, g.instances[0], g.options, Target.named(target), **options)


@pytest.mark.parametrize("text", [FUSED, MXFP8_MATMUL], ids=["quantize after matmul", "matmul of dequantized"])
def test_b200_plans_block_scaled_matmuls_whole(text):
    assert _compile(text, "b200").plan_count >= 1


@pytest.mark.parametrize("text", [FUSED, MXFP8_MATMUL], ids=["quantize after matmul", "matmul of dequantized"])
def test_the_h200_refusal_says_block_scaled_formats_need_sm_100(text):
    with pytest.raises(DslError) as e:
        _compile(text, "h200")
    notes = " ".join(text for text, _ in e.value.diagnostics[0].notes)
    assert "no cuDNN engine for NVIDIA H200 supports this graph" in notes
    assert "block-scaled (MXFP8) formats need sm_100+ (Blackwell; `--target b200`)" in notes


def test_check_for_the_h200_runs_the_block_scale_ops_as_torch_fallbacks_and_says_where_they_fuse(tmp_path):
    from tests.cli_util import run_cli

    path = tmp_path / "f.cdg"
    path.write_text(FUSED)
    p = run_cli("check", "--target", "h200", str(path))
    assert p.returncode == 0, p.stderr
    assert "part 2: block_scale_quantize (line 5) — torch fallback" in p.stdout
    assert "to fuse it, quantize the result of a matmul in its graph, on sm_100+" in p.stdout


def test_a_graph_that_reads_or_writes_scales_is_refused_a_run_one_without_is_not():
    from cudnn_dsl.ops.quantize import tile_order_refusal

    for text, scales in ((MXFP8_MATMUL, "sa, sb"), (FUSED, "s")):
        g = program(text=text).graphs[0]
        why = tile_order_refusal(g, g.instances[0])
        assert f"reads or writes block scales ({scales})" in why and "F8_128x4 tile order" in why
    plain = program(
        text=FUSED.replace("y, s = block_scale_quantize(matmul(x, w))", "y = matmul(x, w)").replace("  output s\n", "")
    ).graphs[0]
    assert tile_order_refusal(plain, plain.instances[0]) == ""
