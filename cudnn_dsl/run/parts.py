"""The parts one shape of a graph runs as: Whole, the one cuDNN graph cuDNN takes it as, or Parts, the graphs
(and torch fallbacks) it is cut into, run in order. Both run, bind and launch alike, so a caller does not
ask which.

The parts come from `partition.find_partition`, with acceptance decided by building each
candidate part on this GPU (so each part's plan is in the plan store like any graph's); equal parts
share one compiled graph, launched on each one's buffers. Tensors that one part makes and a later
part reads are allocated here, in their inferred dtype; a view is its operand's memory, or where its
result is a buffer the caller gave, its operand is made in that buffer; an op no engine runs is its
torch reference on the GPU, rounded to its result's dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from cudnn_dsl.build.planner import Executable
from cudnn_dsl.ops import IMPLS
from cudnn_dsl.run.buffers import snapshot, view, written
from cudnn_dsl.run.launch import Bound, Launch
from cudnn_dsl.run.launch_plan import LaunchPlan
from cudnn_dsl.run.partition import CUDNN, VIEW, Part, Partition, build_key, find_partition, short, split_at
from cudnn_dsl.target.bits import logical
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.library import load_cudnn
from cudnn_dsl.target.memory import as_type, empty, same_memory, stored
from dsl.diagnostics import DslError
from dsl.ir import Graph, Instance


class Whole:
    """A shape that runs as one cuDNN graph: its one part. The plan is the compiled graph's at each use
    (tune may adopt another); its Launch is worked out again only then."""

    def __init__(self, cg, inst: Instance, graph: Graph | None = None):
        """`graph`: the part whose names the buffers are given by, where it shares the compiled graph `cg` of an
        equal part (Launch's `graph`)."""
        self.cg, self.inst, self.graph = cg, inst, graph
        self._launch: Launch | None = None

    def launch(self) -> Launch:
        exe = self.cg.executable(self.inst)
        if self._launch is None or self._launch.exe is not exe:
            self._launch = Launch(exe, self.graph)
        return self._launch

    def executables(self) -> list[Executable]:
        return [self.cg.executable(self.inst)]

    def run(self, tensors: dict[str, Any], outputs: dict[str, torch.Tensor]) -> None:
        """One launch: reads `tensors` (inputs and scalars by name, checked by the caller), writes `outputs`."""
        self.launch().run(tensors, outputs)

    def bind(self, tensors: dict[str, Any], outputs: dict[str, torch.Tensor]) -> Bound:
        return self.launch().bind(tensors, outputs)

    def launch_plan(self, tensors: dict[str, Any], outputs: dict[str, torch.Tensor], check) -> LaunchPlan:
        """The launch bound on checked buffers (a first call's), each later call's own put in their place."""
        plan = LaunchPlan(self.cg.graph, self.inst, tensors, outputs, check)
        plan.launch(self.bind(tensors, outputs), self.launch().layout)
        return plan


class Parts:
    """The parts of one shape, each a compiled graph (None: a view or a torch fallback; equal parts share one),
    and how to run them."""

    def __init__(self, graph: Graph, inst: Instance, partition: Partition, compiled: list):
        self.graph, self.inst, self.partition, self.compiled = graph, inst, partition, compiled
        self.wholes = [
            Whole(cg, cg.graph.instances[0], p.graph) if cg is not None else None
            for cg, p in zip(compiled, partition.parts)
        ]

    @property
    def lines(self) -> list[str]:
        return self.partition.lines(self.graph)

    def executables(self) -> list[Executable]:
        """Each distinct cuDNN graph's (built on first use)."""
        exes = [e for w in self.wholes if w is not None for e in w.executables()]
        return list({id(e): e for e in exes}.values())

    def run(self, tensors: dict[str, Any], outputs: dict[str, torch.Tensor]) -> None:
        """Runs every part in order: reads `tensors` (inputs and scalars by name, checked by the caller),
        writes `outputs`. An input that an output overwrites is read from a copy: a later part reads it as
        it was before the launch."""
        env: dict[str, Any] = {**snapshot(self.graph, tensors), **outputs}
        self._place_views(env)
        for k in range(len(self.compiled)):
            self.run_part(k, env)

    def run_part(self, k: int, env: dict[str, Any]) -> None:
        """Runs part k on the tensors of `env` (by name); what it makes is written into the buffers
        `env` holds for it, or into new ones it adds. No checks: the caller's buffers were checked once."""
        self._step(k, env, _device(env))()

    def bind(self, tensors: dict[str, Any], outputs: dict[str, torch.Tensor]) -> BoundParts:
        """Every part bound once to checked buffers: intermediates allocated, each variant pack built."""
        device = _device(tensors)
        saved = {k: t for k, t in snapshot(self.graph, tensors).items() if t is not tensors[k]}  # copies
        env: dict[str, Any] = {**tensors, **saved, **outputs}
        self._place_views(env)
        launches = [self._step(k, env, device, bound=True) for k in range(len(self.compiled))]
        return BoundParts(self, outputs, [(saved[k], tensors[k]) for k in saved], launches, env)

    def launch_plan(self, tensors: dict[str, Any], outputs: dict[str, torch.Tensor], check) -> LaunchPlan:
        """Every part bound once on checked buffers (a first call's), each later call's own put in their place."""
        return self.bind(tensors, outputs).launch_plan(tensors, check)

    def _place_views(self, env: dict[str, Any]) -> None:
        """Walks the views backwards: where a view's result is a buffer `env` holds (an output the caller gave, or
        one placed so) and its operand is an intermediate, the operand is placed in that memory, so the part that
        makes it writes the result there (a chain of views, through each)."""
        held = {name for name, t in env.items() if t is not None}
        for operand, result in self.partition.views_placed(self.graph, held).items():
            env[operand] = as_type(env[result], self.inst.type(operand))

    def _view(self, part: Part, env: dict[str, Any]) -> Callable[[], Any]:
        """A view's step: its result is its operand's memory, added to `env`; where `env` holds another buffer for
        it (an output the caller gave that the operand could not be placed in), one copy into it."""
        node = self.graph.nodes[part.first]
        seen = as_type(self._memory(env, node.inputs[0]), self.inst.type(node.outputs[0]))
        result, t = node.outputs[0], self.inst.type(node.outputs[0])
        held = env.get(result)
        if held is None or same_memory(held, seen):
            env[result] = seen
            return _nothing
        # read from `env` at each run: a launch plan points it at each call's buffers
        return lambda: env[result].copy_(as_type(self._memory(env, node.inputs[0]), t))

    def views_sharing_memory(self, env: dict[str, Any]) -> list[tuple[str, str]]:
        """(operand, result) of each view bound on `env` as one memory (no copy): a launch plan points both at a
        call's buffer where either is an argument or an output."""
        pairs = []
        for part in self.partition.parts:
            node = self.graph.nodes[part.first]
            if part.kind == VIEW and self._memory(env, node.inputs[0]).data_ptr() == env[node.outputs[0]].data_ptr():
                pairs.append((node.inputs[0], node.outputs[0]))
        return pairs

    def _memory(self, env: dict, name: str) -> torch.Tensor:
        """The buffer a value is in (a view input: its window on its buffer)."""
        value, v = env.get(name), self.graph.value(name)
        return view(v, self.inst, env) if value is None and v.view is not None else value

    def _step(self, k: int, env: dict[str, Any], device, bound: bool = False) -> Callable[[], Any]:
        """Part k's launch on the buffers of `env` (those it makes added to it): a cuDNN graph's variant
        pack (bound: built once, launched raw), a view's nothing (or its copy), or the fallback op's
        reference on the GPU."""
        part, cg = self.partition.parts[k], self.compiled[k]
        if part.kind == VIEW:
            return self._view(part, env)
        node = self.graph.nodes[part.first]
        names = part.graph.outputs if part.kind == CUDNN else [self.graph.value(o) for o in node.outputs]
        for v in names:
            if env.get(v.name) is None:
                env[v.name] = empty(self.inst.type(v.name), device)
        if cg is not None:
            whole, made = self.wholes[k], {v.name: env[v.name] for v in part.graph.outputs}
            # the Bound, not its bare launch: it keeps the variant pack's buffers (intermediates
            # allocated here) alive, where the raw launch holds only their addresses.
            return whole.bind(env, made) if bound else lambda: whole.run(env, made)
        scalars = {  # made on the GPU once: a host-to-device copy has no place in a CUDA-graph capture
            i: _wide(env.get(i), self.graph, i, device)
            for i in node.inputs
            if i is not None and not isinstance(env.get(i), torch.Tensor) and self.graph.value(i).view is None
        }
        types, attrs_ = [self.inst.type(o) for o in node.outputs], self.inst.attrs(part.first)
        impl = IMPLS[node.op]
        narrow, ref = impl.narrow is not None, impl.narrow or impl.ref

        def fallback():
            ins = [
                None
                if i is None
                else scalars[i]
                if i in scalars
                else _wide(self._value(env, i), self.graph, i, device, narrow)
                for i in node.inputs
            ]
            with torch.no_grad():
                results = ref(ins, attrs_, types)
            for name, r, t in zip(node.outputs, results, types):  # into a buffer as cuDNN would hold it
                env[name].copy_(stored(r.to(torch_dtype(t.dtype)), t))

        return fallback

    def _value(self, env: dict, name: str):
        """A tensor as values (a bool one unpacked; a view read off its buffer), or a scalar given by
        value; None: a declared scalar."""
        value = self._memory(env, name)
        if isinstance(value, torch.Tensor):
            return logical(value, self.inst.type(name))
        return value


class BoundParts:
    """A graph run in parts, bound once to its buffers, like launch.Bound for a whole one: `run()` refreshes the
    copies of inputs that outputs overwrite, then launches every part back to back, with no checks. `env` holds
    every buffer by name (the bound ones, the copies, the intermediates), which the torch parts read."""

    def __init__(
        self, parts: Parts, outputs: dict, copies: list[tuple[torch.Tensor, torch.Tensor]], launches, env: dict
    ):
        self.parts, self.outputs, self.copies, self.launches, self.env = parts, outputs, copies, launches, env
        self.handles = list({id(c.planner.handle): c.planner.handle for c in parts.compiled if c is not None}.values())

    @property
    def plan_name(self) -> str:
        """each part's plan, in order (for a part with none, what it is: a view, a torch fallback)"""
        parts = zip(self.parts.compiled, self.parts.partition.parts)
        return " + ".join(c.executable(c.graph.instances[0]).plan_name if c else p.kind for c, p in parts)

    @property
    def source(self) -> str:
        return self.parts.partition.reason

    def set_stream(self, stream) -> None:
        for h in self.handles:
            load_cudnn().set_stream(h, stream)

    def run(self) -> dict[str, torch.Tensor]:
        for copy, source in self.copies:
            copy.copy_(source)
        for launch in self.launches:
            launch()
        return self.outputs

    def launch_plan(self, tensors: dict[str, Any], check) -> LaunchPlan:
        """These parts as one LaunchPlan, bound on `tensors` (the arguments bound here): each call puts its own
        arguments and outputs in their place; the intermediates and copies stay. A torch part that reads a
        scalar runs afresh per call (Parts.run_part), so that it reads the value given then."""
        parts, env = self.parts, self.env
        copies = {n: env[n] for n in written(parts.graph)}
        plan = LaunchPlan(
            parts.graph, parts.inst, tensors, self.outputs, check, copies, parts.views_sharing_memory(env)
        )
        for k, launch in enumerate(self.launches):
            if isinstance(launch, Bound):
                plan.launch(launch, parts.wholes[k].launch().layout)
                continue
            if launch is _nothing:  # a view: its memory is pointed per call with its operand's
                continue
            node = parts.graph.nodes[parts.partition.parts[k].first]
            scalar = any(i is not None and parts.graph.value(i).kind == "scalar" for i in node.inputs)
            plan.torch_part(functools.partial(parts.run_part, k, env) if scalar else launch, env)
        return plan


def _nothing() -> None:
    """A view's launch."""


def _device(tensors: dict) -> torch.device:
    return next(t.device for t in tensors.values() if isinstance(t, torch.Tensor))


def _wide(value, graph: Graph, name: str, device, narrow: bool = False) -> torch.Tensor:
    """An input of a fallback op as its reference wants it: float32 (float64 for double), on the GPU; with
    `narrow` (an op with OpImpl.narrow), a half or bf16 one as it is."""
    if not isinstance(value, torch.Tensor):  # a scalar given by value
        value = torch.as_tensor(value if value is not None else graph.value(name).scalar)
    value = value.to(device)
    if narrow and value.dtype in (torch.float16, torch.bfloat16):
        return value
    return value.to(torch.float64 if value.dtype == torch.float64 else torch.float32)


def in_parts(
    graph: Graph,
    inst: Instance,
    options,
    declined: str,
    compile_part: Callable[[Graph], Any],
    cuts: tuple[int, ...] | None = None,
    chosen: str = "",
    first: int | None = None,
) -> Parts:
    """One shape in parts built on this GPU by `compile_part` (a part graph -> its compiled graph, whose first
    build raises DslError when cuDNN declines it): the fewest parts when cuDNN declined it whole (`declined`
    says why; given `first`, the first part ends there), or the parts starting at `cuts` (`chosen` says why)."""
    built: dict[tuple, Any] = {}  # build_key -> the compiled graph equal parts share

    def accepts(part: Graph) -> str | None:
        key = build_key(part)
        if key in built:
            return None
        cg = compile_part(part)
        try:
            cg.executable(part.instances[0])
        except DslError as e:
            return short(e.diagnostics[0].message)
        built[key] = cg
        return None

    if cuts is None:
        partition = find_partition(graph, inst, accepts, declined, options.fallback, first)
    else:
        partition = split_at(graph, inst, cuts, accepts, options.fallback, declined, chosen)
    compiled = [built[build_key(p.graph)] if p.kind == CUDNN else None for p in partition.parts]
    return Parts(graph, inst, partition, compiled)
