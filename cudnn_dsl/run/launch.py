"""Launching: the one place where a graph's buffers reach their cuDNN UIDs (the variant pack) and a plan runs.

A Layout works out once per shape where each UID takes its buffer from; a launch then gathers only the
buffers, in the Layout's order, for the frontend's ordered execute. A Launch is one executable with its
Layout; a Bound launches one variant pack again and again (through the frontend's innermost launch where
the pinned version allows); `plan_runner` launches one of tune's candidate plans by its index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from cudnn_dsl.build.planner import Candidates, Executable, host_tensors
from cudnn_dsl.run.buffers import on, window
from cudnn_dsl.target.library import load_cudnn
from cudnn_dsl.target.memory import empty, host_scalar
from dsl.ir import Graph, Instance, Value


def arguments(graph: Graph) -> tuple[tuple[str, ...], tuple[Value, ...]]:
    """A graph's arguments in their one order: the device memory the caller binds (buffers and inputs that
    are no views), then the scalars."""
    return tuple(v.name for v in graph.device_inputs), graph.of_kind("scalar")


class Layout:
    """Where each of one shape's cuDNN UIDs takes its buffer from, worked out once.

    A launch gives the graph's arguments in `arguments`' order and its fresh outputs (those not in place)
    in the graph's order; each UID then gets: a host tensor of the executable (a constant, scratch memory),
    an argument, a view's window on its buffer, a scalar's one-element CPU tensor, or an output (in place:
    its input's memory). Per launch only `buffers` runs.
    """

    def __init__(self, graph: Graph, inst: Instance, host: dict[int, Any]):
        names, scalars = arguments(graph)
        at = {n: k for k, n in enumerate(names + tuple(v.name for v in scalars))}
        self.tensor_names = names
        self.scalar_values = scalars
        self.scalars = tuple((at[v.name], v.uid, inst.type(v.name).dtype) for v in scalars)
        self.last: dict[int, tuple] = {v.uid: (v.scalar, host[v.uid]) for v in scalars}
        """uid -> (value, its CPU tensor): a scalar given again with the same value reuses its tensor (the
        declared value's is the lowering's own)"""
        constants = [(u, t) for u, t in host.items() if u not in self.last]
        self.host = tuple(t for _, t in constants)
        self.plain = tuple((at[v.name], v.uid) for v in graph.of_kind("input") if v.view is None)
        self.views = tuple((at[v.view[0]], window(v, inst), v.uid) for v in graph.views)
        self.fresh = tuple(v for v in graph.outputs if v.into is None)
        in_place = []  # (uid, the argument written over, and for a view of it, its window)
        for v in graph.in_place:
            target = graph.value(v.into)
            if target.view is None:
                in_place.append((v.uid, at[target.name], None))
            else:
                in_place.append((v.uid, at[target.view[0]], window(target, inst)))
        self.in_place = tuple(in_place)
        self.uids = (
            tuple(u for u, _ in constants)
            + tuple(u for _, u in self.plain)
            + tuple(u for _, _, u in self.views)
            + tuple(u for _, u, _ in self.scalars)
            + tuple(v.uid for v in self.fresh)
            + tuple(u for u, _, _ in self.in_place)
        )

    def _scalar(self, uid: int, value, dtype: str):
        last = self.last[uid]
        if last[0] != value:
            last = self.last[uid] = (value, host_scalar(value, dtype))
        return last[1]

    def buffers(self, values: Sequence, outputs: Sequence) -> tuple:
        """The buffer of every UID, in `uids`' order: `values` are the arguments, `outputs` the fresh outputs."""
        return (
            self.host
            + tuple(values[i] for i, _ in self.plain)
            + tuple(on(values[i], w) for i, w, _ in self.views)
            + tuple(self._scalar(uid, values[i], dtype) for i, uid, dtype in self.scalars)
            + tuple(outputs)
            + tuple(values[i] if w is None else on(values[i], w) for _, i, w in self.in_place)
        )

    def named(self, tensors: dict, outputs: dict) -> tuple:
        """`buffers` for arguments and outputs by name (a scalar left out: its declared value)."""
        values = [tensors[n] for n in self.tensor_names] + [
            _number(tensors.get(v.name, v.scalar)) for v in self.scalar_values
        ]
        return self.buffers(values, [outputs[v.name] for v in self.fresh])


def _number(value):
    """A scalar given as a one-element tensor, as its number (what its CPU tensor is made from)."""
    return value.item() if isinstance(value, torch.Tensor) else value


class Launch:
    """One executable and its Layout, launched through the frontend's ordered execute on the device's
    current stream: called with the arguments in order, it allocates the fresh outputs and returns them;
    `run` and `bind` take the buffers by name (checked by the caller)."""

    def __init__(self, exe: Executable, graph: Graph | None = None):
        """`graph`: a graph equal to the executable's but for its names (a part that shares the compiled graph of
        an equal part: run.partition.build_key), whose names the buffers are given by; by default its own."""
        graph, inst = (exe.low.graph, exe.low.instance) if graph is None else (graph, graph.instances[0])
        self.exe, self.device = exe, exe.device
        self.layout = Layout(graph, inst, exe.host)
        self.types = [inst.type(v.name) for v in self.layout.fresh]
        self.set_stream = load_cudnn().set_stream

    def __call__(self, values: Sequence) -> list[torch.Tensor]:
        outs = [empty(t, self.device) for t in self.types]
        self.on(self.layout.buffers(values, outs))
        return outs

    def run(self, tensors: dict, outputs: dict[str, torch.Tensor]) -> None:
        self.on(self.layout.named(tensors, outputs))

    def on(self, buffers: tuple) -> None:
        """One launch on these buffers (`Layout.buffers`)."""
        exe = self.exe
        self.set_stream(exe.handle, torch.cuda.current_stream(self.device).cuda_stream)
        # an override-shape plan (built at the largest shape) runs this shape only given its dims: without them
        # cuDNN would run the built shape on these smaller buffers
        exe.low.g.execute(buffers, exe.workspace, handle=exe.handle, tensor_uids=self.layout.uids, **exe.overrides)

    def bind(self, tensors: dict, outputs: dict[str, torch.Tensor]) -> Bound:
        """The buffers bound once, for launches with no per-call Python work on the stream current now."""
        exe, uids, buffers = self.exe, self.layout.uids, self.layout.named(tensors, outputs)
        keep = dict(zip(uids, buffers))
        self.set_stream(exe.handle, torch.cuda.current_stream(self.device).cuda_stream)
        launch = None if exe.overrides else raw_launch(exe, keep)
        if launch is None:
            g, ws, h, overrides = exe.low.g, exe.workspace, exe.handle, exe.overrides
            launch = lambda: g.execute(buffers, ws, handle=h, tensor_uids=uids, **overrides)  # noqa: E731
        return Bound(exe, outputs, keep, launch)


@attrs.define
class Bound:
    """A graph bound once to its buffers: `run()` launches with no per-call Python checks.

    The buffers were checked when bound; they must stay alive and in place. Launches go on the
    stream that was current at bind time.
    """

    exe: Executable
    outputs: dict[str, torch.Tensor]
    keep: dict[int, Any]
    """uid -> buffer: the references that keep every bound buffer alive"""
    launch: Callable[[], None]

    @property
    def plan_name(self) -> str:
        return self.exe.plan_name

    @property
    def source(self) -> str:
        return self.exe.source

    def set_stream(self, stream) -> None:
        load_cudnn().set_stream(self.exe.handle, stream)

    def run(self) -> dict[str, torch.Tensor]:
        self.launch()
        return self.outputs


def raw_launch(exe: Executable, pack: dict[int, Any]) -> Callable[[], None] | None:
    """The frontend's own innermost launch, with the variant pack built once.

    pygraph.execute re-normalizes the variant pack on every call (~15 µs on the H200); for a
    bound graph the pointers never change, so the pack it builds is built here once and the
    backend launch is called directly. These are frontend internals of the pinned version
    (nvidia-cudnn-frontend 1.32.0): if any is missing, None sends the caller to the public path.
    """
    g = exe.low.g
    try:
        if g.selected_engine is not None:  # a python-engine plan: only the public path runs it
            return None
        vp = g._normalize(g._uid_to_data(pack), exe.workspace)
        lowered = g._lowered_graph
        if vp is None or lowered is None:
            return None
        cfg = g._materialize_backend_plan(g._plan_index) if g._plans else None
        index = -1 if cfg is None or cfg.cpp_index is None else cfg.cpp_index
        args = (vp.address, len(vp), vp.workspace, exe.handle.backend_handle or 0, index)
        launch = lowered._execute_with_raw_ptrs
    except Exception:  # noqa: BLE001 - any drift in the internals: use the public path
        return None

    def run(vp=vp):  # vp is held by the closure: its memory backs `args`
        launch(*args)

    return run


def candidates_pack(cands: Candidates, tensors: dict, outputs: dict[str, torch.Tensor]) -> dict[int, Any]:
    """The variant pack of tune's candidate plans (one lowered graph, its host tensors made afresh), uid ->
    buffer, from buffers by name."""
    low = cands.low
    layout = Layout(low.graph, low.instance, host_tensors(low, cands.planner.device))
    return dict(zip(layout.uids, layout.named(tensors, outputs)))


def plan_runner(cands: Candidates, index: int, pack: dict[int, Any], workspace) -> Callable[[], None]:
    """A launch of one candidate plan (by its index, built first) on `candidates_pack`'s buffers."""
    g, handle = cands.low.g, cands.planner.handle
    return lambda: g.execute_plan_at_index(pack, workspace, index=index, handle=handle)
