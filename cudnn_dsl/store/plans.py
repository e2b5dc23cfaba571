"""The versioned plan store: entries, searches and partition choices on disk, export and import of bundles.

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
import hashlib
import json
import os
import time
from pathlib import Path

import attrs

from cudnn_dsl.store.files import (
    READ_CHUNK,
    StoreProblem,
    atomic_write,
    clean,
    cleaned,
    is_temp,
    loads,
    locked_dir,
    open_regular,
    read_regular,
    scan_dir,
)
from cudnn_dsl.store.kernels import KERNEL_CACHE_NAME, load_kernel_cache_text, save_kernel_cache_text
from cudnn_dsl.store.keys import FORMAT, PlanKey, cache_dir, is_entry_id
from cudnn_dsl.store.schema import (
    BUNDLE_FIELDS,
    KERNEL_CACHE_FIELDS,
    PARTITION_FIELDS,
    SEARCH_FIELDS,
    brief,
    check_entry,
    check_fields,
)
from dsl import files

ENTRY_LIMIT = 64 << 20
"""bytes; a serialized plan is a few MB at most"""
BUNDLE_LIMIT = 512 << 20
SEARCH_LIMIT = 64 << 20
"""bytes of one search record (tune --exhaustive): some 200 bytes per configuration tried"""

_BLOB_MARK = b'\n "blob": "'
"""how to_json's indent=1 layout starts the blob: a newline cannot occur inside a JSON string"""


# ---- entries ----


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
        check_entry(d)
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
        if not KERNEL_CACHE_NAME.fullmatch(name):
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
        data = read_regular(p, ENTRY_LIMIT, "plan entry")
        if data is None:
            return None
        try:
            return Entry.from_json(loads(data))
        except ValueError as e:
            raise StoreProblem(f"corrupt plan entry {p.name}: {e}") from None

    def _place(self, entry: Entry, force: bool, elsewhere: bool = False) -> str:
        """Writes entry unless the stored one should stay: 'written', 'kept' (tuned here) or 'same'. An entry
        made elsewhere (imported, or `elsewhere`: a signed fleet store's) never replaces a local tuned one."""
        try:
            old = self.get(entry.key)
        except StoreProblem:
            old = None  # damaged: not worth keeping
        elsewhere = elsewhere or entry.imported
        if old is not None and elsewhere and old.same_plan(entry):
            return "same"  # keeps the local copy, which is not marked imported
        if old is not None and old.tuned and not force and (elsewhere or not entry.tuned):
            return "kept"
        text = json.dumps(entry.to_json(), indent=1)
        if len(text) > ENTRY_LIMIT:
            raise StoreProblem(f"the plan of {entry.graph} is {len(text)} bytes as JSON, over the {ENTRY_LIMIT} limit")
        try:
            atomic_write(self.path(entry.key), text, follow_symlinks=False)
        except OSError as e:
            raise StoreProblem(f"cannot write to the plan store {self.root}: {e.strerror or e}") from None
        return "written"

    def _locked(self):
        """Serializes read-then-write sequences between processes."""
        return locked_dir(self.root, "the plan store")

    # ---- search records (tune --exhaustive): what was tried, so that a later search resumes ----

    def search_path(self, key: PlanKey) -> Path:
        return self.root.parent / "searches" / f"{key.id}.json"

    def get_search(self, key: PlanKey) -> list[dict]:
        """The configurations tried for key so far ([] when none): each {"engine", "knobs", "source", "status",
        and "name", "median_us", "workspace", "error" where known}; StoreProblem when the record is unusable."""
        p = self.search_path(key)
        data = read_regular(p, SEARCH_LIMIT, "search record")
        if data is None:
            return []
        try:
            d = loads(data)
            check_fields(d, SEARCH_FIELDS, "search record")
            if PlanKey(**d["key"]) != key:
                raise ValueError("it was made for another key")
        except (ValueError, TypeError) as e:
            raise StoreProblem(f"search record {p.name}: {e}") from None
        return [cleaned(t) for t in d["tried"]]

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
        data = read_regular(p, ENTRY_LIMIT, "partition record")
        if data is None:
            return None
        try:
            d = loads(data)
            if type(d) is dict and "format" in d and not PARTITION_FIELDS["format"][0](d["format"]):
                raise ValueError(f"format {brief(d['format'])} is not {FORMAT} (made by another version)")
            check_fields(d, PARTITION_FIELDS, "partition record")
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
        for e in scan_dir(self.root):
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
            return cleaned(shown)
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
            for e in scan_dir(folder):
                what = "temp_files" if is_temp(e.name) else kind
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
        for e in scan_dir(self.root):
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
        for e in scan_dir(self.kernels):
            if e.name.endswith(".cache"):
                try:
                    if not KERNEL_CACHE_NAME.fullmatch(e.name):
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

    def take(self, entries: list[Entry], force: bool = False) -> dict[str, int]:
        """Stores entries made elsewhere (a bundle's, a fleet store's), under one lock: how many were written,
        kept (a local tuned entry they would replace, unless force) and the same plan as the one here."""
        counts = {"written": 0, "kept": 0, "same": 0}
        with self._locked():
            for entry in entries:
                counts[self._place(entry, force, elsewhere=True)] += 1
        return counts

    def import_(self, src: Path, *, force: bool = False, kernels: bool = False) -> Imported:
        """Checks the whole bundle, then stores its entries (marked imported: the planner rebuilds them from their
        engine and knobs, never loading their blobs). A local tuned entry is kept unless force. Its kernel caches
        are compiled code, merged into the local ones only with kernels=True (a bundle you trust). Unreadable when
        src is no regular file within BUNDLE_LIMIT; StoreProblem, with nothing written, when any part of the
        bundle is wrong: the message names the first bad entry."""
        entries, caches = _read_bundle(Path(src))
        counts = self.take([attrs.evolve(entry, imported=True) for entry in entries], force)
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
    data = files.read_regular(src, BUNDLE_LIMIT, "bundle")  # the user's file: Unreadable, a usage error

    def bad(why: str) -> StoreProblem:
        return StoreProblem(f"{src}: {why}; nothing was imported")

    try:
        bundle = loads(data)
        check_fields(bundle, BUNDLE_FIELDS, "the bundle", {"kernel_caches": (lambda v: type(v) is list, "a list")})
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
            check_fields(c, KERNEL_CACHE_FIELDS, "kernel cache")
        except ValueError as e:
            raise bad(f"kernel cache {i}: {e}") from None
        if c["name"] in names:
            raise bad(f"kernel cache {i}: a second {c['name']}")
        names.add(c["name"])
        caches.append((c["name"], c["text"]))
    return entries, caches


# ---- entry files ----


def _summary(path: Path, check: bool = True) -> tuple[dict, int]:
    """An entry's JSON object with its blob left out (read past, never held or decoded: D27), and the blob's size
    in bytes. check: validate the other fields. FileNotFoundError, or ValueError / StoreProblem saying why not."""
    with open_regular(path, ENTRY_LIMIT, "plan entry") as f:
        if f is None:
            raise FileNotFoundError(path)
        head = b""
        while (at := head.find(_BLOB_MARK)) < 0:
            chunk = f.read(READ_CHUNK)
            if not chunk:  # a small file in another layout: parse it whole
                d = loads(head)
                blob = d.get("blob") if type(d) is dict else None
                text = blob.encode() if type(blob) is str else b""
                return _summary_of(d, check), len(text) * 3 // 4 - text[-2:].count(b"=")
            if len(head) > 4 * READ_CHUNK:
                raise ValueError("no blob field in the first MiB")
            head += chunk
        rest, head = head[at + len(_BLOB_MARK) :], head[: at + len(_BLOB_MARK)]
        chars, last = 0, b""
        while (end := rest.find(b'"')) < 0:
            chars, last = chars + len(rest), (last + rest)[-2:]
            rest = f.read(READ_CHUNK)
            if not rest:
                raise ValueError("the blob is cut short")
        chars, last = chars + end, (last + rest[:end])[-2:]
        tail = rest[end:] + f.read(4 * READ_CHUNK)
        if f.read(1):
            raise ValueError("more than a MiB after the blob")
    return _summary_of(loads(head + tail), check), chars * 3 // 4 - last.count(b"=")


def _summary_of(d: object, check: bool) -> dict:
    if check:
        check_entry(d)
    elif type(d) is not dict:
        raise ValueError(f"the entry is {brief(d)}, not a JSON object")
    return d
