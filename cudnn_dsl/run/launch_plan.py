"""One shape's launches bound once, each call rebinding only its own buffers: the path of a torch op and of a
training step, whole graphs and graphs run in parts alike.

A LaunchPlan is made on the first call of a kind of arguments — each tensor's shape, strides, dtype and
device, `LaunchPlans`' key (a call of the latest kind is told by torch's own C++ tensor check, the one
torch.compile's guards run, without building the key) — once the caller has checked them in full: every
part bound once (run.parts), its variant pack built as the backend's pointer array (run.launch), its
intermediates allocated and kept. A later call of that kind is checked only for its arguments' alignment;
it allocates the fresh outputs (a torch op returns new tensors, never a kept one), refreshes the copies of
the inputs an output overwrites, points each part at the call's arguments and outputs (one array entry per
pointer), sets the handles' stream only when the current one is another, and launches.

The kept memory — intermediates, copies, each part's workspace — is one set per plan, whatever stream a call
is on, as an executable's workspace is: calls on two streams must not overlap on the device.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cudnn_dsl.run.buffers import BindingError, view
from cudnn_dsl.run.launch import Bound, Layout, arguments, current_device, current_stream
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.library import load_cudnn
from cudnn_dsl.target.memory import allocator, as_type, host_scalar
from dsl.ir import Graph, Instance
from dsl.types import ALIGNMENT


def origins(graph: Graph, copied: frozenset[str] = frozenset()) -> dict[str, int]:
    """name -> the source a call takes its memory from, by LaunchPlan's numbering of a call's pointers: the
    tensor arguments (launch.arguments' order), then the fresh outputs, then the scalars' CPU tensors. An
    output in place is its input's memory (a view's: its buffer's); an input in `copied` is read from a copy
    the plan keeps, so it is no source."""
    names, scalars = arguments(graph)
    fresh = [v.name for v in graph.outputs if v.into is None]
    at = {n: k for k, n in enumerate(names)}
    src = {n: k for n, k in at.items() if n not in copied}
    src.update((n, len(names) + k) for k, n in enumerate(fresh))
    src.update((v.name, len(names) + len(fresh) + k) for k, v in enumerate(scalars))
    for v in graph.in_place:
        target = graph.value(v.into)
        src[v.name] = at[target.view[0] if target.view else target.name]
    return src


class LaunchPlan:
    """One shape's launches, bound on a first call whose arguments were checked: `plan(values)` launches them
    on the arguments in launch.arguments' order and returns the fresh outputs, allocated for this call.

    Built from the first call's `tensors` (arguments by name) and `outputs`: `launch` adds a cuDNN part bound
    on them, `torch_part` a part that reads and writes an environment by name; `check(values)` is the caller's
    full check, run (to raise its located error) when an argument is not aligned; `copies` are the copies of
    the inputs an output overwrites, by name, which the parts read instead."""

    def __init__(
        self,
        graph: Graph,
        inst: Instance,
        tensors: dict[str, Any],
        outputs: dict[str, torch.Tensor],
        check: Callable[[Sequence], None],
        copies: dict[str, torch.Tensor] | None = None,
        same: Sequence[tuple[str, str]] = (),
    ):
        names, scalars = arguments(graph)
        fresh = [v.name for v in graph.outputs if v.into is None]
        first = tensors[names[0]]
        self.graph, self.inst, self.check = graph, inst, check
        self.count = len(names)
        self.index = first.get_device()
        """the device (-1: the CPU, where only torch parts run)"""
        self.new = [_allocator(inst.type(n), first.device) for n in fresh]
        copies = copies or {}
        self.origins = origins(graph, frozenset(copies))
        self.aliases = self._aliases(same)
        """a value that is another's memory (a view) -> (that one, which has an origin; its type)"""
        self.first = [tensors[n].data_ptr() for n in names] + [outputs[n].data_ptr() for n in fresh]
        """the first call's pointers, which the parts were bound on"""
        self.dtypes = [inst.type(v.name).dtype for v in scalars]
        self.last: list[tuple[Any, torch.Tensor | None]] = [(None, None)] * len(scalars)
        """per scalar, (the value last given, as _same_value tells it, its CPU tensor)"""
        self.copies = [(copies[n], k) for k, n in enumerate(names) if n in copies]
        """(a copy the plan keeps, the argument it copies), refreshed per call: `copies` by name"""
        self.names = names
        self.steps: list[tuple[Callable[[Sequence[int]], None] | None, Callable[[], None]]] = []
        """(pointing a part's pack at a call's pointers, or None for a torch part; its launch), in order"""
        self.handles: list = []
        self.env: dict[str, Any] | None = None
        self.set_stream = load_cudnn().set_stream

    def _aliases(self, same: Sequence[tuple[str, str]]) -> dict[str, tuple[str, Any]]:
        """Values one memory with an argument or output (`same`: pairs of one memory, as views bind them) take
        its origin: a part that reads or writes one is pointed at each call's buffer."""
        group = {n: {n} for pair in same for n in pair}
        for a, b in same:
            if group[a] is not group[b]:
                merged = group[a] | group[b]
                for n in merged:
                    group[n] = merged
        out = {}
        for members in {id(g): g for g in group.values()}.values():
            roots = [n for n in members if n in self.origins]
            if len(roots) == 1:
                out.update((n, (roots[0], self.inst.type(n))) for n in members if n != roots[0])
        self.origins.update((n, self.origins[root]) for n, (root, _) in out.items())
        return out

    def launch(self, bound: Bound, layout: Layout) -> None:
        """A cuDNN part, bound on the first call's buffers (its Layout says what each UID's buffer is)."""
        moving = [(uid, self.origins[name]) for uid, name in layout.origin.items() if name in self.origins]
        self.steps.append((bound.repoint(moving, self.first), bound.pointers.launch))
        if not any(h is bound.exe.handle for h in self.handles):
            self.handles.append(bound.exe.handle)

    def torch_part(self, run: Callable[[], None], env: dict[str, Any]) -> None:
        """A torch part: `run()` reads and writes `env`, which each call points at its own tensors and scalars
        (the intermediates in it stay)."""
        self.env = env
        self.steps.append((None, run))

    def __call__(self, values: Sequence) -> list[torch.Tensor]:
        if self.index >= 0 and current_device() != self.index:
            with torch.cuda.device(self.index):
                return self(values)  # on its device now
        ptrs = [t.data_ptr() for t in (values if len(values) == self.count else values[: self.count])]
        if functools.reduce(operator.or_, ptrs, 0) % ALIGNMENT:
            self.check(values)
            raise BindingError(f"graph '{self.graph.name}': an argument is not aligned to {ALIGNMENT} bytes")
        outs = [new() for new in self.new]
        ptrs += [o.data_ptr() for o in outs]
        if self.dtypes:
            ptrs += self._scalars(values[self.count :])
        if self.handles:
            stream = current_stream(self.index)
            for h in self.handles:
                if h.stream != stream:
                    self.set_stream(h, stream)
        for copy, k in self.copies:
            copy.copy_(values[k])
        if self.env is None:  # cuDNN parts only
            for point, launch in self.steps:
                point(ptrs)
                launch()
            return outs
        moved = self._point_env(values, outs)
        try:
            for point, launch in self.steps:
                if point is not None:
                    point(ptrs)
                launch()
        finally:
            if moved:  # the plan keeps none of the caller's tensors
                self.env.update(dict.fromkeys(moved))
        return outs

    def _scalars(self, given: Sequence) -> list[int]:
        """The pointers of the scalars' CPU tensors: one made per value (a tensor a launch was given is never
        written over), kept while the value stays."""
        out = []
        for k, value in enumerate(given):
            last, same = self.last[k], _same_value(value)
            if last[0] != same or last[1] is None:
                last = self.last[k] = (same, host_scalar(value, self.dtypes[k]))
            out.append(last[1].data_ptr())
        return out

    def _point_env(self, values: Sequence, outs: list[torch.Tensor]) -> list[str]:
        """Points the torch parts' environment at this call's arguments, outputs and scalars; returns the names
        of the tensors set (let go after the call)."""
        env, n, m = self.env, self.count, len(outs)
        tensors = dict(zip(self.names, values[:n]))
        moved = []
        for name, source in self.origins.items():
            if name in self.aliases:
                continue
            if source >= n + m:  # a scalar, by value
                env[name] = values[source - m]
                continue
            env[name] = outs[source - n] if source >= n else tensors.get(name)  # an output in place: below
            moved.append(name)
        for v in self.graph.in_place:
            env[v.name] = view(self.graph.value(v.into), self.inst, tensors)
        for name, (root, t) in self.aliases.items():
            env[name] = as_type(env[root], t)
            moved.append(name)
        return moved


_EMPTY = {
    "cuda": getattr(torch._C._dynamo.guards, "_empty_strided_cuda", None),
    "cpu": getattr(torch._C._dynamo.guards, "_empty_strided_cpu", None),
}
"""torch's allocation without its Python argument parsing (what Inductor's generated code allocates with): on the
current device, which a LaunchPlan's call makes its own first"""


def _allocator(t, device: torch.device) -> Callable[[], torch.Tensor]:
    """A new output per call on the plan's device (current while the plan runs)."""
    fast = _EMPTY.get(device.type)
    if fast is None or t.dtype == "bool":
        return allocator(t, device)
    return functools.partial(fast, t.shape, t.strides, torch_dtype(t.dtype))


def _same_value(value) -> tuple:
    """What tells two scalar values apart: -0.0 from 0.0 too (a divisor's sign), NaN equal to NaN."""
    return (type(value), repr(value))


class LaunchPlans:
    """Launch plans by the kind of their arguments: each tensor's shape, strides, dtype and device, everything the
    first call of a kind was checked for (`first(values)` checks it and makes its plan), so that a later call of
    the kind needs only its alignment checked (by the plan). A call of the latest kind is told by a TensorGuards
    check (torch's C++ check of sizes, strides, dtype, device, dispatch keys and requires_grad: stricter than the
    key, so a miss only costs the key)."""

    def __init__(self, count: int, first: Callable[[Sequence], LaunchPlan]):
        self.count, self.first = count, first
        self.plans: dict[tuple, LaunchPlan] = {}
        self.guard = None
        """the latest kind's TensorGuards, or None"""
        self.last: LaunchPlan | None = None
        """the latest kind's plan"""

    def __call__(self, values: Sequence) -> list[torch.Tensor]:
        tensors = values if len(values) == self.count else values[: self.count]
        if self.guard is not None and self.guard.check(*tensors):
            return self.last(values)
        key = tuple([(t.shape, t.stride(), t.dtype, t.get_device()) for t in tensors])
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self.first(values)
        self.guard, self.last = _guard(tensors), plan
        return plan(values)

    def __getstate__(self) -> dict:
        # torch's TensorGuards is not picklable; a copy re-learns the latest kind on its first call
        return {**self.__dict__, "guard": None, "last": None}

    def forget(self, device: torch.device) -> None:
        """Drops the plans of one device's arguments (a key's first tensor names its device)."""
        index = -1 if device.type == "cpu" else device.index
        self.plans = {k: p for k, p in self.plans.items() if k[0][3] != index}
        self.guard = self.last = None

    def clear(self) -> None:
        """Drops every plan (and what each keeps: compiled graphs, workspaces, intermediates)."""
        self.plans.clear()
        self.guard = self.last = None


_TensorGuards = getattr(torch._C._dynamo.guards, "TensorGuards", None)


def _guard(tensors: Sequence[torch.Tensor]):
    """torch's C++ check that tensors are of these tensors' kind (None where this torch has none)."""
    if _TensorGuards is None:
        return None
    try:
        return _TensorGuards(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        )
    except (TypeError, RuntimeError):  # another torch's signature: the key alone
        return None
