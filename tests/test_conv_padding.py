"""Convolutions whose padding differs at the start and the end of a dim (`pre_padding` / `post_padding`): the
language's rules, the references of conv_fprop, conv_dgrad and conv_wgrad against an independent formulation
(the image written into a larger zero tensor, then convolved without padding) and torch autograd through it, the
derived backward, and deviceless planning for an H200.

The checks take a device: tests/gpu/test_conv_padding_gpu.py runs them on the GPU, where cuDNN computes what
the reference computes here."""

import pytest
import torch
import torch.nn.functional as F

from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import run_reference
from cudnn_dsl.target.dtypes import from_torch as language_dtype
from cudnn_dsl.target.dtypes import tolerance
from dsl.diagnostics import DslError
from dsl.pipeline import program
from tests.helpers import TOL

PRE, POST, STRIDE = [1, 0], [2, 1], [2, 1]
GEOMETRY = "pre_padding=[1, 0], post_padding=[2, 1], stride=[2, 1]"


def padded_conv(x, w, pre, post, stride):
    """A convolution of x zero-padded by `pre` before and `post` after each spatial dim: x written into the
    middle of a zero tensor of the padded size, convolved with no padding."""
    size = [h + a + b for h, a, b in zip(x.shape[2:], pre, post)]
    padded = x.new_zeros(*x.shape[:2], *size)
    padded[(slice(None), slice(None), *(slice(a, a + h) for a, h in zip(pre, x.shape[2:])))] = x
    return F.conv2d(padded, w, stride=stride)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """`got` against the float64 `want`, with the tolerances of got's dtype, atol scaled by the largest element: on
    the CPU the derived backward's, on a GPU run's (cuDNN's float convolutions may take TF32's inputs)."""
    atol, rtol = TOL[got.dtype] if got.device.type == "cpu" else tolerance(language_dtype(got.dtype))
    got = got.detach().cpu().double()
    torch.testing.assert_close(got, want, atol=atol * max(1.0, want.abs().max().item()), rtol=rtol)


# ---- the language's rules -------------------------------------------------------------------------


def graph_text(dtype: str = "float", layout: str = "") -> str:
    """The three ops at one geometry: x [2, 8, 9, 8] and w [16, 8, 3, 3] give y [2, 16, 5, 7]; dy is y's size."""
    return (
        f"graph c {{\n  input x : {dtype}[2, 8, 9, 8]{layout}\n  input w : {dtype}[16, 8, 3, 3]{layout}\n"
        f"  input dy : {dtype}[2, 16, 5, 7]{layout}\n"
        f"  output y = conv_fprop(x, w, {GEOMETRY})\n"
        f"  output dx = conv_dgrad(dy, w, {GEOMETRY}, output_padding=[1, 0])\n"
        f"  output dw = conv_wgrad(x, dy, {GEOMETRY}, filter=[3, 3])\n}}\n"
    )


ONE_CONV = (
    "graph c {\n  input x : float[1, 8, 9, 9] nhwc\n  input w : float[8, 8, 3, 3] nhwc\n"
    "  output y = conv_fprop(x, w, {call})\n}\n"
)


def test_the_sides_set_the_result_size():
    g = program(text=graph_text()).graphs[0]
    inst = g.instances[0]
    assert [inst.type(n).shape for n in ("y", "dx", "dw")] == [(2, 16, 5, 7), (2, 8, 9, 8), (16, 8, 3, 3)]
    assert inst.attrs(0) == {"pre_padding": (1, 0), "post_padding": (2, 1), "stride": (2, 1), "dilation": (1, 1)}


def test_padding_is_both_sides_alike_and_one_graph_with_them():
    one = ONE_CONV.replace("{call}", "%s")
    forms = ["padding=1", "padding=[1, 1]", "pre_padding=1, post_padding=1", "padding=0, pre_padding=1, post_padding=1"]
    graphs = [program(text=one % f).graphs[0] for f in forms]
    assert all(g == graphs[0] for g in graphs)
    side = program(text=one % "pre_padding=[2, 1]").graphs[0]
    assert side.instances[0].attrs(0)["post_padding"] == (0, 0)  # the side not given is `padding`'s: 0


@pytest.mark.parametrize(
    "call,words",
    [
        ("padding=1, pre_padding=[0, 0]", "give 'padding' (both sides alike) or 'pre_padding'"),
        ("post_padding=[1, 2, 3]", "'post_padding' has 3 values, the input has 2 spatial dims"),
        ("pre_padding=-1", "pre_padding"),
    ],
)
def test_padding_given_twice_or_of_the_wrong_rank_is_a_located_error(call, words):
    text = ONE_CONV.replace("{call}", call)
    with pytest.raises(DslError) as e:
        program(text=text, file="c.cdg")
    assert words in str(e.value)
    [err] = [d for d in e.value.diagnostics if d.severity == "error"]
    assert err.loc.line == 4 and err.loc.col > text.splitlines()[3].index("conv_fprop")


# ---- the references and the derived backward, against padded_conv ------------------------------------------


def run_on(device: str, text: str, ins: dict) -> dict:
    """The graph's outputs on `device`: its reference on the CPU, cuDNN's graphs on a GPU."""
    g = program(text=text).graphs[0]
    if device == "cpu":
        return run_reference(g, g.instances[0], ins, "cpu")
    import cudnn_dsl

    return cudnn_dsl.compile(text=text, device=device)(ins)


def check_ops(device: str, dtype: str = "float", layout: str = " nhwc") -> None:
    """conv_fprop against padded_conv, conv_dgrad and conv_wgrad against autograd's gradients of it for dy."""
    text = graph_text(dtype, layout)
    g = program(text=text).graphs[0]
    ins = generate_inputs(g, g.instances[0], device, seed=1)
    out = run_on(device, text, ins)
    x, w, dy = (ins[n].detach().cpu().double().requires_grad_() for n in ("x", "w", "dy"))
    y = padded_conv(x, w, PRE, POST, STRIDE)
    y.backward(dy)
    close(out["y"], y.detach())
    close(out["dx"], x.grad)
    close(out["dw"], w.grad)


def test_each_op_is_the_convolution_of_the_padded_image():
    check_ops("cpu")


def check_derived_backward(device: str, dtype: str = "float", layout: str = " nhwc") -> None:
    """The derived backward of conv_fprop (dgrad and wgrad at its padding) against autograd through padded_conv;
    the padding's sides differ, so a backward that padded both alike would fail (the sizes alone differ)."""
    from cudnn_dsl.torch_op.autograd import differentiable

    text = (
        f"graph c {{\n  input x : {dtype}[2, 8, 9, 8]{layout}\n  input w : {dtype}[16, 8, 3, 3]{layout}\n"
        f"  output y = conv_fprop(x, w, {GEOMETRY})\n}}\n"
    )
    f = differentiable(text=text, device=device)
    ins = generate_inputs(f.graph, f.graph.instances[0], device, seed=2)
    leaves = {k: v.requires_grad_() for k, v in ins.items()}
    out = f(leaves)["y"]
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.dtype).to(device)
    out.backward(dy)
    x, w = (ins[n].detach().cpu().double().requires_grad_() for n in ("x", "w"))
    y = padded_conv(x, w, PRE, POST, STRIDE)
    close(out.detach(), y.detach())
    y.backward(dy.cpu().double())
    close(leaves["x"].grad, x.grad)
    close(leaves["w"].grad, w.grad)


def test_the_derived_backward_is_autograd_through_the_padded_convolution():
    check_derived_backward("cpu")


def test_the_derived_backward_keeps_each_side():
    from dsl.autodiff import derive

    text = (
        "graph c {\n  input x : float[2, 8, 9, 8]\n  input w : float[16, 8, 3, 3]\n"
        f"  output y = conv_fprop(x, w, {GEOMETRY})\n}}\n"
    )
    d = derive(program(text=text).graphs[0], avoid=lambda *a: None)
    assert [n.op for n in d.backward.nodes] == ["conv_dgrad", "conv_wgrad"]
    for index in range(2):
        a = d.backward.instances[0].attrs(index)
        assert (a["pre_padding"], a["post_padding"]) == ((1, 0), (2, 1))


# ---- deviceless: cuDNN 9.28 plans each op for an H200 -----------------------------------------------------


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target

    return Target.named("h200")


@pytest.mark.parametrize("output", ["y", "dx", "dw"])
def test_h200_plans_each_op_with_padding_whose_sides_differ(output, h200):
    from cudnn_dsl.build.pipeline import compile_shape

    lines = graph_text("half", " nhwc").splitlines()
    keep = [line for line in lines if not line.lstrip().startswith("output") or f"output {output} " in line]
    g = program(text="\n".join(keep) + "\n").graphs[0]
    lowered = compile_shape(g, g.instances[0], g.options, h200)
    assert lowered.plan_count >= 1
