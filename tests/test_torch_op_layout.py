"""The torch op's layout contract, on the CPU: an argument laid out otherwise than declared is copied into its
layout with one LayoutWarning, or refused by a strict op, alike on CPU tensors (the reference kernel), meta
tensors and fake tensors of either device (the fake kernel, as torch.compile traces a CUDA model); the ops'
stride tag, which keeps Inductor from choosing another layout; the autograd.Function path (differentiable), held to
the same contract. tests/gpu/test_torch_op_gpu.py holds the CUDA kernel to it."""

import contextlib
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cudnn_dsl
from cudnn_dsl.run.buffers import BindingError
from cudnn_dsl.torch_op.autograd import differentiable
from cudnn_dsl.torch_op.layout import LayoutWarning

COL = """
graph cm {
  input x : float[2, 16, 8] col_major
  input w : float[2, 8, 4]
  output y = matmul(x, w)
}
"""
WARNING = (
    "<string>:3:3: graph 'cm': 'x': expected strides [128, 1, 16], given [128, 8, 1]; copied into the declared "
    "layout on every call with these strides (as_torch_op(cg, strict=True) refuses it)"
)
WHERE = ["cpu", "meta", "fake cpu", "fake cuda"]
_SEEDS = iter(range(1000, 2000))


def fresh_op(text: str = COL, strict: bool = False):
    """An op of its own (another seed is another op), so that its warnings are not spent by another test."""
    return cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=text, seed=next(_SEEDS)), strict=strict)


def called_twice(op, where: str, *shapes):
    """The op called twice on row-major tensors of these shapes made at `where`: the LayoutWarnings it issued,
    and what the second call returned."""
    fake = where.startswith("fake")
    device = where.split()[-1]
    with FakeTensorMode() if fake else contextlib.nullcontext(), warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        args = [torch.randn(*s) if where == "cpu" else torch.empty(*s, device=device) for s in shapes]
        op(*args)
        out = op(*args)
    return [str(w.message) for w in got if issubclass(w.category, LayoutWarning)], out


@pytest.mark.parametrize("where", WHERE)
def test_a_misplaced_input_is_copied_with_one_warning_alike_everywhere(where):
    got, out = called_twice(fresh_op(), where, (2, 16, 8), (2, 8, 4))
    assert got == [WARNING]
    assert out.shape == (2, 16, 4) and out.device.type == where.split()[-1]


@pytest.mark.parametrize("where", WHERE)
def test_a_strict_op_refuses_a_misplaced_input_with_one_error_everywhere(where):
    with pytest.raises(BindingError, match=r"^'x': expected strides \[128, 1, 16\], given \[128, 8, 1\]$") as e:
        called_twice(fresh_op(strict=True), where, (2, 16, 8), (2, 8, 4))
    assert (e.value.loc.line, e.value.loc.col) == (3, 3)


def test_the_copy_is_the_declared_layout_and_inputs_in_it_pass_silently():
    op = fresh_op()
    x, w = torch.randn(2, 16, 8), torch.randn(2, 8, 4)
    with pytest.warns(LayoutWarning):
        torch.testing.assert_close(op(x, w), x @ w)
    col = x.transpose(1, 2).contiguous().transpose(1, 2)  # the same values, col_major
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(op(col, w), x @ w)


def test_an_input_written_in_place_is_copied_back_after_the_copy_is_written():
    text = "graph ip {\n  input x : float[4, 8]\n  input d : float[4, 8]\n  output y in x = x + d\n}\n"
    op = fresh_op(text)
    x, d = torch.randn(8, 4).t(), torch.randn(4, 8)  # x column-major, declared row-major
    want = x + d
    with pytest.warns(LayoutWarning, match="'x': expected strides \\[8, 1\\], given \\[1, 4\\]"):
        y = op(x, d)
    torch.testing.assert_close(x, want)
    assert y.data_ptr() == x.data_ptr()


def test_a_symbolic_size_is_traced_once_with_the_warning_and_no_specialization():
    text = "graph dyn {\n  dim T in 16..64 step 16\n  input x : float[1, T, 8]\n  input w : float[1, 8, 4]\n"
    text += "  output y = matmul(x, w)\n}\n"
    op = fresh_op(text)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    f = torch.compile(lambda x, w: op(x, w), backend=backend, fullgraph=True, dynamic=True)
    w = torch.randn(1, 8, 4)
    with pytest.warns(LayoutWarning) as got:
        for t in (16, 32, 48):
            x = torch.randn(1, 8, t).transpose(1, 2)  # strides [8 T, 1, T]: T-major, declared [8 T, 8, 1]
            torch.testing.assert_close(f(x, w), x @ w)
    assert len(graphs) == 1
    assert any("given [8*s" in str(w.message) for w in got)  # the trace's, in the symbolic size


def test_every_op_of_the_namespace_asks_for_exact_strides():
    op = fresh_op()
    x, w = torch.randn(2, 8, 16).transpose(1, 2).requires_grad_(), torch.randn(2, 8, 4)
    op(x, w).sum().backward()
    ops = [op.overload] + [getattr(torch.ops.cudnn_dsl, f"{op.name}_{k}10").default for k in ("ad", "bw")]
    assert all(torch.Tag.needs_exact_strides in o.tags for o in ops)


def test_inductor_passes_the_op_the_strides_eager_mode_gives_it():
    """x is computed in the compiled function: eager lays `a^T + b` out as a^T (col_major, as declared), Inductor
    free to choose lays it out row-major. With custom ops' default constraint made flexible, only the op's own tag
    keeps the strides, and a strict op's CPU kernel would refuse any others."""
    op = fresh_op(strict=True)
    a, b, w = torch.randn(2, 8, 16), torch.randn(2, 16, 8), torch.randn(2, 8, 4)
    f = lambda a, b, w: op(a.transpose(1, 2) + b, w)
    assert (a.transpose(1, 2) + b).stride() == (128, 1, 16)
    with torch._functorch.config.patch(custom_op_default_layout_constraint="flexible_layout"):
        got = torch.compile(f, backend="inductor", fullgraph=True)(a, b, w)
    torch.testing.assert_close(got, (a.transpose(1, 2) + b) @ w)


def test_opcheck_passes_on_the_op_the_docs_show_with_a_misplaced_input_and_gradients():
    op = fresh_op()
    x, w = torch.randn(2, 16, 8), torch.randn(2, 8, 4)
    with pytest.warns(LayoutWarning):
        torch.library.opcheck(op.overload, (x, w))
        torch.library.opcheck(op.overload, (x.requires_grad_(), w))
    torch.library.opcheck(getattr(torch.ops.cudnn_dsl, op.name), (x.transpose(1, 2).contiguous().transpose(1, 2), w))


# ---- the autograd.Function path (torch_op.autograd.differentiable): the same contract ---------------------


def fresh_differentiable(text: str = COL, strict: bool = False):
    return differentiable(text=text, seed=next(_SEEDS), strict=strict)


def test_the_differentiable_path_copies_a_misplaced_input_with_one_warning_and_its_gradient_flows():
    f = fresh_differentiable()
    x, w = torch.randn(2, 16, 8, requires_grad=True), torch.randn(2, 8, 4)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        f(x=x, w=w)
        f(x=x, w=w)["y"].sum().backward()
    assert [str(g.message) for g in got if issubclass(g.category, LayoutWarning)] == [
        WARNING.replace("as_torch_op(cg, strict=True)", "differentiable(..., strict=True)")
    ]
    torch.testing.assert_close(x.grad, torch.ones(2, 16, 4) @ w.transpose(1, 2))


def test_a_strict_differentiable_refuses_a_misplaced_input_as_the_op_does():
    f = fresh_differentiable(strict=True)
    with pytest.raises(BindingError, match=r"^'x': expected strides \[128, 1, 16\], given \[128, 8, 1\]$") as e:
        f(x=torch.randn(2, 16, 8), w=torch.randn(2, 8, 4))
    assert (e.value.loc.line, e.value.loc.col) == (3, 3)


@pytest.mark.parametrize("grad", [False, True])
def test_the_differentiable_path_copies_an_input_written_in_place_back(grad):
    """x is a running statistic: written in place, no gradient of it (d's flows through z)."""
    text = "graph ip {\n  input x : float[4, 8]\n  input d : float[4, 8]\n  output y in x = x + 1\n"
    text += "  output z = d * 2\n}\n"
    f = fresh_differentiable(text)
    x, d = torch.randn(8, 4).t(), torch.randn(4, 8, requires_grad=grad)  # x column-major, declared row-major
    want = x + 1
    with pytest.warns(LayoutWarning, match="'x': expected strides \\[8, 1\\], given \\[1, 4\\]"):
        got = f(x=x, d=d)
    torch.testing.assert_close(x, want)
    torch.testing.assert_close(got["y"], want)
    if grad:
        got["z"].sum().backward()
        torch.testing.assert_close(d.grad, torch.full((4, 8), 2.0))
