"""Attributes and options — their declared kinds, and the one converter of values.

An op's attributes and a graph's options are rows of the same kind (``Attr``), and every value,
whether it comes from a .cdg file, the command line or the Python API, goes through ``convert``:
one set of rules, one set of messages. Bad values raise ``RuleError``; the caller locates it.
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs

from dsl.diagnostics import RuleError, did_you_mean
from dsl.syntax import ast
from dsl.types import DTYPE_ALIASES, DTYPES, INT64_MAX, canonical_dtype

REQUIRED = object()
"""default of an attribute the user must give"""
DERIVED = object()
"""default of an attribute the op's rule computes from the input types (e.g. sdpa's scale)"""

KINDS = ("int", "float", "bool", "ints", "spatial", "enum", "enums", "dtype")
"""int; float; bool; ints: a list of ints (one int is a list of one); spatial: one int for every
spatial dim or a list of them, expanded to the node's spatial rank; enum: one of `choices` (any
case); enums: a list of them; dtype: a dtype name or alias."""


@attrs.frozen
class Attr:
    name: str
    kind: str
    default: Any = REQUIRED
    choices: tuple[str, ...] = ()
    doc: str = ""
    lo: float | None = None
    """least value (every item of a list); None: no bound"""
    hi: float | None = INT64_MAX
    """greatest value (every item of a list)"""
    optional: bool = False
    """None is a value of its own (an option left to a default decided elsewhere)"""
    tensor: bool = False
    """lowered to a pass-by-value cuDNN tensor (epsilon, momentum): it may take a uid, `epsilon=1e-5 uid=7`"""

    def __attrs_post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"attribute {self.name}: unknown kind {self.kind}")

    @property
    def described(self) -> str:
        """How the docs and messages name what the attribute takes."""
        return {
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
            "ints": "a list of integers",
            "spatial": "an integer or a list of integers",
            "enum": "one of " + ", ".join(self.choices),
            "enums": "a list of " + ", ".join(self.choices),
            "dtype": "a dtype",
        }[self.kind]


def _bounded(a: Attr, x):
    if a.lo is not None and x < a.lo or a.hi is not None and x > a.hi:
        lo = "" if a.lo is None else f">= {_num(a.lo)}"
        hi = "" if a.hi is None or a.hi == INT64_MAX else f"<= {_num(a.hi)}"
        rng = " and ".join(p for p in (lo, hi) if p) or "within 64 bits"
        raise RuleError(f"must be {rng}, got {_num(x)}")
    return x


def _num(x) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() and abs(x) < 1e15 else str(x)


def _int(a: Attr, v) -> int:
    if isinstance(v, ast.Number) and isinstance(v.value, int):
        if abs(v.value) > INT64_MAX:
            raise RuleError(f"has a value out of range ({v.text or v.value})")
        return _bounded(a, v.value)
    raise RuleError(f"must be {'an integer' if a.kind == 'int' else a.described}")


def _enum(a: Attr, v) -> str:
    if isinstance(v, ast.Ident):
        for c in a.choices:
            if c.lower() == v.name.lower():
                return c
        raise RuleError(f"must be one of {', '.join(a.choices)}; got {v.name}{did_you_mean(v.name, a.choices)}")
    raise RuleError(f"must be one of {', '.join(a.choices)}")


def convert(a: Attr, v) -> Any:
    """An AST value as the attribute's canonical Python value (tuples for lists, enums in their
    declared spelling, floats finite); RuleError says what is wrong with it."""
    if a.kind == "int":
        return _int(a, v)
    if a.kind == "float":
        if isinstance(v, ast.Number):
            x = float(v.value)
            if not math.isfinite(x):
                raise RuleError("must be a finite number")
            return _bounded(a, x)
        raise RuleError("must be a number")
    if a.kind == "bool":
        if isinstance(v, ast.Ident) and v.name in ("true", "false"):
            return v.name == "true"
        raise RuleError("must be true or false")
    if a.kind in ("ints", "spatial"):
        if isinstance(v, ast.ListValue):
            if not v.items:
                raise RuleError(f"must be {a.described}, not an empty list")
            return tuple(_int(a, x) for x in v.items)
        value = _int(a, v)
        return value if a.kind == "spatial" else (value,)
    if a.kind == "enum":
        return _enum(a, v)
    if a.kind == "enums":
        items = v.items if isinstance(v, ast.ListValue) else (v,)
        if not items:
            raise RuleError(f"give at least one of {', '.join(a.choices)}")
        return tuple(_enum(a, x) for x in items)
    if a.kind == "dtype":
        if isinstance(v, ast.Ident) and canonical_dtype(v.name):
            return canonical_dtype(v.name)
        hint = did_you_mean(v.name, list(DTYPES) + list(DTYPE_ALIASES)) if isinstance(v, ast.Ident) else ""
        raise RuleError("must be a dtype" + hint)
    raise AssertionError(a.kind)


# ---- values from outside a .cdg file, made into the AST values that `convert` takes ------------

#: the grammar's NUMBER with a sign (ASCII digits, as there)
_NUMBER = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?")

#: what `number` accepts, for the messages that refuse other text
NUMBER_SYNTAX = "ASCII digits with an optional sign, point and exponent, e.g. 3, -0.5, 1e-5"


def number(text: str) -> int | float:
    """A number as the language spells it ('3', '-0.5', '1e-5'); ValueError for anything else, or for a number
    a 64-bit float cannot hold (Python's int() and float() also take other scripts' digits, '_' and 'inf')."""
    text = text.strip(" \t")
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"{text!r} is not a number ({NUMBER_SYNTAX})")
    sign, body = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
    if body.isdigit():
        return sign * int(body)
    value = sign * float(body)
    if math.isinf(value):
        raise ValueError(f"{text} is out of range of a 64-bit float")
    return value


def natural(text: str) -> int:
    """A non-negative integer in ASCII digits (a dim, a count); ValueError for anything else."""
    text = text.strip(" \t")
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"{text!r} is not a whole number (ASCII digits 0-9)")
    return int(text)


def _text_item(text: str):
    try:
        return ast.Number(number(text), text.strip())
    except ValueError:
        return ast.Ident(text.strip())


def from_text(a: Attr, text: str):
    """A command-line value: '3', '0.5', 'true', 'A,B' (lists are comma separated)."""
    if a.kind in ("ints", "spatial", "enums") and "," in text:
        return ast.ListValue(tuple(_text_item(t) for t in text.split(",") if t.strip()))
    return _text_item(text)


def from_python(a: Attr, value):
    """A Python API value: bool, int, float, str, or a list or tuple of them."""
    if isinstance(value, bool):
        return ast.Ident("true" if value else "false")
    if isinstance(value, (int, float)):
        return ast.Number(value, repr(value))
    if isinstance(value, str):
        return from_text(a, value)
    if isinstance(value, (list, tuple)):
        return ast.ListValue(tuple(from_python(a, x) for x in value))
    raise RuleError(f"must be {a.described}, got a {type(value).__name__}")
