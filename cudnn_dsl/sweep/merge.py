"""Merging measurements into a fleet store, and the manifest a deployment pins.

Merge is set union: every record of every source is copied into the store (records are named by content, so a
copy already there is the same file), then the store's entries and manifest are computed from the whole set. The
winner of a plan key is a pure function of that set: only records whose plan passed the reference check, then the
fastest median quantised to 1%, then the engine id, the knobs and the record id. So mergers in any order, any number
of times, by any number of hosts give one manifest and one digest. Nothing is overwritten silently: support answers
that disagree for one key are a conflict with no winner, and one plan measured more than 20% apart on two hosts is
flagged. Damaged files are reported, never read.

The store's layout is store.fleet's; a store, and each source, is a path or a URL (store.remote).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import attrs

from cudnn_dsl.store.files import StoreProblem
from cudnn_dsl.store.fleet import LATEST, entry_name, latest_digest, manifest_name, read_manifest
from cudnn_dsl.store.keys import FORMAT, PlanKey
from cudnn_dsl.store.remote import Tree, open_tree
from cudnn_dsl.sweep import records as rec
from cudnn_dsl.sweep.records import Damaged, Record, canonical, sha256

MANIFEST_FORMAT = 1
QUANTUM = 0.01
"""medians within 1% of each other rank as equal; then the engine id and knobs decide"""
DISAGREE = 1.2
"""one plan of one key measured this many times slower on one host than on another is flagged"""
PLAN_KINDS = ("tune", "exhaustive")


@attrs.frozen
class Merged:
    digest: str
    """the manifest's sha256: the store version a deployment pins"""
    manifest: dict
    added: int
    """records that were not in the store before"""
    damaged: list[Damaged]


def merge(sources: Iterable[Path | str], into: Path | str | Tree) -> Merged:
    """Copies every record of sources into the store `into`, then writes its entries and manifest (Merged)."""
    tree = open_tree(into)
    if not tree.writable:
        raise StoreProblem(f"cannot write {tree.url}/: an http(s) store is read-only (merge into its source)")
    added, damaged = 0, []
    with tree.lock():
        for src in sources:
            records, bad = rec.read_all(src)
            damaged += bad
            for r in records:
                added += rec.write(tree, r)
        records, bad = rec.read_all(tree)
        damaged += bad
        manifest, entries = build_manifest(records)
        for data in entries:
            tree.write_once(entry_name(sha256(data)), data)
        data = canonical(manifest)
        digest = sha256(data)
        tree.write_once(manifest_name(digest), data)
        tree.write(LATEST, f"sha256:{digest}\n".encode())
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
            **{k: entry["key"].get(k, "") for k in attrs.fields_dict(PlanKey)},
        }
    return manifest, entries


def latest(store: Path | str | Tree) -> tuple[str, dict] | None:
    """(digest, manifest) of a store's newest manifest, checked against its name; None for a store without one."""
    tree = open_tree(store)
    digest = latest_digest(tree)
    return None if digest is None else (digest, read_manifest(tree, digest))


def stored(store: Path | str | Tree):
    """Whether a store's newest manifest answers a key (sweep.units.plan's `stored`): same pool, digest, GPU and
    constraints, and a cuDNN of the version asked ('' : any)."""
    from cudnn_dsl.target.library import matches, version_text

    found = latest(store)
    versions: dict[tuple, list[str]] = defaultdict(list)  # (pool, digest, gpu, constraints) -> cuDNN versions
    for pool in ("plans", "support"):
        for row in (found[1] if found else {}).get(pool, {}).values():
            where = (pool, row.get("digest"), row.get("gpu"), row.get("constraints", ""))
            versions[where].append(version_text(int(row.get("cudnn_backend", 0))))

    def has(pool: str, key: dict) -> bool:
        there = versions.get((pool, key["digest"], key["gpu"], key["constraints"]), [])
        return any(not key["cudnn"] or matches(v, key["cudnn"]) for v in there)

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
