"""The torch op's host path on the CPU: the eager training path (torch_op.eager) against the registered ops, the
launch plans' check of a call's kind, and what torch.compile's CUDA graphs would refuse (computed from the traced
graphs by Inductor's own predicates, as `mode="reduce-overhead"` computes its skip reasons)."""

from __future__ import annotations

import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cudnn_dsl
from cudnn_dsl.torch_op import training
from cudnn_dsl.torch_op.eager import GraphFunction
from cudnn_dsl.torch_op.layout import LayoutWarning
from tests.graphs import BLOCK, block_in_torch, block_params


class Seen(TorchDispatchMode):
    """The cudnn_dsl ops a call dispatches, by name (everything runs as it would)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "cudnn_dsl":
            self.ops.append(func.name())
        return func(*args, **(kwargs or {}))


def _grads(op, x, params, g, alpha):
    y = op(x, *params.values(), alpha=alpha)
    return y, torch.autograd.grad(y, (x, *params.values()), g)


def test_an_eager_training_call_is_one_function_and_matches_the_registered_ops():
    """Eagerly, a call that wants gradients runs the derived graphs' ops from one autograd Function; under a dispatch
    mode it takes the registered augmented forward (and its backward op), with the same outputs and gradients, and
    both match torch's autograd of the same block."""
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=BLOCK))
    params = {k: v.requires_grad_() for k, v in block_params(4).items()}
    x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    g = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(2))
    y, got = _grads(op, x, params, g, 0.75)
    assert type(y.grad_fn).__name__ == GraphFunction.__name__ + "Backward"
    with Seen() as seen:
        y2, registered = _grads(op, x, params, g, 0.75)
    mask = "1" * 5
    assert f"cudnn_dsl::{op.name}_ad{mask}" in seen.ops and f"cudnn_dsl::{op.name}_bw{mask}" in seen.ops
    torch.testing.assert_close(y, y2, atol=0, rtol=0)
    for a, b in zip(got, registered):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    ref = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    x2 = x.detach().clone().requires_grad_()
    want_y = block_in_torch(x2, **ref, alpha=0.75)
    want = torch.autograd.grad(want_y, (x2, *ref.values()), g)
    torch.testing.assert_close(y, want_y)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_the_eager_path_keeps_one_shape_per_size_and_set_of_gradients():
    """A new size or another set of inputs wanting gradients is another shape of the path (a size seen again, the
    same one); a gradient only some inputs want reaches those alone. The op is one per process: other tests' shapes
    may be there too."""
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=BLOCK))
    params = block_params()
    w = params["w"].requires_grad_()

    def sizes(mask):
        return sorted(key[1][0][0] for key in op.eager.shapes if key[0] == mask)

    for n in (2, 4, 2):
        op(torch.randn(n, 8, 16), **params).sum().backward()
    assert sizes((False, True, False, False, False)) == [2, 4] and w.grad is not None
    assert all(params[k].grad is None for k in ("b", "gamma", "beta"))
    params["b"].requires_grad_()
    op(torch.randn(2, 8, 16), **params).sum().backward()
    assert 2 in sizes((False, True, True, False, False)) and params["b"].grad is not None


def test_the_registered_training_ops_run_the_shape_the_eager_path_bound(monkeypatch):
    """The augmented forward's and the backward's kernels (what compiled code calls) run a shape bound once
    (torch_op.bound), the one the eager path runs: no binding by name per call."""
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=BLOCK))
    params = {k: v.requires_grad_() for k, v in block_params(3).items()}
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(3), requires_grad=True)
    g = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(4))
    y, eager = _grads(op, x, params, g, 0.5)
    (shape,) = [s for (wants, sizes), s in op.eager.shapes.items() if all(wants) and sizes[0][0] == 2]

    def by_name(*args, **kwargs):
        raise AssertionError("a real kernel bound the backward by name")

    monkeypatch.setattr(training, "backward_inputs", by_name)
    with Seen() as seen:
        y2, registered = _grads(op, x, params, g, 0.5)
    assert f"cudnn_dsl::{op.name}_bw11111" in seen.ops
    assert shape in training.grad_ops(op, tuple(op.tensor_names))._bound.values()
    torch.testing.assert_close(y, y2, atol=0, rtol=0)
    for a, b in zip(eager, registered):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_a_kind_called_again_after_another_takes_its_own_plan():
    """The latest kind is told by a C++ check; another kind (other strides, or a tensor wanting a gradient under
    no_grad) falls back to the key, and each call runs on the plan of its own kind."""
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=BLOCK))
    params = block_params()
    x = torch.randn(2, 8, 16)
    x_t = x.transpose(0, 1).contiguous().transpose(0, 1)  # the same values, other strides: copied into the layout
    want = block_in_torch(x, **params)
    before = set(op.references.plans)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", LayoutWarning)
        for t in (x, x_t, x, x_t):
            torch.testing.assert_close(op(t, **params), want, atol=1e-5, rtol=1e-5)
        assert len(set(op.references.plans) - before) == 2
        params["w"].requires_grad_()  # the C++ check tells it apart; the key does not: the same plan
        torch.testing.assert_close(op(x, **params), want, atol=1e-5, rtol=1e-5)
    assert len(set(op.references.plans) - before) == 2


def test_reduce_overhead_finds_no_reason_to_skip_cuda_graphs_in_the_op_or_its_training_ops():
    """The forward and backward graphs AOT autograd traces through the op and its training ops hold no node that
    Inductor's CUDA graphs refuse (no op tagged cudagraph_unsafe or forbidden, no data-dependent size) and mutate no
    input: what `mode="reduce-overhead"` checks before it captures (torch._inductor.utils,
    cudagraph_utils; on CUDA it also refuses CPU tensors, the only reason it gives here)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.cudagraph_utils import get_input_storage_mutation_info
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=BLOCK))
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm)

    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep)
    params = {k: v.requires_grad_() for k, v in block_params(2).items()}
    compiled = torch.compile(lambda x, *p: op(x, *p).sum(), backend=backend, fullgraph=True)
    compiled(torch.randn(2, 8, 16), *params.values()).backward()
    with torch.no_grad():
        torch.compile(lambda x, *p: op(x, *p), backend=backend, fullgraph=True)(torch.randn(2, 8, 16), *params.values())
    assert len(graphs) == 3  # forward and backward of the training step, the no-grad call
    for gm in graphs:
        assert any("cudnn_dsl" in str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        assert get_first_incompatible_cudagraph_node(gm) is None
        assert not get_input_storage_mutation_info(gm).input_idxs
        placeholders = {n for n in gm.graph.nodes if n.op == "placeholder"}  # an input mutated: a copy_ into it
        assert not [n for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default and n.args[0] in placeholders]
