"""`tune --exhaustive` — every engine and knob combination cuDNN enumerates for a graph.

The space is every engine of get_engine_count with every combination of its knobs' values (each knob's least
value to its greatest, by its stride, as get_knobs_for_engine gives them). It is searched in a fixed order:
engines in turn, and within one engine the combinations nearest the knobs' least values first (by the sum of
the steps away from them), so that a search cut short by its cap or budget has seen every engine. What was
tried is recorded in the plan store under the plan key, and a later search of the same key goes on from there.
The heuristics' own plans (tune's normal list) are timed too, to say whether the search beat them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import attrs

from cudnn_dsl.build.constraints import excluded_or
from cudnn_dsl.build.lower import clean
from cudnn_dsl.build.pipeline import compile_shape
from cudnn_dsl.build.planner import Candidates
from cudnn_dsl.build.space import KnobRange, engine_space
from cudnn_dsl.target.library import Target
from dsl.ir import Graph, Instance, shape_label
from dsl.options import Options

MAX_CONFIGS = 1000
"""configurations one search tries unless told otherwise (--max-configs): the rest wait for a later one"""


@attrs.define
class Tried:
    """One configuration and what became of it: timed, unsupported (cuDNN refused to create it), failed (created
    but did not build or run), excluded (by the plan constraints)."""

    engine: int
    knobs: dict[str, int]
    source: str = "search"
    """heuristics (tune's normal list) or search"""
    status: str = ""
    name: str = ""
    median_us: float | None = None
    workspace: int = 0
    error: str = ""
    earlier: bool = False
    """from the record of an earlier search, not tried again"""

    @property
    def key(self) -> tuple:
        return self.engine, tuple(sorted(self.knobs.items()))

    def to_json(self) -> dict:
        d = {"engine": self.engine, "knobs": self.knobs, "source": self.source, "status": self.status}
        d.update({"name": self.name, "workspace": self.workspace, "error": self.error[:500]})
        return d | ({"median_us": self.median_us} if self.median_us is not None else {})

    @classmethod
    def from_json(cls, d: dict) -> Tried:
        fields = ("name", "median_us", "workspace", "error")
        return cls(d["engine"], dict(d["knobs"]), d["source"], d["status"], **{k: d[k] for k in fields if k in d})


@attrs.define
class SearchResult:
    graph: str
    binding: dict
    space: dict[int, list[KnobRange] | str]
    size: int
    """configurations in the space (engines the constraints exclude left out)"""
    tried: list[Tried] = attrs.Factory(list)
    """this search's, then the earlier searches' (earlier=True)"""
    cap: int = MAX_CONFIGS
    stopped: str = ""
    """why the search stopped before the end of the space: the cap, the budget, an interrupt"""
    left: int = 0
    winner: Tried | None = None
    check: str = ""
    timed: bool = True
    """False without a GPU: configurations are created (cuDNN's support) but neither built nor timed"""
    notes: list[str] = attrs.Factory(list)

    def of(self, source: str) -> list[Tried]:
        return sorted(
            (t for t in self.tried if t.source == source and t.status == "timed"), key=lambda t: t.median_us or 0
        )

    @property
    def ranked(self) -> list[Tried]:
        return sorted((t for t in self.tried if t.status == "timed"), key=lambda t: t.median_us or 0)


# ---- the space and its order -----------------------------------------------------------------


def space_size(space: dict, excluded: set[int]) -> int:
    return sum(
        math.prod(len(k.values) for k in knobs)
        for e, knobs in space.items()
        if isinstance(knobs, list) and e not in excluded
    )


def configurations(space: dict, excluded: set[int]) -> Iterator[tuple[int, dict[str, int]]]:
    """Every (engine, knobs) of the space: engines in turn, each one's nearest its knobs' least values first."""
    gens = [_engine_configs(e, knobs) for e, knobs in sorted(space.items()) if isinstance(knobs, list)]
    gens = [g for g, e in zip(gens, sorted(e for e, k in space.items() if isinstance(k, list))) if e not in excluded]
    while gens:
        for g in list(gens):
            try:
                yield next(g)
            except StopIteration:
                gens.remove(g)


def _engine_configs(engine: int, knobs: list[KnobRange]) -> Iterator[tuple[int, dict[str, int]]]:
    sizes = [len(k.values) for k in knobs]
    for total in range(sum(s - 1 for s in sizes) + 1):
        for ranks in _steps(total, sizes):
            yield engine, {k.name: k.values[r] for k, r in zip(knobs, ranks)}


def _steps(total: int, sizes: list[int]) -> Iterator[tuple[int, ...]]:
    """Every way of taking `total` steps over knobs of these sizes (each at most size - 1 steps)."""
    if not sizes:
        if total == 0:
            yield ()
        return
    room = sum(s - 1 for s in sizes[1:])
    for r in range(max(0, total - room), min(sizes[0] - 1, total) + 1):
        for tail in _steps(total - r, sizes[1:]):
            yield (r, *tail)


# ---- the search -------------------------------------------------------------------------------


def search(
    cands: Candidates,
    earlier: list[Tried],
    excluded: set[int],
    *,
    cap: int = MAX_CONFIGS,
    budget_s: float | None = None,
    measure: Callable[[int, Tried], None] | None = None,
    progress: Callable[[str], None] | None = None,
    save: Callable[[list[Tried]], None] | None = None,
) -> SearchResult:
    """Tries the heuristics' plans and then the space, skipping what `earlier` holds, up to `cap` configurations
    or `budget_s` seconds. `measure(index, tried)` builds and times one plan (setting status, median, workspace;
    raising when it fails); without it (no GPU) a configuration cuDNN creates counts as supported. `save` hears
    every configuration tried so far, now and then and at the end (an interrupt too)."""
    low = cands.low
    space = engine_space(low)
    result = SearchResult(
        low.graph.name, dict(low.instance.binding), space, space_size(space, excluded), cap=cap, timed=bool(measure)
    )
    seen = {t.key for t in earlier}
    mine: list[Tried] = []
    t0 = time.perf_counter()

    def todo() -> Iterator[tuple[Tried, int | None]]:
        for i in cands.indices:  # the heuristics' plans, already in the list
            engine, knobs = cands.engine_and_knobs(i)
            if engine is not None and (engine, tuple(sorted(knobs.items()))) not in seen:
                yield Tried(engine, knobs, "heuristics", name=cands.name(i)), i
        for engine, knobs in configurations(space, excluded):
            yield Tried(engine, knobs), None

    try:
        for t, index in todo():
            if t.key in seen:
                continue
            if len(mine) >= cap:
                result.stopped = f"tried the cap of {cap} configurations (--max-configs)"
                break
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                result.stopped = f"the budget of {budget_s:g} s ran out (--budget)"
                break
            seen.add(t.key)
            mine.append(t)
            if progress:
                progress(f"{len(mine)}/{min(cap, result.size + len(cands.indices))} eng{t.engine} {_short(t.knobs)}")
            _try(cands, t, index, measure)
            if save and len(mine) % 50 == 0:
                save(mine + earlier)
    except KeyboardInterrupt:
        result.stopped = "interrupted"
    finally:
        if save:
            save(mine + earlier)
    result.tried = mine + [attrs.evolve(t, earlier=True) for t in earlier]
    result.left = max(0, result.size - sum(1 for t in result.tried if t.source == "search"))
    return result


def search_deviceless(
    graph: Graph,
    inst: Instance,
    options: Options,
    target: Target,
    cap: int = MAX_CONFIGS,
    budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> SearchResult:
    """The search without a GPU: each configuration is created for the target (cuDNN says whether it supports it),
    none is built or timed, and nothing is recorded."""
    low = compile_shape(graph, inst, options, target, stop="check_support", tuning=True)
    excluded = set(options.exclude_engines or ())
    return search(Candidates(None, low, options), [], excluded, cap=cap, budget_s=budget_s, progress=progress)


def _try(cands: Candidates, t: Tried, index: int | None, measure) -> None:
    try:
        index = cands.add(t.engine, t.knobs) if index is None else index
    except Exception as e:  # noqa: BLE001 - cuDNN refuses to finalize this engine configuration
        t.status, t.error = "unsupported", clean(e, 200)
        return
    t.name = t.name or cands.name(index)
    if measure is None:
        t.status = "supported"
        return
    try:
        measure(index, t)
        t.status = "timed"
    except Exception as e:  # noqa: BLE001 - a plan that fails to build or run is counted, with why
        t.error = excluded_or(e)
        t.status = "excluded" if t.error.startswith("excluded") else "failed"


def _short(knobs: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in knobs.items())


# ---- the report -------------------------------------------------------------------------------


def report(r: SearchResult, top_k: int = 10) -> str:
    label = r.graph + (f" [{shape_label(r.binding.items())}]" if r.binding else "")
    engines = [e for e, k in r.space.items() if isinstance(k, list)]
    mine = [t for t in r.tried if not t.earlier]
    count = {
        s: sum(1 for t in mine if t.status == s) for s in ("timed", "supported", "unsupported", "failed", "excluded")
    }
    lines = [
        f"graph {label}: exhaustive search over {len(r.space)} engines ({len(engines)} with knobs for this graph), "
        f"{r.size:,} engine and knob configurations"
    ]
    created = count["timed"] + count["failed"] + count["excluded"] + count["supported"]
    done = f"built and timed {count['timed']}, failed {count['failed']}" if r.timed else "not built (no GPU)"
    lines.append(
        f"  this search: tried {len(mine)}; cuDNN supported {created}, refused {count['unsupported']}; {done}"
        + (f"; excluded by the constraints {count['excluded']}" if count["excluded"] else "")
    )
    earlier = len(r.tried) - len(mine)
    if earlier:
        lines.append(f"  earlier searches of this graph on this GPU: {earlier} configurations (not tried again)")
    per_engine = {}
    for t in mine:
        n, ok = per_engine.get(t.engine, (0, 0))
        per_engine[t.engine] = (n + 1, ok + (t.status != "unsupported"))
    lines.append(
        "  by engine (supported/tried): " + ", ".join(f"eng{e} {ok}/{n}" for e, (n, ok) in sorted(per_engine.items()))
    )
    again = "run it again to go on" if r.timed else "a larger --max-configs sees more"
    if r.stopped:
        lines.append(f"  stopped: {r.stopped}; {r.left:,} configurations left: {again}")
    elif r.left:
        lines.append(f"  {r.left:,} configurations left: {again}")
    else:
        lines.append("  the whole space has been tried")
    ranked = r.ranked[:top_k]
    if ranked:
        lines.append(f"  {'#':>3} {'plan':44} {'median µs':>10} {'workspace':>10} from")
        for pos, t in enumerate(ranked, 1):
            src = t.source + (" (earlier)" if t.earlier else "")
            lines.append(f"  {pos:>3} {t.name[:44]:44} {t.median_us:10.1f} {t.workspace:10d} {src}")
    heur, found = r.of("heuristics"), r.of("search")
    if heur and found:
        h, s = heur[0], found[0]
        verdict = (
            f"the search beat the heuristics' list by {h.median_us / s.median_us:.2f}x"
            if s.median_us < h.median_us
            else "the heuristics' list already held the fastest plan"
        )
        lines.append(f"  heuristics' best {h.name}: {h.median_us:.1f} µs; search's best {s.name}: {s.median_us:.1f} µs")
        lines.append(f"  {verdict}")
    lines += [f"  note: {n}" for n in r.notes]
    if r.check:
        lines.append(f"  fastest plan against the reference: {r.check}")
    if r.timed and ranked and r.winner is None:
        lines.append("  nothing stored: the fastest plan's outputs do not match the reference")
    return "\n".join(lines)
