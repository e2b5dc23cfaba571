"""Recompute in the backward (dsl.autodiff's Emit.recompute, the RECOMPUTE rows of dsl/ops/): a cheap intermediate
a VJP reads is computed again inside the backward graph where only ops that fuse with it read it and the forward then
saves fewer bytes; else the forward saves it, and `derive` says why. On the CPU against torch autograd, and planned
for an H200 by the real cuDNN library without a GPU."""

from __future__ import annotations

import math

import pytest

from dsl.autodiff import derive
from dsl.pipeline import program
from dsl.types import itemsize
from tests.helpers import ON_H200, check_grads

EXAMPLE = "examples/training/conv_bn_relu.cdg"


def _small(src: str) -> str:
    """The example at a CPU-sized shape: the same ops, layouts and dtypes."""
    for big, small in (("[8, 64, 16, 16]", "[2, 8, 5, 5]"), ("[64, 64, 3, 3]", "[8, 8, 3, 3]")):
        src = src.replace(big, small)
    return src.replace("[1, 64, 1, 1]", "[1, 8, 1, 1]")


def _saved(d, graph) -> dict[str, int]:
    """What the derived forward saves beyond the graph's own outputs, in bytes."""
    own = {v.name for v in graph.outputs}
    inst = d.forward.instances[0]
    sizes = {v.name: inst.type(v.name) for v in d.forward.outputs if v.name not in own}
    return {name: math.prod(t.shape) * itemsize(t.dtype) for name, t in sizes.items()}


def test_the_conv_bn_relu_example_recomputes_the_norm_and_matches_autograd():
    f = check_grads(_small(open(EXAMPLE).read()), "cpu", flips=0.02)
    d = next(iter(f._pairs.values())).derived
    assert [v.name for v in d.forward.outputs] == ["c", "y"]  # the convolution's output alone is saved
    assert d.choices[0].startswith("saves c (conv_fprop, 800 bytes): not a cheap op to recompute")
    assert [line.split(" (")[0] for line in d.choices[1:]] == ["recomputes sub_0", "recomputes mul_1"]
    assert "  sub_0 = sub(c, mean)\n  mul_1 = mul(sub_0, inv_variance)\n" in d.backward_text


def test_batchnorm_inference_is_recomputed_as_its_pointwise_form():
    text = """graph bn {
  input x : float[2, 3, 4, 4]
  input mean : float[1, 3, 1, 1]
  input inv_variance : float[1, 3, 1, 1] init=uniform(0.5, 2)
  input scale : float[1, 3, 1, 1]
  input bias : float[1, 3, 1, 1]
  output y = gelu(batchnorm_inference(x, mean, inv_variance, scale, bias))
}
"""
    f = check_grads(text, "cpu")
    d = next(iter(f._pairs.values())).derived
    assert [v.name for v in d.forward.outputs] == ["y"]  # gelu's input is recomputed from the inputs
    assert d.choices == (
        "recomputes batchnorm_inference_0 (batchnorm_inference) in the backward, fused with what reads it: "
        "384 bytes unsaved",
    )
    assert "batchnorm_inference" not in {n.op for n in d.backward.nodes}
    assert {"sub", "mul", "add", "gelu_backward"} <= {n.op for n in d.backward.nodes}


def test_a_value_a_convolution_reads_is_saved():
    g = program("examples/training/resnet_block.cdg").graph()
    d = derive(g, g.instances[-1], avoid=ON_H200)
    assert "saves h (relu, 4 MiB): read from memory by conv_wgrad" in d.choices
    assert "h" in {v.name for v in d.forward.outputs}


def test_a_recompute_that_would_save_more_is_not_taken():
    text = """graph g {
  input a : float[2, 3, 4]
  input b : float[2, 4, 5]
  input c : float[2, 4, 5]
  output y = sin(matmul(a, b) + matmul(a, c))
}
"""
    d = check_grads(text, "cpu")._pairs.popitem()[1].derived
    assert d.choices[-1] == "saves add_2 (add, 120 bytes): recomputing it would save matmul_0, matmul_1 instead"
    assert [v.name for v in d.forward.outputs] == ["add_2", "y"]


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target

    return Target.named("h200")


def test_recomputing_saves_fewer_bytes_in_no_more_cudnn_graphs_on_an_h200(h200):
    from cudnn_dsl.run.partition import plan_for_target

    def graphs(g) -> int:
        low, partition = plan_for_target(g, g.instances[0], g.options, h200)
        assert low is not None or partition.counts.fallbacks == 0
        return 1 if low is not None else partition.counts.graphs

    g = program(EXAMPLE).graph()
    saving, recomputing = (derive(g, avoid=ON_H200, recompute=r) for r in (False, True))
    assert _saved(saving, g) == {"sub_0": 512 * 1024, "mul_1": 512 * 1024}  # two float intermediates
    assert _saved(recomputing, g) == {"c": 256 * 1024}  # the half convolution output
    assert graphs(recomputing.forward) == graphs(saving.forward) == 1
    assert graphs(recomputing.backward) <= graphs(saving.backward) == 3


ZERO_CENTRED = "examples/training/zero_centred_rmsnorm.cdg"


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_a_zero_centred_gammas_plus_one_is_recomputed_before_the_norm_backward_and_matches_autograd(norm):
    """gamma + 1 is read by rmsnorm_backward (layernorm_backward) as its scale, a port a pointwise prologue fuses
    into (OpSig.prologue): the backward adds the 1 again and the forward saves only the statistics."""
    text = (
        open(ZERO_CENTRED).read().replace("[64, 512, 1, 1]", "[4, 16, 1, 1]").replace("[1, 512, 1, 1]", "[1, 16, 1, 1]")
    )
    if norm == "layernorm":
        text = text.replace(
            "  output y = rmsnorm(x, weight, epsilon=1e-5)",
            "  input beta : float[1, 16, 1, 1]\n  output y = layernorm(x, weight, beta, epsilon=1e-5)",
        )
    f = check_grads(text, "cpu")
    d = next(iter(f._pairs.values())).derived
    assert d.choices == ("recomputes weight (add) in the backward, fused with what reads it: 64 bytes unsaved",)
    assert [n.op for n in d.backward.nodes] == ["add", f"{norm}_backward"]
    assert "weight" not in {v.name for v in d.forward.outputs}


def test_the_zero_centred_norm_backward_is_one_cudnn_graph_on_an_h200_where_saving_the_weight_is_one_too(h200):
    """The fusion the prologue row claims: cuDNN 9.28 plans add + rmsnorm_backward as one graph for an H200."""
    from cudnn_dsl.run.partition import plan_for_target

    g = program(ZERO_CENTRED).graph()
    saving, recomputing = (derive(g, avoid=ON_H200, recompute=r) for r in (False, True))
    assert _saved(saving, g) == {"weight": 512 * 4, "y_inv_variance": 64 * 4}
    assert _saved(recomputing, g) == {"y_inv_variance": 64 * 4}
    for d in (saving, recomputing):
        for part in (d.forward, d.backward):
            low, _ = plan_for_target(part, part.instances[0], part.options, h200)
            assert low is not None, part.name  # whole
