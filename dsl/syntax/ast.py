"""The untyped tree the parser builds, one frozen node per construct."""

from __future__ import annotations

import attrs

from dsl.diagnostics import UNKNOWN, Loc


def _loc():
    return attrs.field(default=UNKNOWN, eq=False, repr=False)


# ---- attribute values (keyword arguments and options) --------------------------


@attrs.frozen
class Number:
    value: int | float
    text: str = attrs.field(eq=False, repr=False, default="")
    """The source spelling, kept so the printer reproduces it."""
    loc: Loc = _loc()


@attrs.frozen
class Ident:
    name: str
    loc: Loc = _loc()


@attrs.frozen
class String:
    value: str
    loc: Loc = _loc()


@attrs.frozen
class ListValue:
    items: tuple
    loc: Loc = _loc()


Value = Number | Ident | String | ListValue


# ---- expressions ------------------------------------------------------------------


@attrs.frozen
class Ref:
    name: str
    loc: Loc = _loc()


@attrs.frozen
class Kwarg:
    name: str
    value: Value
    loc: Loc = _loc()
    uid: int | None = None
    """`epsilon=1e-5 uid=7`: the uid of the pass-by-value tensor the attribute lowers to"""
    uid_loc: Loc = _loc()


@attrs.frozen
class Call:
    op: str
    args: tuple
    kwargs: tuple[Kwarg, ...]
    loc: Loc = _loc()
    op_loc: Loc = _loc()


@attrs.frozen
class BinOp:
    """Infix ``+ - * /``; the checker maps it to the pointwise op of ``op``."""

    op: str
    lhs: Expr
    rhs: Expr
    loc: Loc = _loc()


@attrs.frozen
class Neg:
    operand: Expr
    loc: Loc = _loc()


Expr = Ref | Number | Call | BinOp | Neg


# ---- declarations and statements -----------------------------------------------


@attrs.frozen
class Dim:
    """A dimension: an int, or the name of a symbolic dimension."""

    value: int | str
    loc: Loc = _loc()


@attrs.frozen
class TypeSpec:
    dtype: str
    dims: tuple[Dim, ...] | None
    loc: Loc = _loc()
    dtype_loc: Loc = _loc()


@attrs.frozen
class Layout:
    name: str
    loc: Loc = _loc()


@attrs.frozen
class Strides:
    values: tuple[int | tuple[int | str, ...], ...]
    """per axis, a number or the factors of a product of dims and numbers (`H*W*C`: ("H", "W", "C"))"""
    loc: Loc = _loc()
    value_locs: tuple[Loc, ...] = attrs.field(default=(), eq=False, repr=False)
    """where each value is written (empty for strides no file wrote)"""


@attrs.frozen
class Uid:
    value: int
    loc: Loc = _loc()


@attrs.frozen
class Place:
    """`in qkv at 128` (an input viewing a buffer at an element offset) or `in x` (an output
    written over input x)."""

    target: str
    offset: int | None
    loc: Loc = _loc()


@attrs.frozen
class InitSpec:
    """``init=randn(0, 0.5)``: how `run` fills a generated input; ``init=like(x)`` names an input."""

    dist: str
    args: tuple[Number | Ident, ...]
    loc: Loc = _loc()


TensorSpec = Layout | Strides | Uid | Place | InitSpec


@attrs.frozen
class TypesDecl:
    """``io half`` / ``intermediate float`` / ``compute float``."""

    kind: str
    dtype: str
    loc: Loc = _loc()
    dtype_loc: Loc = _loc()


@attrs.frozen
class OptionDecl:
    name: str
    value: Value
    loc: Loc = _loc()


@attrs.frozen
class DimDecl:
    name: str
    values: tuple[int, ...]
    """the values of `dim N in {8, 16}`; empty for a range"""
    loc: Loc = _loc()
    span: tuple[int, int, int] | None = None
    """(first, last, step) of `dim N in 1..4096 step 8`"""


@attrs.frozen
class InputDecl:
    name: str
    type: TypeSpec
    specs: tuple[TensorSpec, ...]
    loc: Loc = _loc()


@attrs.frozen
class ScalarDecl:
    name: str
    dtype: str
    value: Number
    specs: tuple[TensorSpec, ...]
    loc: Loc = _loc()
    dtype_loc: Loc = _loc()
    dims: tuple[Dim, ...] | None = None
    """the pass-by-value tensor's dims as cuDNN gets them (`scalar s : float[1] = 0.5`); None: the rank it meets"""


@attrs.frozen
class OutputDecl:
    name: str
    type: TypeSpec | None
    specs: tuple[TensorSpec, ...]
    expr: Expr | None
    loc: Loc = _loc()


@attrs.frozen
class BufferDecl:
    """`buffer qkv : half[...] [init=...]`: memory bound once, read through views."""

    name: str
    type: TypeSpec
    specs: tuple[TensorSpec, ...]
    """as the grammar reads them; the checker takes init= only"""
    loc: Loc = _loc()


@attrs.frozen
class Assign:
    targets: tuple[str, ...]
    expr: Expr
    loc: Loc = _loc()
    type: TypeSpec | None = None
    """``y : bf16 = ...``: the declared type of a named intermediate"""


Stmt = TypesDecl | OptionDecl | DimDecl | InputDecl | ScalarDecl | OutputDecl | BufferDecl | Assign


@attrs.frozen
class GraphDef:
    name: str
    stmts: tuple
    loc: Loc = _loc()


@attrs.frozen
class Module:
    file: str
    graphs: tuple[GraphDef, ...]
    comments: tuple[tuple[int, str], ...] = attrs.field(default=(), eq=False, repr=False)
    """(line, text) of every comment, so the formatter keeps them."""
