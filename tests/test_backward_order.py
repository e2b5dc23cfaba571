"""The derived backward graph's node order (dsl.subgraph.fusion_order): what cuDNN may fuse stays
adjacent, so the partitioner, which splits a declined graph into runs of consecutive nodes, gets
fewer parts. The order is a valid topological one and deterministic; the gradients are checked
against torch autograd in tests/test_autodiff.py and tests/test_torch_op.py."""

import random

import pytest

from dsl.autodiff import derive
from dsl.ops import OPS
from dsl.pipeline import program
from dsl.subgraph import fusion_order
from tests.graphs import BLOCK
from tests.helpers import ON_H200

RESNET = "examples/training/resnet_block.cdg"


def _backward(path=None, text=None):
    """The backward as derived for the H200's cuDNN 9.19 (where the norms' backward is the chain over tokens)."""
    g = program(path, text=text, file="<t>").graphs[0] if text else program(path).graphs[0]
    return derive(g, g.instances[0], avoid=ON_H200).backward


def _topological(nodes) -> bool:
    made: set[str] = set()
    everything = {o for n in nodes for o in n.outputs}
    for n in nodes:
        if any(i in everything and i not in made for i in n.inputs if i):
            return False
        made |= set(n.outputs)
    return True


def test_resnet_backward_keeps_each_dgrad_with_the_op_that_reads_it():
    g = _backward(RESNET)
    assert _topological(g.nodes)
    ops = [n.op for n in g.nodes]
    dgrads = [k for k, op in enumerate(ops) if op == "conv_dgrad"]
    assert len(dgrads) == 2
    for k in dgrads:  # dgrad + dReLU, and the last dgrad + the shortcut's add: cuDNN epilogues
        assert g.nodes[k].outputs[0] in g.nodes[k + 1].inputs, ops
    assert [ops[k + 1] for k in dgrads] == ["relu_backward", "add"]
    assert ops[-2:] == ["conv_wgrad", "conv_wgrad"]  # nothing fuses with a wgrad: last, not between


def test_layernorm_backward_pointwise_ops_form_two_runs():
    """The layernorm+GELU block's backward: its pointwise ops come as two runs, the one before the
    row reductions and the one after (in the VJPs' order they came as five)."""
    g = _backward(text=BLOCK)
    assert _topological(g.nodes)
    fams = [OPS[n.op].family for n in g.nodes]
    runs = sum(1 for k, f in enumerate(fams) if f == "pointwise" and (k == 0 or fams[k - 1] != "pointwise"))
    assert runs == 2, [n.op for n in g.nodes]
    last = [n.op for n in g.nodes][-3:]
    assert last == ["matmul", "reshape", "matmul"]  # the weight's gradient: one matmul over the batch, no sum


def test_the_order_is_deterministic():
    text = program(RESNET).graphs[0]
    first, again = derive(text, text.instances[0], avoid=ON_H200), derive(text, text.instances[0], avoid=ON_H200)
    assert first.backward_text == again.backward_text


def test_a_reduction_ends_an_anchor_run_and_an_operand_joins_before_its_reader():
    nodes = [
        ("matmul", ("a", "b"), ("m",)),
        ("reduction", ("g",), ("r",)),  # reads an input: each such reduction is a part of its own
        ("mul", ("r", "c"), ("s",)),  # joins the add only through the add
        ("relu", ("m",), ("e",)),
        ("add", ("e", "s"), ("y",)),
        ("reduction", ("y",), ("z",)),
    ]
    order = fusion_order(nodes, {"a", "b", "c", "g"})
    assert [nodes[k][2][0] for k in order] == ["r", "m", "e", "s", "y", "z"]


@pytest.mark.parametrize("seed", range(20))
def test_random_graphs_get_a_topological_permutation(seed):
    rnd = random.Random(seed)
    ops = ["add", "mul", "relu", "reduction", "matmul", "conv_dgrad", "reshape"]
    nodes, values = [], ["in0", "in1", "in2"]
    for k in range(rnd.randint(1, 25)):
        ins = tuple(rnd.sample(values, min(len(values), rnd.randint(1, 2))))
        nodes.append((rnd.choice(ops), ins, (f"v{k}",)))
        values.append(f"v{k}")
    order = fusion_order(nodes, {"in0", "in1", "in2"})
    assert sorted(order) == list(range(len(nodes)))
    made = {"in0", "in1", "in2"}
    for k in order:
        assert set(nodes[k][1]) <= made
        made |= set(nodes[k][2])
    assert order == fusion_order(nodes, {"in0", "in1", "in2"})


def test_resnet_backward_splits_into_fewer_parts_for_h200():
    """Deviceless planning with the real cuDNN library: in the VJPs' order the backward split into 9
    parts (every dgrad alone); in this order each dgrad fuses the op that reads it, and each bias's sum
    (float) fuses after the dReLU: 5 cuDNN graphs, none left to torch."""
    from cudnn_dsl.run.partition import plan_for_target
    from cudnn_dsl.target.library import Target

    g = _backward(RESNET)
    low, partition = plan_for_target(g, g.instances[0], g.options, Target.named("h200"))
    assert low is None
    fused = [[g.nodes[i].op for i in range(p.first, p.end)] for p in partition.parts if p.end - p.first > 1]
    assert ["conv_dgrad", "relu_backward", "reduction"] in fused and ["conv_dgrad", "add"] in fused
    assert ["relu_backward", "reduction"] in fused
    assert len(partition.parts) == 5 and not partition.fallbacks


# ---- the order costs about the graph's length: no scan of every node, or of every waiting node, per step ----


def _steps(fn) -> int:
    """The lines fn() executes, loop iterations included (comprehensions too): its work, counted alike on any
    machine and under any load, where a wall clock would not be."""
    import sys

    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        count += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count


def _chain(n: int) -> str:
    """A forward chain of n ops, pointwise and matmuls: its backward's weight gradients wait while the chain's
    gradient goes on, so the nodes ready at once grow with n."""
    ops = ["relu({})", "matmul({}, w)", "{} * w", "tanh({})"]
    lines = [f"  t{i} = " + ops[i % 4].format(f"t{i - 1}" if i else "x") for i in range(n)]
    return (
        "graph g {\n  input x : float[1, 16, 16]\n  input w : float[1, 16, 16]\n"
        + "\n".join(lines)
        + (f"\n  output y = relu(t{n - 1})\n}}\n")
    )


def test_fusion_order_work_grows_linearly_with_the_backward():
    def work(n: int) -> int:
        g = _backward(text=_chain(n))
        nodes = [(nd.op, tuple(i for i in nd.inputs if i), nd.outputs) for nd in g.nodes]
        inputs = {v.name for v in g.inputs}
        return _steps(lambda: fusion_order(nodes, inputs))

    small, big = work(50), work(200)
    # 4x the ops, ~4x the work (a scan of every node per step made it ~13x, of the waiting nodes ~8x)
    assert big <= 4 * 1.25 * small, (small, big)
