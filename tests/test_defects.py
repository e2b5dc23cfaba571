"""Graphs cuDNN 9.19 built and ran wrong on the H200 (cudnn_dsl/target/quirks.py): declined before cuDNN sees
them, located at the op; split, they run as graphs that run right (tests/gpu/test_defects_gpu.py)."""

import pytest

from cudnn_dsl.target.quirks import runs_wrong
from dsl.pipeline import program
from tests.graphs import DEFECTS, defect_text


def graph(body: str):
    return program(text=defect_text(body), file="g.cdg").graphs[0]


@pytest.mark.parametrize("case", sorted(DEFECTS))
def test_a_graph_cudnn_runs_wrong_is_declined_at_the_op(case):
    body, words = DEFECTS[case]
    g = graph(body)
    d = runs_wrong(g, g.instances[0])
    assert d is not None and words in d.message and "option split = true" in d.message
    assert d.loc.line >= 6  # at an op of the body, not the graph


@pytest.mark.parametrize(
    "body",
    [
        "output o = sub(m0, mul(m, r))",  # one way of broadcasting, an input: ran right
        "output o = mul(m, r) + mul(m0, r)",  # two chains joined by the add
        "output o = relu(m * r)\n  output p = sigmoid(m0 * r)",  # pointwise chains sharing an input (as rope)
    ],
)
def test_graphs_that_ran_right_are_left_to_cudnn(body):
    g = graph(body)
    assert runs_wrong(g, g.instances[0]) is None


def test_the_in_place_rope_example_stays_one_graph():
    g = program("examples/rope_in_place.cdg").graphs[0]
    assert runs_wrong(g, g.instances[0]) is None


def test_a_non_pointwise_graph_beside_an_unconnected_op_is_declined():
    text = """graph g {
  io half
  compute float
  input dy : half[4, 64, 8, 8] nhwc
  input x : half[4, 64, 8, 8] nhwc
  input h : half[4, 64, 8, 8] nhwc
  input d : half[4, 64, 8, 8] nhwc
  output dw : half[64, 64, 3, 3] nhwc = conv_wgrad(x, dy, padding=[1, 1], filter=[3, 3])
  output dr = relu_backward(d, h)
}
"""
    g = program(text=text, file="g.cdg").graphs[0]
    d = runs_wrong(g, g.instances[0])
    assert d is not None and "relu_backward (line 9) shares no value" in d.message


def test_deviceless_planning_splits_a_declined_graph_into_parts_that_run_right():
    """Through cuDNN 9.28 planning for the H200: the graph is split where the rule says."""
    from cudnn_dsl.run.partition import plan_for_target
    from cudnn_dsl.target.library import Target

    g = graph(DEFECTS["made_then_broadcast"][0])
    low, partition = plan_for_target(g, g.instances[0], g.options, Target.named("h200"))
    assert low is None and "runs it wrong" in partition.declined
    assert [(p.first, p.end) for p in partition.parts] == [(0, 1), (1, 3)]
    for p in partition.parts:
        assert p.graph is None or runs_wrong(p.graph, p.graph.instances[0]) is None


def test_a_per_channel_broadcast_at_rank_4_is_left_to_cudnn():
    """[1, C, 1, 1] over NHWC [N, C, H, W]: a conv's epilogue run alone ran right on the H200 (tune checks it)."""
    text = (
        "graph g {\n  io half\n  compute float\n  input x : half[4, 64, 8, 8] nhwc\n"
        "  input s : half[1, 64, 1, 1] nhwc\n  output o = relu(bias(x, s))\n}\n"
    )
    g = program(text=text, file="g.cdg").graphs[0]
    assert runs_wrong(g, g.instances[0]) is None
