"""Running a sweep's work: the staging directory, resuming, progress, the report, and the merge into the store.

The staging directory (`<cache>/sweeps/<sweep id>/`, or one the caller names) holds the work (work.json) and every
record as it arrives. It is the sweep's checkpoint: a driver killed at any point is resumed (`--resume ID`) by
running only the shapes that have no record there; a record is named by its content, so a shape recorded twice
merges once.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import attrs

from cudnn_dsl.store.files import StoreProblem, atomic_write, is_temp
from cudnn_dsl.store.keys import cache_dir
from cudnn_dsl.sweep import records as rec
from cudnn_dsl.sweep.merge import Merged, merge
from cudnn_dsl.sweep.records import Record
from cudnn_dsl.sweep.units import Unit, Work, load_work

UNFINISHED = ("timeout", "error", "unschedulable")
"""outcomes of shapes the sweep did not complete: its exit status is then 1"""


@attrs.frozen
class Result:
    id: str
    staging: Path
    counts: dict[str, int]
    """records of this sweep by outcome"""
    unfinished: list[str]
    """a line per shape that timed out, failed or could not be scheduled, with why"""
    merged: Merged | None
    seconds: float

    @property
    def complete(self) -> bool:
        return not self.unfinished

    def to_json(self) -> dict:
        return {
            "sweep": self.id,
            "staging": str(self.staging),
            "outcomes": self.counts,
            "unfinished": self.unfinished,
            "complete": self.complete,
            "manifest": f"sha256:{self.merged.digest}" if self.merged else None,
            "damaged": [attrs.asdict(d) for d in self.merged.damaged] if self.merged else [],
            "seconds": round(self.seconds, 1),
        }


def staging_of(sweep_id: str) -> Path:
    return cache_dir() / "sweeps" / sweep_id


def run(work: Work, executor, *, staging: Path | None = None, store: str | None = None, progress=None) -> Result:
    """Runs the work's units not yet recorded in staging, then merges staging into `store` (the spec's unless given;
    '' : none)."""
    staging = Path(staging or staging_of(work.id))
    path = staging / "work.json"
    if path.exists():
        try:
            other = load_work(path).get("id")
        except (ValueError, StoreProblem) as e:
            raise NotResumable(f"staging directory {staging}: {e}") from None
        if other != work.id:  # its records are another sweep's: counting them done would run nothing
            raise NotResumable(f"staging directory {staging} holds sweep {str(other)!r:.60}, not {work.id}")
    else:
        spec = work.spec
        _write_work(path, {**work.to_json(), "store": spec.store, "timeout_s": spec.timeout_s, "retries": spec.retries})
    store = work.spec.store if store is None else store
    return _execute(
        work.id, list(work.units), staging, store, executor, work.spec.timeout_s, work.spec.retries, progress
    )


class NotResumable(ValueError):
    """A --resume ID that names no sweep's staging directory, or one whose work file is not a sweep's."""


_SWEEP_ID = re.compile(r"[0-9a-f]{16}")
"""Work.id's form: what names a staging directory, so no other text may become a path"""


def resume(sweep_id: str, executor, *, staging: Path | None = None, store: str | None = None, progress=None) -> Result:
    """Runs what a sweep's staging directory has no record of yet, then merges into `store` (the sweep's unless
    given; '' : none)."""
    if not _SWEEP_ID.fullmatch(sweep_id):
        raise NotResumable(f"{sweep_id!r:.60} is not a sweep id (16 hex digits, as `sweep` printed it)")
    staging = Path(staging or staging_of(sweep_id))
    try:
        d = load_work(staging / "work.json")
        units = [Unit.from_json(u) for u in d["units"]]
    except (ValueError, TypeError, KeyError, StoreProblem) as e:
        raise NotResumable(f"no sweep {sweep_id} to resume: {e}") from None
    if d.get("id") != sweep_id:
        raise NotResumable(f"{staging} holds sweep {str(d.get('id'))!r:.60}, not {sweep_id}")
    return _execute(
        sweep_id,
        units,
        staging,
        d.get("store", "") if store is None else store,
        executor,
        float(d.get("timeout_s", 1800)),
        int(d.get("retries", 3)),
        progress,
    )


def _write_work(path: Path, d: dict) -> None:
    try:
        atomic_write(path, json.dumps(d, indent=1), follow_symlinks=False)
    except OSError as e:
        raise StoreProblem(f"cannot write the sweep's staging directory {path.parent}: {e.strerror or e}") from None


def _clear_unfinished_writes(staging: Path) -> None:
    """Removes what a killed driver left mid-write in its staging directory (the driver is its only writer)."""
    for p in (staging / "measurements").glob("*/.*.tmp"):
        if is_temp(p.name) and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)


def _execute(sweep_id, units, staging, store, executor, timeout_s, retries, progress) -> Result:
    t0 = time.monotonic()
    _clear_unfinished_writes(staging)
    mine = {u.id for u in units}
    done: dict[str, set] = {}
    for r in rec.read_all(staging)[0]:
        if r.unit in mine:
            done.setdefault(r.unit, set()).add(tuple(sorted(r.binding.items())))
    todo = [u for u in units if any(b not in done.get(u.id, ()) for b in u.bindings)]
    if progress is not None:
        progress.total = sum(len(u.bindings) for u in units)
        progress.skip(sum(len(done.get(u.id, ())) for u in units))
        progress.label = f"sweep {sweep_id}"

    def on_record(r: Record) -> None:
        rec.write(staging, r)
        if progress is not None:
            progress.skip()
            progress(f"{r.graph} {','.join(f'{k}={v}' for k, v in sorted(r.binding.items()))}: {r.outcome}")

    if todo:
        staging.mkdir(parents=True, exist_ok=True)
        executor.run(todo, sweep_id, on_record, timeout_s=timeout_s, retries=retries, done=done)
    latest: dict[tuple, Record] = {}
    for r in rec.read_all(staging)[0]:
        if r.unit in mine:
            k = (r.unit, json.dumps(r.binding, sort_keys=True))
            if k not in latest or (r.outcome not in UNFINISHED, r.provenance.get("time", 0)) > (
                latest[k].outcome not in UNFINISHED,
                latest[k].provenance.get("time", 0),
            ):
                latest[k] = r  # a shape that finished on a later attempt counts as finished
    counts = dict(sorted(Counter(r.outcome for r in latest.values()).items()))
    unfinished = sorted(
        f"{r.graph} {r.binding} on {r.key.gpu}: {r.outcome}: {r.result.get('error', '')}"
        for r in latest.values()
        if r.outcome in UNFINISHED
    )
    expected = sum(len(u.bindings) for u in units)
    if len(latest) < expected:
        unfinished.append(f"{expected - len(latest)} shapes have no record (the executor stopped early)")
    merged = merge([staging], store) if store else None
    return Result(sweep_id, staging, counts, unfinished, merged, time.monotonic() - t0)
