"""The plan store on the CPU: keys, atomic writes, concurrency, corruption handling, export/import."""

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import attrs
import pytest

import cudnn_dsl.store.kernels as kernels_mod
import cudnn_dsl.store.plans as store_mod
from cudnn_dsl.store.files import LOCK_NAME, StoreProblem, atomic_write
from cudnn_dsl.store.kernels import load_kernel_cache_text, merge_kernel_caches, save_kernel_cache_text
from cudnn_dsl.store.keys import PlanKey, graph_digest, is_entry_id
from cudnn_dsl.store.plans import Entry, PlanStore
from dsl import files
from dsl.pipeline import program

TEXT = """graph g {
  input a : half[4, 8]
  input b : half[4, 8]
  scalar s : float = 0.5
  output y = (a + b) * s
}
"""


def key(**kw) -> PlanKey:
    base = {"digest": "d" * 64, "gpu": "NVIDIA H200", "compute_capability": "9.0", "cudnn_backend": 91900}
    base["cudnn_frontend"] = "1.32.0"
    return PlanKey(**{**base, **kw})


def entry(k: PlanKey, blob: bytes = b"\x00plan\xff" * 10, plan="eng4_k24=3") -> Entry:
    return Entry(k, "g", plan, 4, {"TILE_SIZE": 3}, blob, 1024, True, {"median_us": 12.5}, 1.0)


def test_digest_ignores_file_and_scalar_values_but_not_shapes():
    g1 = program(text=TEXT, file="one.cdg").graphs[0]
    g2 = program(text=TEXT.replace("0.5", "2.0"), file="two.cdg").graphs[0]
    g3 = program(text=TEXT.replace("[4, 8]", "[4, 16]"), file="one.cdg").graphs[0]
    d = lambda g: graph_digest(g, g.instances[0])
    assert d(g1) == d(g2)
    assert d(g1) != d(g3)


def test_every_key_field_changes_the_entry_id():
    ids = {
        key().id,
        key(gpu="NVIDIA H100").id,
        key(compute_capability="8.0").id,
        key(cudnn_backend=92800).id,
        key(cudnn_frontend="1.33.0").id,
        key(digest="e" * 64).id,
    }
    assert len(ids) == 6


def test_round_trip(tmp_path):
    store = PlanStore(tmp_path)
    k = key()
    store.put(entry(k))
    got = store.get(k)
    assert got.blob == entry(k).blob and got.knobs == {"TILE_SIZE": 3} and got.tuned


def test_missing_is_none_and_no_temp_files_are_left(tmp_path):
    store = PlanStore(tmp_path)
    assert store.get(key()) is None
    store.put(entry(key()))
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME, f"{key().id}.json"]  # the writers' lock stays


@pytest.mark.parametrize("damage", ["truncate", "not_json", "bad_base64", "checksum", "format", "foreign_key"])
def test_damaged_entries_raise_store_problem(tmp_path, damage):
    store = PlanStore(tmp_path)
    k = key()
    p = store.put(entry(k))
    d = json.loads(p.read_text())
    text = {
        "truncate": p.read_text()[:100],
        "not_json": "\x00\x01garbage",
        "bad_base64": json.dumps({**d, "blob": "%%%"}),
        "checksum": json.dumps({**d, "blob_sha256": "0" * 64}),
        "format": json.dumps({**d, "format": 99}),
        "foreign_key": json.dumps({**d, "key": {**d["key"], "gpu": "Other GPU"}}),
    }[damage]
    p.write_text(text)
    with pytest.raises(StoreProblem):
        store.get(k)


def _writer(root, n, plan):
    store = PlanStore(root)
    for _ in range(n):
        store.put(entry(key(), blob=plan.encode() * 5000, plan=plan))


def test_concurrent_writers_of_one_key_leave_one_valid_entry(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), 30, f"plan{i}")) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got = PlanStore(tmp_path).get(key())
    assert got.plan_name in {f"plan{i}" for i in range(4)}
    assert got.blob == got.plan_name.encode() * 5000
    assert len([p for p in tmp_path.iterdir() if p.name != LOCK_NAME]) == 1


def test_export_import_and_clear(tmp_path):
    a, b = PlanStore(tmp_path / "a" / "plans"), PlanStore(tmp_path / "b" / "plans")
    a.put(entry(key()))
    a.put(entry(key(gpu="NVIDIA H100")))
    assert a.export(tmp_path / "bundle.json").entries == 2
    assert b.import_(tmp_path / "bundle.json").imported == 2
    assert b.get(key(gpu="NVIDIA H100")).plan_name == "eng4_k24=3"
    assert b.clear().entries == 2 and b.listing() == []


def test_cache_command_lists_shows_exports_imports_and_clears(tmp_path):
    env = {**os.environ, "CUDNN_DSL_CACHE_DIR": str(tmp_path / "cache")}
    store = PlanStore(tmp_path / "cache" / "plans")
    store.put(entry(key()))
    (store.root / "broken.json").write_text("{not json")

    def cdsl(*args):
        return subprocess.run(
            [sys.executable, "-m", "cudnn_dsl", "cache", *args], check=False, capture_output=True, text=True, env=env
        )

    ls = cdsl("ls").stdout
    assert key().id in ls and "eng4_k24=3" in ls and "tuned" in ls and "unreadable" in ls
    shown = json.loads(cdsl("show", key().id).stdout)
    assert shown["plan_name"] == "eng4_k24=3" and shown["blob"].startswith("<")
    assert cdsl("show", "nope").returncode == 2
    bundle = tmp_path / "bundle.json"
    assert "exported 1 entries" in cdsl("export", str(bundle)).stdout
    assert "removed 2 entries" in cdsl("clear").stdout
    assert "empty" in cdsl("ls").stdout
    assert "imported 1 entries" in cdsl("import", str(bundle)).stdout
    assert PlanStore(tmp_path / "cache" / "plans").get(key()).plan_name == "eng4_k24=3"


# ---- hardening: damaged entries, special files, listing, clear, export, import, kernel caches, atomic_write ----


@contextlib.contextmanager
def within(seconds: int):
    """Fails the test instead of hanging it (a FIFO opened for reading blocks forever)."""

    def alarm(*_):
        raise TimeoutError(f"took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def stored(tmp_path) -> tuple[PlanStore, Path, dict]:
    s = PlanStore(tmp_path / "plans")
    p = s.put(entry(key()))
    return s, p, json.loads(p.read_text())


DAMAGE = {
    "json_list": lambda d: "[1, 2]",
    "json_string": lambda d: '"entry"',
    "json_null": lambda d: "null",
    "deep_nesting": lambda d: "[" * 100000 + "]" * 100000,
    "deep_nesting_in_field": lambda d: (
        json.dumps({**d, "timing": 1})[:-1] + ', "x": ' + "[" * 100000 + "]" * 100000 + "}"
    ),
    "huge_integer": lambda d: json.dumps(d).replace('"workspace": 1024', '"workspace": ' + "9" * 5000),
    "bad_utf8": lambda d: json.dumps(d).replace('"g"', '"g\udcff"', 1),
    "empty": lambda d: "",
    "format_true": lambda d: json.dumps({**d, "format": True}),
    "format_string": lambda d: json.dumps({**d, "format": "1"}),
    "key_not_dict": lambda d: json.dumps({**d, "key": [1]}),
    "key_extra_field": lambda d: json.dumps({**d, "key": {**d["key"], "extra": 1}}),
    "key_backend_string": lambda d: json.dumps({**d, "key": {**d["key"], "cudnn_backend": "91900"}}),
    "engine_float": lambda d: json.dumps({**d, "engine_id": 1.5}),
    "engine_bool": lambda d: json.dumps({**d, "engine_id": True}),
    "engine_huge": lambda d: json.dumps({**d, "engine_id": 10**30}),
    "engine_negative": lambda d: json.dumps({**d, "engine_id": -1}),
    "workspace_negative": lambda d: json.dumps({**d, "workspace": -1}),
    "workspace_absurd": lambda d: json.dumps({**d, "workspace": 2**40 + 1}),
    "workspace_float": lambda d: json.dumps({**d, "workspace": 1024.0}),
    "tuned_string": lambda d: json.dumps({**d, "tuned": "false"}),
    "tuned_int": lambda d: json.dumps({**d, "tuned": 1}),
    "created_string_nan": lambda d: json.dumps({**d, "created": "nan"}),
    "created_nan": lambda d: json.dumps({**d, "created": float("nan")}),
    "created_inf": lambda d: json.dumps({**d, "created": float("inf")}),
    "created_negative": lambda d: json.dumps({**d, "created": -5.0}),
    "knobs_list": lambda d: json.dumps({**d, "knobs": [1]}),
    "knob_float": lambda d: json.dumps({**d, "knobs": {"TILE_SIZE": 3.5}}),
    "knob_string": lambda d: json.dumps({**d, "knobs": {"TILE_SIZE": "3"}}),
    "timing_string": lambda d: json.dumps({**d, "timing": {"median_us": "fast"}}),
    "blob_int": lambda d: json.dumps({**d, "blob": 5}),
    "graph_int": lambda d: json.dumps({**d, "graph": 5}),
    "sha_not_hex": lambda d: json.dumps({**d, "blob_sha256": None}),
    "imported_string": lambda d: json.dumps({**d, "imported": "no"}),
    "unknown_field": lambda d: json.dumps({**d, "surprise": 1}),
}
REQUIRED = ["format", "key", "graph", "plan_name", "engine_id", "knobs", "blob", "blob_sha256", "workspace", "tuned"]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_get_reports_every_damaged_entry_as_store_problem(tmp_path, damage):
    s, p, d = stored(tmp_path)
    p.write_bytes(DAMAGE[damage](d).encode("utf-8", "surrogateescape"))
    with pytest.raises(StoreProblem):
        s.get(key())


@pytest.mark.parametrize("field", REQUIRED)
def test_get_reports_a_missing_field(tmp_path, field):
    s, p, d = stored(tmp_path)
    del d[field]
    p.write_text(json.dumps(d))
    with pytest.raises(StoreProblem, match=field):
        s.get(key())


def test_get_accepts_old_entries_without_optional_fields(tmp_path):
    s, p, d = stored(tmp_path)
    for optional in ("timing", "created", "imported"):
        d.pop(optional, None)
    p.write_text(json.dumps(d))
    assert s.get(key()).timing == {} and not s.get(key()).imported


def test_get_never_opens_special_files(tmp_path):
    s = PlanStore(tmp_path / "plans")
    s.root.mkdir()
    p = s.path(key())
    os.mkfifo(p)
    with within(5), pytest.raises(StoreProblem, match="not a regular file"):
        s.get(key())
    p.unlink()
    p.mkdir()
    with pytest.raises(StoreProblem, match="not a regular file"):
        s.get(key())
    p.rmdir()
    (tmp_path / "elsewhere.json").write_text(json.dumps(entry(key()).to_json()))
    p.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(StoreProblem, match="not a regular file"):
        s.get(key())


def test_get_refuses_an_oversized_entry_before_reading_it(tmp_path, monkeypatch):
    s, _, _ = stored(tmp_path)
    monkeypatch.setattr(store_mod, "ENTRY_LIMIT", 100)
    with pytest.raises(StoreProblem, match="limit"):
        s.get(key())


def test_put_refuses_an_entry_that_get_would_refuse_as_too_large(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "ENTRY_LIMIT", 1000)
    with pytest.raises(StoreProblem, match="limit"):
        PlanStore(tmp_path / "plans").put(entry(key(), blob=b"x" * 1000))


def test_get_of_an_entry_deleted_after_it_was_seen_is_none(tmp_path, monkeypatch):
    """D30: `clear` removes the file between the existence check and the read."""
    s = PlanStore(tmp_path / "plans")
    s.root.mkdir()
    monkeypatch.setattr(Path, "exists", lambda self, **kw: True)  # it existed a moment ago
    assert s.get(key()) is None


def test_get_during_clear_is_an_entry_or_none(tmp_path):
    s = PlanStore(tmp_path / "plans")
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            s.put(entry(key()))
            s.path(key()).unlink(missing_ok=True)

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(3000):
            got = s.get(key())
            assert got is None or got.plan_name == "eng4_k24=3"
    finally:
        stop.set()
        t.join()


# ---- put: tuned entries are kept ----


def test_put_keeps_a_tuned_entry_unless_forced(tmp_path):
    s = PlanStore(tmp_path / "plans")
    s.put(entry(key()))  # tuned
    heuristic = attrs.evolve(entry(key(), plan="heur"), tuned=False)
    assert s.put(heuristic) is None
    assert s.get(key()).plan_name == "eng4_k24=3"
    assert s.put(heuristic, force=True) == s.path(key())
    assert s.get(key()).plan_name == "heur"
    assert s.put(entry(key(), plan="tuned2")) is not None  # tuned replaces untuned
    s.path(key()).write_text("{broken")
    assert s.put(heuristic) is not None  # a damaged tuned entry is not worth keeping
    assert s.get(key()).plan_name == "heur"


# ---- listing and show ----


def test_listing_reports_damage_and_special_files_without_hanging(tmp_path):
    s, p, d = stored(tmp_path)
    (s.root / ("a" * 32 + ".json")).write_text("[1]")
    (s.root / ("b" * 32 + ".json")).mkdir()
    os.mkfifo(s.root / ("c" * 32 + ".json"))
    (s.root / ("d" * 32 + ".json")).write_text("[" * 100000 + "]" * 100000)
    (s.root / ("e" * 32 + ".json")).write_text(json.dumps({**d, "created": "nan"}))
    (s.root / ("f" * 32 + ".json")).symlink_to(p)
    with within(10):
        rows = {r.id: r for r in s.listing()}
    assert rows[key().id].problem is None and rows[key().id].tuned and rows[key().id].plan_name == "eng4_k24=3"
    for c in "abcdef":
        assert rows[c * 32].problem, c
        assert rows[c * 32].line().startswith(c * 32) and "unreadable" in rows[c * 32].line()


def test_listing_does_not_decode_blobs(tmp_path):
    """D27: listing a 20 MB entry must not hold it (or its blob) in memory."""
    s = PlanStore(tmp_path / "plans")
    s.put(entry(key(), blob=os.urandom(20 << 20)))
    tracemalloc.start()
    try:
        rows = s.listing()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rows[0].problem is None and rows[0].blob_bytes == 20 << 20
    assert peak < 2 << 20


def test_listing_and_show_strip_terminal_control_characters(tmp_path):
    """D26: fields of an imported entry must not reach the terminal raw."""
    s = PlanStore(tmp_path / "plans")
    evil = Entry(key(gpu="\x1b]0;pwned\x07GPU\x9b"), "ok\x1b[2J", "plan\x7f\r", 4, {"K\x1b": 1}, b"x", 0, False)
    s.put(evil)
    line = s.listing()[0].line()
    shown = json.dumps(s.show(evil.key.id))
    for text in (line, shown):
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text), repr(text)
    assert "ok[2J" in line and "]0;pwnedGPU" in line


def test_show_summarises_an_entry_and_refuses_unreadable_ones(tmp_path):
    s, p, d = stored(tmp_path)
    shown = s.show(key().id)
    assert shown["plan_name"] == "eng4_k24=3" and shown["blob"] == "<60 bytes>" and shown["status"] == "ok"
    p.write_text(json.dumps({**d, "blob_sha256": "0" * 64}))
    assert "checksum" in s.show(key().id)["status"]
    p.write_text("[1]")
    with pytest.raises(StoreProblem, match="unreadable"):
        s.show(key().id)
    assert s.show("0" * 32) is None
    for bad in ("../x", "/etc/passwd", "A" * 32, "a" * 31, "a" * 33, key().id + "/"):
        assert not is_entry_id(bad)
        with pytest.raises(StoreProblem):
            s.show(bad)
    assert is_entry_id(key().id)


# ---- clear ----


def test_clear_removes_entries_temp_files_and_kernel_caches_without_parsing(tmp_path):
    s, p, _ = stored(tmp_path)
    (s.root / ("a" * 32 + ".json")).write_text("[" * 100000 + "]" * 100000)
    (s.root / f".{p.name}.x1y2.tmp").write_text("partial")  # D29: left by a killed writer
    (s.root / ("b" * 32 + ".json")).mkdir()
    (s.root / ("b" * 32 + ".json") / "inside").write_text("keep")
    os.mkfifo(s.root / ("c" * 32 + ".json"))
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (s.root / ("d" * 32 + ".json")).symlink_to(outside)
    kc = s.kernel_cache_path("g", "0" * 64)
    save_kernel_cache_text(kc, "{}")
    (kc.parent / "notes.txt").write_text("keep")
    with within(10):
        r = s.clear()
    assert (r.entries, r.temp_files, r.kernel_caches) == (2, 1, 1)
    assert sorted(r.left) == sorted(["b" * 32 + ".json", "c" * 32 + ".json", "d" * 32 + ".json"])
    assert (s.root / ("b" * 32 + ".json") / "inside").read_text() == "keep" and outside.read_text() == "{}"
    assert not kc.exists() and (kc.parent / "notes.txt").exists()


def test_clear_of_a_store_that_cannot_be_changed_is_a_store_problem(tmp_path):
    (tmp_path / "cache").write_text("a file where the cache directory should be")
    s = PlanStore(tmp_path / "cache" / "plans")
    with pytest.raises(StoreProblem, match="Not a directory"):
        s.clear()
    s = PlanStore(tmp_path / "plans")
    s.put(entry(key()))
    s.root.chmod(0o500)
    try:
        if os.access(s.root, os.W_OK):
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(StoreProblem, match=str(s.root)):
            s.clear()
    finally:
        s.root.chmod(0o700)


# ---- export ----


def test_export_bundles_valid_regular_entries_and_kernel_caches_only(tmp_path):
    s, _, d = stored(tmp_path)
    (s.root / ("a" * 32 + ".json")).write_text("{broken")
    (s.root / ("b" * 32 + ".json")).write_text(json.dumps(d))  # a valid entry under the wrong name
    outside = tmp_path / "foreign.json"
    outside.write_text(json.dumps({"secret": 1}))
    (s.root / ("c" * 32 + ".json")).symlink_to(outside)
    os.mkfifo(s.root / ("e" * 32 + ".json"))
    save_kernel_cache_text(s.kernel_cache_path("g", "1" * 64), KC(1))
    with within(10):
        r = s.export(tmp_path / "bundle.json")
    assert (r.entries, r.kernel_caches) == (1, 1)
    assert len(r.skipped) == 4 and all(x[:32] in {"a" * 32, "b" * 32, "c" * 32, "e" * 32} for x in r.skipped)
    bundle = json.loads((tmp_path / "bundle.json").read_text())
    assert bundle["format"] == 1 and len(bundle["entries"]) == 1 and "secret" not in json.dumps(bundle)
    assert bundle["kernel_caches"] == [{"name": f"g-{'1' * 24}.cache", "text": KC(1)}]


def test_export_to_an_unwritable_place_is_a_store_problem(tmp_path):
    s, _, _ = stored(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreProblem, match="file"):
        s.export(tmp_path / "file" / "bundle.json")


# ---- import ----


def bundle_of(*entries: Entry, **extra) -> dict:
    return {"format": 1, "entries": [e.to_json() for e in entries], **extra}


def _bad_bundles() -> dict:
    good = entry(key()).to_json()
    second = entry(key(gpu="Other")).to_json()
    return {
        "not_json": "{not json",
        "empty": "",
        "list": "[]",
        "null": "null",
        "format_2": json.dumps({"format": 2, "entries": []}),
        "no_entries": json.dumps({"format": 1}),
        "entries_int": json.dumps({"format": 1, "entries": 5}),
        "entries_dict": json.dumps({"format": 1, "entries": {"a": good}}),
        "entry_not_dict": json.dumps({"format": 1, "entries": [good, [1]]}),
        "bad_checksum": json.dumps({"format": 1, "entries": [good, {**second, "blob_sha256": "0" * 64}]}),
        "bad_base64": json.dumps({"format": 1, "entries": [good, {**second, "blob": "%%%"}]}),
        "missing_field": json.dumps(
            {"format": 1, "entries": [good, {k: v for k, v in second.items() if k != "graph"}]}
        ),
        "entry_format_99": json.dumps({"format": 1, "entries": [good, {**second, "format": 99}]}),
        "key_types": json.dumps({"format": 1, "entries": [good, {**second, "key": {**second["key"], "gpu": 5}}]}),
        "deep": '{"format": 1, "entries": [' + "[" * 100000 + "]" * 100000 + "]}",
        "binary": "\udcff\udcfe\x00\x01",
        "duplicate_key": json.dumps({"format": 1, "entries": [good, good]}),
        "kernel_cache_traversal": json.dumps(
            {"format": 1, "entries": [good], "kernel_caches": [{"name": "../../x.cache", "text": "{}"}]}
        ),
        "kernel_cache_text_int": json.dumps(
            {"format": 1, "entries": [good], "kernel_caches": [{"name": f"g-{'0' * 24}.cache", "text": 5}]}
        ),
    }


@pytest.mark.parametrize("case", sorted(_bad_bundles()))
def test_import_validates_the_whole_bundle_before_writing_anything(tmp_path, case):
    src = tmp_path / "bundle.json"
    src.write_bytes(_bad_bundles()[case].encode("utf-8", "surrogateescape"))
    s = PlanStore(tmp_path / "cache" / "plans")
    with pytest.raises(StoreProblem) as e:
        s.import_(src)
    if case.startswith(("bad_", "missing", "entry_", "key_")):
        assert "entry 1" in str(e.value)
    assert not s.root.exists() or not any(s.root.glob("*.json"))
    assert not (tmp_path / "cache" / "kernels").exists() or not any((tmp_path / "cache" / "kernels").iterdir())


def test_import_refuses_an_oversized_or_special_bundle(tmp_path, monkeypatch):
    src = tmp_path / "bundle.json"
    src.write_text(json.dumps(bundle_of(entry(key()))))
    s = PlanStore(tmp_path / "plans")
    monkeypatch.setattr(store_mod, "BUNDLE_LIMIT", 100)
    with pytest.raises(files.TooLarge, match="limit"):
        s.import_(src)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with within(5), pytest.raises(files.Unreadable, match="not a regular file"):
        s.import_(fifo)


def test_import_keeps_local_tuned_entries_unless_forced(tmp_path):
    s = PlanStore(tmp_path / "plans")
    s.put(entry(key(), plan="local"))  # tuned here
    s.put(attrs.evolve(entry(key(gpu="B"), plan="local"), tuned=False))
    s.put(entry(key(gpu="C")))
    src = tmp_path / "bundle.json"
    src.write_text(
        json.dumps(
            bundle_of(
                entry(key(), plan="theirs"),
                entry(key(gpu="B"), plan="theirs"),
                entry(key(gpu="C")),
                entry(key(gpu="D"), plan="theirs"),
            )
        )
    )
    r = s.import_(src)
    assert (r.imported, r.kept, r.skipped) == (2, 1, 1)
    assert s.get(key()).plan_name == "local" and s.get(key(gpu="B")).plan_name == "theirs"
    assert s.get(key(gpu="B")).imported and not s.get(key()).imported
    r = s.import_(src, force=True)
    assert r.kept == 0 and s.get(key()).plan_name == "theirs" and s.get(key()).imported


def test_import_of_an_old_bundle_without_kernel_caches(tmp_path):
    src = tmp_path / "bundle.json"
    src.write_text(json.dumps(bundle_of(entry(key()))))
    r = PlanStore(tmp_path / "plans").import_(src)
    assert (r.imported, r.kernel_caches) == (1, 0)


def test_export_import_round_trip_merges_kernel_caches(tmp_path):
    a, b = PlanStore(tmp_path / "a" / "plans"), PlanStore(tmp_path / "b" / "plans")
    a.put(entry(key()))
    save_kernel_cache_text(a.kernel_cache_path("g", "2" * 64), KC(1, 2))
    save_kernel_cache_text(b.kernel_cache_path("g", "2" * 64), KC(3))
    a.export(tmp_path / "bundle.json")
    r = b.import_(tmp_path / "bundle.json")  # a bundle's kernels are compiled code: not taken unless asked for
    assert (r.imported, r.kernel_caches, r.kernel_caches_left) == (1, 0, 1)
    assert sorted(
        e["id"] for e in json.loads(load_kernel_cache_text(b.kernel_cache_path("g", "2" * 64)))["kernel_cache"]
    ) == [3]
    r = b.import_(tmp_path / "bundle.json", kernels=True)
    assert r.kernel_caches == 1
    merged = json.loads(load_kernel_cache_text(b.kernel_cache_path("g", "2" * 64)))
    assert sorted(e["id"] for e in merged["kernel_cache"]) == [1, 2, 3]
    assert b.get(key()).blob == entry(key()).blob


# ---- kernel caches ----


def KC(*ids: int, version: int = 92801, graph: str = "og") -> str:
    return json.dumps(
        {
            "cudnnVersion": version,
            "schemaVersion": 1,
            "operationGraph": {"ops": [graph]},
            "kernel_cache": [{"id": i, "binary": f"k{i}"} for i in ids],
        }
    )


def ids_of(text: str) -> list[int]:
    return sorted(e["id"] for e in json.loads(text)["kernel_cache"])


def test_kernel_cache_path_is_named_like_the_runtime_names_it(tmp_path):
    s = PlanStore(tmp_path / "cache" / "plans")
    digest = hashlib.sha256(b"x").hexdigest()
    assert s.kernel_cache_path("conv", digest) == tmp_path / "cache" / "kernels" / f"conv-{digest[:24]}.cache"
    with pytest.raises(StoreProblem):
        s.kernel_cache_path("../x", digest)


def test_kernel_cache_saves_merge_instead_of_overwriting(tmp_path):
    p = PlanStore(tmp_path / "plans").kernel_cache_path("g", "3" * 64)
    assert load_kernel_cache_text(p) is None
    save_kernel_cache_text(p, KC(1, 2))
    save_kernel_cache_text(p, KC(2, 3))  # a second process, which loaded the cache before the first saved
    assert ids_of(load_kernel_cache_text(p)) == [1, 2, 3]
    save_kernel_cache_text(p, KC(9, version=99999))  # another cuDNN: ours alone
    assert ids_of(load_kernel_cache_text(p)) == [9]
    save_kernel_cache_text(p, KC(8, graph="other"))  # another operation graph: ours alone
    assert ids_of(load_kernel_cache_text(p)) == [8]
    p.write_text("\x00garbage")
    save_kernel_cache_text(p, KC(4))
    assert ids_of(load_kernel_cache_text(p)) == [4]
    save_kernel_cache_text(p, "not json from a future cuDNN")
    assert load_kernel_cache_text(p) == "not json from a future cuDNN"


def test_merge_kernel_caches_dedups_by_content():
    a = json.dumps({"cudnnVersion": 1, "schemaVersion": 1, "operationGraph": {}, "kernel_cache": [{"a": 1, "b": 2}]})
    b = json.dumps({"cudnnVersion": 1, "schemaVersion": 1, "operationGraph": {}, "kernel_cache": [{"b": 2, "a": 1}]})
    assert len(json.loads(merge_kernel_caches(a, b))["kernel_cache"]) == 1
    assert merge_kernel_caches(a, None) == a and merge_kernel_caches(a, "[]") == a


def test_load_kernel_cache_refuses_special_and_oversized_files(tmp_path, monkeypatch):
    p = tmp_path / "k.cache"
    os.mkfifo(p)
    with within(5), pytest.raises(StoreProblem, match="not a regular file"):
        load_kernel_cache_text(p)
    p.unlink()
    p.write_text(KC(1))
    monkeypatch.setattr(kernels_mod, "KERNEL_CACHE_LIMIT", 10)
    with pytest.raises(StoreProblem, match="limit"):
        load_kernel_cache_text(p)


def _kc_writer(path, who, rounds):
    for r in range(rounds):
        save_kernel_cache_text(Path(path), KC(who * 1000 + r))


def test_concurrent_kernel_cache_writers_keep_each_others_kernels(tmp_path):
    p = tmp_path / "kernels" / f"g-{'4' * 24}.cache"
    ctx = mp.get_context("fork")  # spawn would import torch in every child (seconds each)
    procs = [ctx.Process(target=_kc_writer, args=(str(p), w, 25)) for w in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert ids_of(load_kernel_cache_text(p)) == sorted(w * 1000 + r for w in range(4) for r in range(25))


# ---- atomic_write (D13) ----


@pytest.mark.parametrize("mode", [0o644, 0o664, 0o600, 0o755])
def test_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path, mode):
    p = tmp_path / "f.cdg"
    p.write_text("old")
    p.chmod(mode)
    atomic_write(p, "new")
    assert p.read_text() == "new" and (p.stat().st_mode & 0o7777) == mode


def test_atomic_write_gives_a_new_file_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "new.json", "{}")
    finally:
        os.umask(old)
    assert ((tmp_path / "new.json").stat().st_mode & 0o777) == 0o644


def test_atomic_write_writes_through_a_symlink(tmp_path):
    real = tmp_path / "real.cdg"
    real.write_text("old")
    real.chmod(0o644)
    link = tmp_path / "link.cdg"
    link.symlink_to("real.cdg")
    atomic_write(link, "new")
    assert link.is_symlink() and real.read_text() == "new" and (real.stat().st_mode & 0o777) == 0o644
    assert sorted(x.name for x in tmp_path.iterdir()) == ["link.cdg", "real.cdg"]


def test_atomic_write_replaces_a_hard_link_with_a_new_file(tmp_path):
    """Documented: a hard-linked file gets a new inode (the other name keeps the old text)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("old")
    os.link(a, b)
    atomic_write(a, "new")
    assert a.read_text() == "new" and b.read_text() == "old"


# ---- the CLI on damaged stores and bundles (D7, D9, D23, D26) ----

ROOT = Path(__file__).resolve().parents[1]
# Runs several `cudnn-dsl` command lines in one process (each start imports torch: seconds), like __main__ does,
# turning any exception that escapes main() into "traceback".
DRIVER = """
import contextlib, io, json, sys, traceback
from cudnn_dsl.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException:
            traceback.print_exc()
            rc = "traceback"
    results.append([rc, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def env_for(tmp_path) -> dict:
    return {**os.environ, "CUDNN_DSL_CACHE_DIR": str(tmp_path / "cache")}


def cache_cli(tmp_path, *args):
    """One real `python -m cudnn_dsl cache ...`."""
    return subprocess.run(
        [sys.executable, "-m", "cudnn_dsl", "cache", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        env=env_for(tmp_path),
        timeout=60,
        cwd=ROOT,
    )


def cache_cli_many(tmp_path, *argvs) -> list[tuple[int, str, str]]:
    """(rc, stdout, stderr) of each `cudnn-dsl cache ARGS...`, run by cli.main in one process."""
    argvs = [["cache", *map(str, a)] for a in argvs]
    p = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(argvs)],
        check=False,
        capture_output=True,
        text=True,
        env=env_for(tmp_path),
        timeout=120,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    results = [tuple(r) for r in json.loads(p.stdout)]
    for argv, (rc, _, err) in zip(argvs, results, strict=True):
        assert rc in (0, 1, 2) and "Traceback" not in err, (argv, rc, err)
        assert rc == 0 or err.startswith("cudnn-dsl: error:"), (argv, err)
    return results


def test_cli_on_a_damaged_store_reports_without_tracebacks_or_hangs(tmp_path):
    """D7: a JSON list, a directory and a FIFO named like entries, deep nesting; D23: `show` takes ids only."""
    s = PlanStore(tmp_path / "cache" / "plans")
    s.put(entry(key()))
    aa, bb, cc, dd = ("a" * 32 + ".json", "b" * 32 + ".json", "c" * 32 + ".json", "d" * 32 + ".json")
    (s.root / aa).write_text("[1]")
    (s.root / bb).mkdir()
    os.mkfifo(s.root / cc)
    (s.root / dd).write_text("[" * 100000 + "]" * 100000)
    (tmp_path / "x.json").write_text(json.dumps(entry(key()).to_json()))
    bad_ids = ["aa", "../x", "/etc/passwd", str(tmp_path / "x"), key().id.upper()]
    ls, *shows = cache_cli_many(
        tmp_path, ["ls"], *(["show", n[:32]] for n in (aa, bb, cc, dd)), *(["show", b] for b in bad_ids)
    )
    assert ls[0] == 0 and key().id in ls[1]
    assert all(f"{n[:32]}  unreadable" in ls[1] for n in (aa, bb, cc, dd)), ls[1]
    assert [rc for rc, _, _ in shows] == [1] * 4 + [2] * len(bad_ids)
    ex = cache_cli(tmp_path, "export", tmp_path / "bundle.json")
    assert ex.returncode == 0 and "exported 1 entries" in ex.stdout and "Traceback" not in ex.stderr
    cl = cache_cli(tmp_path, "clear")
    assert cl.returncode == 0 and "removed 3 entries" in cl.stdout and "Traceback" not in cl.stderr
    assert sorted(x.name for x in s.root.iterdir() if not x.name.startswith(".")) == [bb, cc]


def test_cli_on_a_store_that_is_a_file(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "plans").write_text("not a directory")
    src = tmp_path / "bundle.json"
    src.write_text(json.dumps(bundle_of(entry(key()))))
    results = cache_cli_many(tmp_path, ["ls"], ["clear"], ["export", tmp_path / "out.json"], ["import", src])
    assert [rc for rc, _, _ in results] == [1, 1, 1, 1]
    assert all("plans" in err for _, _, err in results)


def test_cli_import_of_crafted_bundles_fails_cleanly_and_writes_nothing(tmp_path):
    """D9: one real command line, then every crafted bundle through cli.main."""
    bundles = _bad_bundles()
    for name, text in bundles.items():
        (tmp_path / f"{name}.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    p = cache_cli(tmp_path, "import", tmp_path / "list.json")
    assert p.returncode == 1 and p.stderr.startswith("cudnn-dsl: error:") and "Traceback" not in p.stderr
    results = cache_cli_many(tmp_path, *(["import", tmp_path / f"{name}.json"] for name in bundles))
    for name, (rc, _, err) in zip(bundles, results, strict=True):
        assert rc == 1, (name, err)
        if name.startswith(("bad_", "missing", "entry_", "key_")):
            assert "entry 1" in err, (name, err)
    assert "has no field 'entries'" in results[list(bundles).index("no_entries")][2]
    assert not any((tmp_path / "cache").rglob("*.json")) and not any((tmp_path / "cache").rglob("*.cache"))


def test_cli_ls_strips_terminal_escapes_of_imported_entries(tmp_path):
    """D26."""
    src = tmp_path / "bundle.json"
    evil = Entry(key(gpu="\x1b]0;pwned\x07"), "ok\x1b[2J", "p\x9b1m", 4, {}, b"x", 0, True)
    src.write_text(json.dumps(bundle_of(evil)))
    imported, ls, show = cache_cli_many(tmp_path, ["import", src], ["ls"], ["show", evil.key.id])
    assert imported[0] == 0
    for out in (ls[1], show[1]):
        assert "pwned" in out and not any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) <= 0x9F for c in out)


def test_a_partition_choice_round_trips_beside_its_key_and_damage_is_a_store_problem(tmp_path):
    from cudnn_dsl.store.plans import PartitionChoice

    store, k = PlanStore(tmp_path / "plans"), key()
    assert store.get_partition(k) is None
    store.put_partition(k, "g", PartitionChoice((1, 3), {"whole": 24.3, "1,3": 18.1}))
    assert store.get_partition(k) == PartitionChoice((1, 3), {"whole": 24.3, "1,3": 18.1})
    path, other = store.partition_path(k), key(gpu="other")
    store.partition_path(other).write_text(path.read_text())  # a record under another key's name
    with pytest.raises(StoreProblem, match="made for another key"):
        store.get_partition(other)
    for text, why in [
        ('{"format": 7}', "format 7 is not 1 .made by another version."),
        (path.read_text().replace('"cuts": [\n  1,\n  3\n ]', '"cuts": [3, 1]'), "increasing node indices"),
        ("[", "partition record"),
        (path.read_text().replace('"whole"', '"\\u001b[2J"'), "a map of partitions"),
    ]:
        path.write_text(text)
        with pytest.raises(StoreProblem, match=why):
            store.get_partition(k)
    assert store.clear().partitions == 2 and not path.exists()


def test_the_store_locks_where_fcntl_is_missing_and_never_through_a_link(tmp_path):
    """filelock, not fcntl: on a platform without fcntl (blocked here) the store still imports, locks and stores;
    a link planted as the lock file is refused, and its target left as it was."""
    code = (
        "import sys; sys.modules['fcntl'] = None\n"
        "from pathlib import Path\n"
        "from cudnn_dsl.store.files import locked_dir\n"
        "from cudnn_dsl.store.kernels import save_kernel_cache_text, load_kernel_cache_text\n"
        f"root = Path({str(tmp_path)!r})\n"
        "with locked_dir(root / 'plans', 'the plan store'):\n"
        "    (root / 'plans' / 'inside').write_text('x')\n"
        "save_kernel_cache_text(root / 'k' / 'g-0.cache', 'text')\n"
        "assert load_kernel_cache_text(root / 'k' / 'g-0.cache') == 'text'\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "plans" / "inside").is_file()
    from cudnn_dsl.store.files import locked_dir

    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / LOCK_NAME).symlink_to(victim)
    with within(30), pytest.raises(StoreProblem, match=r"cannot lock the plan store .*\.lock"):
        with locked_dir(tmp_path / "linked", "the plan store"):
            pass
    assert victim.read_text() == "keep"
