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


@pytest.mark.parametrize("extra", ["causal=true", "left_bound=128, right_bound=0"])
def test_fp8_backward_as_written(extra):
    import cudnn_dsl

    _, ins, out = _forward(extra)
    cg = cudnn_dsl.compile(bwd_text(**SHAPES, extra=extra), device="cuda", split=False)
    given = {"q": ins["q"], "k": ins["k"], "v": ins["v"], "o": out["o"], "st": out["o_stats"]}
    given["do"] = torch.randn(out["o"].shape, device="cuda").to(torch.float8_e4m3fn)
    given.update({n: torch.full((1, 1, 1, 1), x, device="cuda") for n, x in VALUES.items()})
    given["dso"] = torch.full((1, 1, 1, 1), 1 / SCALES["so"], device="cuda")  # o holds O * scale_o
    matches(cg, {**cg.allocate_inputs(seed=1), **given}, atol=AMAX, rtol=AMAX)


def test_the_derived_backward_of_fp8_attention():
    import cudnn_dsl

    d, ins, out = _forward("causal=true")
    bwd = cudnn_dsl.compile(d.backward_text, device="cuda")
    env = {**ins, **out}
    grad = torch.randn(out["o"].shape, device="cuda").to(torch.float8_e4m3fn)
    given = {b: grad if kind == "grad" else env[of] for b, kind, of in d.bind}
    results = matches(bwd, given)
    assert {r.name for r in results} == {"grad_q", "grad_k", "grad_v"}
