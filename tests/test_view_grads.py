"""Derived backward graphs of graphs that read buffers through views (dsl/autodiff.py): a view's gradient is
written in place over a view of the buffer's gradient at the same offset, checked on the CPU against torch autograd
through torch's own views of the buffer (tests.helpers.autograd_grads)."""

import pytest
import torch

from cudnn_dsl.api import compile as compile_graph
from cudnn_dsl.torch_op.op import as_torch_op
from dsl.autodiff import derive
from dsl.diagnostics import DslError
from dsl.pipeline import program
from tests.helpers import ON_H200, TOL, autograd_grads, check_grads

PACKED = "examples/training/packed_qkv.cdg"
SMALL = {  # the example's [B, S, 3, H, D] = [2, 512, 3, 8, 64] at [2, 16, 3, 2, 8], the same layout
    "[2, 512, 3, 8, 64]": "[2, 16, 3, 2, 8]",
    "[2, 8, 512, 64]": "[2, 2, 16, 8]",
    "strides [786432, 64, 1536, 1]": "strides [768, 8, 48, 1]",
    "at 512": "at 16",
    "at 1024": "at 32",
}


def _small_packed() -> str:
    text = open(PACKED).read()
    for old, new in SMALL.items():
        text = text.replace(old, new)
    return text


def test_the_packed_qkv_backward_is_one_sdpa_backward_writing_into_one_gradient_buffer():
    g = program(PACKED).graph()
    d = derive(g, avoid=ON_H200)
    assert [n.op for n in d.backward.nodes] == ["sdpa_backward"]
    assert d.grads == (("qkv", "grad_qkv"),)
    assert ("qkv", "value", "qkv") in d.bind and ("grad_qkv", "buffer_grad", "qkv") in d.bind  # written whole
    assert [b.name for b in d.backward.buffers] == ["qkv", "grad_qkv"]
    placed = {o.name: d.backward.value(o.into).view for o in d.backward.outputs}
    assert placed == {f"grad_{v.name}": ("grad_qkv", v.view[1]) for v in g.views}  # the forward's offsets
    for v in g.views:  # read through the forward's views, not bound apart
        assert d.backward.value(v.name).view == v.view


def test_the_packed_qkv_gradient_matches_autograd_through_both_training_paths():
    text = _small_packed()
    check_grads(text, "cpu")  # autograd.differentiable
    cg = compile_graph(text=text)
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(2, 16, 3, 2, 8, generator=gen).bfloat16().requires_grad_()
    o = as_torch_op(cg)(qkv)  # the torch op's training path (GradOps)
    grad = torch.randn(o.shape, generator=gen).bfloat16()
    o.backward(grad)
    want = autograd_grads(cg.graph, cg.graph.instances[0], {"qkv": qkv.detach()}, {"o": grad})["qkv"]
    atol, rtol = TOL[torch.bfloat16]
    torch.testing.assert_close(qkv.grad.double(), want, atol=atol * want.abs().max().item(), rtol=rtol)


def _weights(views: str, body: str, buffer: str = "float[2, 8, 8]") -> str:
    return f"graph w {{\n  buffer ws : {buffer}\n{views}  input x : float[1, 4, 8]\n  {body}\n}}\n"


TWO = "  input wa : float[1, 8, 8] in ws at 0\n  input wb : float[1, 8, 8] in ws at 64\n"


def test_weights_in_one_buffer_get_their_gradients_in_one_and_are_read_transposed_through_views():
    text = _weights(TWO, "output y = matmul(matmul(x, wa), wb)")
    check_grads(text, "cpu")
    d = derive(program(text=text).graph(), avoid=ON_H200)
    assert d.grads == (("ws", "grad_ws"), ("x", "grad_x"))
    transposed = [v for v in d.backward.views if v.view[0] == "ws" and v.name.endswith("_t")]
    assert {v.view[1] for v in transposed} == {0, 64}  # x's gradient reads wa and wb transposed, in place
    assert not {"wa", "wb"} & {of for _, _, of in d.bind}  # the buffer is bound, not its views


def test_views_that_leave_part_of_a_buffer_unread_get_a_zeroed_gradient_buffer():
    text = _weights(TWO, "output y = matmul(x, wa) * 2.0", buffer="float[3, 8, 8]")
    check_grads(text, "cpu")  # wb and the third slot: zero
    d = derive(program(text=text).graph(), avoid=ON_H200)
    assert ("grad_ws", "buffer_grad_zeroed", "ws") in d.bind


@pytest.mark.parametrize(
    "views, met",
    [
        ("  input wa : float[1, 8, 8] in ws at 0\n  input wb : float[1, 8, 8] in ws at 32\n", "view 'wa'"),
        (
            "  input wa : float[1, 8, 8] strides [64, 0, 1] in ws at 0\n  input wb : float[1, 8, 8] in ws at 64\n",
            "itself",
        ),
    ],
)
def test_views_whose_gradients_would_meet_in_memory_are_a_located_error(views, met):
    g = program(text=_weights(views, "output y = matmul(matmul(x, wa), wb)")).graph()
    with pytest.raises(DslError, match=f"reaches an element that {met} reaches too") as e:
        derive(g, avoid=ON_H200)
    line = 3 if met == "itself" else 4
    assert e.value.diagnostics[0].loc.line == line
    derive(g, wrt=("x",), avoid=ON_H200)  # the buffer's gradient not asked: no error


def test_a_broadcast_views_gradient_is_summed_then_written_in_the_buffers_dtype():
    text = """graph b {
  io half
  compute float
  buffer p : half[2, 1, 8]
  input scale : half[1, 1, 8] in p at 0
  input shift : half[1, 1, 8] in p at 8
  input x : half[4, 3, 8]
  output y = x * scale + shift
}
"""
    check_grads(text, "cpu")
    d = derive(program(text=text).graph(), avoid=ON_H200)
    made = {n.outputs[0]: n.op for n in d.backward.nodes}
    for o in (d.backward.value(f"grad_{v}") for v in ("scale", "shift")):
        assert d.backward.instances[0].type(o.name).dtype == "half" and made[o.name] == "identity"  # of the float sum
