"""Planning one graph: a Planner turns each shape into an Executable.

A Planner owns what a graph's builds share (the cuDNN handle on its device, the dynamic-shape kernel
cache, the plan store) and turns one shape of a graph into an Executable: from the local plan store
(serialized plan, then engine id and knobs), else from a pinned fleet store (store.fleet: engine id and
knobs, or the serialized plan of a manifest signed by a trusted key; copied into the local store), else
from the heuristics, through the pipeline's stages on its GPU (build.pipeline, whose executable stage it
is). Tuning asks it for the candidates and adopts a winner. With `option require_store_hit`, every shape to
be served is looked up along the same chain before anything is built, and the ones with no tuned plan are
refused in one error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from cudnn_dsl.build.constraints import (
    PlanSpec,
    engine_of,
    knobs_at,
    over_workspace_limit,
)
from cudnn_dsl.build.lower import Lowered, clean, override_args
from cudnn_dsl.build.override import OverrideDeclined
from cudnn_dsl.build.pipeline import compile_override, compile_shape, dynamic_shapes
from cudnn_dsl.build.space import add_plan
from cudnn_dsl.build.steps import check_support_within, selected_index
from cudnn_dsl.ops.quantize import tile_order_refusal
from cudnn_dsl.store.files import StoreProblem
from cudnn_dsl.store.fleet import Fleet, Hit
from cudnn_dsl.store.kernels import load_kernel_cache_text, save_kernel_cache_text
from cudnn_dsl.store.keys import PlanKey, graph_digest
from cudnn_dsl.store.plans import Entry, PlanStore
from cudnn_dsl.target.library import BackendUnavailable, load_cudnn, versions
from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Graph, Instance
from dsl.options import Options

FROM_BLOB = "plan store (serialized plan)"
"""the source of a plan loaded from its serialized form"""

# ---- executables -------------------------------------------------------------------------


@attrs.define
class Executable:
    """One planned shape: the cuDNN graph with a plan selected, its workspace, its host scalars (run.launch
    launches it)."""

    low: Lowered
    handle: Any
    device: Any
    workspace: Any
    """a torch uint8 tensor on the device"""
    host: dict[int, Any]
    """uid -> CPU tensor of each pass-by-value scalar (cuDNN reads it at launch)"""
    plan_name: str = ""
    source: str = "heuristics"
    """where the plan came from: heuristics, autotuned, or the plan store (blob, or engine id + knobs)"""
    notes: list[str] = attrs.Factory(list)
    """fallbacks taken on the way, said to the user"""
    overrides: dict[str, list] = attrs.Factory(dict)
    """execute()'s shape overrides (override_uids, _shapes, _strides) when the plan was built at another shape
    in override-shape mode; empty for a plan of this shape"""

    @property
    def workspace_bytes(self) -> int:
        return int(self.workspace.numel()) if self.workspace.numel() > 1 else 0


def host_tensors(low: Lowered, device) -> dict[int, Any]:
    """uid -> what the graph gets besides the caller's buffers: a CPU tensor of every pass-by-value
    tensor the lowering made, at its declared value, and scratch memory on `device` (Lowered.scratch)."""
    from cudnn_dsl.target.memory import empty, host_scalar

    host = {uid: host_scalar(v, dt) for uid, (v, dt) in low.host_values.items()}
    host.update({uid: empty(low.instance.type(name), device) for name, uid in low.scratch.items()})
    return host


def _compiles_at_run_time(low: Lowered) -> bool:
    """Whether the selected plan carries cuDNN's RUNTIME_COMPILATION note (a python engine's plan has none)."""
    cudnn = load_cudnn()
    try:
        notes = low.g.get_behavior_notes_for_plan_at_index(selected_index(low.g))
    except Exception:  # noqa: BLE001 - python-engine plans have no backend notes
        return False
    return cudnn.behavior_note.RUNTIME_COMPILATION in notes


class Candidates:
    """Every plan the heuristics offer for one shape, planned through check_support; each is
    built by its index (the heuristics' rank), and run so by run.launch.plan_runner. Without a planner
    (deviceless), plans are only listed and added, never built."""

    def __init__(self, planner: Planner | None, low: Lowered, options: Options):
        self.planner, self.low, self.options = planner, low, options

    @property
    def count(self) -> int:
        return self.low.plan_count

    @property
    def indices(self) -> list[int]:
        """The plans the options' constraints leave."""
        return self.low.allowed if self.low.allowed is not None else list(range(self.low.plan_count))

    def name(self, index: int) -> str:
        return self.low.g.get_plan_name_at_index(index)

    def engine_and_knobs(self, index: int) -> tuple[int | None, dict[str, int]]:
        engine = engine_of(self.low, index)
        return engine, knobs_at(self.low.g, index) if engine is not None else {}

    def add(self, engine: int, knobs: dict[str, int]) -> int:
        """A plan of this engine and knobs, appended to the candidates; its index (raises when cuDNN refuses it)."""
        return add_plan(self.low, engine, knobs, self.options)

    def build(self, index: int) -> int:
        """Builds one plan; returns the workspace it needs in bytes."""
        self.low.g.build_plan_at_index(index)
        return int(self.low.g.get_workspace_size_plan_at_index(index))

    def executable(self, index: int) -> Executable:
        """This plan selected for execute() and serialize()."""
        self.low.g.build_plan_at_index(index)
        return self.planner.executable_of(self.low, "autotuned", [])


class Planner:
    """Turns each shape of one graph into an Executable, sharing a handle, a kernel cache and the
    plan store across shapes."""

    def __init__(
        self,
        graph: Graph,
        options: Options,
        device,
        store: PlanStore | None = None,
        use_store: bool = True,
        rebuild: bool = False,
        progress: Callable[[str], None] | None = None,
        fleet: Fleet | None = None,
    ):
        self.graph, self.options, self.device = graph, options, device
        self.store = store or PlanStore()
        self.use_store = use_store
        """look plans up in, and save them to, the plan store"""
        self.rebuild = rebuild
        """ignore stored plans (and overwrite them)"""
        self.progress = progress
        self.plan_spec: PlanSpec | None = None
        """the one plan to build (run --plan): neither looked up in nor saved to the store"""
        self.use_kernel_cache = dynamic_shapes(graph, options)
        """build in cuDNN's dynamic-shape mode, sharing one kernel cache across the shapes (auto turns it on
        once a plan turns out to compile its kernel at run time)"""
        self.use_override = bool(graph.symbols) and options.shape_mode == "override"
        """run every shape with the one plan built in cuDNN's override-shape mode (when this cuDNN can)"""
        self._override: Executable | None = None
        self._override_declined: str | None = None
        self._handle = None
        self._kc = None
        self._kc_first_build_s: float | None = None
        self._exes: dict[tuple, Executable] = {}
        self.kernel_cache_loaded = False
        self.kernel_cache_notes: list[str] = []
        self.fleet = fleet if fleet is not None else Fleet.from_env() if use_store else Fleet()
        """the pinned fleet stores asked after the local store (CUDNN_DSL_STORE)"""

    # ---- what every build shares ----------------------------------------------------------

    @property
    def handle(self):
        """The cuDNN handle, created on this planner's device."""
        if self._handle is None:
            import torch

            with torch.cuda.device(self.device):
                self._handle = load_cudnn().create_handle()
        return self._handle

    @property
    def device_name(self) -> str:
        import torch

        return torch.cuda.get_device_name(self.device)

    @property
    def compute_capability(self) -> str:
        import torch

        major, minor = torch.cuda.get_device_capability(self.device)
        return f"{major}.{minor}"

    def key(self, inst: Instance) -> PlanKey:
        return plan_key(self.graph, inst, self.options, self.device_name, self.compute_capability)

    def require_tuned(self, instances) -> None:
        """NotTuned, naming every shape of these with no tuned plan for this GPU along the lookup chain."""
        missing = untuned(
            self.graph, instances, self.options, self.device_name, self.compute_capability, self.store, self.fleet
        )
        if missing is not None:
            raise NotTuned([missing])

    def stage(self, inst: Instance, stop: str, dynamic: bool | None = None, **planning) -> Lowered:
        """The shape at the pipeline's stage `stop` (lowered, or planned through a step) on this GPU: in
        dynamic-shape mode, with the shared kernel cache, as the planner goes or as `dynamic` says. `planning`:
        compile_shape's `tuning` or `pin`."""
        return compile_shape(
            self.graph,
            inst,
            self.options,
            stop=stop,
            handle=self.handle,
            gpu=self.device_name,
            kernel_cache=self._kernel_cache(dynamic),
            progress=self.progress,
            **planning,
        )

    def executable_of(self, low: Lowered, source: str, notes: list[str], workspace: int | None = None) -> Executable:
        """An Executable of the plan the lowered graph has selected, its workspace allocated."""
        import torch

        size = low.g.get_workspace_size() if workspace is None else workspace
        ws = torch.empty(max(size, 1), dtype=torch.uint8, device=self.device)
        name = low.g.get_plan_name_at_index(selected_index(low.g)) if low.plan_count else ""
        return Executable(low, self.handle, self.device, ws, host_tensors(low, self.device), name, source, notes)

    # ---- one shape -> an executable -------------------------------------------------------

    @property
    def built(self) -> list[tuple]:
        """The bindings of the shapes built so far (or adopted from tuning)."""
        return list(self._exes)

    def executable(self, inst: Instance) -> Executable:
        """The shape's executable: built once per planner, from the store when it can be."""
        exe = self._exes.get(inst.binding)
        if exe is None:
            exe = self._exes[inst.binding] = self._overridden(inst) if self.use_override else self._build(inst)
        return exe

    def _overridden(self, inst: Instance) -> Executable:
        """The shape run by the one override-shape plan, built on first use; where this cuDNN or this graph
        cannot have one, the shape's own plan (as under shape_mode auto), with a note saying why."""
        if self._override is None and self._override_declined is None:
            try:
                low = compile_override(
                    self.graph,
                    self.options,
                    handle=self.handle,
                    gpu=self.device_name,
                    progress=self.progress,
                    pin=self.plan_spec,
                )
                self._override = self.executable_of(low, "heuristics, override-shape mode", [])
            except OverrideDeclined as e:
                self._override_declined = str(e)
        if self._override is None:
            exe = self._build(inst)
            exe.notes.insert(
                0, f"shape_mode = override not used, a plan for this shape instead: {self._override_declined}"
            )
            return exe
        return self._override_at(inst)

    def _override_at(self, inst: Instance) -> Executable:
        """The override-shape plan at this shape: the same built cuDNN graph, launched with this shape's dims
        and strides as execute-time overrides; a larger workspace only where cuDNN asks for one at this shape."""
        import torch

        base = self._override
        overrides = override_args(self.graph, inst)
        try:
            size = int(base.low.g.get_workspace_size(self.handle, **overrides))
        except Exception:  # noqa: BLE001 - a frontend that cannot size an override: the built shape's size
            size = 0
        workspace = base.workspace
        if size > workspace.numel():
            workspace = torch.empty(size, dtype=torch.uint8, device=self.device)
        low = attrs.evolve(base.low, instance=inst)  # the built graph, bound and checked at this shape
        note = (
            f"override-shape plan built once at {base.low.instance.label} for every shape (option shape_mode = "
            f"override); this shape runs it through execute-time shape overrides"
        )
        return attrs.evolve(base, low=low, workspace=workspace, notes=[note], overrides=overrides)

    def _build(self, inst: Instance) -> Executable:
        refusal = tile_order_refusal(self.graph, inst)
        if refusal and float(self.compute_capability) >= 10:  # below sm_100 cuDNN refuses block scales, and says so
            raise BackendUnavailable(refusal)
        key = self.key(inst) if self.use_store and self.plan_spec is None else None
        notes: list[str] = []
        replace = self.rebuild
        if key is not None and not self.rebuild:
            exe, replace = self._from_store(inst, key, notes)
            if exe is not None:
                return exe
        dynamic = self.use_kernel_cache
        if dynamic:  # loaded before the build, which then adds to it
            self._kernel_cache_load()
        cached = self._kc_size()
        # lowered afresh: a stored engine that failed to rebuild may have left its graph half-built
        low = self.stage(inst, "build_plans", pin=self.plan_spec)
        if dynamic:
            notes.append(self._kernel_cache_note(cached, self._kc_size(), low.timings.get("build_plans", 0.0)))
        elif self.graph.symbols:
            notes.append(self._shape_mode_note(low))
        source = "heuristics" if self.plan_spec is None else f"--plan {self.plan_spec.text}"
        exe = self.executable_of(low, source, notes)
        if key is not None:  # --rebuild, or a stored plan that proved unusable, is replaced by this one
            self._persist(key, exe, tuned=False, force=replace)
        self._kernel_cache_save()
        return exe

    def _shape_mode_note(self, low: Lowered) -> str:
        """Why this shape got a static plan; under `auto`, a plan that compiles its kernel at run time turns
        on the dynamic-shape mode (one kernel cache) for the shapes still to come."""
        build_ms = 1e3 * low.timings.get("build_plans", 0.0)
        if self.options.shape_mode == "static":
            return f"static plan for this shape (option shape_mode = static; built in {build_ms:.0f} ms)"
        if not _compiles_at_run_time(low):
            return (
                f"static plan for this shape: it compiles nothing at run time, so a build per shape is cheap "
                f"({build_ms:.0f} ms) and runs faster than a dynamic-shape plan"
            )
        self.use_kernel_cache = True
        return (
            f"static plan for this shape; it compiled its kernel at run time ({build_ms:.0f} ms), so the shapes "
            "still to come build in dynamic-shape mode and share one kernel cache"
        )

    def _from_store(self, inst: Instance, key: PlanKey, notes: list[str]) -> tuple[Executable | None, bool]:
        """The stored plan as an executable (the local store's, else a pinned fleet store's), or None; and whether
        the local entry is unusable (to be replaced)."""
        replace = False
        try:
            entry = self.store.get(key)
        except StoreProblem as e:
            notes.append(f"plan store: {e}; rebuilding")
            entry, replace = None, True
        hit = self.fleet.lookup(key, notes) if entry is None else None
        if hit is not None:
            entry = hit.entry
        if entry is None:
            return None, replace
        over = over_workspace_limit(entry.workspace, self.options)
        if over:  # right for other runs: kept
            notes.append(f"stored plan {entry.plan_name} {over}; building another")
            return None, False
        low = self.stage(inst, "lowered")
        if entry.imported:
            # A serialized plan replaces the lowered graph wholesale, and cuDNN cannot show what a blob computes,
            # so a plan from someone else's bundle is never loaded: its engine and knobs are built on this graph.
            exe = self._from_engine(low, entry, notes)
            if exe is not None:
                exe.source = hit.source if hit else "plan store (imported engine id + knobs, rebuilt here)"
                self._persist(key, exe, tuned=entry.tuned, timing=entry.timing, force=True)
        else:
            exe = self._from_blob(low, entry, notes) or self._from_engine(low, entry, notes)
            if exe is not None and hit is not None:
                self._keep(hit, exe, replace)
        if exe is not None and hit is not None:
            exe.notes.append(f"plan of key {key.id} from fleet store {hit.pin.text}, copied into the local plan store")
        return exe, exe is None

    def _keep(self, hit: Hit, exe: Executable, replace: bool) -> None:
        """A trusted fleet store's plan, copied into the local store: as fetched when its serialized plan loaded,
        else the plan rebuilt here from its engine and knobs."""
        if exe.source == FROM_BLOB:
            exe.source = hit.source
            try:
                self.store.put(hit.entry, force=replace)
            except StoreProblem as e:
                exe.notes.append(f"plan not stored: {e}")
        else:
            exe.source = f"fleet store {hit.pin.short} (engine id + knobs)"
            self._persist(hit.entry.key, exe, tuned=hit.entry.tuned, timing=hit.entry.timing, force=True)

    def _from_blob(self, low: Lowered, entry: Entry, notes: list[str]) -> Executable | None:
        """The serialized plan: no heuristics query, no kernel compilation."""
        cudnn = load_cudnn()
        t0 = time.perf_counter()
        try:
            g = cudnn.pygraph(handle=self.handle)
            g.deserialize(self.handle, entry.blob)
        except Exception as e:  # noqa: BLE001 - a blob from another build of cuDNN fails in many ways
            notes.append(f"stored plan blob did not load ({clean(e, 300)}); rebuilding engine {entry.engine_id}")
            return None
        # the scratch tensors too: the serialized plan writes them (a seeded dropout's mask) and needs their memory
        timings = {"deserialize": time.perf_counter() - t0}
        loaded = Lowered(low.graph, low.instance, g, low.host_values, timings, scratch=low.scratch)
        workspace = max(entry.workspace, _workspace_of(g))
        exe = self.executable_of(loaded, FROM_BLOB, notes, workspace)
        exe.plan_name = entry.plan_name
        return exe

    def _from_engine(self, low: Lowered, entry: Entry, notes: list[str]) -> Executable | None:
        """The stored engine id and knobs, built on the freshly lowered graph."""
        cudnn = load_cudnn()
        try:
            t0 = time.perf_counter()
            g = low.g
            g.validate()
            g.build_operation_graph()
            g.create_execution_plan(entry.engine_id, {getattr(cudnn.knob_type, k): v for k, v in entry.knobs.items()})
            index = g.get_execution_plan_count() - 1
            check_support_within(g, self.options.workspace_limit)
            g.build_plan_at_index(index)
            low.timings["rebuild_from_engine"] = time.perf_counter() - t0
            low.plan_count = index + 1
        except Exception as e:  # noqa: BLE001 - an engine this cuDNN no longer offers, knobs it refuses
            notes.append(f"stored engine {entry.engine_id} did not rebuild ({clean(e, 300)}); using heuristics")
            return None
        return self.executable_of(low, "plan store (engine id + knobs)", notes)

    def plan_of(self, exe: Executable) -> tuple[int, dict[str, int], bytes]:
        """(engine id, knobs by name, serialized plan) of an executable: from its graph, or, for a plan loaded
        from its serialized form (which cannot say), from the store entry it came from."""
        g = exe.low.g
        blob = bytes(g.serialize(as_bytes=True))
        try:
            engine_id, knobs = g.get_engine_and_knobs_at_index(selected_index(g))
        except Exception:  # noqa: BLE001 - a deserialized plan: the store knows
            entry = self.store.get(self.key(exe.low.instance))
            if entry is None:
                raise
            return entry.engine_id, dict(entry.knobs), blob
        return int(engine_id), {getattr(k, "name", str(k)): int(v) for k, v in knobs.items()}, blob

    def pin(self, inst: Instance, engine_id: int, knobs: dict[str, int], source: str) -> Executable:
        """Makes this engine and these knobs the shape's plan (built on this graph, not stored)."""
        entry = Entry(self.key(inst), self.graph.name, "", engine_id, knobs, b"", 0, False)
        notes: list[str] = []
        exe = self._from_engine(self.stage(inst, "lowered"), entry, notes)
        if exe is None:
            raise BackendUnavailable(f"the pinned plan (engine {engine_id}) does not build here: {'; '.join(notes)}")
        exe.source = source
        self._exes[inst.binding] = exe
        return exe

    def _persist(
        self, key: PlanKey, exe: Executable, tuned: bool, timing: dict | None = None, force: bool = False
    ) -> None:
        """Stores the executable's plan. A tuned entry is not replaced by an untuned one unless force."""
        try:
            engine_id, knobs, blob = self.plan_of(exe)
        except Exception as e:  # noqa: BLE001 - some plans cannot serialize; the run goes on
            exe.notes.append(f"plan not stored: {clean(e, 300)}")
            return
        entry = Entry(
            key,
            self.graph.name,
            exe.plan_name,
            engine_id,
            knobs,
            blob,
            exe.workspace_bytes,
            tuned,
            timing or {},
            time.time(),
        )
        try:
            self.store.put(entry, force=force)
        except StoreProblem as e:
            exe.notes.append(f"plan not stored: {e}")

    # ---- tuning ------------------------------------------------------------------------------

    def candidates(self, inst: Instance, dynamic: bool | None = None) -> Candidates:
        """Every plan of every heuristic mode for this shape, planned through check_support (in dynamic-shape
        mode or not, as `stage` decides)."""
        return Candidates(self, self.stage(inst, "check_support", dynamic, tuning=True), self.options)

    def adopt(self, exe: Executable, tuned: bool = True, timing: dict | None = None) -> None:
        """Makes exe the shape's executable from now on, and stores it (when the store is on)."""
        inst = exe.low.instance
        self._exes[inst.binding] = exe
        if self.use_store:
            self._persist(self.key(inst), exe, tuned, timing, force=True)
        self._kernel_cache_save()

    # ---- dynamic shapes: one kernel cache for every shape of the graph ----------------------

    def _kernel_cache_path(self):
        return self.store.kernel_cache_path(self.graph.name, graph_digest(self.graph, self.graph.instances[0]))

    def _kernel_cache(self, dynamic: bool | None):
        """The shared kernel cache (loaded on first use) when a shape builds in dynamic-shape mode, as the planner
        goes or as `dynamic` says; else None."""
        if dynamic or (dynamic is None and self.use_kernel_cache):
            self._kernel_cache_load()
            return self._kc
        return None

    def _kernel_cache_load(self) -> None:
        if self._kc is not None:
            return
        cudnn = load_cudnn()
        self._kc = cudnn.create_kernel_cache()
        if not self.use_store or self.rebuild:
            return
        try:
            text = load_kernel_cache_text(self._kernel_cache_path())
        except StoreProblem as e:
            self.kernel_cache_notes.append(f"kernel cache: {e}; starting empty")
            return
        if text is None:
            return
        try:
            self._kc.deserialize(text)
            self.kernel_cache_loaded = True
        except Exception as e:  # noqa: BLE001 - a cache from another cuDNN build
            self.kernel_cache_notes.append(f"kernel cache did not load ({clean(e, 300)}); starting empty")
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
            return (
                f"kernel cache: WARNING: this shape compiled {after - before} new kernel(s) instead of reusing the "
                f"cache"
            )
        ms, first_ms = build_s * 1e3, self._kc_first_build_s * 1e3
        if first:
            return f"kernel cache: first shape, build_plans {ms:.1f} ms"
        if build_s > max(3 * self._kc_first_build_s, 0.1):
            return (
                f"kernel cache: WARNING: build_plans took {ms:.1f} ms against {first_ms:.1f} ms for the first "
                f"shape, like a fresh compile"
            )
        return f"kernel cache: build_plans {ms:.1f} ms (first shape {first_ms:.1f} ms)"

    def _kernel_cache_save(self) -> None:
        if self._kc is None or not self.use_store:
            return
        try:  # merged with what another process saved meanwhile, not overwritten
            save_kernel_cache_text(self._kernel_cache_path(), self._kc.serialize())
        except Exception as e:  # noqa: BLE001 - not every cache can serialize; the run goes on
            self.kernel_cache_notes.append(f"kernel cache not saved: {clean(e, 300)}")


# ---- keys, and the serving check --------------------------------------------------------


def plan_key(graph: Graph, inst: Instance, options: Options, gpu: str, compute_capability: str) -> PlanKey:
    """The plan store key of one shape on a GPU (by name and compute capability, as torch gives them), with the
    cuDNN this process loaded: a Planner's on its device, and on a CPU the key a serving GPU would look up."""
    v = versions()
    return PlanKey(
        graph_digest(graph, inst), gpu, compute_capability, v["cudnn_backend"], v["cudnn_frontend"], options.constraints
    )


class NotTuned(DslError):
    """Shapes to be served with no tuned plan along the lookup chain (option require_store_hit, run --require-tuned):
    a diagnostic per graph, at the graph, a note per shape."""


def untuned(
    graph: Graph, instances, options: Options, gpu: str, compute_capability: str, store: PlanStore, fleet: Fleet
) -> Diagnostic | None:
    """The error naming each shape with no tuned plan for this GPU, neither in the local store (a tuned entry, or
    the partition tune kept) nor in a pinned fleet store; None when every shape has one. Nothing is built."""
    instances = list(instances)
    missing, notes = [], []
    for inst in instances:
        key = plan_key(graph, inst, options, gpu, compute_capability)
        if _tuned_locally(store, key, notes):
            continue
        hit = fleet.lookup(key, notes)
        if hit is None or not hit.entry.tuned:
            missing.append(f"{inst.label or 'its one shape'} on {gpu} (plan key {key.id})")
    if not missing:
        return None
    pinned = ", ".join(p.short for p in fleet.pins)
    where = f"the plan store {store.root}" + (f" or the fleet stores {pinned}" if pinned else " (no CUDNN_DSL_STORE)")
    message = (
        f"graph '{graph.name}': {len(missing)} of {len(instances)} shapes have no tuned plan in {where}, and option "
        f"require_store_hit asks for one; nothing was built"
    )
    return Diagnostic("error", message, graph.loc, tuple((line, None) for line in missing + notes))


def _tuned_locally(store: PlanStore, key: PlanKey, notes: list[str]) -> bool:
    try:
        entry = store.get(key)
        return (entry is not None and entry.tuned) or store.get_partition(key) is not None
    except StoreProblem as e:
        notes.append(f"plan store: {e}")
        return False


def _workspace_of(g) -> int:
    """The workspace a loaded plan asks for; 0 where this frontend cannot say (the entry's then stands)."""
    try:
        return int(g.get_workspace_size())
    except Exception:  # noqa: BLE001
        return 0
