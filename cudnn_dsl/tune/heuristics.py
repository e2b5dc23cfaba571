"""Autotuning — build every candidate plan, time each, keep the winner in the store.

Each plan is timed as the GPU sees it: its launches are captured in a CUDA graph and replayed, so
a short kernel is not ranked by the host time of launching it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import attrs
import torch

from cudnn_dsl.build.constraints import excluded_or, over_workspace_limit
from cudnn_dsl.run.buffers import restore, snapshot
from cudnn_dsl.run.compare import compare_outputs
from cudnn_dsl.run.compiled import CompiledGraph, capture
from cudnn_dsl.run.launch import Launch, candidates_pack, plan_runner
from cudnn_dsl.run.partition import ANCHOR, cut_label, declined_whole, short, tuned_why
from cudnn_dsl.run.parts import Parts
from cudnn_dsl.run.timing import gpu_time_us, replay_time_us
from cudnn_dsl.store.files import StoreProblem
from cudnn_dsl.store.plans import PartitionChoice
from cudnn_dsl.tune.exhaustive import MAX_CONFIGS, SearchResult, Tried, search
from cudnn_dsl.tune.plots import Panel, draw
from dsl.diagnostics import DslError
from dsl.ir import Graph, Instance, shape_label
from dsl.ops import OPS, Ctx
from dsl.types import itemsize


@attrs.define
class Candidate:
    index: int
    """the heuristics' rank (0 = their first choice)"""
    name: str
    workspace: int = 0
    mode: str = ""
    """"dynamic" for a plan built in cuDNN's dynamic-shape mode, when tune times both modes"""
    times_us: list[float] = attrs.Factory(list)
    error: str = ""

    @property
    def median_us(self) -> float:
        return statistics.median(self.times_us) if self.times_us else math.inf

    @property
    def label(self) -> str:
        return f"{self.name} (dynamic)" if self.mode else self.name


@attrs.define
class TuneResult:
    graph: str
    binding: dict
    candidates: list[Candidate]
    flops: int
    bytes: int
    build_s: dict
    winner: Candidate | None = None
    check: str = ""
    """the winner's outputs against the reference"""

    @property
    def ranked(self) -> list[Candidate]:
        return sorted((c for c in self.candidates if c.times_us), key=lambda c: c.median_us)


def work(graph: Graph, inst: Instance) -> tuple[int, int]:
    """(floating-point operations, the fewest bytes moved: every input read and output written once)."""
    flops = 0
    for index, n in enumerate(graph.nodes):
        ins = tuple(inst.type(i) if i else None for i in n.inputs)
        flops += OPS[n.op].count_flops(Ctx(n.op, ins, inst.attrs(index)), [inst.type(o) for o in n.outputs])
    moved = sum(
        inst.type(v.name).numel * itemsize(inst.type(v.name).dtype)
        for v in graph.values
        if v.kind in ("input", "output")
    )
    return flops, moved


def tune(cg: CompiledGraph, inst: Instance, progress: Callable[[str], None] | None = None) -> TuneResult:
    """Times every plan the heuristics offer (every mode); selects and stores the fastest, once its
    outputs match the reference. Plans over the options' workspace limit are skipped, with why.
    `progress` hears what is being done ("3/42 eng4_k24=43")."""
    planner = cg.planner
    o = cg.options
    # a dynamic graph under shape_mode auto: static plans and dynamic-shape ones, the faster kept
    modes = [False, True] if cg.graph.symbols and o.shape_mode == "auto" else [None]
    tensors = cg.allocate_inputs(dict(inst.binding))
    before = snapshot(cg.graph, tensors)  # the candidates' launches overwrite what outputs in place write
    outputs = cg.bind_outputs(inst, tensors)
    flops, moved = work(cg.graph, inst)
    result = TuneResult(cg.graph.name, dict(inst.binding), [], flops, moved, {})
    of: dict[int, object] = {}  # id(candidate) -> the Candidates it came from
    for dynamic in modes:
        cands = planner.candidates(inst, dynamic)
        result.build_s.update(cands.low.timings)
        pack = candidates_pack(cands, tensors, outputs)
        indices = cands.indices  # the plans the options' constraints leave
        for n, i in enumerate(indices):
            c = Candidate(i, cands.name(i), mode="dynamic" if dynamic else "")
            of[id(c)] = cands
            result.candidates.append(c)
            if progress:
                progress(f"{n + 1}/{len(indices)} {c.name}{' (dynamic)' if dynamic else ''}")
            try:
                t0 = time.perf_counter()
                c.workspace = cands.build(i)
                over = over_workspace_limit(c.workspace, o)
                if over:
                    c.error = over
                    continue
                ws = torch.empty(max(1, c.workspace), dtype=torch.uint8, device=cg.device)
                c.times_us = replay_time_us(
                    plan_runner(cands, i, pack, ws), planner.handle, cg.device, o.iterations, o.warmup
                )
                result.build_s["plans"] = result.build_s.get("plans", 0.0) + time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 - a plan that fails to build or run is skipped, with why
                c.error = excluded_or(e)
    ranked = result.ranked
    if not ranked:
        return result
    result.winner = ranked[0]
    exe = of[id(result.winner)].executable(result.winner.index)
    restore(tensors, before)
    Launch(exe).run(tensors, outputs)  # the winner must also be right, not only fast
    comps = compare_outputs(cg.graph, inst, outputs, cg.reference(before), o)
    result.check = "; ".join(str(c) for c in comps)
    if not all(c.ok for c in comps):
        result.winner = None  # nothing is stored; the caller reports the mismatch
        return result
    planner.adopt(exe, tuned=True, timing={"median_us": result.winner.median_us, "candidates": len(result.candidates)})
    return result


def exhaustive(
    cg: CompiledGraph,
    inst: Instance,
    *,
    cap: int = MAX_CONFIGS,
    budget_s: float | None = None,
    restart: bool = False,
    progress: Callable[[str], None] | None = None,
) -> SearchResult:
    """tune --exhaustive: times the heuristics' plans and every engine and knob combination after them (see
    cudnn_dsl.tune.exhaustive), going on from what earlier searches of this plan key tried unless `restart`; selects and
    stores the fastest, once its outputs match the reference."""
    planner, o = cg.planner, cg.options
    cands = planner.candidates(inst)
    tensors = cg.allocate_inputs(dict(inst.binding))
    outputs = cg.bind_outputs(inst, tensors)
    pack = candidates_pack(cands, tensors, outputs)
    key = planner.key(inst) if planner.use_store else None
    notes, earlier = [], []
    if key is None:
        notes.append("--no-cache: this search is not recorded, and the next one starts afresh")
    elif not restart:
        try:
            earlier = [Tried.from_json(d) for d in planner.store.get_search(key)]
        except StoreProblem as e:
            notes.append(f"{e}; searching afresh")

    def measure(index: int, t: Tried) -> None:
        t.workspace = cands.build(index)
        over = over_workspace_limit(t.workspace, o)
        if over:
            raise RuntimeError(over)
        ws = torch.empty(max(1, t.workspace), dtype=torch.uint8, device=cg.device)
        t.median_us = statistics.median(
            replay_time_us(plan_runner(cands, index, pack, ws), planner.handle, cg.device, o.iterations, o.warmup)
        )

    def save(tried: list[Tried]) -> None:
        if key is not None:
            try:
                done = [t.to_json() for t in tried if t.status in ("timed", "unsupported", "failed", "excluded")]
                planner.store.put_search(key, cg.graph.name, done)  # not one an interrupt cut short
            except StoreProblem as e:
                notes.append(f"search record not saved: {e}")

    excluded = set(o.exclude_engines or ())
    r = search(cands, earlier, excluded, cap=cap, budget_s=budget_s, measure=measure, progress=progress, save=save)
    r.notes += dict.fromkeys(notes)
    if not r.ranked:
        return r
    best = r.ranked[0]
    exe = cands.executable(cands.add(best.engine, best.knobs))  # built afresh: it may come from an earlier search
    Launch(exe).run(tensors, outputs)
    comps = compare_outputs(cg.graph, inst, outputs, cg.reference(tensors), o)
    r.check = "; ".join(str(c) for c in comps)
    if all(c.ok for c in comps):
        r.winner = best
        planner.adopt(exe, tuned=True, timing={"median_us": best.median_us or 0.0, "candidates": len(r.tried)})
    return r


# ---- partitions: the whole graph against its anchor op alone and the rest as one graph ----------------


@attrs.define
class Alternative:
    cuts: tuple[int, ...]
    """the node indices where a part starts (none: the whole graph)"""
    label: str
    parts: list[TuneResult] = attrs.Factory(list)
    """each cuDNN part's plans, tuned (the whole graph's are tune()'s own)"""
    times_us: list[float] = attrs.Factory(list)
    error: str = ""
    check: str = ""

    @property
    def median_us(self) -> float:
        return statistics.median(self.times_us) if self.times_us else math.inf


@attrs.define
class PartitionTune:
    graph: str
    binding: dict
    alternatives: list[Alternative]
    kept: Alternative | None = None
    why: str = ""
    """'tuned: split after matmul (line 5), 18.1 µs vs 24.3 µs whole'"""
    note: str = ""


def tune_partitions(
    cg: CompiledGraph, inst: Instance, whole: TuneResult | None, declined: str = "", progress=None
) -> PartitionTune:
    """Times each partition of one shape (the whole graph as `whole` tuned it, unless cuDNN `declined` it; the
    fewest parts then; the anchor op alone and the rest), each part's plans tuned first, each partition bound
    and replayed from a CUDA graph like a plan; keeps the fastest whose outputs match the reference, and stores
    the choice beside the whole graph's plan."""
    g, o = cg.graph, cg.options
    tensors = cg.allocate_inputs(dict(inst.binding))
    before = snapshot(g, tensors)
    want = cg.reference(before)
    result = PartitionTune(g.name, dict(inst.binding), [])
    seen = set()
    if declined:
        result.alternatives.append(Alternative((), "whole", error=declined_whole(declined)))
    ways = ([None] if declined else [()]) + ([ANCHOR] if len(g.nodes) > 1 else [])  # fewest parts, or whole
    for way in ways:
        try:  # the cut points of each way (finding them builds each part once)
            cuts = way if way == () else cg.use_partition(inst, None, declined=declined, first=way).partition.cuts
        except DslError as e:
            label = "anchor op alone" if way else "fewest parts"
            result.alternatives.append(Alternative((), label, error=short(e.diagnostics[0].message)))
            continue
        if cuts in seen:
            continue
        seen.add(cuts)
        a = Alternative(cuts, cut_label(g, cuts) if cuts or not declined else "its op left to torch")
        result.alternatives.append(a)
        if progress:
            progress(f"partition {a.label}")
        if not cuts and not declined and (whole is None or whole.winner is None):
            a.error = "its fastest plan's outputs do not match the reference"
            continue
        try:
            parts = cg.use_partition(inst, cuts if cuts or not declined else None, declined=declined)
            distinct = {id(c): c for c in parts.compiled if c is not None} if isinstance(parts, Parts) else {}
            for pcg in distinct.values():  # equal parts share one compiled graph: tuned once
                a.parts.append(tune(pcg, pcg.graph.instances[0], progress))
            restore(tensors, before)
            bound = cg.bind(tensors)
            bound.run()
            comps = compare_outputs(g, inst, bound.outputs, want, o)
            a.check = "; ".join(str(c) for c in comps)
            if not all(c.ok for c in comps):
                a.error = f"outputs do not match the reference: {a.check}"
                continue
            a.times_us = bound_time_us(bound, cg.device, o.iterations, o.warmup)
        except DslError as e:
            a.error = short(e.diagnostics[0].message)
        except Exception as e:  # noqa: BLE001 - a partition that fails to build or run is skipped, with why
            a.error = excluded_or(e)
    timed = sorted((a for a in result.alternatives if a.times_us), key=lambda a: a.median_us)
    if not timed:  # none ran right: the shape runs as it would have, not as the last partition tried
        cg.forget_partition(inst)
        return result
    result.kept = timed[0]
    choice = PartitionChoice(result.kept.cuts, {PartitionChoice.name(a.cuts): a.median_us for a in timed})
    if len(result.alternatives) > 1:  # a choice was made (another ran wrong or failed, maybe): it is stored
        result.why = cg.why[inst.binding] = tuned_why(g, choice)
    cg.use_partition(inst, choice.cuts if choice.cuts or not declined else None, result.why, declined)
    if result.why and cg.planner.use_store:
        try:
            cg.planner.store.put_partition(cg.planner.key(inst), g.name, choice)
        except StoreProblem as e:
            result.note = f"partition not stored: {e}"
    return result


def bound_time_us(bound, device, iterations: int, warmup: int) -> list[float]:
    """GPU time per run of a bound graph, whole or in parts, as plans are timed: ten runs captured in one
    CUDA graph, one sample per replay (launched directly where a part cannot be captured)."""
    try:
        replay = capture(bound, device, repeat=10)
    except Exception:  # noqa: BLE001 - capture refused: time the launches themselves
        return gpu_time_us(bound.run, iterations, warmup)
    return [t / 10 for t in gpu_time_us(replay.replay, iterations, warmup=warmup, inner=1)]


def partition_report(result: PartitionTune) -> str:
    label = result.graph + (f" [{shape_label(result.binding.items())}]" if result.binding else "")
    lines = [f"graph {label}: {len(result.alternatives)} partitions"]
    for a in result.alternatives:
        for r in a.parts:
            lines += ["  " + line for line in report(r).splitlines()]
    lines.append(f"  {'partition':52} {'median µs':>10}")
    for a in result.alternatives:
        kept = "  kept" if a is result.kept else ""
        lines.append(
            f"  {a.label[:52]:52} {a.median_us:10.1f}{kept}" if a.times_us else f"  {a.label[:52]:52} {a.error}"
        )
    if result.kept is not None:
        lines.append(f"  {result.why}")
    if result.note:
        lines.append(f"  {result.note}")
    return "\n".join(lines)


def report(result: TuneResult) -> str:
    lines = []
    ranked = result.ranked
    label = result.graph + (f" [{shape_label(result.binding.items())}]" if result.binding else "")
    lines.append(f"graph {label}: {len(result.candidates)} plans, {len(ranked)} timed")
    lines.append(f"  {'#':>3} {'plan':44} {'median µs':>10} {'TFLOP/s':>8} {'GB/s':>8} {'workspace':>10} {'rank':>5}")
    for pos, c in enumerate(ranked, 1):
        t = c.median_us * 1e-6
        lines.append(
            f"  {pos:>3} {c.label[:44]:44} {c.median_us:10.1f} {result.flops / t / 1e12:8.1f} "
            f"{result.bytes / t / 1e9:8.1f} {c.workspace:10d} {c.index:5d}"
        )
    for c in result.candidates:
        if not c.times_us:
            lines.append(f"  skipped {c.label}: {c.error}")
    if result.check:
        lines.append(f"  fastest plan against the reference: {result.check}")
    if ranked:
        best, worst = ranked[0], ranked[-1]
        first = next((c for c in result.candidates if c.index == 0), None)  # static, when both modes were timed
        lines.append(
            f"  winner {best.label}: {best.median_us:.1f} µs; worst {worst.median_us:.1f} µs "
            f"({worst.median_us / best.median_us:.2f}x spread)"
        )
        if result.winner is None:
            lines.append("  nothing stored: the fastest plan's outputs do not match the reference")
        if first is not None and first.times_us:
            lines.append(
                f"  heuristics' first choice {first.name}: {first.median_us:.1f} µs "
                f"({first.median_us / best.median_us:.2f}x the winner)"
            )
    return "\n".join(lines)


def plot(results: list[TuneResult], path: str) -> None:
    """Each graph's plans by median GPU time, with the spread of their samples."""
    panels = [
        Panel(
            f"{r.graph} {r.binding or ''}: plans by median GPU time",
            [c.name.split("_")[0] + f"#{c.index}" for c in r.ranked],
            [c.median_us for c in r.ranked],
            [c.median_us - min(c.times_us) for c in r.ranked],
            [max(c.times_us) - c.median_us for c in r.ranked],
            "µs",
            log=bool(r.ranked) and r.ranked[-1].median_us > 20 * r.ranked[0].median_us,
            tick_size=6,
            tick_rotation=90,
        )
        for r in results
    ]
    draw(panels, path, side_by_side=False, size=(10, 3.2))
