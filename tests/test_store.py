"""The plan store on the CPU: keys, atomic writes, concurrency, corruption handling, export/import."""

import json
import multiprocessing as mp

import pytest

from cudnn_dsl.store import Entry, PlanKey, PlanStore, StoreProblem, graph_digest
from dsl.pipeline import program

TEXT = """graph g {
  input a : half[4, 8]
  input b : half[4, 8]
  scalar s : float = 0.5
  output y = (a + b) * s
}
"""


def key(**kw) -> PlanKey:
    base = dict(digest="d" * 64, gpu="NVIDIA H200", compute_capability="9.0", cudnn_backend=91900,
                cudnn_frontend="1.32.0")
    return PlanKey(**{**base, **kw})


def entry(k: PlanKey, blob: bytes = b"\x00plan\xff" * 10, plan="eng4_k24=3") -> Entry:
    return Entry(k, "g", plan, 4, {"TILE_SIZE": 3}, blob, 1024, True, {"median_us": 12.5}, 1.0)


def test_digest_ignores_file_and_scalar_values_but_not_shapes():
    g1 = program(text=TEXT, file="one.cdg").graphs[0]
    g2 = program(text=TEXT.replace("0.5", "2.0"), file="two.cdg").graphs[0]
    g3 = program(text=TEXT.replace("[4, 8]", "[4, 16]"), file="one.cdg").graphs[0]
    d = lambda g: graph_digest(g, g.instances[0])  # noqa: E731
    assert d(g1) == d(g2)
    assert d(g1) != d(g3)


def test_every_key_field_changes_the_entry_id():
    ids = {key().id, key(gpu="NVIDIA H100").id, key(compute_capability="8.0").id,
           key(cudnn_backend=92800).id, key(cudnn_frontend="1.33.0").id, key(digest="e" * 64).id}
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
    assert [p.name for p in tmp_path.iterdir()] == [f"{key().id}.json"]


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
    assert len(list(tmp_path.iterdir())) == 1


def test_export_import_and_clear(tmp_path):
    a, b = PlanStore(tmp_path / "a"), PlanStore(tmp_path / "b")
    a.put(entry(key()))
    a.put(entry(key(gpu="NVIDIA H100")))
    assert a.export(tmp_path / "bundle.json") == 2
    assert b.import_(tmp_path / "bundle.json") == 2
    assert b.get(key(gpu="NVIDIA H100")).plan_name == "eng4_k24=3"
    assert b.clear() == 2 and b.entries() == []


def test_cache_command_lists_shows_exports_imports_and_clears(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "CUDNN_DSL_CACHE_DIR": str(tmp_path / "cache")}
    store = PlanStore(tmp_path / "cache" / "plans")
    store.put(entry(key()))
    (store.root / "broken.json").write_text("{not json")

    def cdsl(*args):
        return subprocess.run([sys.executable, "-m", "cudnn_dsl", "cache", *args], capture_output=True, text=True,
                              env=env)

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
