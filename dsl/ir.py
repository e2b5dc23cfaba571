"""Semantic layer: the checked, typed, immutable IR (one Graph per `graph` block).

The IR is canonical: two spellings of the same graph give equal IR (and one plan-store key).
Concrete facts live in one Instance per binding of the symbolic dims: the type of every value and
the full attribute set of every node, defaults filled and lists expanded.
"""

from __future__ import annotations

from typing import Any

import attrs

from dsl.diagnostics import UNKNOWN, Loc
from dsl.inits import Init
from dsl.options import Options
from dsl.types import TensorType


def _loc():
    return attrs.field(default=UNKNOWN, eq=False, repr=False)


class NotFound(LookupError):
    """A graph or shape that a caller asked for by name is not in the program."""


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
    init: Init | None = None
    """an input's declared distribution (`init=`); None: the default for its dtype"""


@attrs.frozen
class Node:
    """One op application, in topological order (its attributes are per Instance)."""

    op: str
    inputs: tuple[str | None, ...]
    outputs: tuple[str, ...]
    compute: str
    loc: Loc = _loc()


def shape_label(binding) -> str:
    """'N=8, M=4' for a binding of symbolic dims."""
    return ", ".join(f"{k}={v}" for k, v in binding)


@attrs.frozen
class Instance:
    """The concrete types of every value, and the canonical attributes of every node, for one
    binding of the symbolic dimensions."""

    binding: tuple[tuple[str, int], ...]
    types: tuple[tuple[str, TensorType], ...]
    node_attrs: tuple[tuple[tuple[str, Any], ...], ...] = ()
    """per node of the graph, in order: (name, value) of every attribute, sorted by name"""
    _by_name: dict = attrs.field(init=False, eq=False, repr=False)
    _attr_dicts: tuple = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self):
        object.__setattr__(self, "_by_name", dict(self.types))
        object.__setattr__(self, "_attr_dicts", tuple(dict(a) for a in self.node_attrs))

    def type(self, name: str) -> TensorType:
        return self._by_name[name]

    def attrs(self, node_index: int) -> dict[str, Any]:
        """The canonical attributes of the graph's node at this index (do not modify)."""
        return self._attr_dicts[node_index]

    @property
    def label(self) -> str:
        return shape_label(self.binding)


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

    @property
    def declared_shapes(self) -> str:
        """'N in {8, 16}; M in {4}' — what a caller may bind."""
        return "; ".join(f"{s.name} in {{{', '.join(map(str, s.values))}}}" for s in self.symbols)

    def instance(self, binding: dict[str, int] | None = None) -> Instance:
        """The instance for a binding of the symbolic dims (the only one when there are none)."""
        if not binding and len(self.instances) == 1:
            return self.instances[0]
        want = tuple(sorted((binding or {}).items()))
        for inst in self.instances:
            if tuple(sorted(inst.binding)) == want:
                return inst
        raise NotFound(
            f"graph '{self.name}' has no shape {dict(want) or 'without a binding'}; declared: {self.declared_shapes}"
        )


@attrs.frozen
class Program:
    file: str
    graphs: tuple[Graph, ...]

    def graph(self, name: str | None = None) -> Graph:
        if name is None:
            if len(self.graphs) != 1:
                names = ", ".join(g.name for g in self.graphs)
                raise NotFound(f"{self.file} holds {len(self.graphs)} graphs ({names}); choose one")
            return self.graphs[0]
        for g in self.graphs:
            if g.name == name:
                return g
        raise NotFound(f"{self.file} has no graph '{name}' (it has: {', '.join(g.name for g in self.graphs)})")
