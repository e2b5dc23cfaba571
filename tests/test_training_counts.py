"""What a training step of each block in examples/training/ launches, planned for an H200 by the real cuDNN
library without a GPU: the derived forward and backward as cuDNN graphs (distinct graphs, launches), views
between them, and no torch fallback. Structure, not speed: the speed is bench/train.py's."""

from __future__ import annotations

import pytest

from dsl.autodiff import derive
from dsl.pipeline import program
from tests.helpers import ON_H200

# (block, gradients) -> (the forward's cuDNN graphs at most, the backward's); 'weights': every input but the
# data x, as bench/train.py trains them; 'all': the input's gradient too (check --emit backward's default)
TARGETS = {
    ("resnet_block", "weights"): (2, 4),
    ("resnet_block", "all"): (2, 5),
    ("transformer_block", "weights"): (6, 8),
    ("transformer_block", "all"): (6, 12),
    ("packed_qkv", "all"): (1, 1),
    ("conv_bn_relu", "all"): (1, 3),
}


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target

    return Target.named("h200")


def _counts(graph, target):
    from cudnn_dsl.run.partition import Counts, plan_for_target

    low, partition = plan_for_target(graph, graph.instances[0], graph.options, target)
    return Counts(1, 1, 0, 0) if low is not None else partition.counts  # taken whole: one graph


@pytest.mark.parametrize("block,grads", list(TARGETS), ids=lambda v: str(v))
def test_a_training_step_runs_as_few_cudnn_graphs_and_no_torch_part(block, grads, h200):
    g = program(f"examples/training/{block}.cdg").graphs[0]
    inst = g.instances[-1]  # the training shape (the ResNet block's N=32)
    wrt = tuple(v.name for v in g.inputs if v.name != "x") if grads == "weights" else None
    d = derive(g, inst, wrt, avoid=ON_H200)
    for what, graph, most in zip(("forward", "backward"), (d.forward, d.backward), TARGETS[block, grads]):
        c = _counts(graph, h200)
        assert c.fallbacks == 0, f"{block} {what}: {c.text}"
        assert c.graphs <= most, f"{block} {what}: {c.text} (at most {most} graphs)"
        assert c.launches >= c.graphs
