"""Reuse layer: the versioned plan store.

An entry is keyed by the graph's canonical content (no names of files, no locations, no scalar
values), the GPU (name and compute capability), and the cuDNN backend and frontend versions. It
holds the serialized plan, the winning engine id and knobs (rebuildable when the blob is not),
timing data and a checksum. Entries are JSON files written atomically: concurrent writers of
one key leave one whole entry. A corrupt, truncated or foreign entry is reported and rebuilt.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import attrs

from cudnn_dsl.backend import cache_dir
from dsl.ir import Graph, Instance

FORMAT = 1


def graph_digest(graph: Graph, inst: Instance) -> str:
    """A hash of what the plan depends on: ops, canonical attributes, tensor types and uids."""
    canon = {
        "types": [graph.io, graph.intermediate, graph.compute],
        "values": [[v.name, v.kind, v.uid, v.dtype, v.scalar if v.kind == "const" else None] for v in graph.values],
        "nodes": [[n.op, list(n.inputs), list(n.outputs), [[k, v] for k, v in inst.node_attrs[i]], n.compute]
                  for i, n in enumerate(graph.nodes)],
        "instance": [[k, t.dtype, list(t.shape), list(t.strides)] for k, t in sorted(inst.types)],
    }
    return hashlib.sha256(json.dumps(canon, sort_keys=True, default=str).encode()).hexdigest()


@attrs.frozen
class PlanKey:
    digest: str
    gpu: str
    compute_capability: str
    cudnn_backend: int
    cudnn_frontend: str

    @property
    def id(self) -> str:
        raw = json.dumps(attrs.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:32]


@attrs.frozen
class Entry:
    key: PlanKey
    graph: str
    plan_name: str
    engine_id: int
    knobs: dict
    """knob type name -> value"""
    blob: bytes
    workspace: int
    tuned: bool
    timing: dict = attrs.field(factory=dict)
    created: float = 0.0

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "key": attrs.asdict(self.key),
            "graph": self.graph,
            "plan_name": self.plan_name,
            "engine_id": self.engine_id,
            "knobs": self.knobs,
            "blob": base64.b64encode(self.blob).decode(),
            "blob_sha256": hashlib.sha256(self.blob).hexdigest(),
            "workspace": self.workspace,
            "tuned": self.tuned,
            "timing": self.timing,
            "created": self.created or time.time(),
        }

    @classmethod
    def from_json(cls, d: dict) -> "Entry":
        blob = base64.b64decode(d["blob"], validate=True)
        if hashlib.sha256(blob).hexdigest() != d["blob_sha256"]:
            raise ValueError("plan blob checksum mismatch")
        return cls(PlanKey(**d["key"]), d["graph"], d["plan_name"], int(d["engine_id"]), dict(d["knobs"]), blob,
                   int(d["workspace"]), bool(d["tuned"]), dict(d.get("timing", {})), float(d.get("created", 0)))


class StoreProblem(Exception):
    """An entry exists but cannot be used; the message says why (it is then rebuilt)."""


class PlanStore:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else cache_dir() / "plans"

    def path(self, key: PlanKey) -> Path:
        return self.root / f"{key.id}.json"

    def get(self, key: PlanKey) -> Entry | None:
        """The entry for key, None when there is none; StoreProblem when it is unusable."""
        p = self.path(key)
        if not p.exists():
            return None
        try:
            d = json.loads(p.read_text())
            if d.get("format") != FORMAT:
                raise StoreProblem(f"entry format {d.get('format')} is not {FORMAT}")
            entry = Entry.from_json(d)
        except StoreProblem:
            raise
        except (ValueError, KeyError, TypeError, OSError) as e:
            raise StoreProblem(f"corrupt plan entry {p.name}: {e}") from None
        if entry.key != key:
            raise StoreProblem(f"entry {p.name} was made for {attrs.asdict(entry.key)}")
        return entry

    def put(self, entry: Entry) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        p = self.path(entry.key)
        atomic_write(p, json.dumps(entry.to_json(), indent=1))
        return p

    def entries(self) -> list[tuple[Path, dict | None]]:
        out = []
        for p in sorted(self.root.glob("*.json")) if self.root.exists() else ():
            try:
                out.append((p, json.loads(p.read_text())))
            except (ValueError, OSError):
                out.append((p, None))
        return out

    def clear(self) -> int:
        n = 0
        for p, _ in self.entries():
            p.unlink(missing_ok=True)
            n += 1
        return n

    def export(self, dest: Path) -> int:
        bundle = [d for _, d in self.entries() if d is not None]
        atomic_write(dest, json.dumps({"format": FORMAT, "entries": bundle}))
        return len(bundle)

    def import_(self, src: Path) -> int:
        data = json.loads(Path(src).read_text())
        if data.get("format") != FORMAT:
            raise StoreProblem(f"{src}: bundle format {data.get('format')} is not {FORMAT}")
        n = 0
        for d in data["entries"]:
            self.put(Entry.from_json(d))  # re-verifies the checksum of every blob
            n += 1
        return n


def atomic_write(path: Path, text: str) -> None:
    """Writes text so that a reader sees the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
