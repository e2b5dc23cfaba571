"""The shared test helpers on the CPU: `check` on the reference, and the outcome table of the GPU tests
(`as_recorded`), which fails when cuDNN's verdict on a form changes either way. The refusal here is real:
cuDNN 9.28, planning for an H200 without a GPU, refuses ALiBi without a causal mask at the sdpa."""

import pytest
import torch

from dsl.diagnostics import DslError
from tests.helpers import ACCEPTED, DECLINED, as_recorded, check, outcome, where_refused

ALIBI = (
    "graph p {{\n  io bf16\n  input q : bf16[2, 8, 256, 128]\n  input k : bf16[2, 2, 256, 128]\n"
    "  input v : bf16[2, 2, 256, 128]\n  o, st = sdpa(q, k, v, alibi=true{mask}, stats=true)\n"
    "  output o\n  output st\n}}\n"
)


def _plan(text: str):
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target
    from dsl.pipeline import program

    g = program(text=text, file="p.cdg").graphs[0]
    return compile_shape(g, g.instances[0], g.options, Target.named("h200"))


@pytest.fixture(scope="module")
def refusal() -> DslError:
    """cuDNN's own refusal of a form, located at the sdpa (line 6)."""
    with pytest.raises(DslError, match="cuDNN validate failed for sdpa") as e:
        _plan(ALIBI.format(mask=""))
    return e.value


def _refused(refusal: DslError):
    def attempt():
        raise refusal

    return attempt


def test_the_lines_a_refusal_may_be_located_at():
    text = ALIBI.format(mask="")
    assert where_refused(text) == {1, 6}  # the graph's and the op's
    assert where_refused(text, "sdpa") == {6}
    assert where_refused("graph t {\n  io half\n  input x : half[4]\n  output y = relu(x) * cos(x)\n}\n") == {1, 4}


def test_a_form_cudnn_plans_is_accepted_and_one_it_refuses_at_its_line_declined(refusal):
    assert _plan(ALIBI.format(mask=", causal=true")).plan_count >= 1
    assert outcome(lambda: _plan(ALIBI.format(mask=", causal=true")), {6}) == (ACCEPTED, "")
    seen, why = outcome(_refused(refusal), {6})
    assert seen == DECLINED and "alibi mask is used" in why


def test_a_refusal_elsewhere_or_an_error_not_cuDNNs_is_no_outcome(refusal):
    with pytest.raises(DslError, match="cuDNN validate failed"):
        outcome(_refused(refusal), {1})  # located at the sdpa, not at the graph
    bad = "graph t {\n  input x : half[4]\n  output y = relu(x, slope=2)\n}\n"
    with pytest.raises(DslError, match="slope") as e:
        outcome(lambda: _plan(bad), where_refused(bad))  # the checker's error at the op: not a refusal
    assert e.value.diagnostics[0].loc.line == 3

    def mismatch():
        raise AssertionError("y: MISMATCH in 3 of 16")

    with pytest.raises(AssertionError, match="MISMATCH"):
        outcome(mismatch, {6})


def test_the_recorded_outcome_holds_and_a_change_either_way_fails(refusal):
    def accepted():
        pass

    as_recorded({"alibi": DECLINED}, "alibi", _refused(refusal), {6})
    as_recorded({"alibi": ACCEPTED}, "alibi", accepted, {6})
    with pytest.raises(pytest.fail.Exception, match=r"alibi: cuDNN 9.19 on the H200 .* accepted it, .* declined it"):
        as_recorded({"alibi": ACCEPTED}, "alibi", _refused(refusal), {6})
    with pytest.raises(pytest.fail.Exception, match="record 'accepted' for it in RECORDED") as e:
        as_recorded({"alibi": DECLINED}, "alibi", accepted, {6})
    assert "declined it" in str(e.value) and "it ran and matched" in str(e.value)
    with pytest.raises(pytest.fail.Exception, match="alibi: no outcome recorded; .* declined it"):
        as_recorded({}, "alibi", _refused(refusal), {6})


def test_check_on_the_cpu_holds_the_reference_to_outputs_written_by_hand():
    text = "graph t {\n  input a : float[4, 8]\n  input b : float[1, 8]\n  output y = relu(a) * b + 1\n}\n"
    cg, ins = check(text, "cpu", seed=2, expect=lambda ins: {"y": torch.relu(ins["a"]) * ins["b"] + 1})
    assert cg.device is None and ins["a"].device.type == "cpu"
    torch.testing.assert_close(ins["a"], cg.allocate_inputs(seed=2)["a"])  # the seeded inputs
    with pytest.raises(AssertionError, match="y: "):
        check(text, "cpu", expect=lambda ins: {"y": torch.relu(ins["a"]) * ins["b"]})
    with pytest.raises(AssertionError, match="the reference is what runs"):
        check(text, "cpu")
    given = {"a": -torch.ones(4, 8)}
    check(text, "cpu", given=given, expect=lambda ins: {"y": torch.ones(4, 8)})
