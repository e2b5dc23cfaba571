"""Build layer: the only place that drives cuDNN's build steps.

validate -> build_operation_graph -> create_execution_plans -> check_support -> build_plans, timed,
with every failure reported at the .cdg location of the op it concerns. A Planner owns what a
graph's builds share (the cuDNN handle on its device, the dynamic-shape kernel cache, the plan
store) and turns one shape of a graph into an Executable: from the store (serialized plan, then
engine id and knobs), else from the heuristics. Tuning asks it for the candidates and adopts a
winner; planning without a device goes through `plan_deviceless`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from cudnn_dsl.build.lower import Lowered, clean, lower, override_args
from cudnn_dsl.store.plans import (
    Entry,
    PlanKey,
    PlanStore,
    StoreProblem,
    graph_digest,
    load_kernel_cache_text,
    save_kernel_cache_text,
)
from cudnn_dsl.target.library import BackendUnavailable, Target, load_cudnn, versions
from cudnn_dsl.target.quirks import runs_wrong
from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Graph, Instance, NotFound
from dsl.ops import FAMILIES, OPS
from dsl.options import Options

STEPS = ("validate", "build_operation_graph", "create_execution_plans", "check_support", "build_plans")


# ---- the five steps --------------------------------------------------------------------


def plan(
    low: Lowered,
    options: Options,
    target_name: str = "this GPU",
    progress: Callable[[str], None] | None = None,
    deviceless: bool = False,
    steps: Iterable[str] = STEPS,
    tuning: bool = False,
    pin: PlanSpec | None = None,
) -> Lowered:
    """Runs the build steps on a lowered graph, timing each; raises DslError located at the culprit op.

    `tuning` asks every heuristic mode and keeps every plan (each is then built by index). The options'
    plan constraints (excluded engines, deterministic, no runtime compilation) apply after
    create_execution_plans; `pin` makes one plan, found among the heuristics' or created from its engine
    and knobs, the only one. Deviceless, build_plans of a runtime-compiled engine compiles but cannot load
    the kernel without a GPU driver; that step is then recorded as skipped, with the reason.
    """
    wrong = runs_wrong(low.graph, low.instance)
    if wrong is not None:
        raise DslError(wrong)
    cudnn = load_cudnn()
    g = low.g
    modes = options.modes(tuning or pin is not None)
    policy = "all" if tuning else options.build_policy
    limit = None if tuning else options.workspace_limit

    def create() -> None:
        g.create_execution_plans([getattr(cudnn.heur_mode, m) for m in modes])
        low.plan_count = g.get_execution_plan_count()
        constrain(low, options)
        if pin is not None:
            low.allowed = [_pin_index(low, pin, options)]

    def build() -> None:
        if deviceless or low.allowed is not None:  # deviceless: the first plan that builds, not every one
            _build_first(low, options, all_=policy == "all" and not deviceless)
        else:
            g.build_plans(cudnn.build_plan_policy.ALL if policy == "all" else cudnn.build_plan_policy.HEURISTICS_CHOICE)
            low.selected = _selected_index(g)

    actions = {
        "validate": g.validate,
        "build_operation_graph": g.build_operation_graph,
        "create_execution_plans": create,
        "check_support": lambda: _check_support(g, limit, low, options),
        "build_plans": build,
    }
    for step in steps:
        if progress:
            progress(step)
        t0 = time.perf_counter()
        try:
            actions[step]()
        except PlanRefused as e:
            raise NotAllowed(Diagnostic("error", str(e), low.graph.loc, tuple((n, None) for n in e.notes))) from None
        except Exception as e:  # noqa: BLE001 - cuDNN raises RuntimeError, its own errors, ValueError
            if deviceless and step == "build_plans" and "CUDA_DRIVER" in str(e):
                low.skipped[step] = "the chosen engine compiles its kernel at run time, and loading it needs a GPU"
                continue
            raise DslError(diagnose(low, step, e, modes, target_name, options.constraints)) from None
        low.timings[step] = time.perf_counter() - t0
    return low


def _build_first(low: Lowered, options: Options, all_: bool) -> None:
    """Builds the first allowed plan that builds (every one, with all_) and selects the first that did, as
    build_plans walks its list. A kernel that cannot load without a GPU driver (deviceless) ends the walk."""
    g, failures, built = low.g, [], []
    for i in low.allowed if low.allowed is not None else range(low.plan_count):
        low.selected = i
        try:
            g.build_plan_at_index(i)
            built.append(i)
        except Exception as e:  # noqa: BLE001 - a decline, a plan the note filters barred: the next one
            if "CUDA_DRIVER" in str(e):
                raise
            failures.append(f"[{i}] {g.get_plan_name_at_index(i)}: {excluded_or(e)}")
            continue
        if not all_:
            return
    if not built and all(f.endswith(_EXCLUDED) for f in failures):
        raise nothing_left(low, options, [f.split(" ", 1)[1].removesuffix(": " + _EXCLUDED) for f in failures])
    if not built:
        raise RuntimeError("no plan built: " + "; ".join(failures[:8]))
    low.selected = built[0]
    g.build_plan_at_index(built[0])


# ---- plan constraints and pinned plans ---------------------------------------------------


_EXCLUDED = "excluded by the plan constraints"


def excluded_or(e: Exception) -> str:
    """Why a plan did not build, in words: the frontend's note filters bar a plan only when it is built."""
    msg = clean(e, 200)
    return _EXCLUDED if "Deselecting" in msg or "is excluded by" in msg else msg


KNOB_NUMBERS = {
    "SWIZZLE": 1,
    "TILE_SIZE": 2,
    "EDGE": 4,
    "MULTIPLY": 11,
    "SPLIT_K_BUF": 12,
    "TILEK": 13,
    "STAGES": 14,
    "REDUCTION_MODE": 15,
    "SPLIT_K_SLC": 17,
    "IDX_MODE": 18,
    "SPECFILT": 23,
    "KERNEL_CFG": 24,
    "WORKSPACE": 25,
    "TILE_CGA": 26,
    "TILE_CGA_M": 27,
    "TILE_CGA_N": 28,
    "BLOCK_SIZE": 29,
    "OCCUPANCY": 30,
    "ARRAY_SIZE_PER_THREAD": 31,
    "SPLIT_COLS": 33,
    "TILE_ROWS": 34,
    "TILE_COLS": 35,
    "LOAD_SIZE": 36,
    "CTA_COUNT": 37,
    "STREAM_K": 38,
    "SPLIT_P_SLC": 39,
    "TILE_M": 40,
    "TILE_N": 41,
    "WARP_SPEC_CFG": 42,
    "SWAP_AB": 43,
    "INPUT_TMA_ENABLE": 44,
    "OUTPUT_TMA_ENABLE": 45,
}
"""The cuDNN library's number (cudnnBackendKnobType_t) of each frontend knob type: a backend plan's name,
eng4_k24=43_k17=1, spells its knobs by these numbers, where the frontend's knob_type enum counts otherwise."""
_KNOB_NAMES = {n: k for k, n in KNOB_NUMBERS.items()}
_PLAN_NAME = re.compile(r"eng(\d+)((?:_k\d+=-?\d+)*)")
_ENGINE_KNOBS = re.compile(r"(\d+)(?::(.*))?")


class NotAllowed(DslError):
    """cuDNN offers plans, but the user's constraints or pinned plan allow none: splitting the graph would
    not help (its parts are held to the same), so this is never a reason to split."""


class PlanRefused(Exception):
    """The constraints or the pinned plan leave nothing to build (said at the graph, with notes)."""

    def __init__(self, message: str, notes: Iterable[str] = ()):
        super().__init__(message)
        self.notes = list(notes)


@attrs.frozen
class PlanSpec:
    """One plan asked for by the user: cuDNN's name for it, or an engine id and knobs."""

    text: str
    engine: int | None
    """None: a name alone (a python engine's plan, knobs this table lacks), found only among the listed plans"""
    knobs: dict = attrs.field(factory=dict, hash=False)
    """frontend knob type name -> value"""
    named: bool = True
    """given as cuDNN's plan name (which the plan cuDNN builds must then carry)"""

    @classmethod
    def parse(cls, text: str) -> PlanSpec:
        """'eng4_k24=43_k17=1' (the name cuDNN prints), '4:KERNEL_CFG=43,SPLIT_K_SLC=1' (engine id and the
        frontend's knob names), or any other plan name (matched among the plans cuDNN lists); ValueError says
        what is wrong."""
        text = text.strip()
        if m := _PLAN_NAME.fullmatch(text):
            pairs = [part.split("=") for part in m.group(2).split("_k")[1:]]
            if all(int(number) in _KNOB_NAMES for number, _ in pairs):
                knobs = {_KNOB_NAMES[int(number)]: int(value) for number, value in pairs}
                return cls(text, int(m.group(1)), knobs, True)
            return cls(text, None)
        if m := _ENGINE_KNOBS.fullmatch(text):
            knobs = {}
            for item in filter(None, (m.group(2) or "").split(",")):
                name, sep, value = item.partition("=")
                name = name.strip().upper()
                if not sep or name not in KNOB_NUMBERS or not value.strip().lstrip("-").isdigit():
                    raise ValueError(
                        f"'{item}' is not KNOB=VALUE with a knob type of {', '.join(KNOB_NUMBERS)}"
                        if name not in KNOB_NUMBERS
                        else f"'{item}' is not KNOB=INTEGER"
                    )
                knobs[name] = int(value)
            return cls(text, int(m.group(1)), knobs, False)
        if not text:
            raise ValueError(
                "give a plan name as cuDNN prints it (eng4_k24=43_k17=1) or an engine id with knobs "
                "(4:KERNEL_CFG=43,SPLIT_K_SLC=1)"
            )
        return cls(text, None)


def frontend_knobs(knobs: dict[str, int]) -> dict:
    """{knob name: value} -> the frontend's {cudnn.knob_type: value}."""
    kt = load_cudnn().knob_type
    return {getattr(kt, k): v for k, v in knobs.items()}


def engine_of(low: Lowered, index: int) -> int | None:
    """The engine id of a plan; None where the frontend cannot say (a plan the backend chooses itself)."""
    try:
        return int(low.g.get_engine_and_knobs_at_index(index)[0])
    except Exception:  # noqa: BLE001 - the OPENSOURCE delegating entry has no engine id
        return None


def constrain(low: Lowered, options: Options) -> None:
    """After create_execution_plans: the note constraints through the frontend's own filters (they bar plans by
    their notes at build time); excluded engines by id, into low.allowed, since the frontend's deselect_engines
    matches names by substring (eng4 would bar eng41). PlanRefused when no plan is left."""
    g = low.g
    _note_filters(g, options)
    if not options.constraints:
        return
    low.allowed = list(range(low.plan_count))  # built by our walk, which can say what the constraints left
    if not options.exclude_engines:
        return
    excluded = set(options.exclude_engines)
    low.allowed = [i for i in range(low.plan_count) if engine_of(low, i) not in excluded]
    if not low.allowed:
        raise nothing_left(low, options, [g.get_plan_name_at_index(i) for i in range(low.plan_count)])


def nothing_left(low: Lowered, options: Options, names: list[str]) -> PlanRefused:
    """The constraints barred every plan: what they exclude, every plan cuDNN offered and its engine, and
    which excluded engines offered none (their exclusion changed nothing)."""
    engines = sorted({int(m.group(1)) for m in map(re.compile(r"eng(\d+)(?:_|$)").match, names) if m})
    idle = sorted(set(options.exclude_engines or ()) - set(engines))
    of = f", of engine{'s' if len(engines) > 1 else ''} {', '.join(map(str, engines))}" if engines else ""
    notes = [f"cuDNN offers {len(names)} plans{of}: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}"]
    if idle:
        notes.append(
            f"engine{'s' if len(idle) > 1 else ''} {', '.join(map(str, idle))} offer{'' if len(idle) > 1 else 's'} "
            "no plan for this graph: excluding " + ("them" if len(idle) > 1 else "it") + " changes nothing"
        )
    notes.append(
        "more plans may come with 'option heuristics = [A, B, FALLBACK]'; `tune --exhaustive` tries every engine"
    )
    return PlanRefused(
        f"the plan constraints ({options.constraints}) leave none of the {len(names)} plans cuDNN offers for graph "
        f"'{low.graph.name}'",
        notes,
    )


def _note_filters(g, options: Options) -> None:
    """The note constraints, through the frontend's filters; they mark the plans listed when called, so a plan
    appended later (create_execution_plan) needs them again."""
    cudnn = load_cudnn()
    if options.deterministic:
        g.deselect_numeric_notes([cudnn.numerical_note.NONDETERMINISTIC])
    if options.no_runtime_compilation:
        g.deselect_behavior_notes([cudnn.behavior_note.RUNTIME_COMPILATION])


def _pin_index(low: Lowered, pin: PlanSpec, options: Options) -> int:
    """The index of the pinned plan: among the heuristics' plans, else appended from its engine and knobs."""
    g = low.g
    names = [g.get_plan_name_at_index(i) for i in range(low.plan_count)]
    offered = f"the heuristics offer: {', '.join(names[:30])}{' ...' if len(names) > 30 else ''}"
    excluded = set(options.exclude_engines or ())
    if pin.engine in excluded:
        raise PlanRefused(f"plan {pin.text} is of engine {pin.engine}, which the plan constraints exclude")
    for i, name in enumerate(names):
        if name == pin.text or (not pin.named and engine_of(low, i) == pin.engine and _knobs_at(g, i) == pin.knobs):
            if engine_of(low, i) in excluded:
                raise PlanRefused(f"plan {pin.text} is of engine {engine_of(low, i)}, which the constraints exclude")
            return i
    if pin.engine is None:
        raise PlanRefused(f"cuDNN does not offer plan {pin.text} for graph '{low.graph.name}'", [offered])
    try:
        g.create_execution_plan(pin.engine, frontend_knobs(pin.knobs))
    except Exception as e:  # noqa: BLE001 - an engine this graph has not, knobs it refuses
        raise PlanRefused(
            f"cuDNN does not offer plan {pin.text} for graph '{low.graph.name}': {clean(e, 200)}", [offered]
        ) from None
    index = g.get_execution_plan_count() - 1
    got = g.get_plan_name_at_index(index)
    if pin.named and _name_parts(got) != _name_parts(pin.text):
        raise PlanRefused(f"cuDNN names the plan of {pin.text} '{got}' for graph '{low.graph.name}'", [offered])
    low.plan_count = index + 1
    return index


def _name_parts(name: str) -> tuple:
    head, *knobs = name.split("_k")
    return head, frozenset(knobs)


def _knobs_at(g, index: int) -> dict[str, int]:
    return {getattr(k, "name", str(k)): int(v) for k, v in g.get_engine_and_knobs_at_index(index)[1].items()}


def _check_support(g, workspace_limit: int | None, low: Lowered | None = None, options: Options | None = None) -> None:
    if workspace_limit is not None:
        g.deselect_workspace_greater_than(workspace_limit)
    try:
        g.check_support()
    except Exception as e:  # noqa: BLE001 - said in the user's terms when the constraints barred every plan
        msg = str(e)
        if low is not None and options and options.constraints and msg.count("Deselecting") == msg.count("Plan at"):
            raise nothing_left(low, options, [g.get_plan_name_at_index(i) for i in range(low.plan_count)]) from None
        raise


def plan_deviceless(
    graph: Graph,
    inst: Instance,
    options: Options,
    target: Target,
    progress: Callable[[str], None] | None = None,
    pin: PlanSpec | None = None,
) -> Lowered:
    """Lowers one shape and asks the real cuDNN library for the target's plans, with no GPU."""
    return plan(lower(graph, inst, target=target), options, target.name, progress, deviceless=True, pin=pin)


def candidates_deviceless(graph: Graph, inst: Instance, options: Options, target: Target) -> Lowered:
    """Every heuristic mode's plans for the target, planned through check_support with no GPU (tune --exhaustive
    --target): the graph then takes more plans by engine and knobs (add_plan)."""
    return plan(lower(graph, inst, target=target), options, target.name, deviceless=True, steps=STEPS[:4], tuning=True)


# ---- override-shape mode: one plan for every shape of a graph ------------------------------

OVERRIDE_MIN_CUDNN = 92100
"""cuDNN 9.21.0: the first library with execute-time shape overrides (9.19 says 'Override shape support
requires cudnn 9.21.0 and above')"""


def version_text(version: int) -> str:
    """cuDNN's version number as words: 92801 -> '9.28.1'."""
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


def override_unavailable(version: int) -> str | None:
    """Why a cuDNN library of this version number cannot run override-shape plans (None: it can)."""
    if version >= OVERRIDE_MIN_CUDNN:
        return None
    return (
        f"cuDNN {version_text(version)} has no override-shape mode (it needs {version_text(OVERRIDE_MIN_CUDNN)} "
        "or later)"
    )


class OverrideDeclined(Exception):
    """Override-shape mode cannot serve this graph here; the message says why (per-value plans then do)."""


def representative(graph: Graph) -> Instance:
    """The shape an override-shape graph is built at: every symbolic dim at its largest value, so that every
    other shape runs as an override to a shape no larger. OverrideDeclined when that shape does not type."""
    binding = {s.name: s.span[1] if s.span else max(s.values) for s in graph.symbols}
    binding = {k: v for k, v in binding.items() if k in dict(graph.instances[0].binding)}
    try:
        return graph.instance(binding)
    except (NotFound, DslError) as e:
        raise OverrideDeclined(
            f"the largest shape ({', '.join(f'{k}={v}' for k, v in binding.items())}): {e}"
        ) from None


def plan_override(
    graph: Graph,
    options: Options,
    target_name: str,
    *,
    handle=None,
    target: Target | None = None,
    progress: Callable[[str], None] | None = None,
    pin: PlanSpec | None = None,
) -> Lowered:
    """The graph lowered at its representative shape in override-shape mode and planned (on the GPU of
    `handle`, or for `target` without one). OverrideDeclined says why not: the library's version, a shape
    that does not type, or cuDNN's refusal; a refusal by the user's constraints stays NotAllowed."""
    why = override_unavailable(load_cudnn().backend_version())
    if why:
        raise OverrideDeclined(why)
    rep = representative(graph)
    low = lower(graph, rep, handle=handle, target=target, override_shapes=True)
    try:
        return plan(low, options, target_name, progress, deviceless=target is not None, pin=pin)
    except NotAllowed:
        raise
    except DslError as e:
        msg = e.diagnostics[0].message
        why = clean(msg, 240) + ("…" if len(msg) > 240 else "")
        if "not support override shape" in msg:  # cuDNN's reason, deep in its list of declining engines
            why += " (cuDNN: 'this engine currently does not support override shape')"
        raise OverrideDeclined(f"cuDNN declines it in override-shape mode: {why}") from None


def shape_mode_line(graph: Graph, options: Options, target: Target) -> tuple[str, Lowered | None]:
    """What `check --target` says about the shapes of a graph with symbolic dims: the mode a run would use,
    and for override-shape mode, the plans this library offers for the target (planned deviceless)."""
    count = 1
    for s in graph.symbols:
        count *= s.count
    mode = options.shape_mode
    if mode != "override":
        how = {
            "static": "a static plan per shape",
            "dynamic": "a plan per shape in dynamic-shape mode, one shared kernel cache",
            "auto": "a plan per shape: static while it compiles nothing at run time, then dynamic-shape mode",
        }[mode]
        return f"shape mode {mode}: {how} ({count} shapes)", None
    version = version_text(load_cudnn().backend_version())
    try:
        low = plan_override(graph, options, target.name, target=target)
    except OverrideDeclined as e:
        return f"shape mode override: per-value plans as under auto instead ({count} shapes): {e}", None
    return (
        f"shape mode override: one plan for all {count} shapes, built at {low.instance.label} and run at each "
        f"through execute-time shape overrides; cuDNN {version} here offers {low.plan_count} plans for "
        f"{target.name}, first {first_plan_name(low)}{' (not built: no GPU)' if low.skipped else ''}; cuDNN "
        f"below {version_text(OVERRIDE_MIN_CUDNN)} falls back to a plan per shape",
        low,
    )


# ---- the whole space: every engine and knob combination (tune --exhaustive) ------------------


@attrs.frozen
class KnobRange:
    """One knob of an engine as cuDNN enumerates it: its frontend name, least and greatest value, stride."""

    name: str
    lo: int
    hi: int
    stride: int

    @property
    def values(self) -> range:
        return range(self.lo, self.hi + 1, max(self.stride, 1))


def engine_space(low: Lowered) -> dict[int, list[KnobRange] | str]:
    """Every engine id cuDNN has for this graph (get_engine_count) with its knobs (get_knobs_for_engine), or why
    cuDNN has no knobs for it here (an engine that cannot serve the graph)."""
    g, out = low.g, {}
    for e in range(int(g.get_engine_count())):
        try:
            out[e] = [
                KnobRange(k.type.name, int(k.min_value), int(k.max_value), int(k.stride))
                for k in g.get_knobs_for_engine(e)
            ]
        except Exception as ex:  # noqa: BLE001 - cuDNN says NOT_SUPPORTED for an engine that cannot run the graph
            out[e] = clean(ex, 200)
    return out


def add_plan(low: Lowered, engine: int, knobs: dict[str, int], options: Options) -> int:
    """Appends the plan of this engine and knobs to the graph's list (create_execution_plan), under the options'
    note constraints, and returns its index; raises when cuDNN refuses the configuration."""
    low.g.create_execution_plan(engine, frontend_knobs(knobs))
    low.plan_count = int(low.g.get_execution_plan_count())
    _note_filters(low.g, options)
    return low.plan_count - 1


def timings_text(timings: dict[str, float]) -> str:
    """'validate 0.3 ms · build_operation_graph 1.1 ms · ...'"""
    return " · ".join(f"{k} {v * 1e3:.1f} ms" for k, v in timings.items())


def first_plan_name(low: Lowered) -> str:
    return low.g.get_plan_name_at_index(low.selected) if low.plan_count else "-"


def diagnose(low: Lowered, step: str, e: Exception, modes, target_name: str, constraints: str = "") -> Diagnostic:
    """cuDNN's refusal as a located diagnostic: at the op whose result cuDNN names, else at the
    only op of the family cuDNN names, else at the graph (with where each op is); the advice is
    the registry's, for the families the graph holds."""
    msg = clean(e)
    graph = low.graph
    culprit = None
    for node in graph.nodes:  # the node whose result name appears in cuDNN's message
        if any(re.search(rf"(?<![\w]){re.escape(o)}(?![\w])", msg) for o in node.outputs):
            culprit = node
    if culprit is None:  # else the only node of the family cuDNN's message names
        for family in dict.fromkeys(OPS[n.op].family for n in graph.nodes):
            of_family = [n for n in graph.nodes if OPS[n.op].family == family]
            if len(of_family) == 1 and any(w in msg.lower() for w in FAMILIES[family].words):
                culprit = of_family[0]
                break
    notes = []
    if culprit is None and len(graph.nodes) > 1:
        notes += [(f"{n.op} is here", n.loc) for n in graph.nodes if OPS[n.op].family != "pointwise"][:4]
    if step in ("create_execution_plans", "check_support", "build_plans"):
        dtypes = sorted({low.instance.type(v.name).dtype for v in graph.values if v.kind in ("input", "output")})
        families = dict.fromkeys(OPS[n.op].family for n in graph.nodes)
        advice = "; ".join(FAMILIES[f].advice for f in families)
        notes.append(
            (
                f"no cuDNN engine for {target_name} supports this graph (io dtypes {', '.join(dtypes)}; "
                f"heuristics {', '.join(modes)}). Try: {advice}; or 'option heuristics = [A, B, FALLBACK]'",
                None,
            )
        )
    if constraints and step in ("check_support", "build_plans"):
        notes.append((f"the plan constraints in force ({constraints}) may have excluded every plan", None))
    if low.instance.binding:
        notes.append((f"with {low.instance.label}", None))
    where = f"{culprit.op} in " if culprit else ""
    loc = culprit.loc if culprit else graph.loc
    return Diagnostic("error", f"cuDNN {step} failed for {where}graph '{graph.name}': {msg}", loc, tuple(notes))


# ---- executables -------------------------------------------------------------------------


@attrs.define
class Executable:
    """One planned shape: the cuDNN graph with a plan selected, its workspace, its host scalars."""

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

    def launch(self, pack: dict[int, Any]) -> None:
        """The frontend's public execute, on the device's current stream."""
        import torch

        cudnn = load_cudnn()
        cudnn.set_stream(self.handle, torch.cuda.current_stream(self.device).cuda_stream)
        self.low.g.execute(pack, self.workspace, handle=self.handle, **self.overrides)


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
        notes = low.g.get_behavior_notes_for_plan_at_index(_selected_index(low.g))
    except Exception:  # noqa: BLE001 - python-engine plans have no backend notes
        return False
    return cudnn.behavior_note.RUNTIME_COMPILATION in notes


def _selected_index(g) -> int:
    """The plan index the frontend selected (build_plans or build_plan_at_index sets it)."""
    return int(getattr(g, "_plan_index", 0) or 0)


class Candidates:
    """Every plan the heuristics offer for one shape, planned through check_support; each is
    built and run by its index (the heuristics' rank). Without a planner (deviceless), plans are only
    listed and added, never built."""

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
        return engine, _knobs_at(self.low.g, index) if engine is not None else {}

    def add(self, engine: int, knobs: dict[str, int]) -> int:
        """A plan of this engine and knobs, appended to the candidates; its index (raises when cuDNN refuses it)."""
        return add_plan(self.low, engine, knobs, self.options)

    def build(self, index: int) -> int:
        """Builds one plan; returns the workspace it needs in bytes."""
        self.low.g.build_plan_at_index(index)
        return int(self.low.g.get_workspace_size_plan_at_index(index))

    def runner(self, index: int, pack: dict, workspace) -> Callable[[], None]:
        """A launch of this plan on these buffers (built first)."""
        g, handle = self.low.g, self.planner.handle
        return lambda: g.execute_plan_at_index(pack, workspace, index=index, handle=handle)

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
        self.use_kernel_cache = bool(graph.symbols) and options.shape_mode == "dynamic"
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

    def key(self, inst: Instance) -> PlanKey:
        import torch

        v = versions()
        major, minor = torch.cuda.get_device_capability(self.device)
        return PlanKey(
            graph_digest(self.graph, inst),
            self.device_name,
            f"{major}.{minor}",
            v["cudnn_backend"],
            v["cudnn_frontend"],
            self.options.constraints,
        )

    def lower(self, inst: Instance, dynamic: bool | None = None) -> Lowered:
        """The shape lowered for this GPU: in dynamic-shape mode (with the shared kernel cache) as the
        planner goes, or as `dynamic` says."""
        if dynamic or (dynamic is None and self.use_kernel_cache):
            self._kernel_cache_load()
            return lower(self.graph, inst, handle=self.handle, kernel_cache=self._kc)
        return lower(self.graph, inst, handle=self.handle)

    def executable_of(self, low: Lowered, source: str, notes: list[str], workspace: int | None = None) -> Executable:
        """An Executable of the plan the lowered graph has selected, its workspace allocated."""
        import torch

        size = low.g.get_workspace_size() if workspace is None else workspace
        ws = torch.empty(max(size, 1), dtype=torch.uint8, device=self.device)
        name = low.g.get_plan_name_at_index(_selected_index(low.g)) if low.plan_count else ""
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
                low = plan_override(
                    self.graph,
                    self.options,
                    self.device_name,
                    handle=self.handle,
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
        key = self.key(inst) if self.use_store and self.plan_spec is None else None
        notes: list[str] = []
        replace = self.rebuild
        if key is not None and not self.rebuild:
            exe, replace = self._from_store(inst, key, notes)
            if exe is not None:
                return exe
        dynamic = self.use_kernel_cache
        low = self.lower(inst)  # afresh: a stored engine that failed to rebuild may have left its graph half-built
        cached = self._kc_size()
        plan(low, self.options, self.device_name, self.progress, pin=self.plan_spec)
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
        """The stored plan as an executable, or None; and whether the stored entry is unusable (to be replaced)."""
        try:
            entry = self.store.get(key)
        except StoreProblem as e:
            notes.append(f"plan store: {e}; rebuilding")
            return None, True
        if entry is None:
            return None, False
        limit = self.options.workspace_limit
        if limit is not None and entry.workspace > limit:  # right for other runs: kept
            notes.append(
                f"stored plan {entry.plan_name} needs {entry.workspace} bytes of workspace, over the limit "
                f"of {limit}; building another"
            )
            return None, False
        low = self.lower(inst)
        if entry.imported:
            # A serialized plan replaces the lowered graph wholesale, and cuDNN cannot show what a blob computes,
            # so a plan from someone else's bundle is never loaded: its engine and knobs are built on this graph.
            exe = self._from_engine(low, entry, notes)
            if exe is not None:
                exe.source = "plan store (imported engine id + knobs, rebuilt here)"
                self._persist(key, exe, tuned=entry.tuned, timing=entry.timing, force=True)
            return exe, exe is None
        exe = self._from_blob(low, entry, notes) or self._from_engine(low, entry, notes)
        return exe, exe is None

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
        loaded = Lowered(low.graph, low.instance, g, low.host_values, {"deserialize": time.perf_counter() - t0})
        workspace = max(entry.workspace, _workspace_of(g))
        exe = self.executable_of(loaded, "plan store (serialized plan)", notes, workspace)
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
            _check_support(g, self.options.workspace_limit)
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
            engine_id, knobs = g.get_engine_and_knobs_at_index(_selected_index(g))
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
        exe = self._from_engine(self.lower(inst), entry, notes)
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
        mode or not, as `lower` decides)."""
        low = self.lower(inst, dynamic)
        plan(low, self.options, self.device_name, self.progress, steps=STEPS[:4], tuning=True)
        return Candidates(self, low, self.options)

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


def _workspace_of(g) -> int:
    """The workspace a loaded plan asks for; 0 where this frontend cannot say (the entry's then stands)."""
    try:
        return int(g.get_workspace_size())
    except Exception:  # noqa: BLE001
        return 0
