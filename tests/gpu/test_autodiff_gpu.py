"""Derived backward graphs run by cuDNN (cudnn_dsl/torch_op/autograd.py), checked against torch autograd on the
forward's reference (float64) with per-dtype tolerances. The backward of a conv or matmul holds
several ops cuDNN does not fuse into one graph (dgrad, wgrad, a bias's reduction), so it runs split (the
default, `split=True`), each part a cuDNN graph."""

import pytest

from tests.graphs import ATTENTION
from tests.helpers import check_grads

pytestmark = pytest.mark.gpu


def test_conv_bias_relu_backward_on_cudnn(private_store):
    text = """graph conv_bias_relu {
  io half
  compute float
  input x : half[8, 64, 16, 16] nhwc
  input w : half[64, 64, 3, 3] nhwc
  input b : half[1, 64, 1, 1] nhwc
  y = conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
  output out = relu(bias(y, b))
}
"""
    f = check_grads(text, "cuda")
    assert f._pairs, "the derived graphs were compiled"


def test_strided_conv_backward_on_cudnn(private_store):
    text = """graph strided {
  io half
  compute float
  input x : half[4, 32, 16, 16] nhwc
  input w : half[64, 32, 3, 3] nhwc
  output out = tanh(conv_fprop(x, w, padding=[1, 1], stride=[2, 2]))
}
"""
    check_grads(text, "cuda")


def test_matmul_epilogue_backward_on_cudnn(private_store):
    """dA = dC B^T and dB = A^T dC read the saved operands through transposed views."""
    text = """graph matmul_epilogue {
  io bf16
  compute float
  input a : bf16[4, 64, 128]
  input b : bf16[4, 128, 64]
  input bias : bf16[1, 1, 64]
  scalar alpha : float = 0.5
  output y = gelu(matmul(a, b) * alpha + bias)
}
"""
    check_grads(text, "cuda")


def _backward_ops(f) -> list[str]:
    return [n.op for p in f._pairs.values() for n in p.derived.backward.nodes]


def test_layernorm_backward_from_computed_statistics(private_store):
    """An inference-phase layernorm: the derived forward runs it in training phase for its statistics, the
    backward is layernorm_backward (per sample over [N, C, H, W], the form cuDNN 9.19 runs)."""
    text = """graph ln {
  io bf16
  compute float
  input x : bf16[256, 512, 1, 1]
  input gamma : float[1, 512, 1, 1]
  input beta : float[1, 512, 1, 1]
  output y = layernorm(x, gamma, beta, epsilon=1e-5)
}
"""
    assert _backward_ops(check_grads(text, "cuda")) == ["layernorm_backward"]


@pytest.mark.parametrize(
    "body, op",
    [
        ("output y = rmsnorm(x, gamma, epsilon=1e-5)", "rmsnorm_backward"),
        ("output y = rmsnorm(x, gamma, beta)", "rmsnorm_backward"),
        ("output y = instancenorm(x, gamma, beta)", "instancenorm_backward"),
    ],
)
def test_norm_backward_ops_derived(private_store, body, op):
    scale = "[1, 64, 1, 1]" if "instance" in body else "[1, 64, 4, 4]"
    text = f"""graph norm {{
  io half
  compute float
  input x : half[16, 64, 4, 4]
  input gamma : float{scale}
{"  input beta : float" + scale if "beta" in body else ""}
  {body}
}}
"""
    assert _backward_ops(check_grads(text, "cuda")) == [op]


@pytest.mark.parametrize("act", ["gelu", "tanh", "sigmoid", "swish", "elu", "softplus", "leaky_relu"])
def test_pointwise_backward_modes_derived(private_store, act):
    text = f"""graph act {{
  io half
  compute float
  input x : half[8, 64, 128]
  input c : half[8, 64, 128]
  output y = {act}(x * c)
}}
"""
    assert f"{act}_backward" in _backward_ops(check_grads(text, "cuda"))


def test_batchnorm_training_backward_and_running_stats(private_store):
    import torch

    text = open("examples/batchnorm_training.cdg").read().replace("[16, 64, 32, 32]", "[8, 64, 8, 8]")
    f = check_grads(text, "cuda", frozen=("running_mean", "running_var"))
    assert f.graph.in_place and torch.cuda.is_available()


def test_sdpa_backward_composite_on_cudnn(private_store):
    """The composite sdpa VJP, for dk and dv only (q frozen): its matmuls read saved q, k, v, o and the
    softmax statistics, and the incoming gradient, through transposed views."""
    assert "sdpa_backward" not in _backward_ops(check_grads(ATTENTION, "cuda", frozen=("q",)))


@pytest.mark.parametrize(
    "extra, decl",
    [("causal=true", ""), ("bias=b", "  input b : half[1, 4, 128, 128]\n")],
    ids=["causal", "bias_dbias"],
)
def test_sdpa_backward_op_derived(private_store, extra, decl):
    """dq, dk and dv all wanted: sdpa_backward, with K/V of fewer heads than Q (and the bias's gradient)."""
    text = f"""graph attn {{
  io half
  compute float
  input q : half[2, 4, 128, 64]
  input k : half[2, 2, 128, 64]
  input v : half[2, 2, 128, 64]
{decl}  output o = sdpa(q, k, v, {extra})
}}
"""
    assert _backward_ops(check_grads(text, "cuda")) == ["sdpa_backward"]


def test_resnet_block_backward_fuses_each_dgrad_with_its_reader(private_store):
    """examples/training/resnet_block.cdg at N=4: the derived backward is ordered so that each conv_dgrad is
    followed by the op that reads it (dgrad + dReLU, dgrad + the shortcut's add), parts cuDNN 9.28 plans for an
    H200; the GPU's own cuDNN decides at run time, and the gradients must match torch autograd either way."""
    from pathlib import Path

    from cudnn_dsl.run.parts import Parts

    # seen on the H200: 47 of x's 262,144 elements past the tolerance (ReLU masks at half's rounding of zero),
    # every gradient within 1e-2 of autograd's in norm
    f = check_grads(Path("examples/training/resnet_block.cdg").read_text(), "cuda", flips=1e-3)
    (pair,) = f._pairs.values()
    parts = pair.backward.parts(pair.backward.graph.instances[0])
    assert isinstance(parts, Parts)  # dgrad and wgrad are never one cuDNN graph
    print("\n".join(parts.lines))  # which fusions this cuDNN ran, for the record


def test_conv_statistics_backward_on_cudnn(private_store):
    """genstats's VJP: the conv's output gradient gains dsum + 2 y dsq_sum (pointwise ops), then dgrad and
    wgrad read it."""
    text = """graph conv_stats {
  io half
  compute float
  input x : half[4, 32, 16, 16] nhwc
  input w : half[64, 32, 3, 3] nhwc
  y = conv_fprop(x, w, padding=1)
  s, sq = genstats(y)
  output y
  output s
  output sq
}
"""
    assert {"conv_dgrad", "conv_wgrad"} <= set(_backward_ops(check_grads(text, "cuda")))


def test_mod_backward_on_cudnn(private_store):
    """mod's VJP in b, -dy * (a - y) / b: trunc(a / b) from the remainder cuDNN computed. Where a / b is within
    a rounding of an integer, cuDNN's and the float64 reference's trunc may differ by one: a few flips."""
    text = """graph modg {
  io half
  compute float
  input a : half[8, 64, 128] init=uniform(0.5, 2)
  input b : half[8, 64, 128] init=uniform(0.5, 2)
  output y = mod(a, b)
}
"""
    check_grads(text, "cuda", flips=0.001)


def test_a_zero_centred_rmsnorm_backward_recomputes_the_weight_in_one_cudnn_graph(private_store):
    """examples/training/zero_centred_rmsnorm.cdg: add + rmsnorm_backward, one graph cuDNN runs (split=False)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "examples" / "training" / "zero_centred_rmsnorm.cdg").read_text()
    f = check_grads(text, "cuda", split=False)
    d = next(iter(f._pairs.values())).derived
    assert [n.op for n in d.backward.nodes] == ["add", "rmsnorm_backward"]
