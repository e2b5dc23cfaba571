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
from functools import partial
from typing import Any

import torch

from cudnn_dsl.run.buffers import stride_problem
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.memory import allocator, empty
from cudnn_dsl.torch_op.layout import laid_out
from cudnn_dsl.torch_op.library import results
from cudnn_dsl.torch_op.training import BUFFER_GRADS, GRADS, VIEWS, GradOps


def eligible(tensors: Sequence) -> bool:
    """Whether a call may take the eager path: plain tensors, nothing tracing or intercepting the call."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack():
        return False
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    return all(type(t) in _PLAIN for t in tensors)


_PLAIN = (torch.Tensor, torch.nn.Parameter)
"""the tensor types the eager path takes (a Parameter passes a weight used as declared: a float norm scale)"""


class Shape:
    """One shape's training path for one set of gradients: the derived forward and backward ops, and where each of
    their arguments comes from, as indices."""

    def __init__(self, grads: GradOps, binding: dict):
        op = grads.op
        d, fwd, bwd = grads.shape(binding)
        self.fwd, self.bwd = fwd.overload, bwd.overload
        self.count = len(op.tensor_names)
        at = {n: k for k, n in enumerate(op.arg_names)}
        self.fwd_args = None if fwd.arg_names == op.arg_names else [at[n] for n in fwd.arg_names]
        """the forward's arguments as indices of the op's (None: the same)"""
        made = {n: k for k, n in enumerate(fwd.fresh)}
        self.outputs = [made[n] for n in op.fresh]
        """the op's outputs as indices of the forward's"""
        self.single = len(op.fresh) == 1
        sources = {**{n: ("arg", k) for n, k in at.items()}, **{n: ("out", k) for n, k in made.items()}}
        self.kept = [sources[n] for n in grads.kept]
        """each value the backward reads (training.values_read): an argument's index, or a forward output's"""
        kept_at = {n: k for k, n in enumerate(grads.kept)}
        out_at = {n: k for k, n in enumerate(op.fresh)}
        forward_types = d.forward.instances[0]
        declared = d.backward.instances[0]
        self.binds: list[tuple[str, Any, Any, tuple | None]] = []
        """per backward tensor argument, in its order: (where from, the source's index (a made buffer: its Derived.bind
        kind), its view (a made buffer: its type), declared strides or None where nothing is relaid)"""
        by_name = {name: (kind, of) for name, kind, of in d.bind}
        for name in bwd.tensor_names:
            kind, of = by_name[name]
            want = declared.type(name)
            strides = None if want.dtype == "bool" else tuple(want.strides)
            if kind in GRADS:
                self.binds.append(("grad", out_at[of], partial(GRADS[kind], shape=want.shape), strides))
            elif kind in BUFFER_GRADS:
                self.binds.append(("made", kind, forward_types.type(of), None))
            else:
                self.binds.append(("kept", kept_at[of], partial(VIEWS[kind], shape=want.shape), strides))
        self.zero_types = {out_at[of]: forward_types.type(of) for _, kind, of in d.bind if kind in GRADS}
        self.zeros: dict[tuple, torch.Tensor] = {}
        """(output index, device) -> a zero gradient, read only (the backward writes none of its inputs)"""
        scalars = {v.name: k for k, v in enumerate(op.scalars)}
        self.bwd_scalars = [scalars.get(v.name) for v in bwd.scalars]
        """per backward scalar, the op's scalar it is (None: its declared value)"""
        self.bwd_defaults = bwd.defaults
        bound = {n: k for k, n in enumerate(bwd.tensor_names)}
        fresh = {n: k for k, n in enumerate(bwd.fresh)}
        by_grad = dict(d.grads)
        self.grads = []
        """per op tensor argument: None, or (from the backward's outputs?, index, the argument's shape where the
        gradient is written in another, its dtype where in another), as training.input_gradient makes it"""
        for n in op.tensor_names:
            name = by_grad.get(n)
            if name is None:
                self.grads.append(None)
                continue
            want, have = forward_types.type(n), declared.type(name)
            shape = None if want.shape == have.shape else want.shape
            cast = None if want.dtype == have.dtype else torch_dtype(want.dtype)
            self.grads.append((name in fresh, fresh[name] if name in fresh else bound[name], shape, cast))

    def forward(self, args: tuple) -> tuple:
        values = args if self.fwd_args is None else tuple(args[k] for k in self.fwd_args)
        return results(self.fwd(*values))

    def saved(self, args: tuple, outs: tuple) -> list[torch.Tensor]:
        return [args[k] if where == "arg" else outs[k] for where, k in self.kept]

    def backward(self, kept: Sequence[torch.Tensor], grads: Sequence, scalars: tuple) -> tuple:
        device = kept[0].device if kept else next(g for g in grads if g is not None).device
        values = []
        for kind, k, make, strides in self.binds:
            if kind == "kept":
                t = make(kept[k])
            elif kind == "grad":
                g = grads[k]
                t = make(g if g is not None else self._zero(k, device))
            else:  # a buffer's gradient, made per call
                t = BUFFER_GRADS[k](empty(make, device))
            if strides is not None and t.stride() != strides and stride_problem(t.shape, t.stride(), strides):
                t = laid_out(t, strides)  # autograd's gradients are any layout
            values.append(t)
        values += [d if k is None else scalars[k] for k, d in zip(self.bwd_scalars, self.bwd_defaults)]
        made = results(self.bwd(*values))
        out = []
        for source in self.grads:
            if source is None:
                out.append(None)
                continue
            fresh, k, shape, cast = source
            g = made[k] if fresh else values[k]
            g = g if shape is None else g.reshape(shape)
            out.append(g if cast is None else g.to(cast))
        return tuple(out)

    def _zero(self, k: int, device: torch.device) -> torch.Tensor:
        zero = self.zeros.get((k, device))
        if zero is None:
            zero = self.zeros[k, device] = allocator(self.zero_types[k], device)().zero_()
        return zero


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
            binding = {k: int(v) for k, v in grads.binding(self.op.named(args)).items()}
            shape = self.shapes[key] = Shape(grads, binding)
        return GraphFunction.apply(shape, *args)
