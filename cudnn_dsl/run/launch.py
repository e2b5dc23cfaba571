"""Launching: the one place where a graph's buffers reach their cuDNN UIDs (the variant pack) and a plan runs.

A Layout works out once per shape where each UID takes its buffer from; a launch then gathers only the
buffers, in the Layout's order, for the frontend's ordered execute. A Launch is one executable with its
Layout; a Bound launches one variant pack again and again (through the frontend's innermost launch, on a
pointer array, where the pinned version allows), and can take some of its buffers afresh per launch
(`Bound.repoint`, what run.launch_plan rebinds with); `plan_runner` launches one of tune's candidate plans by
its index. The current device and stream are read here as torch's raw numbers (no Stream object is made).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cudnn_dsl.build.planner import Candidates, Executable, host_tensors
from cudnn_dsl.run.buffers import on, window
from cudnn_dsl.target.library import load_cudnn
from cudnn_dsl.target.memory import host_scalar
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
        self.origin: dict[int, str] = {
            **{u: names[i] for i, u in self.plain},
            **{u: names[i] for i, _, u in self.views},
            **{u: v.name for (_, u, _), v in zip(self.scalars, scalars)},
            **{v.uid: v.name for v in self.fresh},
            **{u: names[i] for u, i, _ in self.in_place},
        }
        """uid -> the argument or output whose memory (or value, for a scalar) its buffer is: a view's buffer, an
        output in place the bound tensor it is written over; the lowering's host tensors have none"""
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
            number(tensors.get(v.name, v.scalar)) for v in self.scalar_values
        ]
        return self.buffers(values, [outputs[v.name] for v in self.fresh])


def number(value):
    """A scalar given as a one-element tensor, as its number (what its CPU tensor is made from)."""
    return value.item() if isinstance(value, torch.Tensor) else value


class Launch:
    """One executable and its Layout, launched through the frontend's ordered execute on the device's
    current stream: `run` and `bind` take the buffers by name (checked by the caller)."""

    def __init__(self, exe: Executable, graph: Graph | None = None):
        """`graph`: a graph equal to the executable's but for its names (a part that shares the compiled graph of
        an equal part: run.partition.build_key), whose names the buffers are given by; by default its own."""
        graph, inst = (exe.low.graph, exe.low.instance) if graph is None else (graph, graph.instances[0])
        self.exe, self.device = exe, exe.device
        self.layout = Layout(graph, inst, exe.host)
        self.set_stream = load_cudnn().set_stream

    def run(self, tensors: dict, outputs: dict[str, torch.Tensor]) -> None:
        self.on(self.layout.named(tensors, outputs))

    def on(self, buffers: tuple) -> None:
        """One launch on these buffers (`Layout.buffers`)."""
        exe = self.exe
        self.set_stream(exe.handle, current_stream(self.device.index))
        # an override-shape plan (built at the largest shape) runs this shape only given its dims: without them
        # cuDNN would run the built shape on these smaller buffers
        exe.low.g.execute(buffers, exe.workspace, handle=exe.handle, tensor_uids=self.layout.uids, **exe.overrides)

    def bind(self, tensors: dict, outputs: dict[str, torch.Tensor]) -> Bound:
        """The buffers bound once, for launches with no per-call Python work on the stream current now."""
        self.set_stream(self.exe.handle, current_stream(self.device.index))
        return Bound(self.exe, outputs, dict(zip(self.layout.uids, self.layout.named(tensors, outputs))))


class Bound:
    """A graph bound once to its buffers: `run()` (or a call) launches with no per-call Python checks.

    The buffers were checked when bound; they must stay alive and in place. Launches go on the
    stream that was current at bind time.
    """

    def __init__(self, exe: Executable, outputs: dict[str, torch.Tensor], keep: dict[int, Any]):
        self.exe, self.outputs = exe, outputs
        self.keep = keep
        """uid -> buffer: the references that keep every bound buffer alive"""
        self.pointers = pointers(exe, keep)

    @property
    def plan_name(self) -> str:
        return self.exe.plan_name

    @property
    def source(self) -> str:
        return self.exe.source

    def set_stream(self, stream) -> None:
        load_cudnn().set_stream(self.exe.handle, stream)

    def __call__(self) -> None:
        self.pointers.launch()

    def run(self) -> dict[str, torch.Tensor]:
        self.pointers.launch()
        return self.outputs

    def repoint(self, moving: Sequence[tuple[int, int]], first: Sequence[int]) -> Callable[[Sequence[int]], None]:
        """Some of this launch's buffers taken afresh before each launch: `moving` gives (uid, source) per such
        buffer, and `point(ptrs)` points its entry at `ptrs[source]` plus the offset it has from `first[source]`
        now (a view's window, an output in place of one); a source past `first` is a scalar's CPU tensor, no
        offset. A UID the backend does not read is left out. The buffers bound now for those UIDs are let go
        (their entries hold bare addresses): `point` keeps the others, and the executable's workspace, alive."""
        p = self.pointers
        at = {u: k for k, u in enumerate(p.uids)}
        slots = []
        for uid, source in moving:
            if uid in at:
                offset = self.keep[uid].data_ptr() - first[source] if source < len(first) else 0
                slots.append((at[uid], source, offset))
                p.array[at[uid]] = self.keep[uid].data_ptr()
        moved = {uid for uid, _ in moving}
        stays = {u: b for u, b in self.keep.items() if u not in moved}
        array, slots = p.array, tuple(slots)

        def point(ptrs: Sequence[int], keep=(self.exe, stays)) -> None:
            for slot, source, offset in slots:
                array[slot] = ptrs[source] + offset

        return point


class Pointers:
    """A variant pack as a launch reads it: one entry per UID in `uids`' order (a device pointer, or for the
    public execute, a buffer or a bare address) and the launch that reads it, a function of this module named
    `execute` (bench/train.py's host profile finds cuDNN's launches by it). An entry may be pointed elsewhere
    between launches."""

    def __init__(self, array, uids: tuple[int, ...], launch: Callable[[], None]):
        self.array, self.uids, self.launch = array, uids, launch


def pointers(exe: Executable, pack: dict[int, Any]) -> Pointers:
    """The pack of one executable on these buffers: the pointer array the backend's launch reads (raw_pointers),
    else the frontend's public, ordered execute."""
    raw = None if exe.overrides else raw_pointers(exe, pack)
    if raw is not None:
        return raw
    uids, array = tuple(pack), list(pack.values())
    g, ws, h, overrides = exe.low.g, exe.workspace, exe.handle, exe.overrides

    def execute() -> None:
        g.execute(array, ws, handle=h, tensor_uids=uids, **overrides)

    return Pointers(array, uids, execute)


def raw_pointers(exe: Executable, pack: dict[int, Any]) -> Pointers | None:
    """The frontend's own innermost launch on a pointer array, the variant pack normalized once.

    pygraph.execute re-normalizes the variant pack on every call (~15 µs on the H200); for a bound graph the
    frontend normalizes it here once (every UID the backend reads must have a buffer, in the backend's order),
    its pointers are copied into an array of ours, and the backend launch is called on that array directly.
    These are frontend internals (target.library.FRONTEND_INTERNALS, checked at import): if any is missing, None
    sends the caller to the public path.
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
        array = (ctypes.c_void_p * len(vp))(*(vp.native.pointer(k) for k in range(len(vp))))
        args = (ctypes.addressof(array), len(vp), vp.workspace, exe.handle.backend_handle or 0, index)
        launch = lowered._execute_with_raw_ptrs
    except Exception:  # noqa: BLE001 - any drift in the internals: use the public path
        return None

    def execute() -> None:
        launch(*args)

    return Pointers(array, tuple(vp.uids), execute)


def current_device() -> int:
    """The index of torch's current CUDA device."""
    return torch._C._cuda_getDevice()


def current_stream(index: int) -> int:
    """The raw handle of the current CUDA stream of a device (its number, as cudnn.set_stream takes it)."""
    return torch._C._cuda_getCurrentRawStream(index)


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
