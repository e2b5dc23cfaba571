"""`cudnn_dsl.compile`, the front door for Python users."""

from __future__ import annotations

import os
import warnings

from cudnn_dsl.run.compiled import CompiledGraph
from dsl.diagnostics import RuleError
from dsl.files import Unreadable
from dsl.pipeline import load


class DslWarning(UserWarning):
    """A warning of the checker (an unused input, a convolution input that is not channels-last)."""


def _is_text(source: str) -> bool:
    """A .cdg text rather than a path: it spans lines, or starts like a graph or a comment."""
    return "\n" in source or source.lstrip().startswith(("graph ", "graph\t", "#"))


def compile(
    source: str | os.PathLike | None = None,
    graph: str | None = None,
    device: int | str | None = None,
    *,
    text: str | None = None,
    file: str | None = None,
    **options,
) -> CompiledGraph:
    """Checks a .cdg file (a path, or `text=`, named `file` in messages) and returns one of its graphs, compiled
    for the GPU on first call. `options` override the file's (heuristics, build_policy, workspace_limit, atol,
    rtol, seed, ...) and are validated as the file's are. The checker's warnings are issued as
    DslWarning. Without a GPU the graph still checks, plans deviceless and runs its reference.
    """
    if text is None and isinstance(source, str) and _is_text(source):
        source, text = None, source
    try:
        result = load(source, text=text, file=file)
    except Unreadable as e:
        raise FileNotFoundError(str(e)) from None
    for d in result.diagnostics:
        if d.severity == "warning":
            warnings.warn(f"{d.loc}: {d.message}", DslWarning, stacklevel=2)
    result.raise_if_errors()
    g = result.program.graph(graph)
    try:
        opts = g.options.with_values(options)
    except RuleError as e:
        raise ValueError(f"option '{e.at}' {e}" if e.at else str(e)) from None
    return CompiledGraph(g, opts, device)
