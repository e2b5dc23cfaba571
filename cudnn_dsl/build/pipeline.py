"""The back half: one shape of a checked graph lowered, planned and made executable, stopping after any stage.

The stages: the cuDNN Frontend graph (build.lower), the graph after each of cuDNN's five build steps (build.steps),
and an Executable (a Planner's), as dsl.pipeline stops the front half after the AST or the IR.

Every command reaches these stages here, and nowhere else lowers or plans: `check --target`, `support` and `run`
without a GPU plan for a Target; `emit` lowers against a recorder and serializes the frontend's graph; `tune
--exhaustive --target` takes the candidates; and on a GPU a Planner makes the executable, planning through this
same walk when the plan store has no plan for the shape.
"""

from __future__ import annotations

from collections.abc import Callable

from cudnn_dsl.build.constraints import NotAllowed, PlanSpec
from cudnn_dsl.build.lower import Lowered, clean, lower
from cudnn_dsl.build.override import OverrideDeclined, override_unavailable, representative
from cudnn_dsl.build.steps import STEPS, plan
from cudnn_dsl.target.library import Target, load_cudnn
from dsl.diagnostics import DslError
from dsl.ir import Graph, Instance
from dsl.options import Options

STAGES = ("lowered", *STEPS, "executable")
"""the stages in order: the lowered graph, the graph after each build step (after build_plans: planned), and the
Executable of a Planner"""


def dynamic_shapes(graph: Graph, options: Options) -> bool:
    """Whether the graph's shapes build in cuDNN's dynamic-shape mode, sharing one kernel cache: option shape_mode
    = dynamic on a graph with symbolic dims (under `auto` a Planner turns the mode on once a plan compiles its
    kernel at run time)."""
    return bool(graph.symbols) and options.shape_mode == "dynamic"


def compile_shape(
    graph: Graph,
    inst: Instance,
    options: Options,
    target: Target | None = None,
    *,
    stop: str = "build_plans",
    handle=None,
    gpu: str = "this GPU",
    kernel_cache=None,
    cudnn=None,
    progress: Callable[[str], None] | None = None,
    pin: PlanSpec | None = None,
    tuning: bool = False,
    planner=None,
):
    """One shape through the stages up to `stop` (one of STAGES), and that stage's value: a Lowered (unplanned for
    "lowered", planned through the step a step's name stops at), or for "executable" the Executable `planner` (a
    Planner of this graph and options) makes, from the plan store or from this walk on its GPU.

    Lowered and planned for `target` without a device, or on the GPU of `handle` (`gpu` names it in messages;
    `kernel_cache`: in dynamic-shape mode, sharing it); `cudnn` lowers against a stand-in of the frontend (emit's
    recorder). `progress` hears each step; `pin` and `tuning` are build.steps.plan's.
    """
    if stop not in STAGES:
        raise ValueError(f"stop must be one of {STAGES}")
    if stop == "executable":
        if planner is None:
            raise ValueError("the executable stage is a Planner's: give planner= (a GPU's)")
        return planner.executable(inst)
    low = lower(graph, inst, handle=handle, target=target, kernel_cache=kernel_cache, cudnn=cudnn)
    if stop == "lowered":
        return low
    return _planned(low, options, target, gpu, STEPS[: STEPS.index(stop) + 1], progress, pin, tuning)


def compile_override(
    graph: Graph,
    options: Options,
    target: Target | None = None,
    *,
    handle=None,
    gpu: str = "this GPU",
    progress: Callable[[str], None] | None = None,
    pin: PlanSpec | None = None,
) -> Lowered:
    """compile_shape's planned stage in cuDNN's override-shape mode: the graph at its representative shape, whose
    one plan then runs every shape. OverrideDeclined says why not: the library's version, a shape that does not
    type, or cuDNN's refusal to plan it; a refusal by the user's constraints stays NotAllowed, and one by the
    lowering stays the DslError it is."""
    why = override_unavailable(load_cudnn().backend_version())
    if why:
        raise OverrideDeclined(why)
    low = lower(graph, representative(graph), handle=handle, target=target, override_shapes=True)
    try:
        return _planned(low, options, target, gpu, STEPS, progress, pin)
    except NotAllowed:
        raise
    except DslError as e:
        msg = e.diagnostics[0].message
        why = clean(msg, 240)
        if "not support override shape" in msg:  # cuDNN's reason, deep in its list of declining engines
            why += " (cuDNN: 'this engine currently does not support override shape')"
        raise OverrideDeclined(f"cuDNN declines it in override-shape mode: {why}") from None


def _planned(low, options, target, gpu, steps, progress, pin, tuning=False) -> Lowered:
    name = target.name if target is not None else gpu
    return plan(low, options, name, progress, deviceless=target is not None, steps=steps, tuning=tuning, pin=pin)
