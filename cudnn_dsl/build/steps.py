"""cuDNN's five build steps (validate → build_operation_graph → create_execution_plans → check_support →
build_plans) for one lowered shape, and the located diagnostic when one fails."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

from cudnn_dsl.build.constraints import (
    EXCLUDED,
    NotAllowed,
    PlanRefused,
    PlanSpec,
    constrain,
    excluded_or,
    nothing_left,
    pin_index,
)
from cudnn_dsl.build.lower import Lowered, clean
from cudnn_dsl.target.library import load_cudnn
from cudnn_dsl.target.quirks import declined
from dsl.diagnostics import Diagnostic, DslError
from dsl.ops import FAMILIES, OPS
from dsl.options import Options

STEPS = ("validate", "build_operation_graph", "create_execution_plans", "check_support", "build_plans")


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
    """Runs the build steps on a lowered graph, timing each; raises DslError located at the culprit op, before
    any plan is made for a graph this library runs wrong (a row of target.quirks in force at its version: the
    frontend's graph itself, through build_operation_graph, is no plan, and its JSON may go in a bug report).

    `tuning` asks every heuristic mode and keeps every plan (each is then built by index). The options'
    plan constraints (excluded engines, deterministic, no runtime compilation) apply after
    create_execution_plans; `pin` makes one plan, found among the heuristics' or created from its engine
    and knobs, the only one. Deviceless, build_plans of a runtime-compiled engine compiles but cannot load
    the kernel without a GPU driver; that step is then recorded as skipped, with the reason.
    """
    cudnn = load_cudnn()
    steps = tuple(steps)
    version = cudnn.backend_version()
    if "create_execution_plans" in steps:
        wrong = declined(low.graph, low.instance, version)
    else:  # built, not run: only a graph whose build would not end in time is declined
        wrong = declined(low.graph, low.instance, version, slow_only=True) if "build_operation_graph" in steps else None
    if wrong is not None:
        raise DslError(wrong)
    g = low.g
    modes = options.modes(tuning or pin is not None)
    policy = "all" if tuning else options.build_policy
    limit = None if tuning else options.workspace_limit

    def create() -> None:
        g.create_execution_plans([getattr(cudnn.heur_mode, m) for m in modes])
        low.plan_count = g.get_execution_plan_count()
        constrain(low, options)
        if pin is not None:
            low.allowed = [pin_index(low, pin, options)]

    def build() -> None:
        if deviceless or low.allowed is not None:  # deviceless: the first plan that builds, not every one
            _build_first(low, options, all_=policy == "all" and not deviceless)
        else:
            g.build_plans(cudnn.build_plan_policy.ALL if policy == "all" else cudnn.build_plan_policy.HEURISTICS_CHOICE)
            low.selected = selected_index(g)

    actions = {
        "validate": g.validate,
        "build_operation_graph": g.build_operation_graph,
        "create_execution_plans": create,
        "check_support": lambda: check_support_within(g, limit, low, options),
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
    if not built and all(f.endswith(EXCLUDED) for f in failures):
        raise nothing_left(low, options, [f.split(" ", 1)[1].removesuffix(": " + EXCLUDED) for f in failures])
    if not built:
        raise RuntimeError("no plan built: " + "; ".join(failures[:8]))
    low.selected = built[0]
    g.build_plan_at_index(built[0])


def check_support_within(
    g, workspace_limit: int | None, low: Lowered | None = None, options: Options | None = None
) -> None:
    if workspace_limit is not None:
        g.deselect_workspace_greater_than(workspace_limit)
    try:
        g.check_support()
    except Exception as e:  # noqa: BLE001 - said in the user's terms when the constraints barred every plan
        msg = str(e)
        if low is not None and options and options.constraints and msg.count("Deselecting") == msg.count("Plan at"):
            raise nothing_left(low, options, [g.get_plan_name_at_index(i) for i in range(low.plan_count)]) from None
        raise


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


def selected_index(g) -> int:
    """The plan index the frontend selected (build_plans or build_plan_at_index sets it)."""
    return int(getattr(g, "_plan_index", 0) or 0)
