"""A compiled graph with a derived backward, as a torch.autograd.Function.

    f = cudnn_dsl.torch_op.autograd.differentiable("examples/conv_bias_relu.cdg")
    out = f(x=x, w=w, b=b)["out"]   # x, w, b may require grad
    out.sum().backward()

The forward runs the augmented forward graph (dsl.autodiff: the graph, also outputting the values
the backward reads), saves those values, and the backward runs the derived backward graph. Both
are compiled from the checked derived graphs with the graph's options, one pair per shape of the graph (a
forward that saves nothing more than the graph's outputs is the graph as compiled, plans and all).
Gradients are derived for the inputs that require grad; with none (or under no_grad) the graph runs as
written. Without a GPU both run their PyTorch references (the same graphs, the same bindings).
A graph's torch op (cudnn_dsl.torch_op.op) derives the same graphs for inputs that require grad, as torch
ops of their own with torch.library.register_autograd (torch_op.training.GradOps), so that torch.compile
traces them; this Function is the path for a graph written in place (running statistics), which has no
torch-op backward. Both bind the backward graph from one table of views (torch_op.bound), and both hold their
arguments to one layout contract (torch_op.layout): one laid out otherwise than declared is copied into its
layout with a one-time LayoutWarning (a buffer written in place copied back after the call), or refused by a
`strict` one, on every device.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from cudnn_dsl import api
from cudnn_dsl.run.buffers import check_inputs, view
from cudnn_dsl.run.compiled import Calls, CompiledGraph
from cudnn_dsl.target.quirks import backward_avoid, library_version
from cudnn_dsl.torch_op.layout import Layouts, laid_out
from cudnn_dsl.torch_op.training import backward_inputs, grads_read, input_gradient, values_read
from dsl.autodiff import Derived, derive
from dsl.ir import Graph


def runner(cg: CompiledGraph) -> Callable[[dict], dict[str, torch.Tensor]]:
    """Tensors by name -> every output by name: on the GPU the compiled graph through its launch plans (each kind
    of arguments checked in full once); without one, its reference."""
    return Calls(cg) if cg.device is not None else cg.reference


def _placed(graph: Graph, bound: dict, out: dict) -> dict:
    """The bound tensors and a run's outputs by name, each output in place copied into its window where the run
    returned it apart (the reference does; cuDNN writes it there): a buffer's gradient holds its views'."""
    inst = graph.instances[0]
    for v in graph.in_place:
        window = view(graph.value(v.into), inst, bound)
        if out[v.name].data_ptr() != window.data_ptr():
            window.copy_(out[v.name])
    return {**bound, **out}


class Pair:
    """The derived graphs of one shape, compiled with the original's options, on its device; `run_forward` and
    `run_backward` run them (`runner`)."""

    def __init__(self, derived: Derived, original: CompiledGraph, run_original):
        self.derived = derived
        device = original.device if original.device is not None else "cpu"
        same = {v.name for v in derived.forward.outputs} == {v.name for v in original.graph.outputs}
        # nothing saved beyond the graph's own outputs: the graph as compiled already (its plans)
        self.forward = original if same else CompiledGraph(derived.forward, original.options, device)
        self.backward = CompiledGraph(derived.backward, original.options, device)
        self.run_forward = run_original if same else runner(self.forward)
        self.run_backward = runner(self.backward)


class Differentiable:
    """A graph whose outputs torch autograd can differentiate, through a derived backward graph."""

    def __init__(self, cg: CompiledGraph, strict: bool = False):
        self.cg = cg
        self.run = runner(cg)
        self.graph = cg.graph
        self._pairs: dict[tuple, Pair] = {}
        self.outputs = tuple(v.name for v in self.graph.outputs)
        self.tensor_inputs = tuple(v.name for v in self.graph.device_inputs)
        self.layouts = Layouts(self.graph, self.tensor_inputs, strict, "differentiable(..., strict=True)")
        self._misplaced: dict[tuple, dict[str, tuple]] = {}
        """each kind of arguments (names, shapes, strides, dtypes, devices) -> those to copy: decided once"""

    def misplaced(self, tensors: dict) -> dict[str, tuple]:
        """name -> declared strides of each argument laid out otherwise (names, shapes and dtypes checked
        first, as the reference checks them); a strict graph raises a BindingError instead."""
        kind = tuple(
            (k, tuple(t.shape), t.stride(), t.dtype, t.device)
            for k, t in tensors.items()
            if isinstance(t, torch.Tensor)
        )
        if kind not in self._misplaced:
            check_inputs(self.graph, self.cg.instance_for(tensors), tensors, None)
            self._misplaced[kind] = self.layouts.misplaced(tensors)
        return self._misplaced[kind]

    @property
    def device(self) -> torch.device | str:
        return self.cg.device if self.cg.device is not None else "cpu"

    def pair(self, tensors: dict, wrt: tuple[str, ...]) -> Pair:
        """The graphs derived for this shape and these inputs' gradients, compiled on first use."""
        inst = self.cg.instance_for(tensors)
        if (inst.binding, wrt) not in self._pairs:
            self._pairs[inst.binding, wrt] = Pair(
                derive(self.graph, inst, wrt, avoid=backward_avoid(library_version())), self.cg, self.run
            )
        return self._pairs[inst.binding, wrt]

    def forward_outputs(
        self, tensors: dict, wrt: tuple[str, ...]
    ) -> tuple[Pair, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(the graphs of this shape, the graph's outputs, every tensor the backward reads) for these inputs,
        the gradients of `wrt` wanted."""
        pair = self.pair(tensors, wrt)
        outs = self.written(tensors, pair.run_forward(tensors))
        values = {**tensors, **outs}
        return pair, {o: outs[o] for o in self.outputs}, {of: values[of] for of in values_read(pair.derived)}

    def written(self, tensors: dict, outs: dict) -> dict[str, torch.Tensor]:
        """A run's outputs, each in place the input object itself (autograd marks it dirty), what the reference
        returned apart copied into it."""
        for v in self.graph.in_place:
            if outs[v.name].data_ptr() != tensors[v.into].data_ptr():
                tensors[v.into].copy_(outs[v.name])
            outs[v.name] = tensors[v.into]
        return outs

    def backward_grads(self, pair: Pair, kept: dict, grads: dict, scalars: dict) -> dict[str, torch.Tensor | None]:
        """The gradient of every tensor input (None where none flows), from the outputs' gradients
        (None: zero), what forward_outputs kept, and the scalars the forward was given."""
        bound = backward_inputs(pair.derived, kept, grads, scalars, self.device)
        out = _placed(pair.backward.graph, bound, pair.run_backward(bound))
        named, types = dict(pair.derived.grads), pair.derived.forward.instances[0]
        return {i: input_gradient(out[named[i]], types.type(i)) if i in named else None for i in self.tensor_inputs}

    def __call__(self, tensors: dict | None = None, /, **named) -> dict[str, torch.Tensor]:
        given = dict(tensors if tensors is not None else named)
        laid = self.misplaced(given)
        if not laid:
            return self._call(given)
        tensors = {k: laid_out(t, laid[k]) if k in laid else t for k, t in given.items()}
        outs = self._call(tensors)
        for v in self.graph.in_place:  # the caller's buffer holds what was written into its copy
            if v.into in laid:
                given[v.into].copy_(tensors[v.into])
        return outs

    def _call(self, tensors: dict) -> dict[str, torch.Tensor]:
        names = tuple(k for k in tensors if isinstance(tensors[k], torch.Tensor))
        scalars = {k: v for k, v in tensors.items() if k not in names}
        wrt = tuple(k for k in names if tensors[k].requires_grad)
        if not (wrt and torch.is_grad_enabled()):  # no gradient wanted: the graph as written
            outs = self.written(tensors, self.run(tensors))
            return {o: outs[o] for o in self.outputs}
        results = GraphFunction.apply(self, names, scalars, *(tensors[k] for k in names))
        return dict(zip(self.outputs, results))


class GraphFunction(torch.autograd.Function):
    """forward: the augmented forward graph; backward: the derived backward graph."""

    @staticmethod
    def forward(ctx, diff: Differentiable, names: tuple, scalars: dict, *tensors):
        inputs = {**dict(zip(names, tensors)), **scalars}
        wrt = tuple(n for n, t in zip(names, tensors) if t.requires_grad)
        pair, outs, kept = diff.forward_outputs(inputs, wrt)
        ctx.diff, ctx.pair, ctx.names, ctx.scalars, ctx.kept_names = diff, pair, names, scalars, tuple(kept)
        ctx.save_for_backward(*kept.values())
        wanted = grads_read(pair.derived)
        ctx.mark_dirty(*(inputs[v.into] for v in diff.graph.in_place))
        ctx.mark_non_differentiable(*(t for o, t in outs.items() if o not in wanted))
        return tuple(outs.values())

    @staticmethod
    def backward(ctx, *grads):
        kept = dict(zip(ctx.kept_names, ctx.saved_tensors))
        got = ctx.diff.backward_grads(ctx.pair, kept, dict(zip(ctx.diff.outputs, grads)), ctx.scalars)
        return (None, None, None, *(got.get(n) for n in ctx.names))


def differentiable(
    source: str | os.PathLike | None = None,
    graph: str | None = None,
    device=None,
    *,
    text: str | None = None,
    strict: bool = False,
    **options,
) -> Differentiable:
    """Like cudnn_dsl.compile, a graph whose outputs torch autograd differentiates (derived backward). An
    argument laid out otherwise than declared is copied into its layout with a LayoutWarning, or with `strict`
    refused (a BindingError), on every device, as for the graph's torch op."""
    return Differentiable(api.compile(source, graph, device, text=text, **options), strict)
