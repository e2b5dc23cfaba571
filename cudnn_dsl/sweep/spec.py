"""A sweep's spec: which graphs at which shapes, planned or tuned for which GPUs and cuDNN versions, into which
store. A TOML file (docs/fleet.md); every mistake is a SpecError naming the file and the table and key."""

from __future__ import annotations

import glob
import math
import os
import sys
from pathlib import Path

import attrs

from cudnn_dsl.target.library import check_version
from dsl import files

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MODES = ("support", "tune", "exhaustive")
SPEC_LIMIT = 1 << 20
"""bytes; a spec is a page of TOML"""


class SpecError(ValueError):
    """A sweep spec that cannot be used; the message names the file and where in it."""


@attrs.frozen
class Spec:
    path: str
    name: str
    files: tuple[tuple[str, str | None], ...]
    """(path of a .cdg file, the graph it names or None for every graph), in glob order"""
    mode: str
    store: str
    """a directory (relative paths are the spec's directory's) or a URL; '' for none (sweep merge later)"""
    tune_targets: tuple[tuple[str, int], ...]
    """(GPU type as torch and nvidia-smi name it, how many GPUs of it to use; 0 for all)"""
    plan_targets: tuple[str, ...]
    """bundled descriptor names, or descriptor files (relative to the spec's directory)"""
    cudnn: tuple[str, ...]
    """cuDNN versions to plan for without a device ('' : the one installed)"""
    shapes: tuple[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]], ...]
    """('file:graph' or 'graph', ((dim, values), ...)): which shapes of a graph; every declared one otherwise"""
    budgets: tuple[tuple[str, float], ...]
    """('file:graph' or 'graph', seconds) for mode exhaustive"""
    budget_s: float
    timeout_s: float
    retries: int

    @classmethod
    def load(cls, path: str | os.PathLike) -> Spec:
        path = str(path)
        try:
            doc = tomllib.loads(files.read_text(path, SPEC_LIMIT, "sweep spec"))
        except files.Unreadable as e:
            raise SpecError(str(e)) from None
        except tomllib.TOMLDecodeError as e:
            raise SpecError(f"{path}: not TOML: {e}") from None
        return cls.parse(doc, path)

    @classmethod
    def parse(cls, doc: dict, path: str) -> Spec:
        at = _At(path)
        _only(at, doc, {"sweep", "tune_targets", "plan_targets", "shapes", "exhaustive"}, "")
        sweep = _table(at, doc, "sweep", required=True)
        _only(at, sweep, {"name", "graphs", "mode", "store", "timeout_s", "retries", "budget_s"}, "[sweep]")
        mode = _get(at, sweep, "[sweep]", "mode", str, "support")
        if mode not in MODES:
            raise at.error("[sweep] mode", f"is {mode!r}, not one of {', '.join(MODES)}")
        here = Path(path).parent
        graphs = _get(at, sweep, "[sweep]", "graphs", list, None)
        if not graphs or not all(isinstance(g, str) and g for g in graphs):
            raise at.error("[sweep] graphs", "must be a list of file globs ('models/*.cdg', 'a.cdg:graph')")
        files = tuple(f for g in graphs for f in _expand(at, here, g))
        tune = _table(at, doc, "tune_targets")
        for gpu, n in tune.items():
            if type(n) is not int or n < 0:
                raise at.error(f"[tune_targets] {gpu!r}", "must be a number of GPUs (0: every one of that type)")
        plan = _table(at, doc, "plan_targets")
        _only(at, plan, {"targets", "cudnn"}, "[plan_targets]")
        targets = tuple(_strings(at, plan, "[plan_targets]", "targets"))
        cudnn = tuple(_strings(at, plan, "[plan_targets]", "cudnn")) or ("",)
        for v in filter(None, cudnn):
            try:
                check_version(v)
            except ValueError as e:
                raise at.error("[plan_targets] cudnn", str(e)) from None
        if mode == "support" and tune:
            raise at.error("[tune_targets]", "is for modes tune and exhaustive: mode support plans without a GPU")
        if mode != "support" and plan:
            raise at.error(
                "[plan_targets]", f"is for mode support: mode {mode} times plans on the GPUs of [tune_targets]"
            )
        if mode != "support" and not tune:
            raise at.error("[tune_targets]", f"mode {mode} times plans on GPUs: name at least one GPU type")
        store = _get(at, sweep, "[sweep]", "store", str, "")
        if store and "://" not in store:
            store = str(here / store)
        return cls(
            path=path,
            name=_get(at, sweep, "[sweep]", "name", str, Path(path).stem),
            files=files,
            mode=mode,
            store=store,
            tune_targets=tuple(sorted(tune.items())),
            plan_targets=tuple(t if "/" not in t and not t.endswith(".json") else str(here / t) for t in targets),
            cudnn=cudnn,
            shapes=_shapes(at, _table(at, doc, "shapes")),
            budgets=_budgets(at, _table(at, doc, "exhaustive")),
            budget_s=_positive(at, sweep, "[sweep]", "budget_s", 100.0),
            timeout_s=_positive(at, sweep, "[sweep]", "timeout_s", 1800.0),
            retries=_retries(at, sweep),
        )

    def shapes_of(self, file: str, graph: str) -> dict[str, tuple[int, ...]]:
        """The shapes the spec asks of a graph ({} : every declared one); 'file:graph' before 'graph'."""
        chosen = dict(self.shapes)
        for name in (f"{self.relative(file)}:{graph}", graph):
            if name in chosen:
                return dict(chosen[name])
        return {}

    def budget_of(self, file: str, graph: str) -> float:
        chosen = dict(self.budgets)
        return chosen.get(f"{self.relative(file)}:{graph}", chosen.get(graph, self.budget_s))

    def relative(self, file: str) -> str:
        return os.path.relpath(file, Path(self.path).parent)


@attrs.frozen
class _At:
    path: str

    def error(self, where: str, what: str) -> SpecError:
        return SpecError(f"{self.path}: {where}: {what}")


def _table(at: _At, doc: dict, name: str, required: bool = False) -> dict:
    if name not in doc:
        if required:
            raise at.error(f"[{name}]", "missing (a sweep spec starts with a [sweep] table)")
        return {}
    if not isinstance(doc[name], dict):
        raise at.error(name, "must be a table")
    return doc[name]


def _only(at: _At, table: dict, known: set[str], where: str) -> None:
    extra = sorted(set(table) - known)
    if extra and not where:
        raise at.error(f"[{extra[0]}]", f"unknown table (known: {', '.join(sorted(known))})")
    if extra:
        raise at.error(f"{where} {extra[0]}", f"unknown key (known: {', '.join(sorted(known))})")


_WORDS = {str: "a string", int: "an integer", list: "a list", float: "a number"}


def _get(at: _At, table: dict, where: str, key: str, kind: type, default):
    if key not in table:
        return default
    v = table[key]
    if type(v) is not kind:
        raise at.error(f"{where} {key}", f"is {v!r:.60}, not {_WORDS[kind]}")
    return v


def _positive(at: _At, table: dict, where: str, key: str, default: float) -> float:
    v = table.get(key, default)
    if type(v) not in (int, float) or not math.isfinite(v) or v <= 0:
        raise at.error(f"{where} {key}", f"is {v!r:.60}, not a positive number of seconds")
    return float(v)


def _retries(at: _At, sweep: dict) -> int:
    n = _get(at, sweep, "[sweep]", "retries", int, 3)
    if n < 0:
        raise at.error("[sweep] retries", f"is {n}, not a number of retries (0 or more)")
    return n


def _strings(at: _At, table: dict, where: str, key: str) -> list[str]:
    v = table.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
        raise at.error(f"{where} {key}", "must be a list of names")
    return [x.strip() for x in v]


def _expand(at: _At, here: Path, pattern: str) -> list[tuple[str, str | None]]:
    """A glob's files (sorted), each with the graph after ':' if the pattern names one."""
    pat, _, graph = pattern.partition(":") if pattern.count(":") == 1 else (pattern, "", "")
    found = sorted(glob.glob(str(here / pat), recursive=True))
    if not found:
        raise at.error("[sweep] graphs", f"{pattern!r} matches no file (relative to {here})")
    return [(f, graph or None) for f in found]


def _shapes(at: _At, table: dict) -> tuple:
    out = []
    for name, dims in sorted(table.items()):
        if not isinstance(dims, dict) or not dims:
            raise at.error(f"[shapes.{name!r}]", "must be a table of dims to lists of values (T = [128, 256])")
        vals = []
        for dim, values in sorted(dims.items()):
            if not isinstance(values, list) or not values or not all(type(v) is int and v > 0 for v in values):
                raise at.error(f"[shapes.{name!r}] {dim}", "must be a list of positive integers")
            vals.append((dim, tuple(values)))
        out.append((name, tuple(vals)))
    return tuple(out)


def _budgets(at: _At, table: dict) -> tuple:
    out = []
    for name, v in sorted(table.items()):
        if not isinstance(v, dict):
            raise at.error(f"[exhaustive.{name!r}]", "must be a table ({ budget_s = 100 })")
        _only(at, v, {"budget_s"}, f"[exhaustive.{name!r}]")
        out.append((name, _positive(at, v, f"[exhaustive.{name!r}]", "budget_s", 100.0)))
    return tuple(out)
