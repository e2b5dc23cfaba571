"""Override-shape mode: one plan built at a representative shape serves every shape of a graph.

Here are its facts (the cuDNN it needs, the shape it is built at, why it is declined); build.pipeline's
compile_override plans it."""

from __future__ import annotations

from cudnn_dsl.target.quirks import version_text
from dsl.diagnostics import DslError
from dsl.ir import Graph, Instance, NotFound

OVERRIDE_MIN_CUDNN = 92100
"""cuDNN 9.21.0: the first library with execute-time shape overrides (9.19 says 'Override shape support
requires cudnn 9.21.0 and above')"""


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
