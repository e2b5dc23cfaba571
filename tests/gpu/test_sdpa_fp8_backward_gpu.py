"""FP8 attention's backward on the GPU against its reference: sdpa_fp8_backward as written, and the derived backward
of sdpa_fp8 (its torch reciprocal, then the one cuDNN graph), each fed the forward's own o and stats as cuDNN wrote
them."""

import pytest
import torch

from dsl.autodiff import derive
from dsl.pipeline import program
from tests.helpers import ON_H200, matches
from tests.test_sdpa_fp8_backward import FORWARD, SCALES, VALUES, bwd_text

pytestmark = pytest.mark.gpu

SHAPES = {"q": "[2, 4, 256, 128]", "kv": "[2, 2, 256, 128]"}
AMAX = dict.fromkeys(("aq", "ak", "av", "ap"), 5e-2)
"""the amaxes' tolerance, absolute and relative: each is the float max |x| of sums of fp8 products, which cuDNN adds
in its tiles' order"""


def _forward(extra: str):
    """The derived forward and backward of one sdpa_fp8, and the forward run by cuDNN on seeded inputs with SCALES
    (checked against its reference): (derived, inputs, outputs)."""
    import cudnn_dsl

    g = program(text=FORWARD.format(**SHAPES, extra=extra, o=""), file="t.cdg").graphs[0]
    d = derive(g, avoid=ON_H200)
    fwd = cudnn_dsl.compile(d.forward_text, device="cuda")
    ins = fwd.allocate_inputs(seed=0)
    ins.update({n: torch.full((1, 1, 1, 1), x, device="cuda") for n, x in SCALES.items()})
    matches(fwd, ins)
    return d, ins, fwd(**ins)


FLIPS = 1e-4
"""of the elements of a gradient that may differ by a rounding flip of the fp8 P or dS they depend on"""


@pytest.mark.parametrize("extra", ["causal=true", "left_bound=128, right_bound=0"])
def test_fp8_backward_as_written(extra):
    import cudnn_dsl

    _, ins, out = _forward(extra)
    cg = cudnn_dsl.compile(bwd_text(**SHAPES, extra=extra), device="cuda", split=False)
    given = {"q": ins["q"], "k": ins["k"], "v": ins["v"], "o": out["o"], "st": out["o_stats"]}
    given["do"] = torch.randn(out["o"].shape, device="cuda").to(torch.float8_e4m3fn)
    given.update({n: torch.full((1, 1, 1, 1), x, device="cuda") for n, x in VALUES.items()})
    given["dso"] = torch.full((1, 1, 1, 1), 1 / SCALES["so"], device="cuda")  # o holds O * scale_o
    results = cg.check({**cg.allocate_inputs(seed=1), **given}, AMAX, AMAX)
    # P and dS are quantized to fp8: an element at a rounding boundary that cuDNN rounds the other way moves its
    # row's gradients by a whole fp8 step (seen on the H200: 1 element of dv in 131072 with the band)
    assert all(r.ok or r.mismatches <= r.numel * FLIPS for r in results), "\n".join(map(str, results))
    assert sum(not r.ok for r in results) <= 1, "\n".join(map(str, results))


@pytest.mark.xfail(
    reason="seen on the H200 (cuDNN 9.19), which plans the derived backward whole: sdpa_fp8_backward reads descale_o "
    "through a pointer, and the backward graph computes it (the reciprocal of scale_o) as a virtual tensor, so the "
    "launch is refused (CUDNN_STATUS_BAD_PARAM_NULL_POINTER); writing it to scratch memory instead made the launch "
    "fault (an illegal address). cuDNN 9.28 plans the reciprocal apart (a torch fallback), which gives it memory"
)
def test_the_derived_backward_of_fp8_attention():
    import cudnn_dsl

    d, ins, out = _forward("causal=true")
    bwd = cudnn_dsl.compile(d.backward_text, device="cuda")
    env = {**ins, **out}
    grad = torch.randn(out["o"].shape, device="cuda").to(torch.float8_e4m3fn)
    given = {b: grad if kind == "grad" else env[of] for b, kind, of in d.bind}
    results = matches(bwd, given)
    assert {r.name for r in results} == {"grad_q", "grad_k", "grad_v"}
