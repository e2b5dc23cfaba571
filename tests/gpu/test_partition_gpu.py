"""Graphs cuDNN declines whole run as parts on the GPU: each part a cuDNN graph built here (or an
op left to torch), intermediates materialized, the outputs matching the reference."""

import pytest

from tests.graphs import GENSTATS, LN_GELU, MM_RESHAPE, READ_AFTER_OVERWRITE, VIEWED_IN_PLACE
from tests.helpers import check

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_store")]


# a training norm's mean read by a later part: its statistics materialized alike
NORM_STATS = (
    "graph lt {\n  io bf16\n  compute float\n  input x : bf16[256, 1024, 1, 1]\n"
    "  input gamma : float[1, 1024, 1, 1]\n  input beta : float[1, 1024, 1, 1]\n"
    "  y, mean, inv_variance = layernorm(x, gamma, beta, epsilon=1e-5, phase=training)\n"
    "  output z = gelu(y)\n  output m2 = mean * 2.0\n}\n"
)


def run_in_parts(text: str):
    """The graph, split where cuDNN declines it whole, against the reference; and the parts it ran as (None:
    cuDNN took it whole)."""
    from cudnn_dsl.run.parts import Parts

    cg, _ = check(text, "cuda", split=True)
    parts = cg.parts(cg.graph.instances[0])
    return cg, parts if isinstance(parts, Parts) else None


@pytest.mark.parametrize(
    "text",
    [LN_GELU, MM_RESHAPE, GENSTATS, VIEWED_IN_PLACE, READ_AFTER_OVERWRITE, NORM_STATS],
    ids=["ln_gelu", "mm_reshape", "genstats", "viewed_in_place", "read_after_overwrite", "norm_stats"],
)
def test_a_graph_cudnn_declines_whole_runs_in_parts_and_matches(text):
    cg, parts = run_in_parts(text)
    if parts is None:  # this cuDNN fuses it after all: nothing to split, and it matched above
        pytest.skip(f"cuDNN {cg.graph.name}: fused whole here")
    assert len(parts.partition.parts) >= 2 or parts.partition.fallbacks
    assert all(line.startswith(f"part {k}:") for k, line in enumerate(parts.lines, 1))


def test_layernorm_then_gelu_is_two_cudnn_graphs():
    _, parts = run_in_parts(LN_GELU)
    assert parts is not None and [p.graph is not None for p in parts.partition.parts] == [True, True]


def _bound_matches(cg, bound, before):
    import torch

    from cudnn_dsl.run.compare import compare_outputs

    torch.cuda.synchronize()
    inst = cg.graph.instances[0]
    comps = compare_outputs(
        cg.graph, inst, {k: v.clone() for k, v in bound.outputs.items()}, cg.reference(before), cg.options
    )
    assert all(c.ok for c in comps), [str(c) for c in comps]


SPLIT = [LN_GELU, MM_RESHAPE, GENSTATS, VIEWED_IN_PLACE, READ_AFTER_OVERWRITE, NORM_STATS]
SPLIT_IDS = ["ln_gelu", "mm_reshape", "genstats", "viewed_in_place", "read_after_overwrite", "norm_stats"]


@pytest.mark.parametrize("text", SPLIT, ids=SPLIT_IDS)
def test_a_split_graph_bound_once_runs_every_part_and_matches_on_every_run(text):
    import cudnn_dsl
    from cudnn_dsl.run.buffers import snapshot
    from cudnn_dsl.run.parts import BoundParts, Parts

    cg = cudnn_dsl.compile(text=text, split=True)
    ins = cg.allocate_inputs()
    bound = cg.bind(ins)
    parts = cg.parts(cg.graph.instances[0])
    if not isinstance(parts, Parts):
        pytest.skip(f"cuDNN {cg.graph.name}: fused whole here")
    assert isinstance(bound, BoundParts) and len(bound.launches) == len(parts.compiled)
    for _ in range(2):  # a second run reads what the first left in inputs that outputs overwrite
        before = snapshot(cg.graph, ins)
        bound.run()
        _bound_matches(cg, bound, before)


@pytest.mark.parametrize("text", SPLIT, ids=SPLIT_IDS)
def test_a_split_graph_through_the_torch_op_rebinds_every_call_to_its_own_tensors(text):
    """The op's launch plan: every part bound on the first call, each later call (new inputs each time) pointed
    at its own arguments and fresh outputs; an input an output overwrites still read, by a later part, as it
    was before the call."""
    import torch

    import cudnn_dsl
    from cudnn_dsl.run.buffers import snapshot
    from cudnn_dsl.run.compare import compare_outputs
    from cudnn_dsl.run.parts import Parts

    cg = cudnn_dsl.compile(text=text, split=True)
    if not isinstance(cg.parts(cg.graph.instances[0]), Parts):
        pytest.skip(f"cuDNN {cg.graph.name}: fused whole here")
    op = cudnn_dsl.as_torch_op(cg)
    names = [v.name for v in cg.graph.outputs]
    held = []  # every call's outputs stay alive: a fresh one cannot take an earlier one's memory
    for seed in range(3):
        ins = cg.allocate_inputs(seed=seed)
        before = snapshot(cg.graph, ins)
        got = op(*(ins[n] for n in op.tensor_names))
        got = dict(zip(names, (got,) if isinstance(got, torch.Tensor) else got))
        torch.cuda.synchronize()
        comps = compare_outputs(cg.graph, cg.graph.instances[0], got, cg.reference(before), cg.options)
        assert all(c.ok for c in comps), [str(c) for c in comps]
        fresh = [got[v.name] for v in cg.graph.outputs if v.into is None]
        assert not {t.data_ptr() for t in fresh} & {t.data_ptr() for t in held}
        held += fresh


@pytest.mark.parametrize(
    "text", [LN_GELU, MM_RESHAPE, READ_AFTER_OVERWRITE], ids=["ln_gelu", "mm_reshape", "read_after_overwrite"]
)
def test_a_split_graph_is_captured_into_one_cuda_graph_and_replays_right(text):
    import cudnn_dsl
    from cudnn_dsl.run.buffers import restore, snapshot

    cg = cudnn_dsl.compile(text=text, split=True)
    ins = cg.allocate_inputs()
    before = snapshot(cg.graph, ins)
    replay = cg.capture(ins)
    restore(ins, before)  # the capture's warm-up run wrote the outputs in place
    replay.replay()
    _bound_matches(cg, replay.bound, before)


def test_forced_cut_points_split_a_graph_cudnn_fuses_and_it_still_matches():
    import cudnn_dsl

    cg = cudnn_dsl.compile("examples/residual_block.cdg", split=True)
    inst = cg.graph.instances[0]
    parts = cg.use_partition(inst, (1,), chosen="forced")
    assert parts.partition.cuts == (1,) and parts.partition.reason == "forced"
    ins = cg.allocate_inputs()
    assert all(r.ok for r in cg.check(ins)), "plain call"
    bound = cg.bind(ins)
    bound.run()
    _bound_matches(cg, bound, ins)


def test_tune_times_the_whole_graph_against_the_anchor_alone_and_run_reuses_the_choice(private_store):
    import cudnn_dsl
    from cudnn_dsl.run.parts import Parts
    from cudnn_dsl.store.plans import PlanStore
    from cudnn_dsl.tune.heuristics import partition_report, tune, tune_partitions

    cg = cudnn_dsl.compile("examples/matmul_epilogue.cdg", split=True, iterations=5, warmup=1)
    inst = cg.graph.instances[0]
    whole = tune(cg, inst)
    r = tune_partitions(cg, inst, whole)
    text = partition_report(r)
    assert r.alternatives[0].label == "whole" and r.alternatives[0].times_us, text
    anchor = r.alternatives[1]
    assert anchor.cuts[:1] == (1,) and (anchor.times_us or anchor.error), text
    assert r.kept is not None and r.why.startswith(f"tuned: {r.kept.label}") and "kept" in text
    choice = PlanStore().get_partition(cg.planner.key(inst))
    assert choice is not None and choice.cuts == r.kept.cuts and "whole" in choice.times_us
    again = cudnn_dsl.compile("examples/matmul_epilogue.cdg", split=True)  # a new process would read the same
    parts = again.parts(again.graph.instances[0])
    assert again.why[inst.binding] == r.why
    assert (parts.partition.cuts if isinstance(parts, Parts) else ()) == r.kept.cuts
    assert all(c.ok for c in again.check(again.allocate_inputs()))


def test_partitions_that_all_run_wrong_leave_the_shape_running_as_before(private_store):
    """No tolerance: every partition tune tries mismatches the reference. The last one tried (the anchor alone)
    stayed the shape's parts, so later calls ran a partition known to be wrong."""
    import cudnn_dsl
    from cudnn_dsl.run.parts import Whole
    from cudnn_dsl.store.plans import PlanStore
    from cudnn_dsl.tune.heuristics import partition_report, tune_partitions

    cg = cudnn_dsl.compile("examples/residual_block.cdg", split=True, iterations=2, warmup=1, atol=0.0, rtol=0.0)
    inst = cg.graph.instances[0]
    r = tune_partitions(cg, inst, None)  # the whole graph's plans as if none ran right
    assert r.kept is None and not any(a.times_us for a in r.alternatives), partition_report(r)
    assert any("do not match" in a.error for a in r.alternatives if a.cuts), partition_report(r)
    assert isinstance(cg.parts(inst), Whole)  # whole again, as cuDNN takes it
    assert PlanStore().get_partition(cg.planner.key(inst)) is None


def test_a_split_that_cannot_be_found_is_labelled_as_the_fewest_parts(private_store):
    """genstats alone runs on no engine and fallback is off: tune's fewest-parts alternative fails, and says it
    is that one (it was labelled 'anchor op alone', a partition tune never tried here)."""
    import cudnn_dsl
    from cudnn_dsl.tune.heuristics import partition_report, tune_partitions

    cg = cudnn_dsl.compile(text=GENSTATS, split=True, fallback=False, iterations=2, warmup=1)
    inst = cg.graph.instances[0]
    try:
        cg.executable(inst)
        pytest.skip("this cuDNN runs genstats alone")
    except cudnn_dsl.DslError as e:
        declined = str(e.diagnostics[0].message)
    r = tune_partitions(cg, inst, None, declined)
    assert [a.label for a in r.alternatives] == ["whole", "fewest parts"], partition_report(r)
    assert "even alone" in r.alternatives[1].error and r.kept is None


def test_a_stored_whole_choice_that_no_longer_builds_is_not_given_as_the_reason(private_store):
    """A partition record saying 'whole' for a graph cuDNN declines whole (another library, say): it runs in
    parts, and its reason is cuDNN's refusal, not 'tuned: whole'."""
    import cudnn_dsl
    from cudnn_dsl.run.parts import Parts
    from cudnn_dsl.store.plans import PartitionChoice

    cg = cudnn_dsl.compile(text=LN_GELU, split=True)
    inst = cg.graph.instances[0]
    cg.planner.store.put_partition(cg.planner.key(inst), cg.graph.name, PartitionChoice((), {"whole": 1.0}))
    parts = cg.parts(inst)
    assert isinstance(parts, Parts) and parts.partition.reason.startswith("cuDNN declines it whole")
    assert inst.binding not in cg.why, cg.why
    assert all(r.ok for r in cg.check(cg.allocate_inputs()))


def test_tune_and_run_commands_report_the_partitions(private_store):
    from tests.cli_util import run_cli

    p = run_cli("tune", "examples/residual_block.cdg", "--iterations", "3", "--warmup", "1")
    assert p.returncode == 0, p.stderr
    assert "partitions" in p.stdout and "split after conv_fprop (line 12)" in p.stdout and "kept" in p.stdout
    assert "tuned: " in p.stdout
    p = run_cli("run", "examples/residual_block.cdg", "--iterations", "3")
    assert p.returncode == 0, p.stderr
    assert "tuned: " in p.stdout  # 'partition  tuned: whole, ...' or 'split      tuned: split after ...'


def test_with_splitting_off_cudnns_refusal_is_the_error():
    import cudnn_dsl

    cg = cudnn_dsl.compile(text=LN_GELU, split=False)
    with pytest.raises(cudnn_dsl.DslError, match="failed"):
        cg(cg.allocate_inputs())


def test_bench_runs_a_split_graph_bound_and_names_each_parts_plan():
    from cudnn_dsl.tune.bench import bench_graph
    from dsl.pipeline import program

    g = program(text=LN_GELU, file="ln.cdg").graphs[0]
    r = bench_graph(g, g.instances[0], against=("torch",), rounds=2, iters=3)
    ours = r["rows"][0]
    assert ours["name"] == "cudnn-dsl" and ours["check"] == "ok" and ours["gpu_us_median"] > 0
    assert " + " in r["plan"] and r["plan_source"].startswith("cuDNN declines it whole")
