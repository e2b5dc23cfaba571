"""Partitioning, deviceless: when the real cuDNN library declines a graph for a target, the fewest
graphs it accepts, the ops left to torch, and `cudnn-dsl support` saying so per target."""

import json
import re

import pytest

from cudnn_dsl.run.partition import plan_for_target
from cudnn_dsl.target.library import Target
from dsl.diagnostics import DslError
from dsl.pipeline import program
from dsl.subgraph import subgraph
from tests.cli_util import run_cli
from tests.graphs import GENSTATS, LN_GELU, VIEWED_IN_PLACE


@pytest.fixture(scope="module")
def h200():
    return Target.named("h200")


def test_a_part_reads_what_earlier_parts_made_as_inputs_numbered_in_the_order_its_nodes_name_them():
    g = program("examples/residual_block.cdg").graphs[0]
    inst = g.instances[0]
    conv = subgraph(g, inst, 0, 1, "conv")
    rest = subgraph(g, inst, 1, len(g.nodes), "rest")
    assert [v.name for v in conv.outputs] == ["y"]  # a virtual tensor a later part reads: materialized
    assert conv.instances[0].type("y").dtype == "float"  # in its inferred (intermediate) dtype
    assert rest.value("y").kind == "input" and g.value("y").uid == 5  # the whole graph's uid is not the part's
    assert [(v.name, v.uid) for v in rest.of_kind("input")] == [("y", 1), ("bn_scale", 2), ("bn_shift", 4), ("x", 6)]
    assert [v.uid for v in rest.values] == list(range(1, 9))
    assert [v.name for v in rest.outputs] == ["out"] and rest.instances[0].attrs(0) == inst.attrs(1)


def test_a_norm_with_an_epilogue_splits_into_two_cudnn_graphs(h200):
    g = program(text=LN_GELU, file="ln.cdg").graphs[0]
    low, partition = plan_for_target(g, g.instances[0], g.options, h200)
    assert low is None and "no engine" in partition.declined
    assert [(p.first, p.end, p.graph is not None) for p in partition.parts] == [(0, 1, True), (1, 2, True)]
    assert partition.lines(g)[0] == "part 1: layernorm (line 6) — cuDNN graph; materializes layernorm_0"


def test_an_op_no_engine_takes_alone_falls_back_to_torch_unless_told_not_to(h200):
    g = program(text=GENSTATS, file="gs.cdg").graphs[0]  # genstats is a conv's epilogue: alone, no engine
    _, partition = plan_for_target(g, g.instances[0], g.options, h200)
    assert [p.graph for p in partition.parts] == [None] and partition.how == "runs as 1 part"
    assert "torch fallback" in partition.lines(g)[0]
    strict = g.options.with_values({"fallback": False})
    with pytest.raises(DslError, match="no cuDNN engine runs genstats here, even alone") as e:
        plan_for_target(g, g.instances[0], strict, h200)
    assert (e.value.diagnostics[0].loc.line, e.value.diagnostics[0].loc.col) == (4, 11)  # at the call


CONV_BN_RELU = """graph conv_bn_relu {
  io half
  input x : half[8, 64, 16, 16] nhwc
  input w : half[64, 64, 3, 3] nhwc
  input mean : float[1, 64, 1, 1] nhwc
  input inv_var : float[1, 64, 1, 1] nhwc
  input gamma : float[1, 64, 1, 1] nhwc
  input beta : float[1, 64, 1, 1] nhwc
  y = conv_fprop(x, w, padding=[1, 1])
  output out = relu(batchnorm_inference(y, mean, inv_var, gamma, beta))
}
"""


def test_a_batchnorm_split_off_its_convolution_is_told_how_to_fuse(h200):
    g = program(text=CONV_BN_RELU, file="bn.cdg").graphs[0]
    _, partition = plan_for_target(g, g.instances[0], g.options, h200)
    lines = partition.lines(g)
    assert len(lines) == 3 and lines[1].startswith("part 2: batchnorm_inference (line 10) — ")
    assert "; to fuse it, fold it into a per-channel scale s = inv_variance * scale and shift t = " in lines[1]
    assert "to fuse" not in lines[0] + lines[2]
    folded = CONV_BN_RELU.replace("input mean", "input s").replace("input inv_var", "input t")
    folded = folded.replace("batchnorm_inference(y, mean, inv_var, gamma, beta)", "bias(scale(y, s), t)")
    folded = "\n".join(line for line in folded.splitlines() if "gamma" not in line and "beta" not in line)
    g = program(text=folded, file="folded.cdg").graphs[0]
    low, partition = plan_for_target(g, g.instances[0], g.options, h200)
    assert partition is None and low.plan_count >= 1  # the advice's spelling fuses, whole


def test_a_reason_in_the_split_report_is_whole_and_cudnns_words_are_clipped_between_words():
    from cudnn_dsl.build.lower import clean
    from cudnn_dsl.run.partition import short

    reason = "cuDNN builds this graph but runs it wrong (" + "quirk " * 40 + "); `option split = true` runs it right"
    assert short(reason + " (the backend declined: eng0 ...)") == reason
    words = " ".join(f"engine{i} declined" for i in range(100))
    clipped = clean(RuntimeError(words), 240)
    assert len(clipped) <= 242 and clipped.endswith(" …")
    kept = clipped[: -len(" …")]
    assert words.startswith(kept + " ")  # the cut falls between two words


def test_with_splitting_off_the_refusal_is_the_error(h200):
    g = program(text=LN_GELU.replace("io bf16", "io bf16\n  option split = false"), file="ln.cdg").graphs[0]
    with pytest.raises(DslError, match="create_execution_plans failed"):
        plan_for_target(g, g.instances[0], g.options, h200)


def test_support_says_per_target_what_fuses_and_where_it_splits(tmp_path):
    f = tmp_path / "ln.cdg"
    f.write_text(LN_GELU)
    report = tmp_path / "support.json"
    p = run_cli("support", f, "examples/residual_block.cdg", "--target", "h200,a100", "--json", report)
    assert p.returncode == 0, p.stderr
    assert "NVIDIA H200 (sm_90): splits into 2 parts" in p.stdout
    assert "NVIDIA A100-SXM4-80GB (sm_80, unverified descriptor)" in p.stdout
    assert re.search(r"NVIDIA H200 \(sm_90\): fuses — one cuDNN [0-9.]+ graph", p.stdout), p.stdout
    records = json.loads(report.read_text())["support"]
    assert [(r["graph"], r["target"], r["fuses"]) for r in records] == [
        ("ln_gelu", "NVIDIA H200", False),
        ("ln_gelu", "NVIDIA A100-SXM4-80GB", False),
        ("residual_block", "NVIDIA H200", True),
        ("residual_block", "NVIDIA A100-SXM4-80GB", True),
    ]


def test_support_refuses_an_unknown_target_before_any_work():
    p = run_cli("support", "examples/residual_block.cdg", "--target", "h200,z9")
    assert p.returncode == 2 and "unknown target 'z9'" in p.stderr and "a100" in p.stderr


def test_support_no_fallback_makes_a_fallback_an_error(tmp_path):
    f = tmp_path / "gs.cdg"
    f.write_text(GENSTATS)
    p = run_cli("support", f, "--target", "h200", "--no-fallback")
    assert p.returncode == 1 and "fallback to torch is off" in p.stderr


def test_check_target_reports_the_partition_instead_of_failing(tmp_path):
    f = tmp_path / "ln.cdg"
    f.write_text(LN_GELU)
    p = run_cli("check", "--target", "h200", f)
    assert p.returncode == 0, p.stderr
    assert "declines graph ln_gelu whole" in p.stdout and "part 2: gelu (line 6) — cuDNN graph" in p.stdout


def test_a_part_keeps_the_buffers_its_views_read_and_binds_an_output_in_place_as_a_plain_output():
    from cudnn_dsl.store.keys import graph_digest

    g = program(text=VIEWED_IN_PLACE, file="v.cdg").graphs[0]
    inst = g.instances[0]
    first, second = subgraph(g, inst, 0, 1, "p1"), subgraph(g, inst, 1, 2, "p2")
    assert [b.name for b in first.buffers] == ["buf"] and first.instances[0].type("buf") == inst.type("buf")
    assert second.buffers == () and second.in_place == ()  # its output lands in acc's memory as bound
    for part in (first, second):  # the plan store's key of each part (a KeyError before)
        assert len(graph_digest(part, part.instances[0])) == 64


def _overwrite_then_read():
    """A graph whose first part (on torch) writes y over input a, which the second part reads."""
    from cudnn_dsl.run.partition import TORCH, Part, Partition
    from cudnn_dsl.run.parts import Parts

    text = (
        "graph g {\n  input a : float[1, 8, 8]\n  input b : float[1, 8, 8]\n"
        "  output y in a = relu(b)\n  output z = a + b\n}\n"
    )
    g = program(text=text, file="g.cdg").graphs[0]
    inst = g.instances[0]
    return (
        g,
        inst,
        Parts(g, inst, Partition((Part(0, 1, TORCH, why="-"), Part(1, 2, TORCH, why="-")), "-"), [None, None]),
    )


def test_a_split_run_reads_an_input_as_it_was_before_an_earlier_part_overwrote_it():
    import torch

    from cudnn_dsl.run.reference import run_reference

    g, inst, parts = _overwrite_then_read()
    a, b = torch.randn(1, 8, 8), torch.randn(1, 8, 8)
    want = run_reference(g, inst, {"a": a.clone(), "b": b})
    outputs = {"y": a, "z": torch.empty(1, 8, 8)}  # y is bound to a's memory, as bind_outputs does
    parts.run({"a": a, "b": b}, outputs)
    assert torch.equal(outputs["y"], want["y"]) and torch.equal(outputs["z"], want["z"])


def test_support_refuses_a_target_list_that_names_no_gpu():
    p = run_cli("support", "examples/residual_block.cdg", "--target", ",")
    assert p.returncode == 2 and "--target ',' names no GPU" in p.stderr and not p.stdout


def test_a_part_materializes_all_of_an_ops_statistics_when_a_later_part_reads_one(h200):
    text = (
        "graph lt {\n  io bf16\n  compute float\n  input x : bf16[256, 1024, 1, 1]\n"
        "  input gamma : float[1, 1024, 1, 1]\n  input beta : float[1, 1024, 1, 1]\n"
        "  y, mean, inv_variance = layernorm(x, gamma, beta, epsilon=1e-5, phase=training)\n"
        "  output z = gelu(y)\n  output m2 = mean * 2.0\n}\n"
    )
    g = program(text=text, file="lt.cdg").graphs[0]
    first = subgraph(g, g.instances[0], 0, 1, "p1")
    assert [v.name for v in first.outputs] == ["y", "mean", "inv_variance"]  # cuDNN wants the two alike
    _, partition = plan_for_target(g, g.instances[0], g.options, h200)
    assert partition.parts[0].graph is not None  # the norm was a torch fallback
    # gelu(y) and mean * 2.0 share no value made in the graph: a part each (cudnn_dsl/target/quirks.py)
    assert [(p.first, p.end) for p in partition.parts] == [(0, 1), (1, 2), (2, 3)]


def test_a_torch_fallback_reads_a_view_off_its_buffer():
    import torch

    from cudnn_dsl.run.inputs import generate_inputs
    from cudnn_dsl.run.partition import TORCH, Part, Partition
    from cudnn_dsl.run.parts import Parts
    from cudnn_dsl.run.reference import run_reference
    from cudnn_dsl.target.memory import empty

    text = (
        "graph v {\n  buffer buf : float[2, 4, 8]\n  input x : float[1, 4, 8] in buf at 32\n  output y = relu(x)\n}\n"
    )
    g = program(text=text, file="v.cdg").graphs[0]
    inst = g.instances[0]
    ins = generate_inputs(g, inst, "cpu", 0)
    outputs = {"y": empty(inst.type("y"), "cpu")}
    Parts(g, inst, Partition((Part(0, 1, TORCH, why="-"),), "-"), [None]).run(ins, outputs)
    assert torch.equal(outputs["y"], run_reference(g, inst, ins)["y"])


@pytest.mark.parametrize("command", [["support", "--target", "h200"], ["run"]])
def test_json_to_stdout_is_the_json_alone(command):
    p = run_cli(*command, "examples/residual_block.cdg", "--json", "-")
    assert p.returncode == 0, p.stderr
    json.loads(p.stdout)  # the human report went to stderr (it was printed before the JSON)
    assert "residual_block" in p.stderr


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--target", ""], "--target '' names no GPU"),
        (["--target", "a100", "--device-properties", "cudnn_dsl/devices/h200.json"], "not both"),
    ],
)
def test_check_refuses_an_empty_target_and_two_targets(flags, words):
    p = run_cli("check", "examples/residual_block.cdg", *flags)  # the empty one was ignored, the name overridden
    assert p.returncode == 2 and words in p.stderr and not p.stdout


def test_a_bound_split_graph_is_bound_once_and_each_run_reads_the_inputs_as_they_are_then():
    import torch

    from cudnn_dsl.run.reference import run_reference

    g, inst, parts = _overwrite_then_read()
    a, b = torch.randn(1, 8, 8), torch.randn(1, 8, 8)
    bound = parts.bind({"a": a, "b": b}, {"y": a, "z": torch.empty(1, 8, 8)})
    for _ in range(2):  # the second run reads a as the first left it (y was written into it)
        want = run_reference(g, inst, {"a": a.clone(), "b": b})
        got = bound.run()
        assert torch.equal(got["y"], want["y"]) and torch.equal(got["z"], want["z"])
    assert bound.outputs["y"].data_ptr() == a.data_ptr() and bound.handles == []


def test_forced_cut_points_make_the_parts_and_bad_ones_are_refused(h200):
    from cudnn_dsl.run.partition import cut_label, deviceless_accepts, split_at

    g = program("examples/residual_block.cdg").graphs[0]
    inst = g.instances[0]
    p = split_at(g, inst, (1,), deviceless_accepts(g.options, h200), fallback=True)
    assert p.cuts == (1,) and [(q.first, q.end, q.graph is not None) for q in p.parts] == [
        (0, 1, True),
        (1, len(g.nodes), True),
    ]
    assert cut_label(g, p.cuts) == "split after conv_fprop (line 12)" and cut_label(g, ()) == "whole"
    for bad in [(0,), (2, 1), (len(g.nodes),), (1, 1)]:
        with pytest.raises(ValueError, match="not increasing node indices"):
            split_at(g, inst, bad, deviceless_accepts(g.options, h200), fallback=True)


def test_the_anchor_alone_then_the_fewest_parts_of_the_epilogue(h200):
    from cudnn_dsl.run.partition import ANCHOR, deviceless_accepts, find_partition

    g = program("examples/matmul_epilogue.cdg").graphs[0]
    p = find_partition(g, g.instances[0], deviceless_accepts(g.options, h200), "", True, first=ANCHOR)
    assert p.parts[0].end == 1 and p.parts[0].graph is not None  # the matmul alone, a cuDNN graph
    assert p.parts[-1].end == len(g.nodes) and p.cuts[0] == 1


def test_the_reason_a_tuned_partition_gives():
    from cudnn_dsl.run.partition import tuned_why
    from cudnn_dsl.store.plans import PartitionChoice

    g = program("examples/residual_block.cdg").graphs[0]
    why = tuned_why(g, PartitionChoice((1,), {"whole": 24.3, "1": 18.1, "9": 1.0}))  # 9: not in this graph
    assert why == "tuned: split after conv_fprop (line 12), 18.1 µs vs 24.3 µs whole"
    assert tuned_why(g, PartitionChoice((), {"whole": 20.0, "1": 30.0})).startswith("tuned: whole, 20.0 µs vs 30.0")


def test_tune_without_a_gpu_lists_the_partitions_it_would_time():
    p = run_cli("tune", "examples/residual_block.cdg")
    assert p.returncode == 1 and "no CUDA GPU is usable here" in p.stderr
    assert "graph residual_block: partitions tune would time" in p.stdout
    assert "whole" in p.stdout and "split after conv_fprop (line 12)" in p.stdout and "2 cuDNN graphs" in p.stdout


def test_tune_without_a_gpu_lists_a_declined_graphs_parts(tmp_path):
    f = tmp_path / "ln.cdg"
    f.write_text(LN_GELU + GENSTATS)
    p = run_cli("tune", f)
    assert p.returncode == 1 and "no CUDA GPU is usable here" in p.stderr
    assert "graph ln_gelu: partitions tune would time\n  whole" in p.stdout and "declined: " in p.stdout
    assert "split after layernorm (line 6)" in p.stdout and "2 cuDNN graphs" in p.stdout
    assert "its op left to torch" in p.stdout and "0 cuDNN graphs, 1 op(s) left to torch" in p.stdout


# ---- partitioning in time: bounded questions, no part cuDNN would take exponential time over -----------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _outputs(n: int) -> str:
    """n outputs o_i = a * b: n ops that read no value made in the graph."""
    return (
        "graph g {\n  input a : float[8, 64]\n  input b : float[8, 64]\n"
        + "".join(f"  output o{i} = a * b\n" for i in range(n))
        + "}\n"
    )


def _summed(n: int) -> str:
    """A chain of 2n ops: n products of the inputs, summed one after the other, and the output."""
    body = "".join(f"  p{i} = a * b\n  s{i} = s{i - 1} + p{i}\n" for i in range(1, n))
    head = "graph g {\n  input a : float[8, 64]\n  input b : float[8, 64]\n  s0 = a * b\n"
    return f"{head}{body}  output y = s{n - 1}\n}}\n"


HANG_S = 120
"""a run this long is a hang or an exponential blow-up: the graphs below partition in seconds (16 outputs took
over 200 s to plan when cuDNN was handed them whole)"""


def test_the_ends_asked_from_a_node_are_bounded_and_reach_the_op_alone():
    from cudnn_dsl.run.partition import PROBES, probe_ends

    assert probe_ends(3, 9) == [9, 8, 7, 6, 5, 4]  # a short run: every end, longest first
    for first, last in ((0, 17), (5, 300), (0, 4096)):
        ends = probe_ends(first, last)
        assert len(ends) <= PROBES and ends == sorted(set(ends), reverse=True)
        assert ends[0] == last and ends[-1] == first + 1 and ends[: PROBES // 2] == list(range(last, last - 8, -1))


def test_many_independent_ops_are_split_in_time(tmp_path, h200):
    """16 outputs o_i = a * b: cuDNN's build_operation_graph takes time exponential in the number of ops that
    read no value made in the graph (quirk many_independent_ops), so the graph is split before cuDNN sees it,
    into parts of at most 8 such ops; `emit --format cudnn` ends in seconds (it ran for minutes)."""
    import subprocess
    import sys

    from cudnn_dsl.target.quirks import MAX_ROOTS

    f = tmp_path / "o.cdg"
    f.write_text(_outputs(16))
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "cudnn_dsl", "emit", "--format", "cudnn", str(f)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S, env=env, check=False, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "def build_part1(" in p.stdout and "def build_part2(" in p.stdout and "def build_part3(" not in p.stdout
    g = program(text=_outputs(16), file="o.cdg").graphs[0]
    low, partition = plan_for_target(g, g.instances[0], g.options, h200)
    assert low is None and "quirk many_independent_ops" in partition.declined
    assert "mul (line 12) is op 9 of the graph that reads no value made in it" in partition.declined
    assert [(p.first, p.end) for p in partition.parts] == [(0, MAX_ROOTS), (MAX_ROOTS, 16)]


def test_a_long_chain_is_partitioned_with_a_bounded_number_of_questions():
    """A chain of 256 ops, 128 of them reading only the inputs: every part asked about holds at most 8 of those,
    at most PROBES ends are asked from each node, and equal parts are asked once (a subprocess: a hang fails the
    test at HANG_S instead of holding the suite)."""
    import json
    import subprocess
    import sys

    code = f"""
import json
from cudnn_dsl.run.partition import deviceless_accepts, find_partition
from cudnn_dsl.target.library import Target
from cudnn_dsl.target.quirks import roots
from dsl.pipeline import program
g = program(text={_summed(128)!r}).graphs[0]
inner, asked = deviceless_accepts(g.options, Target.named("h200")), []
def accepts(part):
    asked.append((len(part.nodes), len(list(roots(part)))))
    return inner(part)
p = find_partition(g, g.instances[0], accepts, "declined whole", False)
print(json.dumps({{"asked": asked, "parts": [[q.first, q.end, q.kind] for q in p.parts]}}))
"""
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S, env=env, check=False, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.splitlines()[-1])
    parts, asked = got["parts"], got["asked"]
    assert [q[0] for q in parts] == sorted(q[0] for q in parts) and parts[-1][1] == 256
    assert all(kind == "cuDNN graph" for *_, kind in parts) and len(parts) == 16  # 8 products a part
    assert all(r <= 8 for _, r in asked) and len(asked) == len(parts)  # each part the first end asked


@pytest.mark.parametrize("mode", ["sum", "avg", "max", "norm2"])
def test_a_torch_fallback_reduction_reads_a_narrow_input_without_a_float_copy_of_it(mode):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from cudnn_dsl.run.inputs import generate_inputs
    from cudnn_dsl.run.partition import TORCH, Part, Partition
    from cudnn_dsl.run.parts import Parts
    from cudnn_dsl.run.reference import run_reference
    from cudnn_dsl.target.memory import empty

    text = (
        "graph r {\n  io bf16\n  compute float\n  input x : bf16[4, 64, 32]\n"
        f"  output y : float = reduction(x, mode={mode}, axes=[0, 1])\n}}\n"
    )
    g = program(text=text, file="r.cdg").graphs[0]
    inst = g.instances[0]
    ins = generate_inputs(g, inst, "cpu", 0)
    outputs = {"y": empty(inst.type("y"), "cpu")}
    copied = []

    class Casts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].shape == ins["x"].shape:
                copied.append(kwargs.get("dtype"))
            return func(*args, **(kwargs or {}))

    with Casts():
        Parts(g, inst, Partition((Part(0, 1, TORCH, why="-"),), "-"), [None]).run(ins, outputs)
    torch.testing.assert_close(outputs["y"], run_reference(g, inst, ins)["y"], rtol=1e-5, atol=1e-5)
    assert copied == ([] if mode in ("sum", "avg") else [torch.float32])
