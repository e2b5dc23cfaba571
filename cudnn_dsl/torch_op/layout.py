"""The torch ops' layout contract, alike on every device: a tensor argument whose strides differ from the graph's
declared ones is copied into them (with a warning, once) or, for a strict op, refused with a BindingError.

Each kernel decides once per kind of arguments (the launch plan's key: shapes, strides, dtypes, device; the
fake kernel on every trace), so a call whose strides match costs nothing more. The declared strides are read
for the sizes at hand: an input with a symbolic dim has a named layout, packed in its axis order whatever the
sizes (symbolic ones too, while tracing); an input of fixed dims has one type in every shape.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch

from cudnn_dsl.build.lower import left_to_offsets
from cudnn_dsl.run.buffers import BindingError, stride_problem
from dsl.ir import Graph
from dsl.types import stride_order


class LayoutWarning(UserWarning):
    """A torch op's argument was not in its declared layout and is copied into it on each call of that kind."""


def dense(shape, order) -> tuple:
    """Packed strides for a shape that may hold symbolic sizes (dsl.types.dense_strides, comparing none)."""
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        d = shape[axis]
        step = step * (max(1, d) if isinstance(d, int) else d)
    return tuple(strides)


def laid_out(t: torch.Tensor, strides) -> torch.Tensor:
    """A copy of t with these strides (its storage exactly what they address)."""
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def in_layout(t: torch.Tensor, strides) -> torch.Tensor:
    """t where its strides are `strides` (dims of size 1 aside), else a copy of it laid out so."""
    return t if stride_problem(t.shape, t.stride(), strides) is None else laid_out(t, strides)


def _declared(graph: Graph, name: str) -> Callable[[tuple], tuple]:
    """sizes -> the declared strides of input `name` at those sizes."""
    dims = dict(graph.input_dims).get(name, ())
    if all(isinstance(d, int) for d in dims):
        fixed = graph.instances[0].type(name).strides
        return lambda shape: fixed
    # the order of the typed shape with the fewest unit dims: a unit dim's stride ties with its neighbour's
    inst = max(graph.instances, key=lambda i: sum(d > 1 for d in i.type(name).shape))
    left = int(name in left_to_offsets(graph, inst))  # a batch stride left to ragged offsets stays 0
    order = stride_order(inst.type(name).strides[left:])
    packed = lambda shape: (0,) * left + dense(shape[left:], order)  # noqa: E731
    types = [i.type(name) for i in graph.instances]
    symbols = {s.name for s in graph.symbols}
    if all(t.strides == packed(t.shape) for t in types) or not symbols <= set(dims):
        return packed
    # strides written over the dims (a view of a wider buffer: a fused projection's q, k and v): the graph typed
    # at these sizes says them
    names = [d if isinstance(d, str) else None for d in dims]

    def typed(shape: tuple) -> tuple:
        sizes = [_size(d) for d in shape]
        if None in sizes:
            return packed(shape)
        binding = {n: v for n, v in zip(names, sizes) if n is not None}
        return graph.instance(binding).type(name).strides

    return typed


def _size(d) -> int | None:
    """A size's value: a symbolic one's hint while tracing; None where it has none."""
    if isinstance(d, int):
        return d
    hint = getattr(getattr(d, "node", None), "hint", None)
    return int(hint) if hint is not None else None


class Layouts:
    """The declared strides of a graph op's tensor arguments (bool ones aside: their packed bytes are checked
    as such everywhere), and the contract on them: `misplaced` says which arguments to copy, or raises. The
    warning names `refusing`, the call that makes the caller strict."""

    def __init__(self, graph: Graph, names: Sequence[str], strict: bool, refusing: str):
        self.graph, self.strict, self.refusing = graph, strict, refusing
        inst = graph.instances[0]
        self.declared = {n: _declared(graph, n) for n in names if inst.type(n).dtype != "bool"}
        self.warned: set[tuple[str, str]] = set()
        """(device type, message) of each warning issued: once each in a process"""

    def misplaced(self, tensors: dict) -> dict[str, tuple]:
        """name -> declared strides of each argument laid out otherwise (checked for dtype and shape already),
        each warned about once; a strict op raises the BindingError a CUDA launch's check raises."""
        out = {}
        for name, declared in self.declared.items():
            t = tensors[name]
            want = declared(tuple(t.shape))
            problem = stride_problem(t.shape, t.stride(), want)
            if problem is None:
                continue
            v = self.graph.value(name)
            if self.strict:
                raise BindingError(f"'{name}': expected {problem}", v.loc)
            self._warn(
                t.device.type,
                f"{v.loc}: graph '{self.graph.name}': '{name}': expected {problem}; copied into the declared "
                f"layout on every call with these strides ({self.refusing} refuses it)",
            )
            out[name] = want
        return out

    def _warn(self, device: str, message: str) -> None:
        if (device, message) not in self.warned:
            self.warned.add((device, message))
            # the message names the declaration; the caller's frame is behind the dispatcher, at no fixed depth
            warnings.warn(message, LayoutWarning, stacklevel=1)


class Relaid:
    """The run of one kind of arguments, some of which are copied into their declared layouts first (`laid`:
    argument index -> strides) and, where an output is written over one (`back`), copied back after."""

    def __init__(self, run: Callable[[Sequence], list], laid: dict[int, tuple], back: Sequence[int]):
        self.run, self.laid, self.back = run, laid, [k for k in back if k in laid]

    def __call__(self, values: Sequence) -> list:
        copies = {k: laid_out(values[k], s) for k, s in self.laid.items()}
        outs = self.run(tuple(copies.get(k, v) for k, v in enumerate(values)))
        for k in self.back:
            values[k].copy_(copies[k])
        return outs
