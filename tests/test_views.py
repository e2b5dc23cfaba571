"""What a split graph runs without a kernel of its own, deviceless: a reshape of a packed value is a view, a
cast that would run alone is written by the part before it, equal parts are one graph; and the parts counted.
The views run here on the CPU between torch fallbacks (their twins on the GPU: tests/gpu/test_views_gpu.py)."""

import json

import pytest
import torch

from cudnn_dsl.run.partition import CUDNN, TORCH, VIEW, Part, Partition, deviceless_accepts, plan_for_target, split_at
from cudnn_dsl.run.parts import Parts
from cudnn_dsl.run.reference import run_reference
from cudnn_dsl.store.keys import graph_digest
from cudnn_dsl.target.library import Target
from cudnn_dsl.target.memory import empty
from dsl.pipeline import program
from dsl.subgraph import cast_folded, subgraph
from tests.cli_util import run_cli
from tests.graphs import MM_RESHAPE
from tests.helpers import Copies

TRANSFORMER = "examples/training/transformer_block.cdg"


@pytest.fixture(scope="module")
def h200():
    return Target.named("h200")


@pytest.fixture(scope="module")
def forward(h200):
    """The transformer block's forward, and its partition for the H200."""
    g = program(TRANSFORMER).graphs[0]
    low, partition = plan_for_target(g, g.instances[0], g.options, h200)
    assert low is None
    return g, partition


def test_the_transformer_forward_is_six_cudnn_parts_and_four_views(forward):
    g, partition = forward
    kinds = [p.kind for p in partition.parts]
    assert kinds.count(CUDNN) == 6 and kinds.count(VIEW) == 4 and not partition.fallbacks
    views = [p for p in partition.parts if p.kind == VIEW]
    assert {g.nodes[p.first].op for p in views} == {"reshape"} and all(p.end == p.first + 1 for p in views)
    c = partition.counts
    assert (c.launches, c.graphs, c.views, c.fallbacks) == (6, 4, 4, 0)  # the q, k and v projections: one graph
    assert c.text == "6 cuDNN launches (4 distinct graphs), 4 views, no torch fallback"
    assert partition.lines(g)[2] == "part 3: reshape (line 29) — view (no launch)"


def test_the_cast_after_layernorm_is_written_by_the_layernorm(forward):
    g, partition = forward
    first = partition.parts[0]
    assert (first.first, first.end, first.kind) == (0, 2, CUDNN)  # layernorm and identity: node indices kept
    part = first.graph
    assert [n.op for n in part.nodes] == ["layernorm"] and part.nodes[0].outputs[0] == "h"
    assert "hn" not in {v.name for v in part.values} and part.instances[0].type("h").dtype == "bf16"
    assert partition.cuts[0] == 2
    assert partition.lines(g)[0].startswith(
        "part 1: layernorm (line 26), identity (line 27) — cuDNN graph (h written as bf16: the cast folded in)"
    )


def test_cut_points_give_the_parts_the_search_found(forward, h200):
    g, partition = forward
    again = split_at(g, g.instances[0], partition.cuts, deviceless_accepts(g.options, h200), fallback=False)
    assert [(p.first, p.end, p.kind) for p in again.parts] == [(p.first, p.end, p.kind) for p in partition.parts]
    assert again.parts[0].graph == partition.parts[0].graph  # the cast folded in, as found


def test_a_cast_whose_operand_another_op_reads_does_not_fold():
    text = (
        "graph c {\n  io bf16\n  compute float\n  input x : bf16[8, 128, 256]\n  input g : float[1, 1, 256]\n"
        "  input b : float[1, 1, 256]\n  hn = layernorm(x, g, b)\n  output h : bf16 = identity(hn)\n"
        "  output s = hn * 2.0\n}\n"
    )
    g = program(text=text, file="c.cdg").graphs[0]
    assert cast_folded(g, g.instances[0], 0, 2, "p") is None
    folds = program(text=text.replace("  output s = hn * 2.0\n", ""), file="c.cdg").graphs[0]
    part = cast_folded(folds, folds.instances[0], 0, 2, "p")
    assert part is not None and [v.name for v in part.outputs] == ["h"]


def test_equal_parts_are_one_digest_and_their_uids_are_their_own():
    text = (
        "graph e {\n  io half\n  input a : half[4, 64, 128]\n  input w1 : half[1, 128, 32]\n"
        "  input w2 : half[1, 128, 32]\n  output p = matmul(a, w1)\n  output q = matmul(a, w2)\n}\n"
    )
    g = program(text=text, file="e.cdg").graphs[0]
    inst = g.instances[0]
    one, two = subgraph(g, inst, 0, 1, "e_part1"), subgraph(g, inst, 1, 2, "e_part2")
    assert graph_digest(one, one.instances[0]) == graph_digest(two, two.instances[0])
    assert [(v.name, v.uid) for v in two.values] == [("a", 1), ("w2", 2), ("q", 3)]
    partition = Partition((Part(0, 1, CUDNN, one), Part(1, 2, CUDNN, two)), "-")
    assert (partition.counts.launches, partition.counts.graphs) == (2, 1)


def test_a_reshape_of_a_value_that_is_not_packed_stays_a_fallback_and_says_why(h200):
    text = (  # channels-last: its row-major reshape is other memory
        "graph t {\n  io half\n  input x : half[8, 64, 16, 16] nhwc\n  y : half = relu(x)\n"
        "  output z : half = reshape(y, shape=[8, 16384])\n}\n"
    )
    g = program(text=text, file="t.cdg").graphs[0]
    _, partition = plan_for_target(g, g.instances[0], g.options, h200)
    assert [p.kind for p in partition.parts] == [CUDNN, TORCH]
    assert "not a view: its operand is not packed row-major (strides [16384, 1, 1024, 64])" in partition.lines(g)[1]


def test_a_view_needs_no_fallback_to_torch(h200):
    g = program(text=MM_RESHAPE, file="m.cdg").graphs[0]
    strict = g.options.with_values({"fallback": False})
    _, partition = plan_for_target(g, g.instances[0], strict, h200)
    assert [p.kind for p in partition.parts] == [CUDNN, VIEW]


def test_check_target_prints_and_reports_the_counts(tmp_path):
    report = tmp_path / "check.json"
    p = run_cli("check", "--target", "h200", "examples/training/transformer_block.cdg")
    assert p.returncode == 0, p.stderr
    assert "    part 10: matmul (line 36)" in p.stdout
    assert p.stdout.rstrip().endswith("6 cuDNN launches (4 distinct graphs), 4 views, no torch fallback")
    p = run_cli("check", "--target", "h200", TRANSFORMER, "--json", report)
    assert p.returncode == 0, p.stderr
    [record] = json.loads(report.read_text())["files"][0]["plans"]
    assert record["counts"] == {"launches": 6, "graphs": 4, "views": 4, "fallbacks": 0} and len(record["parts"]) == 10


# ---- views between torch fallbacks, run on the CPU -------------------------------------------------------

CHAIN = (
    "graph v {\n  input a : float[2, 3, 4]\n  z = relu(a)\n  r = reshape(z, shape=[6, 4])\n"
    "  output y = reshape(r, shape=[24])\n  output w = r * 2.0\n}\n"
)


def _parts(text: str, kinds: list[str]) -> tuple:
    """A graph run as the parts of these kinds, a node each, a torch fallback for every op, on the CPU; and its
    seeded inputs."""
    from cudnn_dsl.run.inputs import generate_inputs

    g = program(text=text, file="v.cdg").graphs[0]
    inst = g.instances[0]
    parts = Parts(g, inst, Partition(tuple(Part(i, i + 1, k) for i, k in enumerate(kinds)), "-"), [None] * len(kinds))
    return g, inst, parts, generate_inputs(g, inst, "cpu", 0)


def test_a_chain_of_views_into_an_output_is_written_by_the_op_before_it():
    g, inst, parts, ins = _parts(CHAIN, [TORCH, VIEW, VIEW, TORCH])
    outputs = {v.name: empty(inst.type(v.name), "cpu") for v in g.outputs}
    with Copies() as copies:
        parts.run(ins, outputs)
    want = run_reference(g, inst, ins)
    assert torch.equal(outputs["y"], want["y"]) and torch.equal(outputs["w"], want["w"])
    assert copies.count == 2  # relu written into y's memory, and w: no copy for either view


def test_a_view_of_an_input_into_an_output_is_one_copy_on_every_run_of_a_binding():
    text = "graph v {\n  input a : float[2, 3, 4]\n  output y = reshape(a, shape=[4, 6])\n}\n"
    g, inst, parts, ins = _parts(text, [VIEW])
    bound = parts.bind(ins, {"y": empty(inst.type("y"), "cpu")})
    for _ in range(2):
        with Copies() as copies:
            bound.run()
        assert copies.count == 1 and torch.equal(bound.outputs["y"], ins["a"].reshape(4, 6))
        ins["a"].add_(1.0)  # the next run reads it as it is then


def test_a_view_of_an_intermediate_is_read_by_the_ops_after_it_in_place():
    text = (
        "graph v {\n  input a : float[2, 3, 4]\n  z = relu(a)\n  r = reshape(z, shape=[6, 4])\n"
        "  output y = r + 1.0\n}\n"
    )
    g, inst, parts, ins = _parts(text, [TORCH, VIEW, TORCH])
    outputs = {"y": empty(inst.type("y"), "cpu")}
    with Copies() as copies:
        parts.run(ins, outputs)
    assert copies.count == 2 and torch.equal(outputs["y"], run_reference(g, inst, ins)["y"])


def test_a_widening_cast_does_not_fold():
    """half -> float: the producer writing float would skip the half rounding the graph declares."""
    text = "graph w {\n  input x : float[4, 64]\n  h : half = x * 3.0\n  output y : float = identity(h)\n}\n"
    g = program(text=text, file="w.cdg").graphs[0]
    assert cast_folded(g, g.instances[0], 0, 2, "p") is None


def test_a_reshape_of_a_window_on_a_buffer_is_no_view():
    from cudnn_dsl.run.partition import view_refusal

    text = (
        "graph b {\n  buffer buf : float[96]\n  input x : float[8, 8] in buf at 32\n"
        "  r = reshape(x, shape=[64, 1])\n  output y = relu(r)\n}\n"
    )
    g = program(text=text, file="b.cdg").graphs[0]
    assert "window on a buffer" in view_refusal(g, g.instances[0], 0)
