"""One shape of a graph op's training path, bound once: the derived forward and backward ops, and where each of their
arguments comes from, as indices, so that a call's work is index lookups.

Both training paths run a shape through it: the eager one (torch_op.eager's Function) and the kernels of the torch
ops that torch.compile traces (training.GradOps). The Derived.bind kinds of the backward's inputs, and the views
they are bound as, are here too (training.backward_inputs binds by them per call, for the paths that bind by name).
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

VIEWS = {
    "value": lambda t, shape: t,
    "transposed": lambda t, shape: t.transpose(-1, -2),
    "flat_transposed": lambda t, shape: t.reshape(*(1,) * (t.dim() - 2), -1, t.shape[-1]).transpose(-1, -2),
    "rows": lambda t, shape: t.reshape(shape),
}
"""the Derived.bind kinds of a forward value the backward reads, each with the view of it that is bound, given the
backward's declared shape (derive declares a flattened value only where its declared strides make it a view; a
value laid out otherwise, an input the forward copied into its layout, is copied into the backward's:
backward_inputs)"""
GRADS = {"grad": VIEWS["value"], "grad_transposed": VIEWS["transposed"], "grad_rows": VIEWS["rows"]}
"""the Derived.bind kinds of an output's gradient (as given, transposed, or in another shape), each with its view"""
BUFFER_GRADS = {"buffer_grad": lambda t: t, "buffer_grad_zeroed": torch.Tensor.zero_}
"""the Derived.bind kinds of a buffer's gradient, each with how its memory is made ready: the backward writes the
one whole, the other in part (the rest is zero)"""


class Shape:
    """One shape's training path for one set of gradients: the derived forward and backward ops, and where each of
    their arguments comes from, as indices. Each op runs `via` its overload (the dispatcher: the eager path) or one
    of its kernels (`cuda_kernel`, `cpu_kernel`: from inside the training ops' own kernels, already dispatched)."""

    def __init__(self, grads, binding: dict):
        """`grads`: the graph op's training.GradOps for this set of gradients; `binding`: the shape's dims."""
        op = grads.op
        d, fwd, bwd = grads.shape(binding)
        self.fwd, self.bwd = fwd, bwd
        self.count = len(op.tensor_names)
        at = {n: k for k, n in enumerate(op.arg_names)}
        self.fwd_args = None if fwd.arg_names == op.arg_names else [at[n] for n in fwd.arg_names]
        """the forward's arguments as indices of the op's (None: the same)"""
        made = {n: k for k, n in enumerate(fwd.fresh)}
        self.outputs = [made[n] for n in op.fresh]
        """the op's outputs as indices of the forward's"""
        self.single = len(op.fresh) == 1
        self.returned = [made[n] for n in (*op.fresh, *grads.saved)]
        """what the augmented forward op returns (GradOps), as indices of the forward's outputs"""
        self.wrt = [op.tensor_names.index(n) for n in grads.grads]
        """what the backward op returns (GradOps: the gradients in the derivation's order), as indices of backward's"""
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

    def forward(self, args: tuple, via: str = "overload") -> tuple:
        values = args if self.fwd_args is None else tuple(args[k] for k in self.fwd_args)
        return results(getattr(self.fwd, via)(*values))

    def saved(self, args: tuple, outs: tuple) -> list[torch.Tensor]:
        return [args[k] if where == "arg" else outs[k] for where, k in self.kept]

    def backward(self, kept: Sequence[torch.Tensor], grads: Sequence, scalars: tuple, via: str = "overload") -> tuple:
        """Per op tensor argument, its gradient or None. A gradient not given reads a zero kept across calls on the
        eager path, and a fresh one from a kernel (compiled code's calls may be a CUDA graph's capture or warm-up,
        whose allocations belong to the graph's pool: a zero kept from one would be a block the graph does not
        track)."""
        device = kept[0].device if kept else next(g for g in grads if g is not None).device
        values = []
        for kind, k, make, strides in self.binds:
            if kind == "kept":
                t = make(kept[k])
            elif kind == "grad":
                g = grads[k]
                t = make(g if g is not None else self._zero(k, device, keep=via == "overload"))
            else:  # a buffer's gradient, made per call
                t = BUFFER_GRADS[k](empty(make, device))
            if strides is not None and t.stride() != strides and stride_problem(t.shape, t.stride(), strides):
                t = laid_out(t, strides)  # autograd's gradients are any layout
            values.append(t)
        values += [d if k is None else scalars[k] for k, d in zip(self.bwd_scalars, self.bwd_defaults)]
        made = results(getattr(self.bwd, via)(*values))
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

    def _zero(self, k: int, device: torch.device, keep: bool) -> torch.Tensor:
        zero = self.zeros.get((k, device)) if keep else None
        if zero is None:
            zero = allocator(self.zero_types[k], device)().zero_()
            if keep:
                self.zeros[k, device] = zero
        return zero
