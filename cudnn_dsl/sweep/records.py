"""Measurement records: what one sweep unit found for one shape, immutable and named by its content.

A record is canonical JSON (sorted keys, no spaces) in `measurements/<key id>/<sha256 of its bytes>.json`, so a
record is written once, any copy of it is the same file, and a file whose name is not its hash has been changed
since it was written: it is reported as damaged and never read as a measurement. Records carry their provenance
(where, on what, when, which attempt); the entries chosen from them carry none of it (sweep.merge).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import attrs

from cudnn_dsl.store.files import StoreProblem, is_temp, loads
from cudnn_dsl.store.keys import PlanKey, is_entry_id
from cudnn_dsl.store.remote import Tree, open_tree
from cudnn_dsl.store.schema import check_fields, check_key

RECORD_FORMAT = 1
RECORD_LIMIT = 96 << 20
"""bytes; a tune record holds one serialized plan (a few MB at most) as base64"""

KINDS = ("support", "tune", "exhaustive")
"""support: what the target's cuDNN plans, without a device; tune and exhaustive: plans timed on a GPU"""

OUTCOMES = ("ok", "declined", "mismatch", "oom", "timeout", "error", "unschedulable")
"""ok: planned (support) or timed and checked (tune); declined: cuDNN plans no whole graph; mismatch: the fastest
plan's outputs differ from the reference; oom: out of device memory; timeout: the unit ran past its limit;
error: anything else (after the executor's retries); unschedulable: no worker of the unit's kind exists.
Only ok records can be chosen; every outcome counts as done when a sweep resumes."""

_NAME = re.compile(r"([0-9a-f]{64})\.json")

_FIELDS = {
    "format": (lambda v: v == RECORD_FORMAT, f"format {RECORD_FORMAT}"),
    "kind": (lambda v: v in KINDS, " or ".join(KINDS)),
    "key": (lambda v: check_key(v) is None, "a plan key"),
    "graph": (lambda v: type(v) is str, "a string"),
    "binding": (lambda v: type(v) is dict and all(type(x) is int for x in v.values()), "a map of dims to integers"),
    "unit": (lambda v: type(v) is str and len(v) == 64, "a unit id"),
    "outcome": (lambda v: v in OUTCOMES, " or ".join(OUTCOMES)),
    "result": (lambda v: type(v) is dict, "a JSON object"),
    "provenance": (lambda v: type(v) is dict, "a JSON object"),
}


def canonical(d: object) -> bytes:
    """The one byte form of a JSON value: what names a record, an entry and a manifest."""
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@attrs.frozen
class Record:
    kind: str
    key: PlanKey
    graph: str
    binding: dict
    unit: str
    outcome: str
    result: dict
    """support: fuses, plans (candidates), declined, parts; tune: plan_name, engine_id, knobs, workspace, blob
    (base64), blob_sha256, samples_us, p50_us, p90_us, check {passed, text}; otherwise: error (why)"""
    provenance: dict
    """host, gpu, gpu_uuid, driver, cuda, cudnn, cudnn_frontend, cudnn_dsl, sweep, attempt, time, worker"""

    def to_json(self) -> dict:
        return {
            "format": RECORD_FORMAT,
            "kind": self.kind,
            "key": self.key.to_json(),
            "graph": self.graph,
            "binding": dict(self.binding),
            "unit": self.unit,
            "outcome": self.outcome,
            "result": self.result,
            "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, d: object) -> Record:
        """ValueError naming the first thing wrong."""
        check_fields(d, _FIELDS, "record")
        key = d["key"]
        return cls(
            d["kind"],
            PlanKey(**key),
            d["graph"],
            dict(d["binding"]),
            d["unit"],
            d["outcome"],
            d["result"],
            d["provenance"],
        )

    @property
    def data(self) -> bytes:
        return canonical(self.to_json())

    @property
    def id(self) -> str:
        return sha256(self.data)

    @property
    def done_key(self) -> tuple[str, str]:
        """What a resumed sweep has no need to run again: this unit at this shape."""
        return self.unit, json.dumps(self.binding, sort_keys=True)


def write(root: Path | str | Tree, record: Record) -> bool:
    """Writes the record under root/measurements unless a copy is there already; whether it did."""
    data = record.data
    return open_tree(root).write_once(f"measurements/{record.key.id}/{sha256(data)}.json", data)


@attrs.frozen
class Damaged:
    path: str
    why: str


def read_all(root: Path | str | Tree) -> tuple[list[Record], list[Damaged]]:
    """Every record under root/measurements, and every file there that is not one (changed since it was written,
    not JSON, not a record, filed under another key, not a regular file), in path order."""
    tree = open_tree(root)
    records, damaged = [], []
    for keydir, is_dir in tree.listing("measurements"):
        if not is_dir or not is_entry_id(keydir):
            damaged.append(Damaged(tree.join(f"measurements/{keydir}"), "not a key directory"))
            continue
        for name, _ in tree.listing(f"measurements/{keydir}"):
            if is_temp(name):  # a write a killed process left unfinished: no record, and not a damaged one
                continue
            rel = f"measurements/{keydir}/{name}"
            why, record = _read_one(tree, rel, name, keydir)
            if record is None:
                damaged.append(Damaged(tree.join(rel), why))
            else:
                records.append(record)
    return records, damaged


def _read_one(tree: Tree, rel: str, name: str, keyid: str) -> tuple[str, Record | None]:
    m = _NAME.fullmatch(name)
    if m is None:
        return "not a record's name", None
    try:
        data = tree.read(rel, RECORD_LIMIT, "measurement")
    except StoreProblem as e:
        return str(e), None
    if data is None:
        return "removed while read", None
    if sha256(data) != m.group(1):
        return "its content does not match its name: changed since it was written", None
    try:
        record = Record.from_json(loads(data))
    except (ValueError, TypeError) as e:
        return str(e), None
    if record.key.id != keyid:
        return f"filed under key {keyid} but made for key {record.key.id}", None
    return "", record
