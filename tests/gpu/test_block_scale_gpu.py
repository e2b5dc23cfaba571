"""MXFP8 block-scale quantization on the GPU: below sm_100 cuDNN has no engine for it, and the refusal says so at
compile time; on sm_100+ a block-scaled matmul is refused at its first run while the run time lays no scales out in
F8_128x4 order."""

import pytest
import torch

from tests.test_block_scale import FUSED, MXFP8_MATMUL

pytestmark = pytest.mark.gpu

BLACKWELL = (10, 0)
"""the first compute capability with engines for block-scaled formats"""


def _below_blackwell() -> bool:
    return torch.cuda.get_device_capability() < BLACKWELL


@pytest.mark.parametrize("text", [FUSED, MXFP8_MATMUL], ids=["quantize after matmul", "matmul of dequantized"])
def test_below_sm_100_the_refusal_says_block_scaled_formats_need_it(text):
    import cudnn_dsl
    from dsl.diagnostics import DslError

    if not _below_blackwell():
        pytest.skip("sm_100+ has engines for block-scaled formats")
    cg = cudnn_dsl.compile(text, device="cuda", split=False)
    with pytest.raises(DslError) as e:  # planned at the first call
        cg(**cg.allocate_inputs(seed=0))
    notes = " ".join(text for text, _ in e.value.diagnostics[0].notes)
    assert "block-scaled (MXFP8) formats need sm_100+" in notes


def test_mxfp8_matmul_with_scales_at_its_ends_is_not_run():
    import cudnn_dsl
    from cudnn_dsl.target.library import BackendUnavailable

    if _below_blackwell():
        pytest.skip("not executable on the H200: sm_90 has no engine for block-scaled formats")
    cg = cudnn_dsl.compile(MXFP8_MATMUL, device="cuda", split=False)
    with pytest.raises(BackendUnavailable, match="F8_128x4 tile order"):  # never a run against scales in another order
        cg(**cg.allocate_inputs(seed=0))
