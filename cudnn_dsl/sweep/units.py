"""Planning a sweep on the CPU: the spec's graphs × shapes × GPU types or (target, cuDNN) pairs become work units,
deduplicated by content, without the keys the store already holds, with the graphs cuDNN declines given their
partition instead of GPU time, each with a cost estimate, longest first.

A unit is one graph × one GPU type or deviceless target and cuDNN version × a group of shapes, so that one worker
runs the group and its dynamic-shape kernel cache serves every shape. The unit carries the graph's canonical
source and the descriptor, so a worker needs no shared filesystem; its id is the sha256 of its content.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import attrs

from cudnn_dsl.sweep.records import canonical, sha256
from cudnn_dsl.sweep.spec import Spec, SpecError
from dsl.ir import Graph, Instance, NotFound

SUPPORT_S = 2.2
"""seconds of one deviceless plan: the median of the examples on two CPU cores (docs/fleet.md)"""
SHOWN = 20
"""skipped shapes listed per reason in a summary"""
CANDIDATE_S = 0.5
"""seconds to build and time one candidate plan on a GPU: the examples' total build time over their candidate
count on the H200 (docs/results/tune-h200.json, build_s.plans)"""


@attrs.frozen
class Unit:
    mode: str
    """support, tune or exhaustive"""
    file: str
    """where the source came from (for messages; not part of the id)"""
    source: str
    """the file's canonical text"""
    graph: str
    bindings: tuple[tuple[tuple[str, int], ...], ...]
    """the shapes of the group, each a sorted tuple of (dim, value)"""
    target: str
    """support: the descriptor's device name; tune and exhaustive: the GPU type"""
    descriptor: str = ""
    """support: the device descriptor's JSON text"""
    cudnn: str = ""
    """support: the cuDNN version to plan with ('' : the one installed)"""
    budget_s: float = 0.0
    """exhaustive: seconds of search per shape"""
    estimate_s: float = attrs.field(default=0.0, eq=False)
    """what it should take (not part of the id)"""

    def content(self) -> dict:
        d = attrs.asdict(self, filter=lambda a, _: a.name not in ("file", "estimate_s"))
        d["bindings"] = [dict(b) for b in self.bindings]
        return d

    @property
    def id(self) -> str:
        return sha256(canonical(self.content()))

    @property
    def lane(self) -> tuple[str, str]:
        """Which workers can run it: ('gpu', GPU type) or ('cpu', cuDNN version)."""
        return ("cpu", self.cudnn) if self.mode == "support" else ("gpu", self.target)

    @property
    def label(self) -> str:
        shapes = ", ".join(",".join(f"{k}={v}" for k, v in b) or "-" for b in self.bindings)
        where = f"{self.target}" + (f" cuDNN {self.cudnn}" if self.cudnn else "")
        return f"{self.file}:{self.graph} [{shapes}] on {where}"

    def to_json(self) -> dict:
        return {**self.content(), "file": self.file, "estimate_s": self.estimate_s}

    @classmethod
    def from_json(cls, d: dict) -> Unit:
        d = dict(d)
        d["bindings"] = tuple(tuple(sorted((str(k), int(v)) for k, v in b.items())) for b in d["bindings"])
        return cls(**d)


@attrs.frozen
class Skipped:
    label: str
    why: str


@attrs.frozen
class Work:
    spec: Spec
    units: tuple[Unit, ...]
    """longest first"""
    skipped: tuple[Skipped, ...]
    """shapes not run: the same content as another, already in the store, or declined by cuDNN"""
    round: str = ""
    """'' for a sweep that resumes its own checkpoint when run again; a retune's token, which gives the same units
    an id, and so a staging directory, of their own: they run again instead of finding their old records"""

    @property
    def id(self) -> str:
        """The sweep's id: its staging directory's name, and what --resume takes."""
        ids = sorted(u.id for u in self.units)
        return sha256(canonical([self.round, ids] if self.round else ids))[:16]

    @property
    def shapes(self) -> int:
        return sum(len(u.bindings) for u in self.units)

    def summary(self) -> str:
        total = sum(u.estimate_s for u in self.units)
        lines = [
            f"sweep {self.spec.name} ({self.id}): {len(self.units)} units, {self.shapes} shapes, "
            f"mode {self.spec.mode}, estimated {_duration(total)} of worker time"
        ]
        lines += [f"  {_duration(u.estimate_s):>8}  {u.label}" for u in self.units]
        by_why: dict[str, list[str]] = {}
        for s in self.skipped:
            by_why.setdefault(s.why, []).append(s.label)
        if by_why:
            lines.append(f"skipped {len(self.skipped)} shapes:")
        for why, labels in by_why.items():
            lines += [f"  {label}: {why}" for label in labels[:SHOWN]]
            if len(labels) > SHOWN:
                lines.append(f"  ... and {len(labels) - SHOWN} more: {why} (--json lists them all)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "spec": self.spec.path,
            "mode": self.spec.mode,
            "units": [u.to_json() for u in self.units],
            "skipped": [attrs.asdict(s) for s in self.skipped],
        }


def _duration(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def plan(spec: Spec, stored: Callable[[str, dict], bool] | None = None, progress=None) -> Work:
    """The spec's work. `stored(pool, key)` says whether the store already has an answer ('support') or a plan
    ('plans') for a key (PlanKey fields; cudnn_backend may be None: any version); None: nothing is skipped."""
    from cudnn_dsl.target.library import DEVICES_DIR, Target
    from dsl.pipeline import load
    from dsl.syntax.printer import fmt_module

    graphs = []  # (file, canonical source, graph)
    for file, only in dict.fromkeys(spec.files):
        result = load(file)
        if not result.ok:
            first = next(d for d in result.diagnostics if d.severity == "error")
            raise SpecError(f"{spec.path}: {file} does not check: {first.loc}: {first.message}")
        source = fmt_module(load(file, stop="ast").module)
        chosen = [g for g in result.program.graphs if only in (None, g.name)]
        if not chosen:
            raise SpecError(f"{spec.path}: {file} has no graph {only!r}")
        graphs += [(file, source, g) for g in chosen]

    if spec.mode == "support":
        targets = [_target(spec, t) for t in spec.plan_targets] or [
            Target.from_file(p) for p in sorted(DEVICES_DIR.glob("*.json"))
        ]
        lanes = [(t.name, t.descriptor, v, t) for t in targets for v in spec.cudnn]
    else:
        bundled = {Target.from_file(p).name: Target.from_file(p) for p in sorted(DEVICES_DIR.glob("*.json"))}
        lanes = [(gpu, "", "", bundled.get(gpu)) for gpu, _ in spec.tune_targets]

    _check_shape_names(spec, graphs)
    units, skipped, seen = [], [], {}
    for file, source, g in graphs:
        instances = _instances(spec, file, g)
        for name, descriptor, cudnn, target in lanes:
            group = []
            for inst in instances:
                shape = f" {inst.label}" if inst.binding else ""
                label = f"{spec.relative(file)}:{g.name}{shape} on {name}" + (f" cuDNN {cudnn}" if cudnn else "")
                why, estimate = _why_skipped(spec, file, g, inst, name, cudnn, target, label, seen, stored, progress)
                if why:
                    skipped.append(Skipped(label, why))
                else:
                    group.append((inst, estimate))
            if group:
                units.append(
                    Unit(
                        spec.mode,
                        spec.relative(file),
                        source,
                        g.name,
                        tuple(tuple(sorted(inst.binding)) for inst, _ in group),
                        name,
                        descriptor,
                        cudnn,
                        spec.budget_of(file, g.name) if spec.mode == "exhaustive" else 0.0,
                        sum(e for _, e in group),
                    )
                )
    units.sort(key=lambda u: (-u.estimate_s, u.id))  # longest first: a long unit started last would tail the sweep
    return Work(spec, tuple(units), tuple(skipped))


def _target(spec: Spec, name: str):
    from cudnn_dsl.target.library import DescriptorFileError, Target, UnknownTarget

    try:
        return Target.from_file(name) if "/" in name else Target.named(name)
    except (UnknownTarget, DescriptorFileError) as e:
        raise SpecError(f"{spec.path}: [plan_targets] targets: {e}") from None


def _check_shape_names(spec: Spec, graphs) -> None:
    """A [shapes] table must name a graph of the sweep: a misspelt one would silently sweep every shape."""
    names = {n for file, _, g in graphs for n in (f"{spec.relative(file)}:{g.name}", g.name)}
    for name, _ in spec.shapes:
        if name not in names:
            raise SpecError(
                f"{spec.path}: [shapes.{name!r}]: no graph of the sweep is called that (name one as 'file.cdg:graph' "
                f"relative to the spec, or by its graph name: {', '.join(sorted(n for n in names if ':' not in n))})"
            )


def _instances(spec: Spec, file: str, g: Graph) -> list[Instance]:
    wanted = spec.shapes_of(file, g.name)
    dims = {s.name for s in g.symbols}
    bad = sorted(set(wanted) - dims)
    where = f"[shapes.'{spec.relative(file)}:{g.name}']"
    if bad:
        raise SpecError(
            f"{spec.path}: {where}: graph '{g.name}' has no symbolic dim {bad[0]} (its dims: "
            f"{', '.join(sorted(dims)) or 'none'})"
        )
    if not wanted:
        return list(g.instances)
    names = [k for k, _ in g.instances[0].binding]
    per = [sorted(wanted.get(n) or {dict(i.binding)[n] for i in g.instances}) for n in names]
    try:
        return [g.instance(dict(zip(names, combo))) for combo in itertools.product(*per)]
    except NotFound as e:
        raise SpecError(f"{spec.path}: {where}: {e}") from None


def _why_skipped(spec, file, g, inst, name, cudnn, target, label, seen, stored, progress) -> tuple[str, float]:
    """Why this shape is not run ('' : it is), and what it should cost."""
    from cudnn_dsl.store.keys import graph_digest

    digest = graph_digest(g, inst)
    options = json.dumps(attrs.asdict(g.options), sort_keys=True, default=str)
    same = (digest, options, name, cudnn)
    if same in seen:
        return f"the same graph, shape and options as {seen[same]}", 0.0
    seen[same] = label
    key = {"digest": digest, "gpu": name, "constraints": g.options.constraints, "cudnn": cudnn}
    pool = "support" if spec.mode == "support" else "plans"
    if stored is not None and stored(pool, key):
        return "already in the store", 0.0
    if spec.mode == "support":
        return "", SUPPORT_S
    if spec.mode == "exhaustive":
        return "", spec.budget_of(file, g.name)
    if target is None:  # no descriptor of this GPU type to ask cuDNN about: booked at a guess
        return "", 10 * CANDIDATE_S
    return _prefilter(g, inst, target, label, progress)


def _prefilter(g, inst, target, label, progress) -> tuple[str, float]:
    """Asks the GPU type's cuDNN, without a device, whether it fuses the graph and how many candidates it has."""
    from cudnn_dsl.run.partition import plan_for_target
    from dsl.diagnostics import DslError

    if progress:
        progress(f"asking cuDNN about {label}")
    try:
        low, partition = plan_for_target(g, inst, g.options, target)
    except DslError as e:
        return f"cuDNN plans no graph for it: {e.diagnostics[0].message}", 0.0
    if partition is not None:
        return f"cuDNN declines it whole ({partition.how}); tune it on a GPU with `cudnn-dsl tune`", 0.0
    return "", max(low.plan_count, 1) * CANDIDATE_S


def load_work(path: Path) -> dict:
    """A staging directory's work.json, as written by sweep.run (ValueError when it is not one)."""
    from cudnn_dsl.store.files import loads, read_regular

    data = read_regular(path, 64 << 20, "sweep work file")
    if data is None:
        raise ValueError(f"{path} does not exist")
    d = loads(data)
    if not isinstance(d, dict) or not isinstance(d.get("units"), list):
        raise ValueError(f"{path} is not a sweep's work file")
    return d
