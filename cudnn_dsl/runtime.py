"""Runtime layer: a compiled graph bound to torch buffers by UID, executed on the GPU."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import torch

from cudnn_dsl.backend import load_cudnn
from cudnn_dsl.dtypes import TORCH
from cudnn_dsl.lower import Lowered, lower, plan
from cudnn_dsl.reference import run_reference
from cudnn_dsl.store import Entry, PlanKey, PlanStore, StoreProblem, atomic_write, graph_digest
from cudnn_dsl.tensors import BindingError, Comparison, check_binding, compare, empty, generate_inputs
from dsl.ir import Graph, Instance, Options
from dsl.types import fmt_shape


@attrs.define
class Executable:
    """One planned instance: the cuDNN graph, its workspace, and its host scalars."""

    low: Lowered
    handle: Any
    device: torch.device
    workspace: torch.Tensor
    host: dict[int, torch.Tensor]
    """uid -> CPU tensor of each pass-by-value scalar (cuDNN reads it at launch)"""
    plan_name: str = ""
    source: str = "heuristics"
    """where the plan came from: heuristics, or the plan store (blob, or engine id + knobs)"""
    notes: list[str] = attrs.Factory(list)
    """fallbacks taken on the way, said to the user"""

    def pack(self, tensors: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> dict[int, Any]:
        return make_pack(self.low, self.host, tensors, outputs)

    def launch(self, pack: dict[int, Any]) -> None:
        cudnn = load_cudnn()
        cudnn.set_stream(self.handle, torch.cuda.current_stream(self.device).cuda_stream)
        self.low.g.execute(pack, self.workspace, handle=self.handle)


@attrs.define
class Bound:
    """A graph bound once to its buffers: `run()` launches with no per-call Python checks.

    The buffers were checked when bound; they must stay alive and in place. Launches go on the
    stream that was current at bind time.
    """

    exe: Executable
    outputs: dict[str, torch.Tensor]
    keep: dict
    """uid -> buffer: the references that keep every bound buffer alive"""
    launch: Any = None

    def __attrs_post_init__(self):
        self.launch = _raw_launcher(self.exe, self.keep) or self._ordered_launcher()

    def _ordered_launcher(self):
        g, ws, h = self.exe.low.g, self.exe.workspace, self.exe.handle
        uids = tuple(self.keep)
        buffers = tuple(self.keep[u] for u in uids)
        return lambda: g.execute(buffers, ws, handle=h, tensor_uids=uids)

    def run(self) -> dict[str, torch.Tensor]:
        self.launch()
        return self.outputs


def _raw_launcher(exe: Executable, pack: dict):
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


@attrs.define
class Replay:
    """An execution captured into a CUDA graph; `replay()` relaunches it with one call."""

    cuda_graph: Any
    bound: Bound

    @property
    def outputs(self) -> dict[str, torch.Tensor]:
        return self.bound.outputs

    def replay(self) -> dict[str, torch.Tensor]:
        self.cuda_graph.replay()
        return self.bound.outputs


def _cuda_device(device: int | str | None) -> torch.device:
    """A CUDA device with its index, so it compares equal to a tensor's ``.device``."""
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    if d.type != "cuda":
        raise ValueError(f"cudnn-dsl runs graphs on CUDA devices, not {d}")
    return d if d.index is not None else torch.device("cuda", torch.cuda.current_device())


def _host_scalar(value, dtype: str) -> torch.Tensor:
    return torch.full((1,), float(value), dtype=TORCH[dtype])


def host_tensors(low: Lowered) -> dict[int, torch.Tensor]:
    """uid -> CPU tensor of every pass-by-value tensor the lowering made, at its declared value."""
    return {uid: _host_scalar(v, dt) for uid, (v, dt) in low.host_values.items()}


def make_pack(low: Lowered, host: dict, tensors: dict, outputs: dict) -> dict[int, Any]:
    """The variant pack, uid -> buffer: host scalars (a scalar given by name overrides its value),
    device inputs, outputs."""
    pack = dict(host)
    for v in low.graph.inputs:
        if v.name in tensors:
            if v.kind == "scalar":
                pack[v.uid] = _host_scalar(tensors[v.name], low.instance.type(v.name).dtype)
            else:
                pack[v.uid] = tensors[v.name]
    for v in low.graph.outputs:
        pack[v.uid] = outputs[v.name]
    return pack


class CompiledGraph:
    """A checked graph, compiled for the local GPU on first use of each shape.

    Call it with torch tensors by name: ``y = cg(x=x, w=w, b=b)["out"]``. Scalars may be
    given (a number) or left to their declared value.
    """

    def __init__(self, graph: Graph, options: Options | None = None, device: int | str | None = None,
                 progress=None, use_store: bool = True, rebuild: bool = False, store: PlanStore | None = None):
        self.graph = graph
        self.options = options or graph.options
        self.device = _cuda_device(device)
        self.progress = progress
        self.use_store = use_store
        """look plans up in, and save them to, the plan store"""
        self.rebuild = rebuild
        """ignore stored plans (and overwrite them)"""
        self.store = store or PlanStore()
        self._exes: dict[tuple, Executable] = {}
        self._handle = None
        self._kc = None
        self._kc_first_build_s: float | None = None
        self.kernel_cache_loaded = False
        self.kernel_cache_notes: list[str] = []

    # ---- specs ------------------------------------------------------------------

    @property
    def inputs(self) -> dict[str, Any]:
        """name -> TensorType of each input (of the first shape, for a dynamic graph)."""
        inst = self.graph.instances[0]
        return {v.name: inst.type(v.name) for v in self.graph.inputs}

    @property
    def outputs(self) -> dict[str, Any]:
        inst = self.graph.instances[0]
        return {v.name: inst.type(v.name) for v in self.graph.outputs}

    def instance_for(self, tensors: dict[str, Any]) -> Instance:
        """The declared shape that the given inputs match; a clear error when none does."""
        if len(self.graph.instances) == 1:
            return self.graph.instances[0]
        for inst in self.graph.instances:
            if all(tuple(tensors[v.name].shape) == inst.type(v.name).shape
                   for v in self.graph.of_kind("input") if isinstance(tensors.get(v.name), torch.Tensor)):
                return inst
        given = ", ".join(f"{k} {fmt_shape(tuple(t.shape))}" for k, t in tensors.items() if isinstance(t, torch.Tensor))
        declared = "; ".join(s.name + " in {" + ", ".join(map(str, s.values)) + "}" for s in self.graph.symbols)
        raise BindingError(f"graph '{self.graph.name}': inputs ({given}) match none of the declared shapes ({declared})")

    def allocate_inputs(self, binding: dict[str, int] | None = None, seed: int | None = None) -> dict[str, torch.Tensor]:
        inst = self.graph.instance(binding)
        return generate_inputs(self.graph, inst, self.device, self.options.seed if seed is None else seed)

    # ---- compile and run ------------------------------------------------------------

    def executable(self, inst: Instance) -> Executable:
        key = inst.binding
        exe = self._exes.get(key)
        if exe is None:
            exe = self._compile(inst)
            self._exes[key] = exe
        return exe

    def _compile(self, inst: Instance) -> Executable:
        cudnn = load_cudnn()
        if self._handle is None:
            with torch.cuda.device(self.device):
                self._handle = cudnn.create_handle()
        self._kernel_cache_load()
        low = lower(self.graph, inst, handle=self._handle, kernel_cache=self._kc)
        host = host_tensors(low)
        key = self._key(inst) if self.use_store else None
        notes: list[str] = []
        entry = None
        if key is not None and not self.rebuild:
            try:
                entry = self.store.get(key)
            except StoreProblem as e:
                notes.append(f"plan store: {e}; rebuilding")
        if entry is not None:
            exe = self._from_entry(low, entry, host, notes)
            if exe is not None:
                return exe
        o = self.options
        cached = self._kc_size()
        plan(low, o.modes(), o.build_policy, o.workspace_limit, torch.cuda.get_device_name(self.device),
             self.progress)
        if self._kc is not None:
            notes.append(self._kernel_cache_note(cached, self._kc_size(), low.timings.get("build_plans", 0.0)))
        exe = self._executable(low, host, "heuristics", notes)
        if key is not None:
            self._persist(key, exe, tuned=False)
        self._kernel_cache_save()
        return exe

    def _executable(self, low: Lowered, host, source: str, notes, workspace: int | None = None) -> Executable:
        size = low.g.get_workspace_size() if workspace is None else workspace
        ws = torch.empty(max(size, 1), dtype=torch.uint8, device=self.device)
        index = getattr(low.g, "_plan_index", 0)
        name = low.g.get_plan_name_at_index(index) if low.plan_count else ""
        return Executable(low, self._handle, self.device, ws, host, name, source, notes)

    def _from_entry(self, low: Lowered, entry, host, notes) -> Executable | None:
        """The stored plan: its blob first (no heuristics, no compilation), then its engine and knobs."""
        cudnn = load_cudnn()
        t0 = time.perf_counter()
        try:
            g = cudnn.pygraph(handle=self._handle)
            g.deserialize(self._handle, entry.blob)
            loaded = Lowered(low.graph, low.instance, g, low.host_values, {"deserialize": time.perf_counter() - t0})
            exe = self._executable(loaded, host, "plan store (serialized plan)", notes,
                                   max(entry.workspace, _workspace_of(g)))
            exe.plan_name = entry.plan_name
            return exe
        except Exception as e:  # noqa: BLE001 - a blob from another build of cuDNN fails in many ways
            notes.append(f"stored plan blob did not load ({_short(e)}); rebuilding engine {entry.engine_id}")
        try:
            t0 = time.perf_counter()
            g = low.g
            g.validate()
            g.build_operation_graph()
            knobs = {getattr(cudnn.knob_type, k): v for k, v in entry.knobs.items()}
            g.create_execution_plan(entry.engine_id, knobs)
            index = g.get_execution_plan_count() - 1
            g.check_support()
            g.build_plan_at_index(index)
            low.timings["rebuild_from_engine"] = time.perf_counter() - t0
            low.plan_count = index + 1
            return self._executable(low, host, "plan store (engine id + knobs)", notes)
        except Exception as e:  # noqa: BLE001
            notes.append(f"stored engine {entry.engine_id} did not rebuild ({_short(e)}); using heuristics")
            return None

    def _key(self, inst: Instance) -> PlanKey:
        from cudnn_dsl.backend import versions

        v = versions()
        major, minor = torch.cuda.get_device_capability(self.device)
        return PlanKey(graph_digest(self.graph, inst), torch.cuda.get_device_name(self.device), f"{major}.{minor}",
                       v["cudnn_backend"], v["cudnn_frontend"])

    def _persist(self, key: PlanKey, exe: Executable, tuned: bool, timing: dict | None = None) -> None:
        g = exe.low.g
        index = getattr(g, "_plan_index", 0)
        try:
            engine_id, knobs = g.get_engine_and_knobs_at_index(index)
            blob = bytes(g.serialize(as_bytes=True))
        except Exception as e:  # noqa: BLE001 - some plans cannot serialize; the run goes on
            exe.notes.append(f"plan not stored: {_short(e)}")
            return
        self.store.put(Entry(key, self.graph.name, exe.plan_name, int(engine_id),
                             {getattr(k, "name", str(k)): int(v) for k, v in knobs.items()}, blob,
                             int(exe.workspace.numel()), tuned, timing or {}, time.time()))

    # ---- dynamic shapes: one kernel cache for every shape of the graph ----------------

    def _kernel_cache_path(self) -> Path:
        digest = graph_digest(self.graph, self.graph.instances[0])[:24]
        return self.store.root.parent / "kernels" / f"{self.graph.name}-{digest}.cache"

    def _kernel_cache_load(self) -> None:
        if not self.graph.symbols or self._kc is not None:
            return
        cudnn = load_cudnn()
        self._kc = cudnn.create_kernel_cache()
        path = self._kernel_cache_path()
        if self.use_store and not self.rebuild and path.exists():
            try:
                self._kc.deserialize(path.read_text())
                self.kernel_cache_loaded = True
            except Exception as e:  # noqa: BLE001
                self.kernel_cache_notes.append(f"kernel cache {path.name} did not load ({_short(e)}); starting empty")
                self._kc = cudnn.create_kernel_cache()

    def _kc_size(self) -> int | None:
        """Entries in the shared kernel cache; None where cuDNN cannot count them (before 9.27)."""
        try:
            return self._kc.size() if self._kc is not None else None
        except RuntimeError:
            return None

    def _kernel_cache_note(self, before: int | None, after: int | None, build_s: float) -> str:
        """Whether this shape's build reused the shared cache: by cuDNN's count of its entries where
        it gives one, else by build time against the first shape's."""
        first = self._kc_first_build_s is None
        if first:
            self._kc_first_build_s = build_s
        if before is not None and after is not None:
            if after == before:
                return f"kernel cache: no new kernel compiled ({after} in the shared cache)"
            if first:
                return f"kernel cache: compiled {after - before} kernel(s) for the first shape"
            return f"kernel cache: WARNING: this shape compiled {after - before} new kernel(s) instead of reusing the cache"
        ms, first_ms = build_s * 1e3, self._kc_first_build_s * 1e3
        if first:
            return f"kernel cache: first shape, build_plans {ms:.1f} ms"
        if build_s > max(3 * self._kc_first_build_s, 0.1):
            return (f"kernel cache: WARNING: build_plans took {ms:.1f} ms against {first_ms:.1f} ms for the first "
                    f"shape, like a fresh compile")
        return f"kernel cache: build_plans {ms:.1f} ms (first shape {first_ms:.1f} ms)"

    def _kernel_cache_save(self) -> None:
        if self._kc is None or not self.use_store:
            return
        try:
            atomic_write(self._kernel_cache_path(), self._kc.serialize())
        except Exception as e:  # noqa: BLE001 - not every cache can serialize
            self.kernel_cache_notes.append(f"kernel cache not saved: {_short(e)}")

    # ---- fast paths -----------------------------------------------------------------------

    def bind(self, out: dict[str, torch.Tensor] | None = None, **tensors) -> Bound:
        """Checks the buffers once and returns a Bound whose run() launches with no checks."""
        cudnn = load_cudnn()
        inst = self.instance_for(tensors)
        exe = self.executable(inst)
        outputs = self._bind(inst, tensors, out)
        pack = exe.pack(tensors, outputs)
        cudnn.set_stream(exe.handle, torch.cuda.current_stream(self.device).cuda_stream)
        return Bound(exe, outputs, pack)

    def capture(self, out: dict[str, torch.Tensor] | None = None, **tensors) -> Replay:
        """Captures one execution into a CUDA graph (the handle follows the capture stream)."""
        cudnn = load_cudnn()
        bound = self.bind(out, **tensors)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm up off the default stream, as capture wants
            cudnn.set_stream(bound.exe.handle, side.cuda_stream)
            bound.run()
        torch.cuda.current_stream(self.device).wait_stream(side)
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            cudnn.set_stream(bound.exe.handle, torch.cuda.current_stream(self.device).cuda_stream)
            bound.run()
        cudnn.set_stream(bound.exe.handle, torch.cuda.current_stream(self.device).cuda_stream)
        return Replay(cg, bound)

    def __call__(self, out: dict[str, torch.Tensor] | None = None, **tensors) -> dict[str, torch.Tensor]:
        inst = self.instance_for(tensors)
        exe = self.executable(inst)
        outputs = self._bind(inst, tensors, out)
        exe.launch(exe.pack(tensors, outputs))
        return outputs

    def _bind(self, inst: Instance, tensors: dict, out: dict | None) -> dict[str, torch.Tensor]:
        names = {v.name for v in self.graph.inputs}
        unknown = set(tensors) - names
        if unknown:
            raise BindingError(f"graph '{self.graph.name}' has no input {', '.join(sorted(unknown))} "
                               f"(inputs: {', '.join(sorted(names))})")
        for v in self.graph.of_kind("input"):
            if v.name not in tensors:
                raise BindingError(f"graph '{self.graph.name}': input '{v.name}' is not bound")
            check_binding(v.name, tensors[v.name], inst.type(v.name), self.device)
        outputs = {}
        for v in self.graph.outputs:
            t = inst.type(v.name)
            if out is not None and v.name in out:
                check_binding(v.name, out[v.name], t, self.device)
                outputs[v.name] = out[v.name]
            else:
                outputs[v.name] = empty(t, self.device)
        return outputs

    def reference(self, **tensors) -> dict[str, torch.Tensor]:
        return run_reference(self.graph, self.instance_for(tensors), tensors, self.device)

    def check(self, atol: dict | float | None = None, rtol: dict | float | None = None, **tensors) -> list[Comparison]:
        """Runs the graph and its reference on the same inputs and compares every output."""
        got = self(**tensors)
        want = self.reference(**tensors)
        return compare_outputs(self.graph, self.instance_for(tensors), got, want, self.options, atol, rtol)


def compare_outputs(graph: Graph, inst: Instance, got, want, options: Options, atol=None, rtol=None) -> list[Comparison]:
    def pick(v, name, default):
        """v: one tolerance for every output, or {output: tolerance}; None: the file's or the dtype's."""
        if isinstance(v, dict):
            return v.get(name, default)
        return default if v is None else v

    floor = loosest_input_dtype(graph, inst)
    return [compare(v.name, got[v.name], want[v.name], inst.type(v.name).dtype,
                    pick(atol, v.name, options.atol), pick(rtol, v.name, options.rtol), floor) for v in graph.outputs]


def loosest_input_dtype(graph: Graph, inst: Instance) -> str | None:
    """An output is never checked tighter than its least precise input allows (an AMAX in float
    of bf16 data is only as exact as bf16)."""
    from cudnn_dsl.dtypes import tolerance

    dtypes = [inst.type(v.name).dtype for v in graph.of_kind("input")]
    return max(dtypes, key=lambda d: tolerance(d)[0], default=None)


def _workspace_of(g) -> int:
    """The workspace a loaded plan asks for; 0 where this frontend cannot say (the entry's then stands)."""
    try:
        return int(g.get_workspace_size())
    except Exception:  # noqa: BLE001
        return 0


def _short(e: Exception) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__


def replay_time_us(fn, handle, device, iterations: int, warmup: int, inner: int = 10) -> list[float]:
    """GPU time per call of fn() without host gaps: `inner` calls captured in a CUDA graph, then
    one sample per replay. Falls back to event timing when the launch cannot be captured."""
    cudnn = load_cudnn()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            cudnn.set_stream(handle, torch.cuda.current_stream(device).cuda_stream)
            for _ in range(inner):
                fn()
    except Exception:  # noqa: BLE001 - capture refused: time launches directly
        return gpu_time_us(fn, iterations, 0, inner)
    finally:
        cudnn.set_stream(handle, torch.cuda.current_stream(device).cuda_stream)
    return [t / inner for t in gpu_time_us(graph.replay, iterations, warmup=1, inner=1)]


def gpu_time_us(fn, iterations: int = 20, warmup: int = 3, inner: int = 10) -> list[float]:
    """GPU time per call of fn() in microseconds: one sample per CUDA-event pair around `inner`
    back-to-back calls, so the device queue stays full and host overhead is not counted."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    for s, e in zip(starts, ends):
        s.record()
        for _ in range(inner):
            fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 / inner for s, e in zip(starts, ends)]


def host_time_us(fn, iterations: int = 200) -> float:
    """Median host time of one call of fn() in microseconds (the GPU is synchronized at the end)."""
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2]
