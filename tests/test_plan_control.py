"""Plan control without a GPU: the plan constraints (options, flags, API), the plan-store key that reflects them,
and pinned plans, all answered by the real cuDNN library planning for an H200."""

from pathlib import Path

import pytest
import torch

from dsl.options import Options
from dsl.pipeline import program

ROOT = Path(__file__).resolve().parents[1]
MATMUL = ROOT / "examples" / "plan_serialization.cdg"


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target

    return Target.named("h200")


@pytest.fixture(scope="module")
def mm():
    g = program(MATMUL).graphs[0]
    return g, g.instances[0]


def _engines(low) -> set[int]:
    from cudnn_dsl.build.constraints import engine_of

    return {engine_of(low, i) for i in (low.allowed if low.allowed is not None else range(low.plan_count))}


# ---- the options, from every source ----------------------------------------------------------


def test_constraints_are_options_of_the_file_the_flags_and_the_api():
    from cudnn_dsl.cli import common

    text = (
        "graph g {\n  option exclude_engines = [4, 7]\n  option deterministic = true\n"
        "  option no_runtime_compilation = true\n  input a : half[4, 8]\n  output y = a * a\n}\n"
    )
    from_file = program(text=text, file="c.cdg").graphs[0].options
    assert (from_file.exclude_engines, from_file.deterministic, from_file.no_runtime_compilation) == (
        (4, 7),
        True,
        True,
    )
    assert from_file.constraints == "exclude engines 4, 7; deterministic; no runtime compilation"
    api = Options().with_values({"exclude_engines": [7, 4], "deterministic": True, "no_runtime_compilation": True})
    assert api.constraints == from_file.constraints  # same words, whatever the order of the engines

    class Args:
        exclude_engine = ["7", "4"]
        deterministic = no_runtime_compilation = True

    assert common.options_from(Args(), Options()).constraints == from_file.constraints
    Args.exclude_engine = ["x"]
    with pytest.raises(common.UsageError, match="--exclude-engine: must be a list of integers"):
        common.options_from(Args(), Options())
    assert Options().constraints == ""


def test_a_bad_constraint_in_the_file_is_located():
    from dsl.pipeline import load

    r = load(None, text="graph g {\n  option deterministic = 3\n  input a : half[4]\n  output y = a * a\n}\n")
    assert not r.ok and "option 'deterministic' must be true or false" in r.render()


def test_the_plan_store_key_reflects_the_constraints():
    from cudnn_dsl.store.keys import PlanKey
    from cudnn_dsl.store.plans import Entry

    plain = PlanKey("0" * 64, "NVIDIA H200", "9.0", 92800, "1.32.0")
    det = PlanKey("0" * 64, "NVIDIA H200", "9.0", 92800, "1.32.0", "deterministic")
    assert plain.id != det.id
    assert "constraints" not in plain.to_json()  # an unconstrained key keeps the id it had before constraints
    entry = Entry(det, "g", "eng0", 0, {}, b"x", 0, False)
    assert Entry.from_json(entry.to_json()).key == det


# ---- constraints applied by cuDNN -----------------------------------------------------------


def test_excluded_engines_leave_the_others(mm, h200):
    from cudnn_dsl.build.constraints import engine_of
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.build.steps import first_plan_name

    g, inst = mm
    free = compile_shape(g, inst, g.options, h200)
    first = engine_of(free, 0)
    low = compile_shape(g, inst, g.options.with_values({"exclude_engines": [first]}), h200)
    assert first not in _engines(low) and _engines(low)
    assert not first_plan_name(low).startswith(f"eng{first}_") and first_plan_name(low) != f"eng{first}"


def test_constraints_that_leave_no_plan_are_a_located_error(mm, h200):
    from cudnn_dsl.build.pipeline import compile_shape
    from dsl.diagnostics import DslError

    g, inst = mm
    free = compile_shape(g, inst, g.options, h200)
    every = sorted(_engines(free))
    with pytest.raises(DslError) as e:
        compile_shape(g, inst, g.options.with_values({"exclude_engines": every}), h200)
    d = e.value.diagnostics[0]
    assert d.loc == g.loc and "leave none of the" in d.message and "exclude engines" in d.message
    assert any(free.g.get_plan_name_at_index(0) in note for note, _ in d.notes)
    engines = ", ".join(map(str, every))
    assert any(f"plans, of engine{'s' if len(every) > 1 else ''} {engines}:" in note for note, _ in d.notes)
    idle = max(every) + 1000  # an engine no plan is of: said, as its exclusion changes nothing
    with pytest.raises(DslError) as e:
        compile_shape(g, inst, g.options.with_values({"exclude_engines": [*every, idle]}), h200)
    notes = [note for note, _ in e.value.diagnostics[0].notes]
    assert f"engine {idle} offers no plan for this graph: excluding it changes nothing" in notes


def test_no_runtime_compilation_filters_by_cudnns_behaviour_notes(mm, h200):
    """Every plan cuDNN offers this matmul on an H200 compiles at run time (its notes say so): none is left."""
    from cudnn_dsl.build.pipeline import compile_shape
    from dsl.diagnostics import DslError

    g, inst = mm
    free = compile_shape(g, inst, g.options, h200)
    notes = [
        {str(n) for n in free.g.get_behavior_notes_for_plan_at_index(i)}
        for i in range(free.plan_count)
        if free.g.get_plan_name_at_index(i) != "backend_heuristics"
    ]
    opts = g.options.with_values({"no_runtime_compilation": True})
    if all("behavior_note.RUNTIME_COMPILATION" in n for n in notes):
        with pytest.raises(DslError, match="no runtime compilation"):
            compile_shape(g, inst, opts, h200)
    else:
        low = compile_shape(g, inst, opts, h200)
        assert "RUNTIME_COMPILATION" not in str(low.g.get_behavior_notes_for_plan_at_index(low.selected))


def test_deterministic_keeps_plans_cudnn_does_not_mark_nondeterministic(mm, h200):
    from cudnn_dsl.build.pipeline import compile_shape

    g, inst = mm
    low = compile_shape(g, inst, g.options.with_values({"deterministic": True}), h200)
    assert low.plan_count >= 1 and low.allowed  # a matmul's plans are deterministic


# ---- pinned plans -----------------------------------------------------------------------------


def test_plan_names_parse_as_cudnn_prints_them():
    from cudnn_dsl.build.constraints import PlanSpec

    s = PlanSpec.parse("eng4_k17=2_k24=43")
    assert (s.engine, s.knobs, s.named) == (4, {"SPLIT_K_SLC": 2, "KERNEL_CFG": 43}, True)
    s = PlanSpec.parse("4:kernel_cfg=43,SPLIT_K_SLC=2")
    assert (s.engine, s.knobs, s.named) == (4, {"KERNEL_CFG": 43, "SPLIT_K_SLC": 2}, False)
    assert PlanSpec.parse("7").knobs == {}
    for name in ("eng4_k99=1", "sdpa_fwd_prefill_sm100[TILE_M=128, TILE_N=128]"):  # matched by name alone
        assert PlanSpec.parse(name).engine is None
    for bad, why in ((" ", "give a plan name"), ("4:NOPE=1", "knob type of"), ("4:TILEK=x", "INTEGER")):
        with pytest.raises(ValueError, match=why):
            PlanSpec.parse(bad)


def test_knobs_parse_by_their_number_in_the_library():
    """kN names a knob by the number plan names spell it by: one the frontend names becomes that name, one it
    has none for (NOT_SET to the frontend) is kept by its number."""
    from cudnn_dsl.build.constraints import PlanSpec, numbered_knobs

    s = PlanSpec.parse("4:k24=43,SPLIT_K_SLC=2")
    assert (s.engine, s.knobs, s.unnamed, s.named) == (4, {"KERNEL_CFG": 43, "SPLIT_K_SLC": 2}, {}, False)
    s = PlanSpec.parse("9:K0=3,k24=-1")
    assert (s.engine, s.knobs, s.unnamed) == (9, {"KERNEL_CFG": -1}, {0: 3})
    assert s.numbers == {24: -1, 0: 3}
    assert numbered_knobs("eng9_k24=-1_k0=3") == (9, s.numbers)
    assert numbered_knobs("sdpa_fwd_prefill_sm100[TILE_M=128]") is None
    with pytest.raises(ValueError, match="kN with its number"):
        PlanSpec.parse("4:k=1")


def test_a_plan_is_pinned_by_its_knob_numbers_among_the_listed_ones(mm, h200):
    """ENGINE:kN=V,... finds the listed plan whose name has those numbers; a knob the
    frontend has no name for cannot make a plan cuDNN does not list, which is said."""
    from cudnn_dsl.build.constraints import PlanSpec, numbered_knobs
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.build.steps import first_plan_name
    from dsl.diagnostics import DslError

    g, inst = mm
    free = compile_shape(g, inst, g.options, h200)
    names = [free.g.get_plan_name_at_index(i) for i in range(free.plan_count)]
    name = next(n for n in reversed(names) if numbered_knobs(n)[1])
    engine, numbers = numbered_knobs(name)
    pin = PlanSpec.parse(f"{engine}:" + ",".join(f"k{n}={v}" for n, v in reversed(numbers.items())))
    assert first_plan_name(compile_shape(g, inst, g.options, h200, pin=pin)) == name
    with pytest.raises(DslError) as e:
        compile_shape(g, inst, g.options, h200, pin=PlanSpec.parse(f"{engine}:k0=1"))
    assert "the frontend cannot make it: it has no name for knob k0" in e.value.diagnostics[0].message


def test_knob_numbers_are_the_ones_cudnn_names_plans_by(mm, h200):
    """The table from knob names to the numbers in plan names, checked against cuDNN's own names."""
    import cudnn

    from cudnn_dsl.build.constraints import KNOB_NUMBERS, PlanSpec
    from cudnn_dsl.build.pipeline import compile_shape

    assert set(KNOB_NUMBERS) <= set(cudnn.knob_type.__members__)
    g, inst = mm
    low = compile_shape(g, inst, g.options, h200)
    seen = 0
    for i in range(low.plan_count):
        name = low.g.get_plan_name_at_index(i)
        engine, knobs = low.g.get_engine_and_knobs_at_index(i)
        spec = PlanSpec.parse(name)
        assert (spec.engine, spec.knobs) == (engine, {k.name: v for k, v in knobs.items()})
        seen += bool(knobs)
    assert seen


def test_a_pinned_plan_is_built_whether_the_heuristics_offer_it_or_not(mm, h200):
    from cudnn_dsl.build.constraints import PlanSpec
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.build.steps import first_plan_name

    g, inst = mm
    free = compile_shape(g, inst, g.options, h200)
    last = free.g.get_plan_name_at_index(free.plan_count - 1)
    low = compile_shape(g, inst, g.options, h200, pin=PlanSpec.parse(last))
    assert first_plan_name(low) == last and low.allowed == [low.selected]
    engine, knobs = free.g.get_engine_and_knobs_at_index(0)
    split = {**{k.name: v for k, v in knobs.items()}, "SPLIT_K_SLC": 2}  # a knob the heuristics leave alone
    by_knobs = compile_shape(g, inst, g.options, h200, pin=PlanSpec(f"{engine}:...", engine, split, False))
    name = first_plan_name(by_knobs)
    assert name.startswith(f"eng{engine}_") and "k17=2" in name
    again = compile_shape(g, inst, g.options, h200, pin=PlanSpec.parse(name))  # the printed name pins it too
    assert first_plan_name(again) == name


def test_a_plan_cudnn_does_not_offer_is_refused_with_the_names_it_does(mm, h200):
    from cudnn_dsl.build.constraints import PlanSpec
    from cudnn_dsl.build.pipeline import compile_shape
    from dsl.diagnostics import DslError

    g, inst = mm
    free = compile_shape(g, inst, g.options, h200)
    with pytest.raises(DslError) as e:
        compile_shape(g, inst, g.options, h200, pin=PlanSpec.parse("eng4_k24=100000"))
    d = e.value.diagnostics[0]
    assert d.loc == g.loc and "does not offer plan eng4_k24=100000" in d.message
    assert free.g.get_plan_name_at_index(0) in d.notes[0][0]
    engine = free.g.get_engine_and_knobs_at_index(0)[0]
    with pytest.raises(DslError, match="which the plan constraints exclude"):
        opts = g.options.with_values({"exclude_engines": [engine]})
        compile_shape(g, inst, opts, h200, pin=PlanSpec.parse(free.g.get_plan_name_at_index(0)))


def test_check_target_takes_the_constraint_and_plan_flags():
    from cli_util import run_cli

    p = run_cli("check", "--target", "h200", "--plan", "eng4_k24=1", MATMUL)
    assert p.returncode == 0, p.stderr
    assert "first eng4_k24=1" in p.stdout
    p = run_cli("check", "--target", "h200", "--exclude-engine", "4,7", MATMUL)
    assert p.returncode == 1 and "the plan constraints (exclude engines 4, 7) leave none" in p.stderr
    p = run_cli("check", "--deterministic", MATMUL)
    assert p.returncode == 2 and "give --target too" in p.stderr


# ---- run --isolate: the single-op graphs ---------------------------------------------------------


@pytest.mark.parametrize("name", ["matmul_epilogue", "conv_bias_relu", "layernorm"])
def test_each_op_alone_is_a_graph_cudnn_plans_or_declines_at_that_op(name, h200):
    from cudnn_dsl.build.pipeline import compile_shape
    from dsl.diagnostics import DslError
    from dsl.subgraph import one_op_graphs

    g = program(ROOT / "examples" / f"{name}.cdg").graphs[0]
    inst = g.instances[0]
    alone = one_op_graphs(g, inst)
    assert [node for node, _ in alone] == list(g.nodes)
    for node, one in alone:
        t = one.instances[0]
        assert one.nodes == (node,) and [v.name for v in one.outputs] == list(node.outputs)
        for v in one.values:  # the types the whole graph gives them
            assert t.type(v.name) == inst.type(v.name)
        try:
            low = compile_shape(one, t, one.options, h200)
            assert low.plan_count >= 1
        except DslError as e:  # cuDNN has no engine for this op alone: said at the op
            assert e.diagnostics[0].loc == node.loc


def test_an_op_alone_on_the_reference_inputs_gives_the_references_output():
    """On the CPU: each single-op graph's reference, fed the whole reference's values, is the whole reference's."""
    import torch

    from cudnn_dsl.run.inputs import generate_inputs
    from cudnn_dsl.run.reference import run_reference
    from dsl.subgraph import one_op_graphs

    g = program(ROOT / "examples" / "layernorm.cdg").graphs[0]
    inst = g.instances[0]
    inputs = generate_inputs(g, inst, "cpu")
    every = run_reference(g, inst, inputs, "cpu", every=True)
    for node, one in one_op_graphs(g, inst):
        feed = {v.name: every[v.name] for v in one.of_kind("input")}
        got = run_reference(one, one.instances[0], feed, "cpu")
        for out in node.outputs:
            torch.testing.assert_close(got[out].float(), every[out].float(), atol=1e-2, rtol=1e-2)


def test_the_ejected_cudnn_script_applies_the_constraints_as_run_does():
    from cudnn_dsl.interop.emit import emit_cudnn

    g = program(MATMUL).graphs[0]
    plain = emit_cudnn(g, g.instances[0])
    assert "deselect" not in plain and "g.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)" in plain
    opts = g.options.with_values({"exclude_engines": [7, 4], "deterministic": True, "no_runtime_compilation": True})
    text = emit_cudnn(g, g.instances[0], opts)
    compile(text, "ejected.py", "exec")  # our own generated script is valid Python
    assert "g.deselect_numeric_notes([cudnn.numerical_note.NONDETERMINISTIC])" in text
    assert "g.deselect_behavior_notes([cudnn.behavior_note.RUNTIME_COMPILATION])" in text
    assert "if g.get_engine_and_knobs_at_index(i)[0] not in (4, 7):" in text and "g.build_plans(" not in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without a GPU (tests/gpu has the rest)")
def test_run_without_a_gpu_plans_the_pinned_plan_and_says_it_skips_isolate():
    from cli_util import run_cli

    p = run_cli("run", "--plan", "eng4_k24=1", "--isolate", "--no-reference", MATMUL)
    assert p.returncode == 0, p.stderr
    assert "plan       for NVIDIA H200 (no device): eng4_k24=1" in p.stdout
    assert "skipped    cuDNN execution and comparison and --isolate: no CUDA GPU here" in p.stdout
    p = run_cli("run", "--plan", "eng4_k99=1", MATMUL)
    assert (
        p.returncode == 1 and "does not offer plan eng4_k99=1" in p.stderr and "the heuristics offer: eng" in p.stderr
    )
    p = run_cli("run", "--plan", "4:NOPE=1", MATMUL)
    assert p.returncode == 2 and "--plan: 'NOPE=1' is not KNOB=VALUE" in p.stderr
