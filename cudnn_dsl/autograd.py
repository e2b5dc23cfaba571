"""API layer: a compiled graph with a derived backward, as a torch.autograd.Function.

    f = cudnn_dsl.autograd.differentiable("examples/conv_bias_relu.cdg")
    out = f(x=x, w=w, b=b)["out"]   # x, w, b may require grad
    out.sum().backward()

The forward runs the augmented forward graph (dsl.autodiff: the graph, also outputting the values
the backward reads), saves those values, and the backward runs the derived backward graph. Both
are compiled with cudnn_dsl.compile from their derived .cdg text, one pair per shape of the graph (a
forward that saves nothing more than the graph's outputs is the graph as compiled, plans and all).
Gradients are derived for the inputs that require grad; with none (or under no_grad) the graph runs as
written. Without a GPU both run their PyTorch references (the same graphs, the same bindings).
`forward_outputs` and `backward_grads` are the two halves, for torch.library.register_autograd.
"""

from __future__ import annotations

import os
import warnings

import torch

from cudnn_dsl import api
from cudnn_dsl.runtime import CompiledGraph
from cudnn_dsl.tensors import empty
from cudnn_dsl.torch_op import NAMESPACE, _library, _returned, as_torch_op
from dsl.autodiff import Derived, derive


class Pair:
    """The derived graphs of one shape, compiled."""

    def __init__(self, derived: Derived, original: CompiledGraph, options: dict):
        self.derived = derived
        device = original.device if original.device is not None else "cpu"
        same = {v.name for v in derived.forward.outputs} == {v.name for v in original.graph.outputs}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", api.DslWarning)  # derived text: nothing for the user to fix
            # nothing saved beyond the graph's own outputs: the graph as compiled already (its plans)
            self.forward = original if same else api.compile(text=derived.forward_text, device=device, **options)
            self.backward = api.compile(text=derived.backward_text, device=device, **options)

    @staticmethod
    def run(cg: CompiledGraph, tensors: dict) -> dict[str, torch.Tensor]:
        """On the GPU the compiled graph; without one, its reference."""
        return cg(tensors) if cg.device is not None else cg.reference(tensors)


class Differentiable:
    """A graph whose outputs torch autograd can differentiate, through a derived backward graph."""

    def __init__(self, cg: CompiledGraph, options: dict | None = None):
        self.cg = cg
        self.graph = cg.graph
        self.options = options or {}
        self._pairs: dict[tuple, Pair] = {}
        self.outputs = tuple(v.name for v in self.graph.outputs)
        self.tensor_inputs = tuple(v.name for v in self.graph.device_inputs)

    @property
    def device(self) -> torch.device | str:
        return self.cg.device if self.cg.device is not None else "cpu"

    def pair(self, tensors: dict, wrt: tuple[str, ...]) -> Pair:
        """The graphs derived for this shape and these inputs' gradients, compiled on first use."""
        inst = self.cg.instance_for(tensors)
        if (inst.binding, wrt) not in self._pairs:
            self._pairs[inst.binding, wrt] = Pair(derive(self.graph, inst, wrt), self.cg, self.options)
        return self._pairs[inst.binding, wrt]

    def forward_outputs(
        self, tensors: dict, wrt: tuple[str, ...]
    ) -> tuple[Pair, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(the graphs of this shape, the graph's outputs, every tensor the backward reads) for these inputs,
        the gradients of `wrt` wanted."""
        pair = self.pair(tensors, wrt)
        outs = Pair.run(pair.forward, tensors)
        for v in self.graph.in_place:  # the input object itself (autograd marks it dirty); the reference's copied in
            if outs[v.name].data_ptr() != tensors[v.into].data_ptr():
                tensors[v.into].copy_(outs[v.name])
            outs[v.name] = tensors[v.into]
        values = {**tensors, **outs}
        keep = {of: values[of] for _, kind, of in pair.derived.bind if kind in ("value", "transposed")}
        return pair, {o: outs[o] for o in self.outputs}, keep

    def backward_grads(self, pair: Pair, kept: dict, grads: dict, scalars: dict) -> dict[str, torch.Tensor | None]:
        """The gradient of every tensor input (None where none flows), from the outputs' gradients
        (None: zero), what forward_outputs kept, and the scalars the forward was given."""
        bwd = pair.backward
        device = self.device
        bound: dict = {}
        for name, kind, of in pair.derived.bind:
            if kind in ("grad", "grad_transposed"):
                t = pair.derived.forward.instances[0].type(of)
                g = grads.get(of)
                if g is None or tuple(g.stride()) != t.strides:  # cuDNN reads the declared layout
                    g = empty(t, device).copy_(g) if g is not None else empty(t, device).zero_()
                grads[of] = g
                value = g.transpose(-1, -2) if kind == "grad_transposed" else g
            else:
                value = kept[of].transpose(-1, -2) if kind == "transposed" else kept[of]
            bound[name] = value
        for v in bwd.graph.of_kind("scalar"):
            if v.name in scalars:
                bound[v.name] = scalars[v.name]
        out = Pair.run(bwd, bound)
        named = dict(pair.derived.grads)
        return {i: out[named[i]] if i in named else None for i in self.tensor_inputs}

    def __call__(self, tensors: dict | None = None, /, **named) -> dict[str, torch.Tensor]:
        tensors = dict(tensors if tensors is not None else named)
        names = tuple(k for k in tensors if isinstance(tensors[k], torch.Tensor))
        scalars = {k: v for k, v in tensors.items() if k not in names}
        wrt = tuple(k for k in names if tensors[k].requires_grad)
        if not (wrt and torch.is_grad_enabled()):  # no gradient wanted: the graph as written
            outs = Pair.run(self.cg, tensors)
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
        graded = {of for _, kind, of in pair.derived.bind if kind in ("grad", "grad_transposed")}
        ctx.mark_dirty(*(inputs[v.into] for v in diff.graph.in_place))
        ctx.mark_non_differentiable(*(t for o, t in outs.items() if o not in graded))
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
    **options,
) -> Differentiable:
    """Like cudnn_dsl.compile, a graph whose outputs torch autograd differentiates (derived backward)."""
    return Differentiable(api.compile(source, graph, device, text=text, **options), options)


# ---- the torch op path: the augmented forward and the backward as torch ops ---------------------


class GradOps:
    """A graph op's (cudnn_dsl.torch_op.TorchOp) training path, for the gradients of `wrt`: two torch ops.

    - `<op>_ad<mask>`: the augmented forward. Its arguments are the graph op's; it returns the graph's
      outputs, then the values the backward reads that are no output (saved intermediates, a norm's or
      sdpa's statistics), as torch's own ops return theirs (native_layer_norm's mean and rstd). Its
      autograd is the derived backward, through torch.library.register_autograd.
    - `<op>_bw<mask>`: the backward, `(Tensor[] kept, Tensor?[] grads, SymInt[] dims, scalars) ->
      Tensor[]`: the kept values, the outputs' gradients (None: zero), the symbolic dims' values.

    Both are shape-generic ops whose kernels run the graphs derived for the shape at hand (derived and
    compiled on first use of a shape, each as a graph op of its own: plans from the store, the reference on
    the CPU); their fake kernels specialize on the sizes (the derived graphs are per shape).
    """

    def __init__(self, op, wrt: tuple[str, ...]):

        if op.mutated:
            raise NotImplementedError(
                f"graph '{op.graph.name}' writes an input in place; its torch op has no backward "
                f"(cudnn_dsl.autograd.differentiable runs it with one)"
            )
        self.op, self.wrt = op, wrt
        self._shapes: dict[tuple, tuple[Derived, object, object]] = {}
        self.symbols = tuple(dict(op.graph.instances[0].binding))
        first = self.shape(op.graph.instances[0].binding)[0]
        self.outputs = tuple(op.fresh)
        self.saved, self.kept = self._values(first)
        self.grads = tuple(w for w, _ in first.grads)
        mask = "".join("1" if n in wrt else "0" for n in op.tensor_names)
        self.name, self.backward_name = f"{op.name}_ad{mask}", f"{op.name}_bw{mask}"
        args = op.schema.split(" -> ")[0][1:-1]
        returns = ", ".join("Tensor" for _ in self.outputs + self.saved)  # one: `(Tensor)` is `Tensor`
        lib = _library()
        lib.define(f"{self.name}({args}) -> ({returns})")
        lib.impl(self.name, lambda *a: self.forward_kernel("cpu_kernel", a), "CPU")
        lib.impl(self.name, lambda *a: self.forward_kernel("cuda_kernel", a), "CUDA")
        torch.library.register_fake(
            f"{NAMESPACE}::{self.name}", lambda *a: self.forward_kernel("fake_kernel", a), lib=lib
        )
        scalars = "".join(", " + s for s in op.scalar_args())
        lib.define(f"{self.backward_name}(Tensor[] kept, Tensor?[] grads, SymInt[] dims{scalars}) -> Tensor[]")
        lib.impl(self.backward_name, lambda *a: self.backward_kernel("cpu_kernel", a), "CPU")
        lib.impl(self.backward_name, lambda *a: self.backward_kernel("cuda_kernel", a), "CUDA")
        torch.library.register_fake(
            f"{NAMESPACE}::{self.backward_name}", lambda *a: self.backward_kernel("fake_kernel", a), lib=lib
        )
        lib.impl(self.backward_name, torch.library.fallthrough_kernel, "Autograd")  # no second derivatives
        self.backward_op = getattr(getattr(torch.ops, NAMESPACE), self.backward_name).default
        torch.library.register_autograd(
            f"{NAMESPACE}::{self.name}", self.backward, setup_context=self.setup_context, lib=lib
        )

    def shape(self, binding) -> tuple[Derived, object, object]:
        """(the derivation, the augmented forward's op, the backward's op) of one shape."""
        key = tuple(sorted(dict(binding).items()))
        if key not in self._shapes:
            g = self.op.graph
            d = derive(g, g.instance(dict(key)) if key else g.instances[0], self.wrt)
            if self._shapes and self._values(d) != self._values(next(iter(self._shapes.values()))[0]):
                raise NotImplementedError(
                    f"graph '{g.name}': its derived backward reads other values at {dict(key)} (the op's "
                    f"schema is the first shape's)"
                )
            fwd, bwd = (as_torch_op(CompiledGraph(part, self.op.options)) for part in (d.forward, d.backward))
            self._shapes[key] = (d, fwd, bwd)
        return self._shapes[key]

    def _values(self, d: Derived) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the values the augmented forward returns beyond the graph's outputs, the values the backward reads)"""
        outputs = {v.name for v in self.op.graph.outputs}
        saved = tuple(v.name for v in d.forward.outputs if v.name not in outputs)
        return saved, tuple(dict.fromkeys(of for _, kind, of in d.bind if kind in ("value", "transposed")))

    def _binding(self, tensors: dict) -> dict:
        shapes = {k: tuple(tensors[k].shape) for k in self.op.tensor_names}
        return self.op.graph.binding_of(shapes)

    def forward_kernel(self, kernel: str, args: tuple):
        named = self.op._named(args)
        binding = {k: int(v) for k, v in self._binding(named).items()}
        _, fwd, _ = self.shape(binding)
        result = getattr(fwd, kernel)(*fwd._positional((), named))
        got = dict(zip(fwd.fresh, _results(result)))
        return _returned([got[n] for n in self.outputs + self.saved])

    def backward_kernel(self, kernel: str, args: tuple):
        kept, grads, dims = args[:3]
        d, _, bwd = self.shape(dict(zip(self.symbols, map(int, dims))))
        values = dict(zip(self.kept, kept))
        given = dict(zip(self.outputs, grads))
        real = kernel != "fake_kernel"
        device = kept[0].device if kept else next(g for g in grads if g is not None).device
        bound: dict = {}
        for name, kind, of in d.bind:
            if kind in ("grad", "grad_transposed"):
                t = d.forward.instances[0].type(of)
                g = given.get(of)
                if g is None:
                    g = empty(t, device).zero_()
                elif real and tuple(g.stride()) != t.strides:  # cuDNN reads the declared layout
                    g = empty(t, device).copy_(g)
                value = g.transpose(-1, -2) if kind == "grad_transposed" else g
            else:
                value = values[of].transpose(-1, -2) if kind == "transposed" else values[of]
            bound[name] = value
        scalars = dict(zip((v.name for v in self.op.scalars), args[3:]))
        bound.update((v.name, scalars[v.name]) for v in bwd.scalars if v.name in scalars)  # the forward's, as given
        result = getattr(bwd, kernel)(*bwd._positional((), bound))
        got = dict(zip(bwd.fresh, _results(result)))
        return [got[name] for _, name in d.grads]

    def setup_context(self, ctx, inputs, output):
        named = self.op._named(tuple(inputs))
        values = {**named, **dict(zip(self.outputs + self.saved, _results(output)))}
        ctx.save_for_backward(*(values[k] for k in self.kept))
        binding = self._binding(named)
        ctx.dims = [binding[s] for s in self.symbols]
        ctx.scalars = tuple(named[v.name] for v in self.op.scalars)

    def backward(self, ctx, *grads):
        got = self.backward_op(list(ctx.saved_tensors), list(grads[: len(self.outputs)]), ctx.dims, *ctx.scalars)
        by_input = dict(zip(self.grads, got))
        return tuple(by_input.get(n) for n in self.op.tensor_names) + (None,) * len(ctx.scalars)


def _results(result) -> tuple:
    """A kernel's result as a tuple (one tensor, or several)."""
    return (result,) if isinstance(result, torch.Tensor) else tuple(result)


_GRAD_OPS: dict[tuple[str, tuple[str, ...]], GradOps] = {}


def grad_ops(op, wrt: tuple[str, ...]) -> GradOps:
    """The training path of a graph op for the gradients of `wrt`, made once per process."""
    key = (op.name, wrt)
    if key not in _GRAD_OPS:
        _GRAD_OPS[key] = GradOps(op, wrt)
    return _GRAD_OPS[key]
