"""Semantic layer: the checked, typed, immutable IR (one Graph per `graph` block)."""

from __future__ import annotations

from typing import Any

import attrs

from dsl.diagnostics import Loc, UNKNOWN
from dsl.types import TensorType


def _loc():
    return attrs.field(default=UNKNOWN, eq=False, repr=False)


HEURISTIC_MODES = ("A", "B", "FALLBACK")
BUILD_POLICIES = ("heuristics_choice", "all")


@attrs.frozen
class Options:
    """Back-end options of a graph; the command line overrides them."""

    heuristics: tuple[str, ...] | None = None
    """heuristic modes asked for plans, in order (None: see modes())"""
    build_policy: str = "heuristics_choice"
    """build the heuristics' first supported plan, or all of them"""
    warmup: int = 3
    """untimed runs per plan when autotuning"""
    iterations: int = 15
    """timed runs per plan when autotuning"""
    cuda_graph: bool = False
    """capture execution into a CUDA graph and replay it"""
    workspace_limit: int | None = None
    """bytes; plans needing more workspace are skipped"""
    atol: float | None = None
    """absolute tolerance against the reference (default: per dtype)"""
    rtol: float | None = None
    """relative tolerance against the reference (default: per dtype)"""
    seed: int = 0
    """seed of the generated inputs"""

    def modes(self, tuning: bool = False) -> tuple[str, ...]:
        """The heuristic modes to ask: the file's or the command line's, else A then FALLBACK for a
        build and every mode (A, B, FALLBACK) for autotuning, which wants every candidate."""
        if self.heuristics:
            return self.heuristics
        return HEURISTIC_MODES if tuning else ("A", "FALLBACK")


@attrs.frozen
class Symbol:
    """A symbolic dimension and the values it takes (a dynamic shape)."""

    name: str
    values: tuple[int, ...]
    loc: Loc = _loc()


@attrs.frozen
class Value:
    """A named tensor of the graph: input, scalar (pass-by-value), constant, virtual or output."""

    name: str
    kind: str
    uid: int
    scalar: float | int | None = None
    """the host value of a scalar or constant"""
    dtype: str | None = None
    """the dtype of a scalar or constant (tensors have theirs per instance)"""
    loc: Loc = _loc()

    @property
    def is_pass_by_value(self) -> bool:
        return self.kind in ("scalar", "const")


@attrs.frozen
class Node:
    """One op application, in topological order."""

    op: str
    inputs: tuple[str | None, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...]
    compute: str
    loc: Loc = _loc()

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)


@attrs.frozen
class Instance:
    """The concrete types of every value for one binding of the symbolic dimensions."""

    binding: tuple[tuple[str, int], ...]
    types: tuple[tuple[str, TensorType], ...]
    _by_name: dict = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self):
        object.__setattr__(self, "_by_name", dict(self.types))

    def type(self, name: str) -> TensorType:
        return self._by_name[name]

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.binding)


@attrs.frozen
class Graph:
    name: str
    file: str
    io: str | None
    intermediate: str
    compute: str
    options: Options
    symbols: tuple[Symbol, ...]
    values: tuple[Value, ...]
    nodes: tuple[Node, ...]
    instances: tuple[Instance, ...]
    loc: Loc = _loc()
    _by_name: dict = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self):
        object.__setattr__(self, "_by_name", {v.name: v for v in self.values})

    def value(self, name: str) -> Value:
        return self._by_name[name]

    def of_kind(self, *kinds: str) -> tuple[Value, ...]:
        return tuple(v for v in self.values if v.kind in kinds)

    @property
    def inputs(self) -> tuple[Value, ...]:
        """Tensors the caller binds: device inputs and host scalars."""
        return self.of_kind("input", "scalar")

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self.of_kind("output")

    def instance(self, binding: dict[str, int] | None = None) -> Instance:
        """The instance for a binding of the symbolic dims (the only one when there are none)."""
        want = tuple(sorted((binding or {}).items()))
        for inst in self.instances:
            if tuple(sorted(inst.binding)) == want or (not binding and len(self.instances) == 1):
                return inst
        declared = ", ".join(f"{s.name} in {{{', '.join(map(str, s.values))}}}" for s in self.symbols)
        raise KeyError(f"graph '{self.name}' has no shape for {dict(want) or 'no binding'}; declared: {declared}")


@attrs.frozen
class Program:
    file: str
    graphs: tuple[Graph, ...]

    def graph(self, name: str | None = None) -> Graph:
        if name is None:
            if len(self.graphs) != 1:
                names = ", ".join(g.name for g in self.graphs)
                raise KeyError(f"{self.file} holds {len(self.graphs)} graphs ({names}); choose one")
            return self.graphs[0]
        for g in self.graphs:
            if g.name == name:
                return g
        raise KeyError(f"{self.file} has no graph '{name}' (it has: {', '.join(g.name for g in self.graphs)})")
