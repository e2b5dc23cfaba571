"""The options of a graph — one table, whatever the source of a value.

A graph's `option NAME = VALUE` lines, the command line's flags and ``cudnn_dsl.compile(**options)``
all name the same rows and convert through the same ``dsl.values.convert``, so a value is valid (or
refused, with the same words) everywhere. The command line wins over the file.
"""

from __future__ import annotations

from typing import Any

import attrs

from dsl.diagnostics import RuleError, did_you_mean
from dsl.types import INT64_MAX
from dsl.values import Attr, convert, from_python, from_text

HEURISTIC_MODES = ("A", "B", "FALLBACK")
BUILD_POLICIES = ("heuristics_choice", "all")
SHAPE_MODES = ("auto", "static", "dynamic", "override")


def _option(kind: str, default, doc: str, **kw):
    return attrs.field(default=default, metadata={"attr": lambda name: Attr(name, kind, default, doc=doc, **kw)})


@attrs.frozen
class Options:
    """Build, tuning and checking options of a graph."""

    heuristics: tuple[str, ...] | None = _option(
        "enums",
        None,
        "heuristic modes asked for plans, in order (default: A, FALLBACK; every mode when tuning)",
        choices=HEURISTIC_MODES,
        optional=True,
    )
    build_policy: str = _option(
        "enum",
        "heuristics_choice",
        "build the heuristics' first supported plan, or all of them",
        choices=BUILD_POLICIES,
    )
    warmup: int = _option("int", 3, "untimed runs per plan when timing", lo=0, hi=10_000)
    iterations: int = _option("int", 15, "timed runs per plan", lo=1, hi=1_000_000)
    cuda_graph: bool = _option("bool", False, "capture execution into a CUDA graph and replay it")
    workspace_limit: int | None = _option(
        "int", None, "bytes; plans needing more workspace are skipped", lo=0, optional=True
    )
    atol: float | None = _option(
        "float", None, "absolute tolerance against the reference (default: per dtype)", lo=0, hi=None, optional=True
    )
    rtol: float | None = _option(
        "float", None, "relative tolerance against the reference (default: per dtype)", lo=0, hi=None, optional=True
    )
    seed: int = _option("int", 0, "seed of the generated inputs", lo=0, hi=INT64_MAX)
    shape_mode: str = _option(
        "enum",
        "auto",
        "plans for the shapes of symbolic dims: static (one per shape), dynamic (cuDNN's dynamic-shape mode, one "
        "kernel cache), auto: static while a plan compiles nothing at run time, dynamic once one does; or override "
        "(cuDNN 9.21+: one plan at the largest shape, run at every shape through execute-time shape overrides; "
        "auto's plans below 9.21)",
        choices=SHAPE_MODES,
    )
    split: bool = _option(
        "bool", True, "when cuDNN declines the whole graph, run it as the fewest graphs cuDNN accepts, in order"
    )
    fallback: bool = _option(
        "bool", True, "run an op that no cuDNN engine takes, even alone, with its torch reference on the GPU"
    )
    exclude_engines: tuple[int, ...] | None = _option(
        "ints",
        None,
        "cuDNN engine ids whose plans are never used (the N of a plan named engN_...)",
        lo=0,
        optional=True,
    )
    deterministic: bool = _option("bool", False, "only plans cuDNN does not mark NONDETERMINISTIC")
    no_runtime_compilation: bool = _option(
        "bool", False, "only plans cuDNN does not mark RUNTIME_COMPILATION (no kernel compiled at build time)"
    )
    require_store_hit: bool = _option(
        "bool",
        False,
        "serve tuned plans only: before anything is built, every shape is looked up in the plan store, then the "
        "pinned fleet stores (CUDNN_DSL_STORE), and the shapes with no tuned plan for this GPU are refused in one "
        "error (run --require-tuned)",
    )

    def modes(self, tuning: bool = False) -> tuple[str, ...]:
        """The heuristic modes to ask: the file's or the command line's, else A then FALLBACK for a
        build and every mode (A, B, FALLBACK) for autotuning, which wants every candidate."""
        if self.heuristics:
            return self.heuristics
        return HEURISTIC_MODES if tuning else ("A", "FALLBACK")

    @property
    def constraints(self) -> str:
        """The plan constraints in force, as words ('' for none): part of the plan-store key, and said to the user."""
        parts = []
        if self.exclude_engines:
            parts.append("exclude engines " + ", ".join(map(str, sorted(set(self.exclude_engines)))))
        if self.deterministic:
            parts.append("deterministic")
        if self.no_runtime_compilation:
            parts.append("no runtime compilation")
        return "; ".join(parts)

    def with_values(self, values: dict[str, Any], source: str = "python") -> Options:
        """These options with others on top, each converted from `source` ("python", or "text" for the
        command line); RuleError(at=the option's name) says what is wrong with the first bad one."""
        to_ast = from_text if source == "text" else from_python
        changes = {}
        for name, value in values.items():
            a = option(name)
            if value is None and a.optional:
                changes[name] = None
                continue
            try:
                changes[name] = convert(a, to_ast(a, value))
            except RuleError as e:
                raise RuleError(str(e), name) from None
        return attrs.evolve(self, **changes)


OPTIONS: dict[str, Attr] = {f.name: f.metadata["attr"](f.name) for f in attrs.fields(Options)}


def option(name: str) -> Attr:
    """The row of an option; RuleError lists the options when there is none."""
    a = OPTIONS.get(name)
    if a is None:
        raise RuleError(f"unknown option '{name}'{did_you_mean(name, OPTIONS)}; options are {', '.join(OPTIONS)}")
    return a
