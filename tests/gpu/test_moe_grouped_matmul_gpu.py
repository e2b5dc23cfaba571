"""The mixture-of-experts grouped GEMM on the GPU against its reference: the forward, its weight gradient (which
cuDNN plans only with a GPU), and the derived backward, each with ascending offsets bound."""

import pytest
import torch

from dsl.autodiff import derive
from dsl.pipeline import program
from tests.helpers import ON_H200, check, matches
from tests.test_moe_grouped_matmul import BACKWARD, FORWARD, PLANNED

pytestmark = pytest.mark.gpu

OFFSETS = torch.tensor([0, 40, 40, 150], dtype=torch.int32).reshape(4, 1, 1)
"""four experts over 256 rows: 40, none, 110 and 106 rows"""


def _older_than_9_22():
    from cudnn_dsl.target.library import load_cudnn

    if load_cudnn().backend_version() < 92200:
        pytest.skip(
            "seen on the H200 with cuDNN 9.19: no engine runs the grouped GEMM whole (its one engine, FORT_NATIVE_10X, "
            "is Blackwell-only), and the frontend asks cuDNN 9.22 for moe_grouped_matmul_bwd"
        )


@pytest.mark.parametrize("dt", ["bf16", "half"])
def test_the_grouped_gemm(dt):
    _older_than_9_22()
    check(FORWARD.format(**{**PLANNED, "dt": dt}), "cuda", given={"first_token_offset": OFFSETS.cuda()}, split=False)


def test_the_weight_gradient():
    _older_than_9_22()
    check(BACKWARD.format(**PLANNED), "cuda", given={"first_token_offset": OFFSETS.cuda()}, split=False)


def test_the_derived_backward():
    """The tokens' gradient (the grouped GEMM by each expert's weight transposed) and the weight's, as cuDNN runs
    the derived backward graph, against its reference on the same bound values."""
    import cudnn_dsl

    d = derive(program(text=FORWARD.format(**PLANNED), file="m.cdg").graphs[0], avoid=ON_H200)
    bwd = cudnn_dsl.compile(d.backward_text, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    env = {
        "token": torch.randn(1, 256, 128, device="cuda", generator=g).to(torch.bfloat16),
        "weight": torch.randn(4, 128, 256, device="cuda", generator=g).to(torch.bfloat16),
        "first_token_offset": OFFSETS.cuda(),
    }
    grad = torch.randn(1, 256, 256, device="cuda", generator=g).to(torch.bfloat16)
    bound = {"grad": lambda of: grad, "transposed": lambda of: env[of].transpose(-1, -2), "value": env.get}
    results = matches(bwd, {b: bound[kind](of) for b, kind, of in d.bind})
    assert {r.name for r in results} == {"grad_token", "grad_weight"}
