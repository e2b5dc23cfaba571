"""Training through derived backward graphs: what both training paths share, and the torch-op one.

`backward_inputs` binds a derived backward graph's inputs by name on each call (dsl.autodiff's `Derived.bind`:
the forward values it reads, the outputs' gradients): for autograd.Differentiable, the torch.autograd.Function path
for a graph written in place, and for the fake kernels of GradOps here, the torch-op path that torch.compile traces.
GradOps's real kernels, as the eager path (torch_op.eager), run each shape bound once (torch_op.bound).
"""

from __future__ import annotations

import torch

from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.memory import empty
from cudnn_dsl.target.quirks import backward_avoid, library_version
from cudnn_dsl.torch_op.bound import BUFFER_GRADS, GRADS, VIEWS, Shape
from cudnn_dsl.torch_op.layout import in_layout
from cudnn_dsl.torch_op.library import LAYOUT_TAGS, NAMESPACE, fragment, results, returned
from dsl.autodiff import Derived, derive
from dsl.types import TensorType


def values_read(d: Derived) -> tuple[str, ...]:
    """The forward values the backward graph reads, once each, in order (what the forward saves)."""
    return tuple(dict.fromkeys(of for _, kind, of in d.bind if kind in VIEWS))


def grads_read(d: Derived) -> set[str]:
    """The outputs whose gradient the backward graph reads."""
    return {of for _, kind, of in d.bind if kind in GRADS}


def backward_inputs(d: Derived, values: dict, grads: dict, scalars: dict, device, relayout: bool = True) -> dict:
    """The backward graph's inputs by name: the kept forward `values` and the outputs' `grads` (None or left
    out: zero), each viewed as the backward reads it (VIEWS, GRADS) and, where it is laid out otherwise,
    copied into the backward's declared layout (autograd's gradients are any layout; `relayout` off for fake
    tensors, which have no data), and the buffers the backward writes a buffer's gradient into; then the scalars the
    forward was given."""
    declared = d.backward.instances[0]
    zeros: dict[str, torch.Tensor] = {}
    bound: dict = {}
    for name, kind, of in d.bind:
        want = declared.type(name)
        if kind in GRADS:
            g = grads.get(of)
            if g is None:
                g = zeros.get(of)
                if g is None:
                    g = zeros[of] = empty(d.forward.instances[0].type(of), device).zero_()
            t = GRADS[kind](g, want.shape)
        elif kind in BUFFER_GRADS:
            t = BUFFER_GRADS[kind](empty(d.forward.instances[0].type(of), device))
        else:
            t = VIEWS[kind](values[of], want.shape)
        bound[name] = in_layout(t, want.strides) if relayout and want.dtype != "bool" else t
    bound.update((v.name, scalars[v.name]) for v in d.backward.of_kind("scalar") if v.name in scalars)
    return bound


def input_gradient(g: torch.Tensor, t: TensorType) -> torch.Tensor:
    """A backward output as the gradient of the forward input of type t: in its shape (a fused op may write it in
    another of as many elements row-major: Derived.grads) and its dtype (a gradient summed in float for a narrower
    input is returned in the input's dtype: what the autograd engine would cast it to, and what a compiled
    backward, Inductor's, takes it to be)."""
    if tuple(g.shape) != t.shape:
        g = g.reshape(t.shape)
    return g.to(torch_dtype(t.dtype))


class GradOps:
    """A graph op's (TorchOp) training path, for the gradients of `wrt`: two torch ops.

    - `<op>_ad<mask>`: the augmented forward. Its arguments are the graph op's; it returns the graph's
      outputs, then the values the backward reads that are no output (saved intermediates, a norm's or
      sdpa's statistics), as torch's own ops return theirs (native_layer_norm's mean and rstd). Its
      autograd is the derived backward, through torch.library.register_autograd.
    - `<op>_bw<mask>`: the backward, `(Tensor[] kept, Tensor?[] grads, SymInt[] dims, scalars) ->
      Tensor[]`: the kept values, the outputs' gradients (None: zero), the symbolic dims' values.

    Both are shape-generic ops whose kernels run the graphs derived for the shape at hand (derived and
    compiled on first use of a shape, each as a graph op of its own: plans from the store, the reference on
    the CPU), bound once per shape (bound.Shape: a later call of the shape is index lookups, as the eager
    path's); their fake kernels specialize on the sizes (the derived graphs are per shape).
    """

    def __init__(self, op, wrt: tuple[str, ...]):
        if op.mutated:
            raise NotImplementedError(
                f"graph '{op.graph.name}' writes an input in place; its torch op has no backward "
                f"(cudnn_dsl.torch_op.autograd.differentiable runs it with one)"
            )
        self.op, self.wrt = op, wrt
        self._shapes: dict[tuple, tuple] = {}
        self._bound: dict[tuple, Shape] = {}
        """by the symbolic dims' values: each shape's bound.Shape"""
        self._by_sizes: dict[tuple, Shape] = {}
        """the same by the tensor arguments' sizes (the augmented forward's key)"""
        self.symbols = tuple(dict(op.graph.instances[0].binding))
        first = self.shape(op.graph.instances[0].binding)[0]
        self.outputs = tuple(op.fresh)
        self.saved, self.kept = self._values(first)
        self.grads = tuple(w for w, _ in first.grads)
        mask = "".join("1" if n in wrt else "0" for n in op.tensor_names)
        self.name, self.backward_name = f"{op.name}_ad{mask}", f"{op.name}_bw{mask}"
        args = op.schema.split(" -> ")[0][1:-1]
        returns = ", ".join("Tensor" for _ in self.outputs + self.saved)  # one: `(Tensor)` is `Tensor`
        lib = fragment()
        lib.define(f"{self.name}({args}) -> ({returns})", tags=LAYOUT_TAGS)
        lib.impl(self.name, lambda *a: self.forward_kernel("cpu_kernel", a), "CPU")
        lib.impl(self.name, lambda *a: self.forward_kernel("cuda_kernel", a), "CUDA")
        torch.library.register_fake(
            f"{NAMESPACE}::{self.name}", lambda *a: self.forward_kernel("fake_kernel", a), lib=lib
        )
        scalars = "".join(", " + s for s in op.scalar_args())
        lib.define(
            f"{self.backward_name}(Tensor[] kept, Tensor?[] grads, SymInt[] dims{scalars}) -> Tensor[]",
            tags=LAYOUT_TAGS,
        )
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

    def shape(self, binding) -> tuple:
        """(the derivation, the augmented forward's op, the backward's op) of one shape."""
        key = tuple(sorted(dict(binding).items()))
        if key not in self._shapes:
            g = self.op.graph
            d = derive(
                g,
                g.instance(dict(key)) if key else g.instances[0],
                self.wrt,
                avoid=backward_avoid(library_version()),
            )
            if self._shapes and self._values(d) != self._values(next(iter(self._shapes.values()))[0]):
                raise NotImplementedError(
                    f"graph '{g.name}': its derived backward reads other values at {dict(key)} (the op's "
                    f"schema is the first shape's)"
                )
            self._shapes[key] = (d, self.op.derived(d.forward), self.op.derived(d.backward))
        return self._shapes[key]

    def bound(self, binding: dict) -> Shape:
        """One shape's training path bound once (its forward and backward ops and their arguments' sources)."""
        key = tuple(int(binding[s]) for s in self.symbols)
        shape = self._bound.get(key)
        if shape is None:
            shape = self._bound[key] = Shape(self, dict(zip(self.symbols, key)))
        return shape

    def _values(self, d: Derived) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the values the augmented forward returns beyond the graph's outputs, the values the backward reads)"""
        outputs = {v.name for v in self.op.graph.outputs}
        return tuple(v.name for v in d.forward.outputs if v.name not in outputs), values_read(d)

    def binding(self, tensors: dict) -> dict:
        """The graph's symbolic dims at these named tensors' shapes."""
        shapes = {k: tuple(tensors[k].shape) for k in self.op.tensor_names}
        return self.op.graph.binding_of(shapes)

    def forward_kernel(self, kernel: str, args: tuple):
        if kernel == "fake_kernel":
            return self._fake_forward(args)
        count = len(self.op.tensor_names)
        sizes = tuple([t.shape for t in args[:count]])
        shape = self._by_sizes.get(sizes)
        if shape is None:
            shape = self._by_sizes[sizes] = self.bound(self.binding(self.op.named(args)))
        outs = shape.forward(args + self.op.defaults[len(args) - count :], kernel)
        return returned([outs[k] for k in shape.returned])

    def backward_kernel(self, kernel: str, args: tuple):
        kept, grads, dims = args[:3]
        if kernel == "fake_kernel":
            return self._fake_backward(kept, grads, dims, args[3:])
        shape = self._bound.get(tuple(dims)) or self.bound(dict(zip(self.symbols, dims)))
        got = shape.backward(kept, grads, args[3:] + self.op.defaults[len(args) - 3 :], kernel)
        return [got[k] for k in shape.wrt]

    def _fake_forward(self, args: tuple):
        named = self.op.named(args)
        _, fwd, _ = self.shape({k: int(v) for k, v in self.binding(named).items()})
        got = dict(zip(fwd.fresh, results(fwd.fake_kernel(*fwd.positional((), named)))))
        return returned([got[n] for n in self.outputs + self.saved])

    def _fake_backward(self, kept, grads, dims, scalars: tuple):
        d, _, bwd = self.shape(dict(zip(self.symbols, map(int, dims))))
        device = kept[0].device if kept else next(g for g in grads if g is not None).device
        scalars = dict(zip((v.name for v in self.op.scalars), scalars))
        bound = backward_inputs(
            d, dict(zip(self.kept, kept)), dict(zip(self.outputs, grads)), scalars, device, relayout=False
        )
        got = {**bound, **dict(zip(bwd.fresh, results(bwd.fake_kernel(*bwd.positional((), bound)))))}
        types = d.forward.instances[0]
        return [input_gradient(got[name], types.type(w)) for w, name in d.grads]

    def setup_context(self, ctx, inputs, output):
        # the saved values the augmented forward returns get no gradient: left None, not zeros allocated and filled
        # per step (the backward reads only the outputs' gradients, and makes a zero where one is None)
        ctx.set_materialize_grads(False)
        named = self.op.named(tuple(inputs))
        values = {**named, **dict(zip(self.outputs + self.saved, results(output)))}
        ctx.save_for_backward(*(values[k] for k in self.kept))
        binding = self.binding(named)
        ctx.dims = [binding[s] for s in self.symbols]
        ctx.scalars = tuple(named[v.name] for v in self.op.scalars)

    def backward(self, ctx, *grads):
        got = self.backward_op(list(ctx.saved_tensors), list(grads[: len(self.outputs)]), ctx.dims, *ctx.scalars)
        by_input = dict(zip(self.grads, got))
        return tuple(by_input.get(n) for n in self.op.tensor_names) + (None,) * len(ctx.scalars)


_GRAD_OPS: dict[tuple[str, tuple[str, ...]], GradOps] = {}


def grad_ops(op, wrt: tuple[str, ...]) -> GradOps:
    """The training path of a graph op (TorchOp) for the gradients of `wrt`, made once per process."""
    key = (op.name, wrt)
    if key not in _GRAD_OPS:
        _GRAD_OPS[key] = GradOps(op, wrt)
    return _GRAD_OPS[key]
