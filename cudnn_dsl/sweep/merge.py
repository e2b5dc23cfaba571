"""Merging measurements into a fleet store, and the manifest a deployment pins.

Merge is set union: every record of every source is copied into the store (records are named by content, so a
copy already there is the same file), then the store's entries and manifest are computed from the whole set. The
winner of a plan key is a pure function of that set: only records whose plan passed the reference check, then the
fastest median quantised to 1%, then the engine id, the knobs and the record id. So mergers in any order, any number
of times, by any number of hosts give one manifest and one digest. Nothing is overwritten silently: support answers
that disagree for one key are a conflict with no winner, and one plan measured more than 20% apart on two hosts is
flagged. Damaged files are reported, never read.

The layout of a fleet store (entries and manifests are named by their sha256 too, so a pinned manifest stays
readable after later merges):

    measurements/<key id>/<sha256>.json   records (sweep.records)
    entries/<sha256>.json                 the chosen plan of a key (a plan store entry) or support answer
    manifests/<sha256>.json               {key id: entry} for every key, conflicts, flags
    LATEST                                sha256:<digest of the newest manifest>
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

from cudnn_dsl.store.files import StoreProblem, atomic_write
from cudnn_dsl.store.keys import FORMAT
from cudnn_dsl.sweep import records as rec
from cudnn_dsl.sweep.records import Damaged, Record, canonical, sha256

MANIFEST_FORMAT = 1
QUANTUM = 0.01
"""medians within 1% of each other rank as equal; then the engine id and knobs decide"""
DISAGREE = 1.2
"""one plan of one key measured this many times slower on one host than on another is flagged"""
PLAN_KINDS = ("tune", "exhaustive")
KEY_FIELDS = ("digest", "gpu", "compute_capability", "cudnn_backend", "cudnn_frontend", "constraints")


@attrs.frozen
class Merged:
    digest: str
    """the manifest's sha256: the store version a deployment pins"""
    manifest: dict
    added: int
    """records that were not in the store before"""
    damaged: list[Damaged]


def merge(sources: Iterable[Path], into: Path) -> Merged:
    """Copies every record of sources into the store `into`, then writes its entries and manifest (Merged)."""
    into = Path(into)
    added, damaged = 0, []
    with _locked(into):
        for src in sources:
            records, bad = rec.read_all(Path(src))
            damaged += bad
            for r in records:
                added += not (into / "measurements" / r.key.id / f"{r.id}.json").is_file()
                rec.write(into, r)
        records, bad = rec.read_all(into)
        damaged += bad
        manifest, entries = build_manifest(records)
        for data in entries:
            _write_once(into / "entries" / f"{sha256(data)}.json", data)
        data = canonical(manifest)
        digest = sha256(data)
        _write_once(into / "manifests" / f"{digest}.json", data)
        _write(into / "LATEST", f"sha256:{digest}\n".encode())
    return Merged(digest, manifest, added, damaged)


def build_manifest(records: list[Record]) -> tuple[dict, list[bytes]]:
    """(the manifest of a set of records, the bytes of every entry it names); records in any order."""
    by_key: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in {r.id: r for r in records}.values():  # a set: a record given twice counts once
        by_key["plans" if r.kind in PLAN_KINDS else "support", r.key.id].append(r)
    manifest: dict = {"format": MANIFEST_FORMAT, "plans": {}, "support": {}, "conflicts": [], "flags": []}
    entries = []
    for (pool, keyid), rs in sorted(by_key.items()):
        rs.sort(key=lambda r: r.id)
        if pool == "plans":
            entry, chosen = plan_winner(rs)
            manifest["flags"] += disagreements(rs)
        else:
            entry, chosen, conflict = support_answer(rs)
            if conflict:
                manifest["conflicts"].append(conflict)
        if entry is None:
            continue
        data = canonical(entry)
        entries.append(data)
        manifest[pool][keyid] = {
            "sha256": sha256(data),
            "graph": min(r.graph for r in chosen),
            "binding": min((r.binding for r in chosen), key=canonical),
            **{k: entry["key"].get(k, "") for k in KEY_FIELDS},
        }
    return manifest, entries


def latest(store: Path) -> tuple[str, dict] | None:
    """(digest, manifest) of a store's newest manifest, checked against its name; None for a store without one."""
    from cudnn_dsl.store.files import loads, read_regular

    pointer = read_regular(Path(store) / "LATEST", 128, "fleet store pointer")
    if pointer is None:
        return None
    digest = pointer.decode("ascii", "replace").strip().removeprefix("sha256:")
    data = read_regular(Path(store) / "manifests" / f"{digest}.json", 256 << 20, "manifest")
    if data is None or sha256(data) != digest:
        raise StoreProblem(f"the manifest {digest[:64]} that {store}/LATEST names is missing or damaged")
    try:
        return digest, loads(data)
    except ValueError as e:
        raise StoreProblem(f"manifest {digest}: {e}") from None


def stored(store: Path):
    """Whether a store's newest manifest answers a key (sweep.units.plan's `stored`): same pool, digest, GPU and
    constraints, and a cuDNN of the version asked ('' : any)."""
    from cudnn_dsl.target.library import matches, version_text

    found = latest(store)
    rows = found[1] if found else {}

    def has(pool: str, key: dict) -> bool:
        return any(
            row.get("digest") == key["digest"]
            and row.get("gpu") == key["gpu"]
            and row.get("constraints", "") == key["constraints"]
            and (not key["cudnn"] or matches(version_text(int(row.get("cudnn_backend", 0))), key["cudnn"]))
            for row in rows.get(pool, {}).values()
        )

    return has


def _quantised(us: float) -> int:
    return math.floor(math.log(max(us, 1e-3)) / math.log1p(QUANTUM))


def _passed(r: Record) -> bool:
    check = r.result.get("check")
    return r.outcome == "ok" and isinstance(check, dict) and check.get("passed") is True and _median(r) is not None


def _median(r: Record) -> float | None:
    v = r.result.get("p50_us")
    return float(v) if type(v) in (int, float) and math.isfinite(v) and v > 0 else None


def plan_winner(rs: list[Record]) -> tuple[dict | None, list[Record]]:
    """(the plan store entry of a key's fastest checked plan, the records that passed); None when none did."""
    ok = [r for r in rs if _passed(r)]
    if not ok:
        return None, []
    best = min(ok, key=lambda r: (_quantised(_median(r)), r.result["engine_id"], canonical(r.result["knobs"]), r.id))
    res = best.result
    entry = {  # the plan store's entry format (store.plans.Entry): the runtime reads it as an imported entry
        "format": FORMAT,
        "key": best.key.to_json(),
        "graph": min(r.graph for r in ok),
        "plan_name": res["plan_name"],
        "engine_id": res["engine_id"],
        "knobs": res["knobs"],
        "blob": res["blob"],
        "blob_sha256": res["blob_sha256"],
        "workspace": res["workspace"],
        "tuned": True,
        "timing": {"median_us": _median(best), "p90_us": float(res.get("p90_us", 0.0)), "records": len(ok)},
        "created": float(best.provenance.get("time", 0.0)),
        "imported": True,
    }
    return entry, ok


def disagreements(rs: list[Record]) -> list[dict]:
    """One flag per plan of this key whose medians on two hosts are more than DISAGREE apart."""
    by_plan: dict[bytes, list[Record]] = defaultdict(list)
    for r in rs:
        if _passed(r):
            by_plan[canonical([r.result["engine_id"], r.result["knobs"]])].append(r)
    flags = []
    for plan, group in sorted(by_plan.items()):
        hosts: dict[str, float] = {}
        for r in group:
            host = str(r.provenance.get("gpu_uuid") or r.provenance.get("host", "?"))
            hosts[host] = min(hosts.get(host, math.inf), _median(r))
        if len(hosts) > 1 and max(hosts.values()) > DISAGREE * min(hosts.values()):
            flags.append(
                {"key": group[0].key.id, "plan": plan.decode(), "median_us_by_host": dict(sorted(hosts.items()))}
            )
    return flags


def support_answer(rs: list[Record]) -> tuple[dict | None, list[Record], dict | None]:
    """(the answer every record of this key gives, those records, None), or (None, [], the conflict) when they
    give different ones. Records of units that did not finish (timeout, error, unschedulable) answer nothing."""
    answers: dict[bytes, list[Record]] = defaultdict(list)
    for r in rs:
        if r.outcome in ("ok", "declined"):
            answers[canonical([r.outcome, r.result])].append(r)
    if not answers:
        return None, [], None
    if len(answers) > 1:
        return (
            None,
            [],
            {
                "key": rs[0].key.id,
                "kind": "support",
                "answers": [[x.id for x in group] for _, group in sorted(answers.items())],
            },
        )
    (group,) = answers.values()
    first = group[0]
    entry = {"format": MANIFEST_FORMAT, "kind": "support", "key": first.key.to_json(), "outcome": first.outcome}
    return {**entry, "result": first.result}, group, None


def _write_once(path: Path, data: bytes) -> None:
    """Content-named files are written once; one already there is the same bytes (or damage verify reports)."""
    if not path.is_file():
        _write(path, data)


def _write(path: Path, data: bytes) -> None:
    try:
        atomic_write(path, data, follow_symlinks=False)
    except OSError as e:
        raise StoreProblem(f"cannot write {path}: {e.strerror or e}") from None


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One merger at a time computes and writes a store's manifest (a lock on the directory)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise StoreProblem(f"cannot write to the fleet store {root}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
