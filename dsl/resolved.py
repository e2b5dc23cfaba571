"""A graph between name resolution (check.py) and typing (infer.py).

The checker fills these records; the typer reads a frozen Resolved and never reaches into the checker.
"""

from __future__ import annotations

from typing import Any

import attrs

from dsl.diagnostics import Loc
from dsl.inits import Init
from dsl.types import DEFAULT_MATH


@attrs.define
class Decl:
    """A declared tensor before typing: an input, scalar or constant."""

    name: str
    kind: str
    loc: Loc
    dtype: str | None = None
    dims: tuple = ()
    layout: str | None = None
    strides: tuple[int, ...] | None = None
    uid: int | None = None
    uid_loc: Loc | None = None
    scalar: Any = None
    by_value_dims: tuple[int, ...] | None = None
    """a scalar's declared dims (`scalar s : float[1] = 0.5`)"""
    view: tuple[str, int] | None = None
    """(buffer, element offset) of an input declared `in BUFFER at OFFSET`"""
    view_loc: Loc | None = None
    init: Init | None = None
    placed_for: str | None = None
    """the output a view was declared for (`output y : ... in BUFFER at OFFSET`): the view it is written over"""


@attrs.define
class PNode:
    """A node before typing: its attributes as given (converted, not yet canonical)."""

    op: str
    inputs: list
    outputs: list
    attrs: dict
    compute: str
    loc: Loc
    arg_locs: list
    attr_locs: dict
    ok: bool = True
    uids: dict = attrs.Factory(dict)
    """attribute -> (uid, loc) of an attribute given `uid=N`"""
    scalars: dict = attrs.Factory(dict)
    """attribute -> the scalar it names (`epsilon=eps`)"""


@attrs.define
class OutDecl:
    """An output's declared type and layout; also the declared type of a named intermediate (``y : bf16 = ...``)."""

    name: str
    loc: Loc
    dtype: str | None = None
    dims: tuple | None = None
    dims_loc: Loc | None = None
    layout: str | None = None
    strides: tuple[int, ...] | None = None
    uid: int | None = None
    uid_loc: Loc | None = None
    into: str | None = None
    """the input this output is written over (`output y in x = ...`)"""
    into_loc: Loc | None = None


@attrs.define
class BufferDecl:
    name: str
    dtype: str
    dims: tuple[int, ...]
    loc: Loc
    init: Init | None = None
    """how `run` fills the buffer, and so every view of it (`init=`)"""


@attrs.frozen
class Resolved:
    """One graph with every name resolved: what typing needs, read-only."""

    types: dict[str, str]
    """'io' / 'intermediate' / 'compute' -> dtype, as declared"""
    decls: dict[str, Decl]
    nodes: tuple[PNode, ...]
    outputs: dict[str, OutDecl]
    poisoned: frozenset[str]
    """names whose declaration failed: their uses are not reported again"""
    buffers: dict[str, BufferDecl] = attrs.Factory(dict)
    typed: dict[str, OutDecl] = attrs.Factory(dict)
    """named intermediates with a declared type"""
    type_locs: dict[str, Loc] = attrs.Factory(dict)
    """where each graph-level type is given (an unset one's line is where a value without a dtype learns why)"""
    user_names: frozenset[str] = frozenset()
    """the names the file writes (the others were made for unnamed values)"""

    @property
    def intermediate(self) -> str | None:
        """None where the graph leaves it unset"""
        return self.types.get("intermediate", DEFAULT_MATH)
