"""Override-shape mode: one plan built at a representative shape serves every shape of a graph."""

from __future__ import annotations

from collections.abc import Callable

from cudnn_dsl.build.constraints import NotAllowed, PlanSpec
from cudnn_dsl.build.lower import Lowered, clean, lower
from cudnn_dsl.build.steps import first_plan_name, plan
from cudnn_dsl.target.library import Target, load_cudnn
from dsl.diagnostics import DslError
from dsl.ir import Graph, Instance, NotFound
from dsl.options import Options

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
