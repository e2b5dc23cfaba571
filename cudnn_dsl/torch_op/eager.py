"""The eager training path of a graph op: one torch.autograd.Function whose forward and backward call the derived
graphs' ops directly, with every name, view and source worked out once per shape.

A graph op called eagerly on inputs that want gradients would otherwise go through the dispatcher to the augmented
forward op (training.GradOps), whose autograd kernel (torch.library.register_autograd) wraps it in a generated
Function, fills its defaults, and whose kernels bind the graphs by name on every call; the backward goes through a
second op taking lists. Here the same derived graphs run, through the same ops (`fwd.overload`, `bwd.overload`: their
launch plans, their checks on a new kind of arguments), from a Function whose per-call work is index lookups.

Taken only where nothing else sees the call: not while torch.compile traces (dynamo and AOTAutograd trace the
registered ops, whose autograd they know), not under a torch function or dispatch mode or a functorch transform
(they see the registered ops as before), and only for plain tensors and parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cudnn_dsl.torch_op.bound import Shape


def eligible(tensors: Sequence) -> bool:
    """Whether a call may take the eager path: plain tensors, nothing tracing or intercepting the call."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack():
        return False
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    return all(type(t) in _PLAIN for t in tensors)


_PLAIN = (torch.Tensor, torch.nn.Parameter)
"""the tensor types the eager path takes (a Parameter passes a weight used as declared: a float norm scale)"""


class GraphFunction(torch.autograd.Function):
    """forward: the derived forward op; backward: the derived backward op (a Shape's)."""

    @staticmethod
    def forward(ctx, shape: Shape, *args):
        outs = shape.forward(args)
        ctx.shape, ctx.scalars = shape, args[shape.count :]
        ctx.set_materialize_grads(False)  # a gradient never given stays None: the backward reads a kept zero
        ctx.save_for_backward(*shape.saved(args, outs))
        return outs[shape.outputs[0]] if shape.single else tuple(outs[k] for k in shape.outputs)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *ctx.shape.backward(ctx.saved_tensors, grads, ctx.scalars), *(None,) * len(ctx.scalars))


class Eager:
    """The eager training path of one graph op: a Shape per (which arguments want a gradient, their sizes)."""

    def __init__(self, op):
        self.op = op
        self.shapes: dict[tuple, Shape] = {}

    def __call__(self, args: tuple, grads_of):
        """The op's outputs for `args` (positional, scalars filled), through GraphFunction; `grads_of(wrt)` is the
        op's GradOps for those gradients."""
        tensors = args[: len(self.op.tensor_names)]
        key = (tuple([t.requires_grad for t in tensors]), tuple([t.shape for t in tensors]))
        shape = self.shapes.get(key)
        if shape is None:
            wrt = tuple(n for n, t in zip(self.op.tensor_names, tensors) if t.requires_grad)
            grads = grads_of(wrt)
            shape = self.shapes[key] = grads.bound(grads.binding(self.op.named(args)))
        return GraphFunction.apply(shape, *args)
