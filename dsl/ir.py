"""The checked, typed, immutable IR (one Graph per `graph` block).

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
    """A symbolic dimension and the values it takes (a dynamic shape): a set, or a range whose
    ends are typed when the file is checked and whose other values are typed on first use."""

    name: str
    values: tuple[int, ...]
    """the set's values; a range's ends"""
    loc: Loc = _loc()
    span: tuple[int, int, int] | None = None
    """(first, last, step) of a range"""

    def accepts(self, value: int) -> bool:
        if self.span is None:
            return value in self.values
        lo, hi, step = self.span
        return lo <= value <= hi and (value - lo) % step == 0

    @property
    def count(self) -> int:
        """How many values the dim takes."""
        if self.span is None:
            return len(self.values)
        lo, hi, step = self.span
        return (hi - lo) // step + 1

    @property
    def text(self) -> str:
        """'{8, 16}', '1..4096' or '8..4096 step 8', as the file spells it."""
        if self.span is None:
            return "{" + ", ".join(map(str, self.values)) + "}"
        lo, hi, step = self.span
        return f"{lo}..{hi}" + (f" step {step}" if step != 1 else "")


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
    view: tuple[str, int] | None = None
    """an input read from a buffer: (buffer, element offset)"""
    into: str | None = None
    """an output written over the memory of this input"""
    init: Init | None = None
    """an input's declared distribution (`init=`); None: the default for its dtype"""
    dims: tuple[int, ...] | None = None
    """a scalar's declared dims, as cuDNN gets its pass-by-value tensor (the C++ frontend's `graph.tensor(x)` is
    [1]); None: ones at the rank of the tensors it meets"""


@attrs.frozen
class Buffer:
    """Memory the caller binds once (dense, row-major, of its declared type in every Instance) and the
    graph reads through views: inputs whose Value.view names it. It is no cuDNN tensor and has no uid."""

    name: str
    loc: Loc = _loc()
    init: Init | None = None
    """the buffer's declared distribution (`init=`), its views' too; None: the default for its dtype"""
    kind = "buffer"


@attrs.frozen
class Node:
    """One op application, in topological order (its attributes are per Instance)."""

    op: str
    inputs: tuple[str | None, ...]
    outputs: tuple[str, ...]
    compute: str
    loc: Loc = _loc()
    uids: tuple[tuple[str, int], ...] = ()
    """(attribute, uid) of each attribute lowered to a pass-by-value tensor with a declared uid"""
    scalars: tuple[tuple[str, str], ...] = ()
    """(attribute, scalar) of each attribute a declared scalar carries (`epsilon=eps`): cuDNN gets that scalar's
    pass-by-value tensor, and the attribute is its value"""

    @property
    def reads(self) -> tuple[str, ...]:
        """The values the node reads: the inputs given, then the scalars its attributes name."""
        return tuple(i for i in self.inputs if i is not None) + tuple(s for _, s in self.scalars)


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
    intermediate: str | None
    """None: unset (`intermediate unset`), every virtual value has a dtype of its own"""
    compute: str | None
    """None: unset (`compute unset`), every node has a compute type of its own"""
    options: Options
    symbols: tuple[Symbol, ...]
    values: tuple[Value, ...]
    nodes: tuple[Node, ...]
    instances: tuple[Instance, ...]
    """the shapes typed when the file was checked: every value of a set, the ends of a range"""
    loc: Loc = _loc()
    buffers: tuple[Buffer, ...] = ()
    input_dims: tuple[tuple[str, tuple[int | str, ...]], ...] = ()
    """each input's declared dims, symbols by name: how a binding is read off the inputs' shapes"""
    typer: Any = attrs.field(default=None, eq=False, repr=False)
    """binding -> Instance, for a value of a range first met after checking (raises DslError)"""
    _by_name: dict = attrs.field(init=False, eq=False, repr=False)
    _typed: dict = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self):
        object.__setattr__(self, "_by_name", {v.name: v for v in self.values + self.buffers})
        object.__setattr__(self, "_typed", {tuple(sorted(i.binding)): i for i in self.instances})

    def value(self, name: str) -> Value | Buffer:
        return self._by_name[name]

    def of_kind(self, *kinds: str) -> tuple[Value, ...]:
        return tuple(v for v in self.values if v.kind in kinds)

    @property
    def inputs(self) -> tuple[Value | Buffer, ...]:
        """What the caller binds, by name: buffers, device inputs that are no views, host scalars."""
        return self.buffers + tuple(v for v in self.values if v.kind in ("input", "scalar") and v.view is None)

    @property
    def device_inputs(self) -> tuple[Value | Buffer, ...]:
        """The device memory the caller binds (and `run` generates): buffers and inputs that are no views."""
        return tuple(v for v in self.inputs if v.kind != "scalar")

    @property
    def views(self) -> tuple[Value, ...]:
        return tuple(v for v in self.values if v.view is not None)

    @property
    def in_place(self) -> tuple[Value, ...]:
        """Outputs written over the memory of an input."""
        return tuple(v for v in self.values if v.into is not None)

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self.of_kind("output")

    @property
    def declared_shapes(self) -> str:
        """'N in {8, 16}; M in 1..64' — what a caller may bind."""
        return "; ".join(f"{s.name} in {s.text}" for s in self.symbols)

    def instance(self, binding: dict[str, int] | None = None) -> Instance:
        """The instance for a binding of the symbolic dims (the only one when there are none); a
        range's value is typed on first use. NotFound, naming the dim's declaration, for a value
        the graph does not declare."""
        if not binding and len(self.instances) == 1:
            return self.instances[0]
        want = tuple(sorted((binding or {}).items()))
        if want in self._typed:
            return self._typed[want]
        syms = {s.name: s for s in self.symbols if self.instances and s.name in dict(self.instances[0].binding)}
        if syms and set(dict(want)) == set(syms) and self.typer is not None:
            outside = [s for k, v in want if not (s := syms[k]).accepts(v)]
            if not outside:
                return self._typed.setdefault(want, self.typer(dict(want)))
            s = outside[0]
            raise NotFound(f"{s.loc}: graph '{self.name}': {s.name}={dict(want)[s.name]} is not in {s.text}")
        raise NotFound(
            f"graph '{self.name}' has no shape {dict(want) or 'without a binding'}; declared: {self.declared_shapes}"
        )

    def binding_of(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
        """The symbolic dims read off the inputs' shapes (name -> shape; inputs not given are skipped).
        Each dim is read where it first appears; the binding check that follows catches disagreements."""
        binding: dict[str, int] = {}
        for name, dims in self.input_dims:
            shape = shapes.get(name)
            if shape is None or len(shape) != len(dims):
                continue
            for d, n in zip(dims, shape):
                if isinstance(d, str):
                    binding.setdefault(d, n)
        return binding


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
