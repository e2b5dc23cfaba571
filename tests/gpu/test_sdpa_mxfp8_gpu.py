"""MXFP8 attention on the GPU: below sm_100 cuDNN refuses it at the op; on sm_100+ it is refused at its first run
while the run time lays no scales out in F8_128x4 order."""

import pytest
import torch

from tests.test_sdpa_mxfp8 import PLANNED, text

pytestmark = pytest.mark.gpu

BLACKWELL = (10, 0)
"""the first compute capability with an engine for MXFP8 attention"""


def test_below_sm_100_it_is_refused_at_the_op():
    import cudnn_dsl
    from dsl.diagnostics import DslError

    if torch.cuda.get_device_capability() >= BLACKWELL:
        pytest.skip("sm_100+ has an engine for MXFP8 attention")
    cg = cudnn_dsl.compile(text(**PLANNED), device="cuda", split=False)
    with pytest.raises(DslError, match="only supported on Blackwell") as e:  # planned at the first call
        cg(**cg.allocate_inputs(seed=0))
    assert e.value.diagnostics[0].loc.line == 9


def test_mxfp8_attention_is_not_run():
    import cudnn_dsl
    from cudnn_dsl.target.library import BackendUnavailable

    if torch.cuda.get_device_capability() < BLACKWELL:
        pytest.skip("not executable on the H200: sm_90 has no engine for MXFP8 attention")
    cg = cudnn_dsl.compile(text(**PLANNED), device="cuda", split=False)
    with pytest.raises(BackendUnavailable, match="F8_128x4 tile order"):  # never a run against scales in another order
        cg(**cg.allocate_inputs(seed=0))
