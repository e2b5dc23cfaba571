"""Plan constraints and pinned plans: the knobs' names, the engines and behaviour notes excluded, `--plan NAME`."""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

from cudnn_dsl.build.lower import Lowered, clean
from cudnn_dsl.target.library import load_cudnn
from dsl.diagnostics import DslError
from dsl.options import Options

EXCLUDED = "excluded by the plan constraints"


def excluded_or(e: Exception) -> str:
    """Why a plan did not build, in words: the frontend's note filters bar a plan only when it is built."""
    msg = clean(e, 200)
    return EXCLUDED if "Deselecting" in msg or "is excluded by" in msg else msg


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


_KNOB_NUMBER = re.compile(r"K(\d+)")


def numbered_knobs(name: str) -> tuple[int, dict[int, int]] | None:
    """(engine id, knobs by the library's number) of a plan name as cuDNN prints it (eng4_k24=43_k17=1); None for
    another name."""
    m = _PLAN_NAME.fullmatch(name)
    if m is None:
        return None
    pairs = [part.split("=") for part in m.group(2).split("_k")[1:]]
    return int(m.group(1)), {int(number): int(value) for number, value in pairs}


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
    unnamed: dict = attrs.field(factory=dict, hash=False)
    """the library's knob number -> value, of the knobs the frontend has no name for (it reads them as NOT_SET): it
    cannot create a plan with one, so such a plan is found only among the plans cuDNN lists"""

    @property
    def numbers(self) -> dict[int, int]:
        """Every knob by the library's number, as plan names spell them."""
        return {KNOB_NUMBERS[k]: v for k, v in self.knobs.items()} | self.unnamed

    @classmethod
    def parse(cls, text: str) -> PlanSpec:
        """'eng4_k24=43_k17=1' (the name cuDNN prints), '4:KERNEL_CFG=43,SPLIT_K_SLC=1' (engine id and the
        frontend's knob names, or a knob's number in the library as plan names spell it: '4:K24=43'), or any
        other plan name (matched among the plans cuDNN lists); ValueError says what is wrong."""
        text = text.strip()
        if (numbered := numbered_knobs(text)) is not None:
            engine, numbers = numbered
            if all(number in _KNOB_NAMES for number in numbers):
                return cls(text, engine, {_KNOB_NAMES[n]: v for n, v in numbers.items()}, True)
            return cls(text, None)
        if m := _ENGINE_KNOBS.fullmatch(text):
            knobs, unnamed = {}, {}
            for item in filter(None, (m.group(2) or "").split(",")):
                name, sep, value = item.partition("=")
                name = name.strip().upper()
                number = _KNOB_NUMBER.fullmatch(name)
                if not sep or not (name in KNOB_NUMBERS or number) or not value.strip().lstrip("-").isdigit():
                    raise ValueError(
                        f"'{item}' is not KNOB=VALUE with a knob type of {', '.join(KNOB_NUMBERS)}, or kN with "
                        "its number in the library (k24 for KERNEL_CFG, as plan names spell it)"
                        if not (name in KNOB_NUMBERS or number)
                        else f"'{item}' is not KNOB=INTEGER"
                    )
                if number and int(number.group(1)) not in _KNOB_NAMES:
                    unnamed[int(number.group(1))] = int(value)
                else:
                    knobs[_KNOB_NAMES[int(number.group(1))] if number else name] = int(value)
            return cls(text, int(m.group(1)), knobs, False, unnamed)
        if not text:
            raise ValueError(
                "give a plan name as cuDNN prints it (eng4_k24=43_k17=1) or an engine id with knobs "
                "(4:KERNEL_CFG=43,SPLIT_K_SLC=1)"
            )
        return cls(text, None)


def over_workspace_limit(workspace: int, options: Options) -> str | None:
    """Why a plan that needs this many bytes of workspace is not used (option workspace_limit), None when it may
    be. Where cuDNN picks the plan, it applies the limit itself (build.steps.check_support_within); this is the
    limit for the plans picked here: a stored plan, a tuning candidate."""
    limit = options.workspace_limit
    if limit is None or workspace <= limit:
        return None
    return f"needs {workspace} bytes of workspace, over the limit of {limit}"


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
    note_filters(g, options)
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


def note_filters(g, options: Options) -> None:
    """The note constraints, through the frontend's filters; they mark the plans listed when called, so a plan
    appended later (create_execution_plan) needs them again."""
    cudnn = load_cudnn()
    if options.deterministic:
        g.deselect_numeric_notes([cudnn.numerical_note.NONDETERMINISTIC])
    if options.no_runtime_compilation:
        g.deselect_behavior_notes([cudnn.behavior_note.RUNTIME_COMPILATION])


def pin_index(low: Lowered, pin: PlanSpec, options: Options) -> int:
    """The index of the pinned plan: among the heuristics' plans, else appended from its engine and knobs."""
    g = low.g
    names = [g.get_plan_name_at_index(i) for i in range(low.plan_count)]
    offered = f"the heuristics offer: {', '.join(names[:30])}{' ...' if len(names) > 30 else ''}"
    excluded = set(options.exclude_engines or ())
    if pin.engine in excluded:
        raise PlanRefused(f"plan {pin.text} is of engine {pin.engine}, which the plan constraints exclude")
    for i, name in enumerate(names):
        by_knobs = not pin.named and not pin.unnamed and engine_of(low, i) == pin.engine and knobs_at(g, i) == pin.knobs
        if name == pin.text or by_knobs or (not pin.named and numbered_knobs(name) == (pin.engine, pin.numbers)):
            if engine_of(low, i) in excluded:
                raise PlanRefused(f"plan {pin.text} is of engine {engine_of(low, i)}, which the constraints exclude")
            return i
    if pin.engine is None:
        raise PlanRefused(f"cuDNN does not offer plan {pin.text} for graph '{low.graph.name}'", [offered])
    if pin.unnamed:
        knobs = ", ".join(f"k{n}" for n in pin.unnamed)
        raise PlanRefused(
            f"cuDNN does not offer plan {pin.text} for graph '{low.graph.name}', and the frontend cannot make it: "
            f"it has no name for knob {knobs}",
            [offered],
        )
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


def knobs_at(g, index: int) -> dict[str, int]:
    return {getattr(k, "name", str(k)): int(v) for k, v in g.get_engine_and_knobs_at_index(index)[1].items()}
