"""Reuse layer: the versioned plan store and the shared kernel caches.

An entry is keyed by the graph's canonical content (no names of files, no locations, no scalar
values), the GPU (name and compute capability), and the cuDNN backend and frontend versions. It
holds the serialized plan, the winning engine id and knobs (rebuildable when the blob is not),
timing data and a checksum. Entries are JSON files written atomically: concurrent writers of
one key leave one whole entry. A corrupt, truncated or foreign entry is reported and rebuilt.

Everything read from the store or from a bundle is untrusted: every field is checked for type and
range, sizes are capped before reading, only regular files are opened (a FIFO would block), links
are not followed, and every failure is a StoreProblem. Text meant for a terminal goes through clean().
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from dsl.ir import Graph, Instance

FORMAT = 1
"""of an entry, and of an export bundle (whose kernel_caches list is optional)"""
ENTRY_LIMIT = 64 << 20
"""bytes; a serialized plan is a few MB at most"""
BUNDLE_LIMIT = 512 << 20
KERNEL_CACHE_LIMIT = 64 << 20
SEARCH_LIMIT = 64 << 20
"""bytes of one search record (tune --exhaustive): some 200 bytes per configuration tried"""
MAX_WORKSPACE = 1 << 40
"""bytes; the runtime allocates a stored plan's workspace on every load, so an absurd one is damage"""
_MAX_CREATED = 1e11
"""seconds since 1970 (the year 5138): beyond it, time.localtime fails"""
_STR_LIMIT = 1024
_CHUNK = 256 << 10

_ENTRY_ID = re.compile(r"[0-9a-f]{32}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_KERNEL_CACHE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}-[0-9a-f]{24}\.cache")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_PARTITION_NAME = re.compile(r"whole|[1-9][0-9]{0,6}(,[1-9][0-9]{0,6}){0,255}")
_BLOB_MARK = b'\n "blob": "'
"""how to_json's indent=1 layout starts the blob: a newline cannot occur inside a JSON string"""


def clean(text: str) -> str:
    """text without C0, DEL and C1 control characters, so that a stored field cannot drive the terminal."""
    return _CONTROL.sub("", text)


def is_entry_id(text: str) -> bool:
    """Whether text is an entry id (32 lowercase hex digits): the only names `cache show` accepts."""
    return bool(_ENTRY_ID.fullmatch(text))


class StoreProblem(Exception):
    """The store, an entry or a bundle cannot be used as it is; the message says why (an entry is then rebuilt)."""

    def __init__(self, message: str):
        super().__init__(clean(str(message)))


def cache_dir() -> Path:
    """$CUDNN_DSL_CACHE_DIR, else $XDG_CACHE_HOME/cudnn-dsl, else ~/.cache/cudnn-dsl."""
    env = os.environ.get("CUDNN_DSL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cudnn-dsl"


def graph_digest(graph: Graph, inst: Instance) -> str:
    """A hash of what the plan depends on: ops, canonical attributes, tensor types, by uid. Names and the values
    of scalars and constants are left out (cuDNN reads those at launch), so two spellings of one graph share it.
    Where tensors share memory (views of a buffer, outputs in place) that is part of it too."""
    uid = {v.name: v.uid for v in graph.values}
    canon = {
        "types": [graph.io, graph.intermediate, graph.compute],
        "values": [[v.kind, v.uid, v.dtype] for v in graph.values],
        "nodes": [
            [
                n.op,
                [uid.get(i) for i in n.inputs],
                [uid[o] for o in n.outputs],
                [list(a) for a in inst.node_attrs[k]],
                n.compute,
            ]
            for k, n in enumerate(graph.nodes)
        ],
        "instance": sorted([uid[k], t.dtype, list(t.shape), list(t.strides)] for k, t in inst.types if k in uid),
    }
    if graph.buffers or graph.in_place or any(n.uids for n in graph.nodes):  # absent otherwise: older keys hold
        canon["memory"] = {
            "buffers": [[inst.type(b.name).dtype, list(inst.type(b.name).shape)] for b in graph.buffers],
            "views": sorted([v.uid, [b.name for b in graph.buffers].index(v.view[0]), v.view[1]] for v in graph.views),
            "in_place": sorted([v.uid, uid[v.into]] for v in graph.in_place),
            "attr_uids": [list(n.uids) for n in graph.nodes],
        }
    return hashlib.sha256(json.dumps(canon, sort_keys=True, default=str).encode()).hexdigest()


@attrs.frozen
class PlanKey:
    digest: str
    gpu: str
    compute_capability: str
    cudnn_backend: int
    cudnn_frontend: str
    constraints: str = ""
    """the plan constraints the plan was chosen under ('' for none: such keys keep the ids they had before)"""

    def to_json(self) -> dict:
        return attrs.asdict(self, filter=lambda a, v: a.name != "constraints" or bool(v))

    @property
    def id(self) -> str:
        raw = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:32]


# ---- field checks: exact types (no bool for int, no float for int), bounded ranges and lengths ----


_Fields = dict[str, tuple[Callable[[object], bool], str]]
"""field name -> (check of its value, what the value should be)"""


def _int(lo: int, hi: int) -> Callable[[object], bool]:
    return lambda v: type(v) is int and lo <= v <= hi


def _str(v: object) -> bool:
    return type(v) is str and len(v) <= _STR_LIMIT


def _number(v: object) -> bool:
    return (type(v) is int and abs(v) < 2**63) or (type(v) is float and math.isfinite(v))


def _dict_of(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: type(v) is dict and len(v) <= 256 and all(_str(k) and check(x) for k, x in v.items())


_KEY_FIELDS: _Fields = {
    "digest": (lambda v: type(v) is str and bool(_DIGEST.fullmatch(v)), "64 hex digits"),
    "gpu": (_str, "a string"),
    "compute_capability": (_str, "a string"),
    "cudnn_backend": (_int(0, 2**31 - 1), "a cuDNN version number"),
    "cudnn_frontend": (_str, "a string"),
}
_ENTRY_FIELDS: _Fields = {
    "format": (lambda v: type(v) is int and v == FORMAT, f"format {FORMAT}"),
    "key": (
        lambda v: _check(v, _KEY_FIELDS, "key", {"constraints": (_str, "a string")}) is None,
        "a plan key",
    ),  # raises naming the bad key field
    "graph": (_str, "a string"),
    "plan_name": (_str, "a string"),
    "engine_id": (_int(0, 2**31 - 1), "an engine id"),
    "knobs": (_dict_of(_int(-(2**63), 2**63 - 1)), "a map of knob names to integers"),
    "blob": (lambda v: type(v) is str, "base64 text"),
    "blob_sha256": (lambda v: type(v) is str and bool(_DIGEST.fullmatch(v)), "a sha256"),
    "workspace": (_int(0, MAX_WORKSPACE), f"a byte count up to {MAX_WORKSPACE}"),
    "tuned": (lambda v: type(v) is bool, "true or false"),
}
_OPTIONAL_FIELDS: _Fields = {
    "timing": (_dict_of(_number), "a map of names to numbers"),
    "created": (lambda v: _number(v) and 0 <= v <= _MAX_CREATED, "a time"),
    "imported": (lambda v: type(v) is bool, "true or false"),
}
_TRIED_FIELDS: _Fields = {
    "engine": (_int(0, 2**31 - 1), "an engine id"),
    "knobs": (_dict_of(_int(-(2**63), 2**63 - 1)), "a map of knob names to integers"),
    "source": (lambda v: v in ("heuristics", "search"), "heuristics or search"),
    "status": (lambda v: v in ("timed", "unsupported", "failed", "excluded"), "timed, unsupported, failed or excluded"),
}
_TRIED_OPTIONAL: _Fields = {
    "name": (_str, "a string"),
    "median_us": (lambda v: _number(v) and v >= 0, "a time in µs"),
    "workspace": (_int(0, MAX_WORKSPACE), "a byte count"),
    "error": (_str, "a string"),
}
_SEARCH_FIELDS: _Fields = {
    "format": (lambda v: type(v) is int and v == FORMAT, f"format {FORMAT}"),
    "key": (lambda v: _check(v, _KEY_FIELDS, "key", {"constraints": (_str, "a string")}) is None, "a plan key"),
    "graph": (_str, "a string"),
    "tried": (
        lambda v: type(v) is list and all(_check(t, _TRIED_FIELDS, "tried", _TRIED_OPTIONAL) is None for t in v),
        "a list",
    ),
}
_PARTITION_FIELDS: _Fields = {
    "format": (lambda v: type(v) is int and v == FORMAT, f"format {FORMAT}"),
    "key": (lambda v: _check(v, _KEY_FIELDS, "key", {"constraints": (_str, "a string")}) is None, "a plan key"),
    "graph": (_str, "a string"),
    "cuts": (
        lambda v: type(v) is list and all(type(c) is int and 0 < c < 1 << 20 for c in v) and v == sorted(set(v)),
        "increasing node indices",
    ),
    "times_us": (
        lambda v: _dict_of(lambda t: _number(t) and t >= 0)(v) and all(_PARTITION_NAME.fullmatch(k) for k in v),
        "a map of partitions ('whole', '1,3') to times in µs",
    ),
}
_BUNDLE_FIELDS: _Fields = {
    "format": (lambda v: type(v) is int, "a number"),
    "entries": (lambda v: type(v) is list, "a list"),
}
_KERNEL_CACHE_FIELDS: _Fields = {
    "name": (lambda v: type(v) is str and bool(_KERNEL_CACHE_NAME.fullmatch(v)), "a kernel cache file name"),
    "text": (lambda v: type(v) is str and len(v) <= KERNEL_CACHE_LIMIT, "text within the size limit"),
}


def _brief(v: object) -> str:
    if isinstance(v, (dict, list)):
        return f"a JSON {'object' if isinstance(v, dict) else 'array'}"
    return repr(v[:40] if isinstance(v, str) else v)[:60]


def _check(d: object, fields: _Fields, what: str, optional: _Fields | None = None) -> None:
    """ValueError naming the first missing, unknown or wrong field of d."""
    if type(d) is not dict:
        raise ValueError(f"{what} is {_brief(d)}, not a JSON object")
    optional = optional or {}
    for name, (ok, want) in {**fields, **optional}.items():
        if name not in d:
            if name in optional:
                continue
            raise ValueError(f"{what} has no field '{name}'")
        if not ok(d[name]):
            raise ValueError(f"{what} field '{name}' is {_brief(d[name])}, not {want}")
    extra = sorted(set(d) - set(fields) - set(optional))
    if extra:
        raise ValueError(f"{what} has an unknown field {extra[0]!r:.60}")


def _check_entry(d: object) -> None:
    """Every field but the blob's content; the format first, so that a newer entry says so."""
    if type(d) is dict and "format" in d and not _ENTRY_FIELDS["format"][0](d["format"]):
        raise ValueError(f"entry format {_brief(d['format'])} is not {FORMAT}")
    _check(d, _ENTRY_FIELDS, "entry", _OPTIONAL_FIELDS)


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
    imported: bool = False
    """came from `cache import`: the blob was made elsewhere, and nothing here has checked it describes the graph"""

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "key": self.key.to_json(),
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
            "imported": self.imported,
        }

    @classmethod
    def from_json(cls, d: object) -> Entry:
        """The entry of a parsed JSON document; ValueError naming the first thing wrong with it."""
        _check_entry(d)
        blob = base64.b64decode(d["blob"], validate=True)
        if hashlib.sha256(blob).hexdigest() != d["blob_sha256"]:
            raise ValueError("plan blob checksum mismatch")
        return cls(
            PlanKey(**d["key"]),
            d["graph"],
            d["plan_name"],
            d["engine_id"],
            dict(d["knobs"]),
            blob,
            d["workspace"],
            d["tuned"],
            dict(d.get("timing", {})),
            float(d.get("created", 0)),
            d.get("imported", False),
        )

    def same_plan(self, other: Entry) -> bool:
        """Whether other holds the same plan (when it was made, and where from, aside)."""
        return attrs.evolve(self, created=0.0, imported=False) == attrs.evolve(other, created=0.0, imported=False)


@attrs.frozen
class PartitionChoice:
    """What `tune` kept for one plan key among the partitions it timed: the node indices where a part starts
    (none: the whole graph), and each partition's time by its cut points ('whole', '1', '1,3')."""

    cuts: tuple[int, ...]
    times_us: dict[str, float]

    @staticmethod
    def name(cuts: tuple[int, ...]) -> str:
        return ",".join(map(str, cuts)) or "whole"

    @staticmethod
    def cuts_of(name: str) -> tuple[int, ...]:
        """name's inverse (names are checked when read)."""
        return () if name == "whole" else tuple(int(c) for c in name.split(","))


# ---- results of the cache commands ----


@attrs.frozen
class Row:
    """One line of `cache ls`: an entry's small fields, or why it cannot be read."""

    id: str
    problem: str | None = None
    graph: str = ""
    plan_name: str = ""
    tuned: bool = False
    imported: bool = False
    gpu: str = ""
    cudnn_backend: int = 0
    created: float = 0.0
    blob_bytes: int = 0

    @classmethod
    def of(cls, entry_id: str, d: dict, blob_bytes: int) -> Row:
        """The row of a checked entry dict."""
        k = d["key"]
        fields = (d["graph"], d["plan_name"], d["tuned"], d.get("imported", False), k["gpu"], k["cudnn_backend"])
        return cls(entry_id, None, *fields, d.get("created", 0.0), blob_bytes)

    def line(self) -> str:
        if self.problem:
            return clean(f"{self.id}  unreadable: {self.problem}")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created))
        kind = ("tuned" if self.tuned else "heuristic") + (" (imported)" if self.imported else "")
        return clean(
            f"{self.id}  {self.graph:20} {self.plan_name[:40]:40} {kind:9} {self.gpu} cuDNN {self.cudnn_backend} {when}"
        )


@attrs.frozen
class Cleared:
    entries: int
    temp_files: int
    kernel_caches: int
    left: list[str]
    """names that look like ours but are not regular files (directories, FIFOs, links): not touched"""
    searches: int = 0
    """search records of tune --exhaustive"""
    partitions: int = 0
    """the partitions tune kept"""


@attrs.frozen
class Exported:
    entries: int
    kernel_caches: int
    skipped: list[str]
    """'name: why' of each file not exported"""


@attrs.frozen
class Imported:
    imported: int
    kept: int
    """local tuned entries that the bundle would have replaced (force=True replaces them)"""
    skipped: int
    """entries already here with the same plan"""
    kernel_caches: int
    kernel_caches_left: int = 0
    """kernel caches of the bundle not taken (compiled code: only when asked for)"""


class PlanStore:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else cache_dir() / "plans"
        self.kernels = self.root.parent / "kernels"
        """the shared kernel caches of dynamic-shape graphs"""

    def path(self, key: PlanKey) -> Path:
        return self.root / f"{key.id}.json"

    def kernel_cache_path(self, graph_name: str, digest: str) -> Path:
        """The kernel cache file of a graph (digest: graph_digest of its first shape); StoreProblem for odd names."""
        name = f"{graph_name}-{digest[:24]}.cache"
        if not _KERNEL_CACHE_NAME.fullmatch(name):
            raise StoreProblem(f"no kernel cache file name for graph {graph_name!r:.60} and digest {digest[:24]!r}")
        return self.kernels / name

    # ---- entries ----

    def get(self, key: PlanKey) -> Entry | None:
        """The entry for key, None when there is none; StoreProblem when it is unusable."""
        entry = self._read(self.path(key))
        if entry is not None and entry.key != key:
            raise StoreProblem(f"entry {key.id} was made for {attrs.asdict(entry.key)}")
        return entry

    def put(self, entry: Entry, *, force: bool = False) -> Path | None:
        """Stores entry and returns its path. A valid tuned entry already stored is kept when entry is not tuned
        (or was imported): then None, unless force. StoreProblem when the store cannot be written."""
        with self._locked():
            return self.path(entry.key) if self._place(entry, force) == "written" else None

    def _read(self, p: Path) -> Entry | None:
        # No exists() first: a file removed by `clear` since anyone looked is simply not there (D30).
        data = _read_regular(p, ENTRY_LIMIT, "plan entry")
        if data is None:
            return None
        try:
            return Entry.from_json(_loads(data))
        except ValueError as e:
            raise StoreProblem(f"corrupt plan entry {p.name}: {e}") from None

    def _place(self, entry: Entry, force: bool) -> str:
        """Writes entry unless the stored one should stay: 'written', 'kept' (tuned here) or 'same'."""
        try:
            old = self.get(entry.key)
        except StoreProblem:
            old = None  # damaged: not worth keeping
        if old is not None and entry.imported and old.same_plan(entry):
            return "same"  # keeps the local copy, which is not marked imported
        if old is not None and old.tuned and not force and (entry.imported or not entry.tuned):
            return "kept"
        text = json.dumps(entry.to_json(), indent=1)
        if len(text) > ENTRY_LIMIT:
            raise StoreProblem(f"the plan of {entry.graph} is {len(text)} bytes as JSON, over the {ENTRY_LIMIT} limit")
        try:
            atomic_write(self.path(entry.key), text, follow_symlinks=False)
        except OSError as e:
            raise StoreProblem(f"cannot write to the plan store {self.root}: {e.strerror or e}") from None
        return "written"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serializes read-then-write sequences between processes (a lock on the directory: no lock file)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise StoreProblem(f"cannot write to the plan store {self.root}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # ---- search records (tune --exhaustive): what was tried, so that a later search resumes ----

    def search_path(self, key: PlanKey) -> Path:
        return self.root.parent / "searches" / f"{key.id}.json"

    def get_search(self, key: PlanKey) -> list[dict]:
        """The configurations tried for key so far ([] when none): each {"engine", "knobs", "source", "status",
        and "name", "median_us", "workspace", "error" where known}; StoreProblem when the record is unusable."""
        p = self.search_path(key)
        data = _read_regular(p, SEARCH_LIMIT, "search record")
        if data is None:
            return []
        try:
            d = _loads(data)
            _check(d, _SEARCH_FIELDS, "search record")
            if PlanKey(**d["key"]) != key:
                raise ValueError("it was made for another key")
        except (ValueError, TypeError) as e:
            raise StoreProblem(f"search record {p.name}: {e}") from None
        return [_cleaned(t) for t in d["tried"]]

    def put_search(self, key: PlanKey, graph: str, tried: list[dict]) -> None:
        """Saves the configurations tried for key (replacing the record); StoreProblem when it cannot."""
        text = json.dumps({"format": FORMAT, "key": key.to_json(), "graph": graph, "tried": tried}, indent=0)
        if len(text) > SEARCH_LIMIT:
            raise StoreProblem(f"the search record of {graph} would be {len(text)} bytes, over {SEARCH_LIMIT}")
        try:
            atomic_write(self.search_path(key), text, follow_symlinks=False)
        except OSError as e:
            raise StoreProblem(f"cannot write the search record {self.search_path(key)}: {e.strerror or e}") from None

    # ---- partitions (tune): which split of a graph runs fastest, keyed like its whole-graph plan ----

    def partition_path(self, key: PlanKey) -> Path:
        return self.root.parent / "partitions" / f"{key.id}.json"

    def get_partition(self, key: PlanKey) -> PartitionChoice | None:
        """The partition tune kept for key (None when it has timed none); StoreProblem when the record is unusable."""
        p = self.partition_path(key)
        data = _read_regular(p, ENTRY_LIMIT, "partition record")
        if data is None:
            return None
        try:
            d = _loads(data)
            if type(d) is dict and "format" in d and not _PARTITION_FIELDS["format"][0](d["format"]):
                raise ValueError(f"format {_brief(d['format'])} is not {FORMAT} (made by another version)")
            _check(d, _PARTITION_FIELDS, "partition record")
            if PlanKey(**d["key"]) != key:
                raise ValueError("it was made for another key")
        except (ValueError, TypeError) as e:
            raise StoreProblem(f"partition record {p.name}: {e}") from None
        return PartitionChoice(tuple(d["cuts"]), dict(d["times_us"]))

    def put_partition(self, key: PlanKey, graph: str, choice: PartitionChoice) -> None:
        """Saves the partition tune kept for key (replacing the record); StoreProblem when it cannot."""
        d = {
            "format": FORMAT,
            "key": key.to_json(),
            "graph": graph,
            "cuts": list(choice.cuts),
            "times_us": choice.times_us,
        }
        try:
            atomic_write(self.partition_path(key), json.dumps(d, indent=1), follow_symlinks=False)
        except OSError as e:
            raise StoreProblem(
                f"cannot write the partition record {self.partition_path(key)}: {e.strerror or e}"
            ) from None

    # ---- cache commands ----

    def listing(self) -> list[Row]:
        """One row per *.json name in the store, without decoding any blob (D27); damage is a row's problem."""
        rows = []
        for e in _scan(self.root):
            if not e.name.endswith(".json"):
                continue
            entry_id = e.name[: -len(".json")]
            try:
                d, blob_bytes = _summary(Path(e.path))
                if PlanKey(**d["key"]).id != entry_id:
                    raise ValueError("the entry inside is for another key")
                rows.append(Row.of(entry_id, d, blob_bytes))
            except (ValueError, StoreProblem) as x:
                rows.append(Row(entry_id, problem=str(x)))
        return rows

    def show(self, entry_id: str) -> dict | None:
        """An entry's fields for display, its blob as '<N bytes>', with "status": "ok" or why it cannot be used;
        every string cleaned of control characters. None when there is no such entry. StoreProblem when entry_id
        is not an id, or the file is not a readable JSON object."""
        if not is_entry_id(entry_id):
            raise StoreProblem(f"{entry_id!r:.80} is not an entry id (32 lowercase hex digits)")
        p = self.root / f"{entry_id}.json"
        try:
            d, blob_bytes = _summary(p, check=False)
        except FileNotFoundError:
            return None
        except (ValueError, StoreProblem) as e:
            raise StoreProblem(f"entry {entry_id} is unreadable: {e}") from None
        try:
            entry = self._read(p)
            if entry is not None and entry.key.id != entry_id:
                raise StoreProblem("the entry inside is for another key")
            status = "ok"
        except StoreProblem as e:
            status = f"unusable: {e}"
        shown = {"id": entry_id, "status": status}
        shown.update((k, v) for k, v in {**d, "blob": f"<{blob_bytes} bytes>"}.items() if k not in shown)
        try:
            return _cleaned(shown)
        except RecursionError:
            raise StoreProblem(f"entry {entry_id} is unreadable: nested too deeply") from None

    def clear(self) -> Cleared:
        """Deletes the entries, the kernel caches and temp files left by killed writers (D29), without reading
        them; leaves directories, FIFOs and links alone. StoreProblem when the store cannot be changed."""
        counts = {"entries": 0, "temp_files": 0, "kernel_caches": 0, "searches": 0, "partitions": 0}
        left = []
        for folder, suffix, kind in (
            (self.root, ".json", "entries"),
            (self.kernels, ".cache", "kernel_caches"),
            (self.root.parent / "searches", ".json", "searches"),
            (self.root.parent / "partitions", ".json", "partitions"),
        ):
            for e in _scan(folder):
                what = "temp_files" if e.name.startswith(".") and e.name.endswith(".tmp") else kind
                if not e.name.endswith(suffix) and what != "temp_files":
                    continue
                if not e.is_file(follow_symlinks=False):
                    left.append(clean(e.name))
                    continue
                try:
                    os.unlink(e.path)
                except FileNotFoundError:
                    continue
                except OSError as x:
                    raise StoreProblem(f"cannot clear {folder}: {x.strerror or x}") from None
                counts[what] += 1
        return Cleared(**counts, left=left)

    def export(self, dest: Path) -> Exported:
        """Writes a bundle of every valid entry and kernel cache: {"format": 1, "entries": [entry...],
        "kernel_caches": [{"name", "text"}...]}. Damaged or special files are skipped and named.
        StoreProblem when the bundle cannot be written or would be over BUNDLE_LIMIT."""
        entries, caches, skipped = [], [], []
        for e in _scan(self.root):
            if e.name.endswith(".json"):
                try:
                    entry = self._read(Path(e.path))
                    if entry is not None and entry.key.id != e.name[: -len(".json")]:
                        raise StoreProblem("the entry inside is for another key")
                except StoreProblem as x:
                    skipped.append(clean(f"{e.name}: {x}"))
                    continue
                if entry is not None:
                    entries.append(entry.to_json())
        for e in _scan(self.kernels):
            if e.name.endswith(".cache"):
                try:
                    if not _KERNEL_CACHE_NAME.fullmatch(e.name):
                        raise StoreProblem("not a kernel cache name")
                    text = load_kernel_cache_text(Path(e.path))
                except StoreProblem as x:
                    skipped.append(clean(f"{e.name}: {x}"))
                    continue
                if text is not None:
                    caches.append({"name": e.name, "text": text})
        text = json.dumps({"format": FORMAT, "entries": entries, "kernel_caches": caches})
        if len(text) > BUNDLE_LIMIT:
            raise StoreProblem(f"the bundle would be {len(text)} bytes, over the {BUNDLE_LIMIT} that import takes")
        try:
            atomic_write(Path(dest), text)
        except OSError as e:
            raise StoreProblem(f"cannot write {dest}: {e.strerror or e}") from None
        return Exported(len(entries), len(caches), skipped)

    def import_(self, src: Path, *, force: bool = False, kernels: bool = False) -> Imported:
        """Checks the whole bundle, then stores its entries (marked imported: the planner rebuilds them from their
        engine and knobs, never loading their blobs). A local tuned entry is kept unless force. Its kernel caches
        are compiled code, merged into the local ones only with kernels=True (a bundle you trust). StoreProblem,
        with nothing written, when any part of the bundle is wrong: the message names the first bad entry."""
        entries, caches = _read_bundle(Path(src))
        counts = {"written": 0, "kept": 0, "same": 0}
        with self._locked():
            for entry in entries:
                counts[self._place(attrs.evolve(entry, imported=True), force)] += 1
        for name, text in caches if kernels else ():
            save_kernel_cache_text(self.kernels / name, text)
        return Imported(
            counts["written"],
            counts["kept"],
            counts["same"],
            len(caches) if kernels else 0,
            0 if kernels else len(caches),
        )


def _read_bundle(src: Path) -> tuple[list[Entry], list[tuple[str, str]]]:
    data = _read_regular(src, BUNDLE_LIMIT, "bundle", follow_symlinks=True)
    if data is None:
        raise StoreProblem(f"{src}: no such file")

    def bad(why: str) -> StoreProblem:
        return StoreProblem(f"{src}: {why}; nothing was imported")

    try:
        bundle = _loads(data)
        _check(bundle, _BUNDLE_FIELDS, "the bundle", {"kernel_caches": (lambda v: type(v) is list, "a list")})
    except ValueError as e:
        raise bad(str(e)) from None
    if bundle["format"] != FORMAT:
        raise bad(f"bundle format {bundle['format']} is not {FORMAT}")
    entries, seen = [], {}
    for i, d in enumerate(bundle["entries"]):
        try:
            entry = Entry.from_json(d)
        except ValueError as e:
            raise bad(f"entry {i}: {e}") from None
        if entry.key.id in seen:
            raise bad(f"entries {seen[entry.key.id]} and {i} are for the same key")
        seen[entry.key.id] = i
        entries.append(entry)
    caches, names = [], set()
    for i, c in enumerate(bundle.get("kernel_caches", [])):
        try:
            _check(c, _KERNEL_CACHE_FIELDS, "kernel cache")
        except ValueError as e:
            raise bad(f"kernel cache {i}: {e}") from None
        if c["name"] in names:
            raise bad(f"kernel cache {i}: a second {c['name']}")
        names.add(c["name"])
        caches.append((c["name"], c["text"]))
    return entries, caches


# ---- kernel caches: one per dynamic-shape graph, shared by every process that builds its shapes ----


def load_kernel_cache_text(path: Path) -> str | None:
    """The serialized kernel cache at path; None when there is none; StoreProblem when it cannot be read."""
    data = _read_regular(Path(path), KERNEL_CACHE_LIMIT, "kernel cache")
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise StoreProblem(f"kernel cache {path} is not text") from None


def save_kernel_cache_text(path: Path, text: str) -> None:
    """Saves a serialized kernel cache, merged with what another process saved there since we loaded it (under a
    lock on a sibling .lock file), atomically. StoreProblem when it cannot be written."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                disk = load_kernel_cache_text(path)
            except StoreProblem:
                disk = None  # unreadable: replaced
            atomic_write(path, merge_kernel_caches(text, disk), follow_symlinks=False)
        finally:
            os.close(fd)
    except OSError as e:
        raise StoreProblem(f"cannot save kernel cache {path}: {e.strerror or e}") from None


_KC_SAME = ("cudnnVersion", "schemaVersion", "operationGraph")


def merge_kernel_caches(ours: str, theirs: str | None) -> str:
    """ours plus the kernels of theirs that ours lacks, when both are cuDNN kernel caches ({"cudnnVersion",
    "schemaVersion", "operationGraph", "kernel_cache": [...]}) of one version and operation graph; else ours."""

    def doc(text: str | None) -> dict | None:
        try:
            d = _loads(text) if text is not None else None
        except ValueError:
            return None
        ok = type(d) is dict and all(k in d for k in _KC_SAME) and type(d.get("kernel_cache")) is list
        return d if ok else None

    a, b = doc(ours), doc(theirs)
    if a is None or b is None or any(a[k] != b[k] for k in _KC_SAME):
        return ours
    seen = {json.dumps(e, sort_keys=True) for e in a["kernel_cache"]}
    extra = []
    for e in b["kernel_cache"]:
        canon = json.dumps(e, sort_keys=True)
        if canon not in seen:
            seen.add(canon)
            extra.append(e)
    return json.dumps({**a, "kernel_cache": a["kernel_cache"] + extra}) if extra else ours


# ---- files ----


def _scan(folder: Path) -> list[os.DirEntry]:
    """The directory's entries by name; none when it does not exist; StoreProblem when it cannot be read."""
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise StoreProblem(f"cannot read {folder}: {e.strerror or e}") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "a special file"


@contextlib.contextmanager
def _open_regular(path: Path, limit: int, what: str, follow_symlinks: bool = False) -> Iterator[object | None]:
    """The open file (binary), or None when there is none. Never opens anything but a regular file: a FIFO would
    block the reader. StoreProblem when it is something else, or over limit bytes, or cannot be read."""
    try:
        st = os.stat(path) if follow_symlinks else os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise StoreProblem(f"{what} {path} is not a regular file ({_kind(st.st_mode)})")
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
        fd = os.open(path, flags)  # O_NONBLOCK: it may have been swapped for a FIFO since the stat
    except FileNotFoundError:
        fd = None
    except OSError as e:
        raise StoreProblem(f"cannot read {what} {path}: {e.strerror or e}") from None
    if fd is None:
        yield None
        return
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreProblem(f"{what} {path} is not a regular file ({_kind(st.st_mode)})")
        if st.st_size > limit:
            raise StoreProblem(f"{what} {path} is {st.st_size} bytes, over the {limit} byte limit")
        yield f


def _read_regular(path: Path, limit: int, what: str, follow_symlinks: bool = False) -> bytes | None:
    with _open_regular(path, limit, what, follow_symlinks) as f:
        if f is None:
            return None
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise StoreProblem(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise StoreProblem(f"{what} {path} grew over the {limit} byte limit")
    return data


def _summary(path: Path, check: bool = True) -> tuple[dict, int]:
    """An entry's JSON object with its blob left out (read past, never held or decoded: D27), and the blob's size
    in bytes. check: validate the other fields. FileNotFoundError, or ValueError / StoreProblem saying why not."""
    with _open_regular(path, ENTRY_LIMIT, "plan entry") as f:
        if f is None:
            raise FileNotFoundError(path)
        head = b""
        while (at := head.find(_BLOB_MARK)) < 0:
            chunk = f.read(_CHUNK)
            if not chunk:  # a small file in another layout: parse it whole
                d = _loads(head)
                blob = d.get("blob") if type(d) is dict else None
                text = blob.encode() if type(blob) is str else b""
                return _summary_of(d, check), len(text) * 3 // 4 - text[-2:].count(b"=")
            if len(head) > 4 * _CHUNK:
                raise ValueError("no blob field in the first MiB")
            head += chunk
        rest, head = head[at + len(_BLOB_MARK) :], head[: at + len(_BLOB_MARK)]
        chars, last = 0, b""
        while (end := rest.find(b'"')) < 0:
            chars, last = chars + len(rest), (last + rest)[-2:]
            rest = f.read(_CHUNK)
            if not rest:
                raise ValueError("the blob is cut short")
        chars, last = chars + end, (last + rest[:end])[-2:]
        tail = rest[end:] + f.read(4 * _CHUNK)
        if f.read(1):
            raise ValueError("more than a MiB after the blob")
    return _summary_of(_loads(head + tail), check), chars * 3 // 4 - last.count(b"=")


def _summary_of(d: object, check: bool) -> dict:
    if check:
        _check_entry(d)
    elif type(d) is not dict:
        raise ValueError(f"the entry is {_brief(d)}, not a JSON object")
    return d


def _loads(data: bytes | str) -> object:
    """json.loads with every failure a ValueError (deep nesting is a RecursionError, bad UTF-8 a UnicodeError)."""
    try:
        return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None


def _cleaned(v: object) -> object:
    if isinstance(v, str):
        return clean(v)
    if isinstance(v, list):
        return [_cleaned(x) for x in v]
    if isinstance(v, dict):
        return {clean(k): _cleaned(x) for k, x in v.items()}
    return v


def atomic_write(path: Path, text: str, *, follow_symlinks: bool = True) -> None:
    """Writes text so that a reader sees the old file or the new one, never a part.

    The file keeps its permission mode; a new file gets 0o666 less the umask, as open() gives. Through a symbolic
    link, the link's target is rewritten and the link stays; follow_symlinks=False replaces the link itself (the
    plan store never writes outside itself). The text goes to a new inode that replaces the name, so other hard
    links to the file keep the old text: writing in place would let a reader, or a crash, see half a file.
    """
    path = Path(os.path.realpath(path)) if follow_symlinks else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
        mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        mode = None
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666 if mode is None else 0o600)
            break
        except FileExistsError:
            continue
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
