"""How a generated input is filled — the distributions of `init=` and `run --init`."""

from __future__ import annotations

import math
import re

import attrs

from dsl.diagnostics import RuleError
from dsl.types import DTYPE_RANGE, is_float
from dsl.values import number


@attrs.frozen
class Dist:
    name: str
    params: tuple[str, ...]
    defaults: tuple[float | None, ...]
    """per parameter; None: required"""
    doc: str


#: every distribution an input can be drawn from; `cudnn_dsl.target.portable.draw` implements them
DISTS = {
    d.name: d
    for d in (
        Dist(
            "uniform",
            ("lo", "hi"),
            (-1.0, 1.0),
            "uniform in [lo, hi) (the default: [-1, 1); [0.5, 1.5) where an op wants positives)",
        ),
        Dist("randn", ("mean", "std"), (0.0, 1.0), "normal with this mean and standard deviation"),
        Dist(
            "randint",
            ("lo", "hi", "scale"),
            (None, None, 1.0),
            "integers in [lo, hi], each equally likely, times scale (the default of integer inputs: -8 to 8; "
            "randint(0, 10, 0.5) draws 0, 0.5, ..., 5: values exact in every float dtype)",
        ),
        Dist("bernoulli", ("p",), (0.5,), "1 (true) with probability p, else 0: masks (the default of bool inputs)"),
        Dist("sparse", ("p",), (0.9,), "uniform in [-1, 1) with a fraction p of the elements 0"),
        Dist("full", ("value",), (None,), "every element the same value (a per-sequence length, a constant)"),
        Dist("zeros", (), (), "every element 0 (false): an accumulator, a cleared cache"),
        Dist("ones", (), (), "every element 1 (true): a neutral scale, a mask that keeps everything"),
        Dist(
            "permutation",
            ("lo", "hi"),
            (None, None),
            "lo to hi in a random order, each once, the order repeated past hi - lo + 1 elements "
            "(the default of page tables: the blocks of the cache)",
        ),
        Dist(
            "arange",
            ("start", "step"),
            (0.0, 1.0),
            "start, start + step, ... in row-major order of the dims (page tables, indices)",
        ),
        Dist(
            "like",
            ("input",),
            (None,),
            "the values of another input of the same shape and dtype, as generated or given (a copy: K equal to Q)",
        ),
    )
}


@attrs.frozen
class Init:
    """A distribution with every parameter given (defaults filled): canonical."""

    dist: str
    args: tuple[float, ...]
    source: str | None = None
    """like(x): the input whose values it takes (no args then)"""

    def __str__(self) -> str:
        if self.source is not None:
            return f"{self.dist}({self.source})"
        return f"{self.dist}({', '.join(num_text(a) for a in self.args)})"

    def bounds(self) -> tuple[float, float] | None:
        """The least and greatest value it draws; None when unbounded (randn) or unknown before the shape (arange)."""
        a = self.args
        if self.dist == "randint":
            scale = a[2] if len(a) > 2 else 1.0
            return min(a[0] * scale, a[1] * scale), max(a[0] * scale, a[1] * scale)
        if self.dist in ("uniform", "permutation"):
            return a[0], a[1]
        if self.dist == "full":
            return a[0], a[0]
        if self.dist in ("zeros", "ones"):
            return (0.0, 0.0) if self.dist == "zeros" else (1.0, 1.0)
        if self.dist in ("bernoulli",):
            return 0.0, 1.0
        if self.dist == "sparse":
            return -1.0, 1.0
        return None


def num_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) <= 2**53 else repr(x)


def make(name: str, args: tuple[float, ...]) -> Init:
    """An Init from a name and the given parameters; RuleError (with `at` the argument's index, when it
    concerns one) when the name or the parameters are wrong."""
    d = DISTS.get(name)
    if d is None:
        raise RuleError(f"unknown distribution '{name}'; the distributions are {', '.join(DISTS)}")
    if len(args) > len(d.params):
        raise RuleError(f"{name} takes {len(d.params)} parameters ({', '.join(d.params)}), got {len(args)}")
    full = tuple(args) + d.defaults[len(args) :]
    missing = [p for p, v in zip(d.params, full) if v is None]
    if missing:
        raise RuleError(f"{name} needs {', '.join(d.params)}; {', '.join(missing)} missing")
    if name == "like":
        raise RuleError("like takes an input's name, not a number: like(x)", at=0)
    if name in ("randint", "permutation"):
        _check_randint_range(name, full[:2])
    a = [_finite(name, d.params[i], v, i) for i, v in enumerate(full)]
    if name in ("uniform", "randint", "permutation") and a[0] > a[1]:
        raise RuleError(f"{name}: lo ({num_text(a[0])}) is greater than hi ({num_text(a[1])})", at=1)
    if name in ("randint", "permutation") and not all(v.is_integer() for v in a[:2]):
        raise RuleError(f"{name}: lo and hi must be integers", at=0 if not a[0].is_integer() else 1)
    if name == "randint" and a[2] == 1.0:
        a = a[:2]  # the scale of plain integers is left out: randint(0, 8) and randint(0, 8, 1) are one init
    if name == "permutation" and a[1] - a[0] >= PERMUTATION_LIMIT:
        raise RuleError(
            f"permutation: {num_text(a[1] - a[0] + 1)} values are too many to order; at most {PERMUTATION_LIMIT}",
            at=1,
        )
    if name == "uniform" and not math.isfinite(a[1] - a[0]):
        raise RuleError("uniform: hi - lo is out of range of a 64-bit float", at=1)
    if name == "randn" and a[1] < 0:
        raise RuleError("randn: std must not be negative", at=1)
    if name in ("bernoulli", "sparse") and not 0 <= a[0] <= 1:
        raise RuleError(f"{name}: p must be between 0 and 1", at=0)
    return Init(name, tuple(a))


def _finite(dist: str, param: str, v: float, at: int) -> float:
    try:
        x = float(v)
    except OverflowError:  # an integer beyond any float
        x = math.inf
    if not math.isfinite(x):
        raise RuleError(f"{dist}: {param} must be a finite 64-bit float", at=at)
    return x


#: randint's (and permutation's) bounds are held as floats: beyond 2**53 a float skips integers
RANDINT_LIMIT = 2**53
#: the most values a permutation orders: it is drawn whole (a cache's blocks are far fewer)
PERMUTATION_LIMIT = 2**24


def _check_randint_range(name: str, given: tuple[float, ...]) -> None:
    for i, v in enumerate(given):
        if not -RANDINT_LIMIT <= v <= RANDINT_LIMIT:
            raise RuleError(
                f"{name}: {DISTS[name].params[i]} {v} is out of range: lo and hi must be from "
                f"-2**53 to 2**53 ({RANDINT_LIMIT}), the integers a 64-bit float holds exactly",
                at=i,
            )


def like(source: str) -> Init:
    """like(x): the values of input x (the checker proves x an input of the same shape and dtype)."""
    return Init("like", (), source)


def check_dtype(init: Init, dtype: str) -> None:
    """RuleError when the drawn values cannot be held by the input's dtype."""
    b = init.bounds()
    if b is None:
        return
    lo, hi = DTYPE_RANGE[dtype]
    for v in b:
        if not lo <= v <= hi:
            raise RuleError(f"{init} draws {num_text(v)}, out of range for {dtype} ({lo:g} to {hi:g})")
    if not is_float(dtype) and init.dist == "full" and not b[0].is_integer():
        raise RuleError(f"{init} is not an integer, and the dtype is {dtype}")
    if not is_float(dtype) and dtype != "bool" and init.dist == "randint" and len(init.args) > 2:
        if not init.args[2].is_integer():
            raise RuleError(f"{init} draws values that are not integers, and the dtype is {dtype}")


def default(dtype: str, positive: bool) -> Init:
    """What an input without `init=` is drawn from."""
    if dtype == "bool":
        return Init("bernoulli", (0.5,))
    if not is_float(dtype):
        lo, hi = (4.0, 12.0) if positive else (0.0 if dtype == "uint8" else -8.0, 8.0)
        return Init("randint", (lo, hi))
    return Init("uniform", (0.5, 1.5) if positive else (-1.0, 1.0))


_TEXT = re.compile(r"\s*([A-Za-z_]\w*)\s*(?:\(([^()]*)\)\s*)?", re.ASCII)


def parse(text: str) -> Init:
    """`randn(0, 0.5)` from the command line (no eval: a name, then numbers); RuleError when malformed."""
    m = _TEXT.fullmatch(text)
    if m is None:
        raise RuleError(f"'{text}' is not DIST or DIST(NUMBER, ...), e.g. randn(0, 0.5)")
    if m.group(1) == "like":
        raise RuleError("like(NAME) is written in the file (init=like(x)), where the checker proves x fits")
    items = m.group(2).split(",") if m.group(2) and m.group(2).strip() else ()
    return make(m.group(1), tuple(_argument(m.group(1), i, t) for i, t in enumerate(items)))


def _argument(dist: str, index: int, text: str) -> float:
    try:
        return number(text)
    except ValueError as e:
        raise RuleError(f"{dist}: argument {index + 1}: {e}", at=index) from None
