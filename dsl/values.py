"""Semantic layer: attribute and option values, converted from the AST and checked.

Each converter returns the value, or a string starting with '!' that says what is wrong (the
caller reports it at the value's location).
"""

from __future__ import annotations

from typing import Any

from dsl import ast
from dsl.diagnostics import did_you_mean
from dsl.ir import BUILD_POLICIES, HEURISTIC_MODES
from dsl.types import DTYPES, INT64_MAX, canonical_dtype


def attr_value(a, v) -> Any:
    """Converts an ast value to the attribute's kind, or '!message' when it doesn't fit."""
    if a.kind == "int":
        return v.value if isinstance(v, ast.Number) and isinstance(v.value, int) else "!must be an integer"
    if a.kind == "float":
        return float(v.value) if isinstance(v, ast.Number) else "!must be a number"
    if a.kind == "bool":
        if isinstance(v, ast.Ident) and v.name in ("true", "false"):
            return v.name == "true"
        return "!must be true or false"
    if a.kind == "ints":
        if isinstance(v, ast.Number) and isinstance(v.value, int):
            return v.value
        if isinstance(v, ast.ListValue) and all(isinstance(x, ast.Number) and isinstance(x.value, int) for x in v.items):
            if any(abs(x.value) > INT64_MAX for x in v.items):
                return "!has a value out of range"
            return tuple(x.value for x in v.items)
        return "!must be an integer or a list of integers"
    if a.kind == "enum":
        if isinstance(v, ast.Ident) and v.name in a.choices:
            return v.name
        got = v.name if isinstance(v, ast.Ident) else "this value"
        return f"!must be one of {', '.join(a.choices)}; got {got}" + (did_you_mean(v.name, a.choices) if isinstance(v, ast.Ident) else "")
    if a.kind == "dtype":
        if isinstance(v, ast.Ident) and canonical_dtype(v.name):
            return canonical_dtype(v.name)
        return "!must be a dtype" + (did_you_mean(v.name, DTYPES) if isinstance(v, ast.Ident) else "")
    raise ValueError(a.kind)


def option_value(name: str, v) -> Any:
    """Converts an option's ast value, or '!message'."""
    if name == "heuristics":
        items = v.items if isinstance(v, ast.ListValue) else (v,)
        modes = []
        for it in items:
            if not isinstance(it, ast.Ident) or it.name.upper() not in HEURISTIC_MODES:
                return f"!heuristic modes are {', '.join(HEURISTIC_MODES)}"
            modes.append(it.name.upper())
        return tuple(modes) if modes else f"!give at least one of {', '.join(HEURISTIC_MODES)}"
    if name == "build_policy":
        if isinstance(v, ast.Ident) and v.name in BUILD_POLICIES:
            return v.name
        return f"!must be one of {', '.join(BUILD_POLICIES)}"
    if name == "cuda_graph":
        if isinstance(v, ast.Ident) and v.name in ("true", "false"):
            return v.name == "true"
        return "!must be true or false"
    if name in ("warmup", "iterations", "workspace_limit", "seed"):
        lo = 1 if name == "iterations" else 0
        if isinstance(v, ast.Number) and isinstance(v.value, int) and lo <= v.value <= INT64_MAX:
            return v.value
        return f"!must be an integer >= {lo}"
    if name in ("atol", "rtol"):
        if isinstance(v, ast.Number) and v.value >= 0:
            return float(v.value)
        return "!must be a number >= 0"
    raise ValueError(name)
