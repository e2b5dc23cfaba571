"""The back half's pipeline: compile_shape stops after any stage, every command goes through it, and `check --emit`
dumps its stages (lowering against the goldens, plans against the pipeline's own)."""

from pathlib import Path

import pytest

from dsl.pipeline import program
from tests.cli_util import run_cli
from tests.graphs import ADD

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "lowering"
EXAMPLES = sorted((ROOT / "examples").glob("*.cdg"))


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target

    return Target.named("h200")


def _graph(text: str = ADD):
    return program(text=text, file="g.cdg").graphs[0]


def test_compile_shape_stops_after_each_stage_with_its_value(h200):
    from cudnn_dsl.build.lower import Lowered
    from cudnn_dsl.build.pipeline import STAGES, compile_shape
    from cudnn_dsl.build.steps import STEPS

    g = _graph()
    low = compile_shape(g, g.instances[0], g.options, h200, stop="lowered")
    assert isinstance(low, Lowered) and low.plan_count == 0 and low.timings == {}
    assert {t.name for t in low.g.get_inputs()} == {"a", "b"}
    for k, step in enumerate(STEPS):
        low = compile_shape(g, g.instances[0], g.options, h200, stop=step)
        assert list(low.timings) + list(low.skipped) == list(STEPS[: k + 1])
        assert (low.plan_count >= 1) == (k >= STEPS.index("create_execution_plans"))
    assert STAGES == ("lowered", *STEPS, "executable")
    planned = compile_shape(g, g.instances[0], g.options, h200)  # planned, by default
    assert set(planned.timings) | set(planned.skipped) == set(STEPS)
    with pytest.raises(ValueError, match="stop must be one of"):
        compile_shape(g, g.instances[0], g.options, h200, stop="planned")


@pytest.fixture
def stages(monkeypatch):
    """The stops the pipeline is asked for, as each call lowers and plans."""
    import cudnn_dsl.build.pipeline as pipeline

    seen = []
    lower, plan = pipeline.lower, pipeline.plan

    def lowering(*args, **kwargs):
        seen.append("lowered")
        return lower(*args, **kwargs)

    def planning(*args, **kwargs):
        seen.append(tuple(kwargs["steps"])[-1])
        return plan(*args, **kwargs)

    monkeypatch.setattr(pipeline, "lower", lowering)
    monkeypatch.setattr(pipeline, "plan", planning)
    return seen


@pytest.mark.parametrize(
    "command,stops",
    [
        (("check", "--target", "h200"), ["lowered", "build_plans"]),
        (("check", "--emit", "lowering"), ["lowered"]),
        (("check", "--emit", "plans", "--target", "h200"), ["lowered", "build_plans"]),
        (("support", "--target", "h200"), ["lowered", "build_plans"]),
        (("emit",), ["lowered", "build_plans", "lowered"]),  # asked whether cuDNN takes it whole, then recorded
        (("emit", "--format", "fe-json"), ["lowered", "create_execution_plans"]),
        (("run", "--no-reference"), ["lowered", "build_plans"]),  # no GPU here: planned for the target
        (("tune", "--exhaustive", "--target", "h200", "--max-configs", "1"), ["lowered", "check_support"]),
    ],
    ids=lambda c: " ".join(c) if isinstance(c, tuple) else None,
)
def test_each_command_lowers_and_plans_through_the_pipeline(command, stops, stages, tmp_path):
    f = tmp_path / "g.cdg"
    f.write_text(ADD)
    p = run_cli(command[0], f, *command[1:])
    assert p.returncode == 0, p.stderr
    assert stages == stops


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_check_emit_lowering_prints_each_shape_as_the_lowering_golden_has_the_first(path):
    """The golden holds each graph's first shape; a graph of several shapes prints the others after it."""
    p = run_cli("check", "--emit", "lowering", path.relative_to(ROOT))
    assert p.returncode == 0, p.stderr
    golden = (GOLDEN / f"{path.stem}.py.txt").read_text()
    graphs = program(path).graphs
    if all(len(g.instances) == 1 for g in graphs):
        assert p.stdout == golden
    else:
        [g] = graphs
        assert p.stdout.startswith(golden) and p.stdout.count('"""Graph ') == len(g.instances)


def test_check_emit_plans_lists_the_planned_stages_plans(tmp_path, h200):
    from cudnn_dsl.build.pipeline import compile_shape

    f = tmp_path / "g.cdg"
    f.write_text(ADD)
    p = run_cli("check", "--emit", "plans", "--target", "h200", f)
    assert p.returncode == 0, p.stderr
    g = _graph()
    low = compile_shape(g, g.instances[0], g.options, h200)
    names = [low.g.get_plan_name_at_index(i) for i in range(low.plan_count)]
    skipped = [f"# {step} skipped: {why}" for step, why in low.skipped.items()]
    assert p.stdout.splitlines() == [
        f"# g: {low.plan_count} plans for NVIDIA H200 (sm_90); * the chosen one",
        *[("* " if i == low.selected else "  ") + n for i, n in enumerate(names)],
        *skipped,
    ]
    p = run_cli("check", "--emit", "plans", "--target", "h200", "--plan", names[-1], f)  # the others left out
    assert p.returncode == 0, p.stderr
    head, *rows = [line for line in p.stdout.splitlines() if not line.startswith("# build_plans skipped")]
    assert head.endswith("; * the chosen one; - left out by the plan constraints or --plan")
    assert rows == [*[f"- {n}" for n in names[:-1]], f"* {names[-1]}"]


def test_check_emit_plans_needs_a_target(tmp_path):
    f = tmp_path / "g.cdg"
    f.write_text(ADD)
    p = run_cli("check", "--emit", "plans", f)
    assert p.returncode == 2 and "give --target" in p.stderr
