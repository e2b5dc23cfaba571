"""The mixture-of-experts grouped GEMM (moe_grouped_matmul) and its weight gradient (moe_grouped_matmul_bwd): the
references against each token row multiplied by its expert's weight, the derived backward against torch autograd,
the shape rules, and cuDNN's deviceless planning for a B200 and the H200."""

import re

import pytest
import torch

from cudnn_dsl.ops import IMPLS
from cudnn_dsl.run.reference import run_reference
from dsl.autodiff import derive
from dsl.diagnostics import DslError
from dsl.pipeline import program
from tests.helpers import ON_H200, reference

FORWARD = """graph moe {{
  io {dt}
  input token : {dt}[1, {t}, {h}]
  input weight : {dt}[{e}, {h}, {n}]
  input first_token_offset : int32[{e}, 1, 1]
  y = moe_grouped_matmul(token, weight, first_token_offset)
  output y
}}
"""

BACKWARD = """graph dw {{
  io {dt}
  input dy : {dt}[1, {t}, {n}]
  input token : {dt}[1, {t}, {h}]
  input first_token_offset : int32[{e}, 1, 1]
  dweight = moe_grouped_matmul_bwd(dy, token, first_token_offset)
  output dweight
}}
"""

SMALL = {"dt": "float", "t": 24, "h": 8, "n": 12, "e": 4}
OFFSETS = torch.tensor([0, 5, 5, 17], dtype=torch.int32).reshape(4, 1, 1)
"""four experts over 24 rows: 5, none, 12 and 7 rows"""


def expert_of_each_row(offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """Row t's expert: the last whose offset is at most t (ascending offsets; an expert with no rows shares its
    offset with the next, which then owns them)."""
    return torch.searchsorted(offsets.reshape(-1).long(), torch.arange(rows), right=True) - 1


def moe_by_rows(token, weight, offsets):
    """Each token row times its expert's [H, N], in float64, as one gather and one batched product (autograd
    differentiates it)."""
    experts = expert_of_each_row(offsets, token.shape[1])
    return torch.einsum("th,thn->tn", token[0], weight[experts]).unsqueeze(0)


def _inputs(seed: int, dt=torch.float32, **dims):
    d = {**SMALL, **dims}
    g = torch.Generator().manual_seed(seed)
    token = torch.randn(1, d["t"], d["h"], generator=g).to(dt)
    weight = torch.randn(d["e"], d["h"], d["n"], generator=g).to(dt)
    return token, weight


def test_the_reference_multiplies_each_token_row_by_its_experts_weight():
    token, weight = _inputs(0)
    _, out = reference(FORWARD.format(**SMALL), seed=0, token=token, weight=weight, first_token_offset=OFFSETS)
    want = moe_by_rows(token.double(), weight.double(), OFFSETS)
    torch.testing.assert_close(out["y"].double(), want, atol=1e-5, rtol=1e-5)


def test_the_rows_before_the_first_experts_are_left_undefined():
    token, weight = _inputs(1)
    offsets = torch.tensor([3, 10, 10, 20], dtype=torch.int32).reshape(4, 1, 1)
    g = program(text=FORWARD.format(**SMALL), file="m.cdg").graphs[0]
    (out_type,) = [g.instances[0].type("y")]
    (mask,) = IMPLS["moe_grouped_matmul"].undefined([token, weight, offsets], {}, [out_type])
    assert mask[0, :3].all() and not mask[0, 3:].any()
    out = run_reference(g, g.instances[0], {"token": token, "weight": weight, "first_token_offset": offsets}, "cpu")
    want = moe_by_rows(token.double(), weight.double(), offsets)
    torch.testing.assert_close(out["y"][0, 3:].double(), want[0, 3:], atol=1e-5, rtol=1e-5)


def test_the_weight_gradient_sums_each_experts_rows():
    token, _ = _inputs(2)
    dy = torch.randn(1, 24, 12, generator=torch.Generator().manual_seed(3))
    _, out = reference(BACKWARD.format(**SMALL), seed=0, dy=dy, token=token, first_token_offset=OFFSETS)
    experts = expert_of_each_row(OFFSETS, 24)
    want = torch.zeros(4, 8, 12, dtype=torch.float64)
    for t in range(24):
        want[experts[t]] += torch.outer(token[0, t].double(), dy[0, t].double())
    assert not want[1].any()  # the expert with no rows
    torch.testing.assert_close(out["dweight"].double(), want, atol=1e-5, rtol=1e-5)


def test_the_derived_backward_is_autograd_through_the_rows():
    g = program(text=FORWARD.format(**SMALL), file="m.cdg").graphs[0]
    d = derive(g, avoid=ON_H200)
    assert "moe_grouped_matmul(grad_y, weight_t, first_token_offset)" in d.backward_text
    assert "moe_grouped_matmul_bwd(grad_y, token, first_token_offset)" in d.backward_text
    token, weight = _inputs(4)
    ins = {"token": token, "weight": weight, "first_token_offset": OFFSETS}
    fwd = run_reference(d.forward, d.forward.instances[0], ins, "cpu")
    grad = torch.randn(fwd["y"].shape, generator=torch.Generator().manual_seed(5))
    env = {**ins, **fwd}
    bound = {"grad": lambda of: grad, "transposed": lambda of: env[of].transpose(-1, -2), "value": env.get}
    given = {b: bound[kind](of) for b, kind, of in d.bind}
    out = run_reference(d.backward, d.backward.instances[0], given, "cpu")
    t, w = token.double().requires_grad_(), weight.double().requires_grad_()
    torch.autograd.backward(moe_by_rows(t, w, OFFSETS), grad.double())
    grads = dict(d.grads)
    torch.testing.assert_close(out[grads["token"]].double(), t.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[grads["weight"]].double(), w.grad, atol=1e-5, rtol=1e-5)
    assert "first_token_offset" not in grads


@pytest.mark.parametrize(
    "old,new,words",
    [
        ("weight : float[4, 8, 12]", "weight : float[3, 8, 12]", "weight [3, 8, 12] must be [E, H, N] = [4, 8, N]"),
        ("weight : float[4, 8, 12]", "weight : half[4, 8, 12]", "dtype conflict: token is float, weight is half"),
        ("token : float[1, 24, 8]", "token : float[2, 24, 8]", "token [2, 24, 8] must be [1, T, *]"),
        ("int32[4, 1, 1]", "int64[4, 1, 1]", "first_token_offset must be int32[E, 1, 1], got int64[4, 1, 1]"),
    ],
)
def test_a_bad_grouped_gemm_is_refused_at_the_op(old, new, words):
    text = FORWARD.format(**SMALL).replace(old, new)
    with pytest.raises(DslError, match=re.escape(words)) as e:
        program(text=text, file="m.cdg")
    assert str(e.value).startswith("m.cdg:6:")


def test_the_offsets_domain_is_the_token_rows():
    from dsl.ops import OPS, Ctx

    g = program(text=FORWARD.format(**SMALL), file="m.cdg").graphs[0]
    inst = g.instances[0]
    ctx = Ctx("moe_grouped_matmul", tuple(inst.type(i) for i in g.nodes[0].inputs), inst.attrs(0))
    assert OPS["moe_grouped_matmul"].domains(ctx) == {2: (0, 24)}


# ---- deviceless planning ------------------------------------------------------------------------------------

PLANNED = {"dt": "bf16", "t": 256, "h": 128, "n": 256, "e": 4}


def _plans(text: str, target: str) -> int:
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target, load_cudnn

    load_cudnn()
    g = program(text=text, file="m.cdg").graphs[0]
    return compile_shape(g, g.instances[0], g.options, Target.named(target)).plan_count


@pytest.mark.parametrize("target", ["b200", "h200"])
def test_the_grouped_gemm_plans_without_a_device(target):
    assert _plans(FORWARD.format(**PLANNED), target) >= 1


@pytest.mark.parametrize("target", ["b200", "h200"])
def test_the_weight_gradient_is_declined_without_a_device(target):
    """Its engine creates a cuBLASLt handle while planning, which needs a GPU; a GPU test runs it."""
    with pytest.raises(DslError, match="create_execution_plans failed") as e:
        _plans(BACKWARD.format(**PLANNED), target)
    assert "cublas" in str(e.value).lower()
