"""Fleet stores anywhere, on this CPU: one merge into a directory, a file:// URL or an fsspec memory:// store gives one
manifest; a store served over HTTP on loopback is read by its pin and refuses writes; a manifest or an entry that
does not match its hash is never used; links are not read through; require_store_hit's listing for an H200 key."""

import base64
import functools
import hashlib
import http.server
import os
import threading
from pathlib import Path

import pytest
from cli_util import run_cli

from cudnn_dsl.build.planner import plan_key, untuned
from cudnn_dsl.store.files import StoreProblem
from cudnn_dsl.store.fleet import Fleet, Pin, parse_pin, pins_from_env, read_manifest
from cudnn_dsl.store.plans import Entry, PlanStore
from cudnn_dsl.store.remote import HttpTree, LocalTree, open_tree
from cudnn_dsl.sweep import records as rec
from cudnn_dsl.sweep.merge import latest, merge
from cudnn_dsl.sweep.records import Record
from dsl.pipeline import load

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
H200 = ("NVIDIA H200", "9.0")


@functools.cache
def _graph():
    return load(EXAMPLES / "dynamic_shapes.cdg").program.graph("dynamic_conv")


def tune_record(n: int, engine: int = 3, p50: float = 10.0, host: str = "a") -> Record:
    """What a tune unit records for the conv at N=n on an H200 with this machine's cuDNN (the blob is bytes, as a
    store holds them: nothing here deserializes it)."""
    g = _graph()
    key = plan_key(g, g.instance({"N": n}), g.options, *H200)
    blob = b"plan-%d-%d" % (n, engine)
    result = {
        "plan_name": f"eng{engine}",
        "engine_id": engine,
        "knobs": {},
        "workspace": 0,
        "blob": base64.b64encode(blob).decode(),
        "blob_sha256": hashlib.sha256(blob).hexdigest(),
        "samples_us": [p50],
        "p50_us": p50,
        "p90_us": p50,
        "check": {"passed": True, "text": ""},
    }
    prov = {"host": host, "gpu_uuid": f"GPU-{host}", "time": 1.0}
    return Record("tune", key, g.name, {"N": n}, "b" * 64, "ok", result, prov)


def _staging(root: Path, *records: Record) -> Path:
    for r in records:
        rec.write(root, r)
    return root


def _files(tree, rel="") -> dict[str, bytes]:
    out = {}
    for name, is_dir in tree.listing(rel):
        path = f"{rel}/{name}" if rel else name
        out.update(_files(tree, path) if is_dir else {path: tree.read(path, 1 << 30, "file")})
    return out


@pytest.fixture
def memory_store(request):
    import fsspec

    url = f"memory://fleet-{request.node.name}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


@pytest.fixture
def served(tmp_path):
    """A directory served over HTTP on 127.0.0.1 (a port the system picks), and its URL."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_one_merge_gives_one_store_in_a_directory_a_file_url_and_memory(tmp_path, memory_store):
    staging = _staging(tmp_path / "staging", tune_record(8), tune_record(16), tune_record(16, engine=5, p50=9.0))
    local = merge([staging], tmp_path / "store")
    as_url = merge([staging], f"file://{tmp_path}/url%20store")
    remote = merge([staging], memory_store)
    assert local.digest == as_url.digest == remote.digest and remote.added == 3
    assert _files(open_tree(memory_store)) == _files(LocalTree(tmp_path / "store"))
    assert (tmp_path / "url store" / "LATEST").read_text() == f"sha256:{local.digest}\n"
    assert latest(memory_store) == (local.digest, local.manifest)
    # a remote store is a source too; merging it again adds nothing and changes nothing
    again = merge([memory_store, staging], tmp_path / "store")
    assert again.digest == local.digest and again.added == 0 and not again.damaged
    # a record changed in the object store is damage, reported with its URL, never a winner
    files = _files(open_tree(memory_store))
    (path,) = [p for p, data in files.items() if p.startswith("measurements/") and b'"engine_id":5' in data]
    open_tree(memory_store).write(path, files[path].replace(b'"p50_us":9.0', b'"p50_us":1.0'))
    damaged = merge([], memory_store)
    assert [d.path for d in damaged.damaged] == [f"{memory_store}/{path}"]
    assert damaged.digest != local.digest and len(damaged.manifest["plans"]) == 2


def test_an_http_store_is_read_by_its_pin_and_never_written(tmp_path, served):
    root, url = served
    m = merge([_staging(tmp_path / "staging", tune_record(8))], root)
    assert latest(url) == (m.digest, m.manifest)
    with pytest.raises(StoreProblem, match=f"cannot write {url}/.*read-only"):
        merge([tmp_path / "staging"], url)
    with pytest.raises(StoreProblem, match="cannot be listed"):
        rec.read_all(url)
    g = _graph()
    key = plan_key(g, g.instance({"N": 8}), g.options, *H200)
    notes = []
    hit = Fleet((Pin(url, m.digest),)).lookup(key, notes)
    assert hit.entry.key == key and hit.entry.imported and hit.entry.tuned and not hit.signer and not notes
    assert "rebuilt here" in hit.source and url in hit.source
    other = plan_key(g, g.instance({"N": 16}), g.options, *H200)
    assert Fleet((Pin(url, m.digest),)).lookup(other, notes) is None and not notes


def test_a_pinned_manifest_or_entry_that_does_not_match_its_hash_is_not_used(tmp_path, served):
    root, url = served
    m = merge([_staging(tmp_path / "staging", tune_record(8))], root)
    g = _graph()
    key = plan_key(g, g.instance({"N": 8}), g.options, *H200)
    # a pin of another digest: no such manifest
    notes = []
    assert Fleet((Pin(url, "0" * 64), Pin(url, m.digest))).lookup(key, notes).pin.digest == m.digest
    assert "no manifest" in notes[0] and "not used" in notes[0]
    # the manifest's bytes changed under its name (in another copy: one read and checked serves the process)
    merge([tmp_path / "staging"], root / "copy")
    path = root / "copy" / "manifests" / f"{m.digest}.json"
    path.write_bytes(path.read_bytes().replace(b'"flags":[]', b'"flags":[] '))
    notes = []
    fleet = Fleet((Pin(f"{url}/copy", m.digest),))
    assert fleet.lookup(key, notes) is None
    assert notes == [
        f"fleet store {url}/copy@sha256:{m.digest[:12]}: manifest {url}/copy/manifests/{m.digest}.json does not "
        "match its digest (changed since it was written); not used"
    ]
    assert fleet.lookup(key, notes) is None and len(notes) == 1  # said once
    # an entry changed under the name the manifest gives it
    m2 = merge([tmp_path / "staging"], tmp_path / "second")
    (entry,) = (tmp_path / "second" / "entries").iterdir()
    entry.write_bytes(entry.read_bytes().replace(b'"plan_name":"eng3"', b'"plan_name":"eng4"'))
    notes = []
    assert Fleet((Pin(str(tmp_path / "second"), m2.digest),)).lookup(key, notes) is None
    assert "does not match the manifest's sha256" in notes[0]


def test_an_unreachable_store_is_a_note_not_a_crash(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    g = _graph()
    key = plan_key(g, g.instance({"N": 8}), g.options, *H200)
    notes = []
    assert Fleet((Pin(f"http://127.0.0.1:{port}", "a" * 64),)).lookup(key, notes) is None
    assert f"http://127.0.0.1:{port}" in notes[0] and "not used" in notes[0]


def test_pins_are_url_at_sha256_and_a_bad_one_is_named():
    d = "ab" * 32
    assert pins_from_env({"CUDNN_DSL_STORE": f"s3://b/p@sha256:{d}, /srv/s@sha256:{d}"}) == (
        Pin("s3://b/p", d),
        Pin("/srv/s", d),
    )
    assert pins_from_env({}) == ()
    for bad in ("s3://b/p", f"s3://b/p@sha256:{d[:-1]}", f"@sha256:{d}", f"x@sha256:{d.upper()}"):
        with pytest.raises(StoreProblem, match="CUDNN_DSL_STORE"):
            pins_from_env({"CUDNN_DSL_STORE": bad})
    assert parse_pin(f"x@y@sha256:{d}") == Pin("x@y", d)


def test_reads_are_bounded_and_no_link_is_read_through(tmp_path):
    m = merge([_staging(tmp_path / "staging", tune_record(8))], tmp_path / "store")
    elsewhere = tmp_path / "elsewhere.json"
    manifest = tmp_path / "store" / "manifests" / f"{m.digest}.json"
    os.replace(manifest, elsewhere)
    manifest.symlink_to(elsewhere)
    with pytest.raises(StoreProblem, match="symbolic link"):
        read_manifest(LocalTree(tmp_path / "store"), m.digest)
    with pytest.raises(StoreProblem, match="over the 4 byte limit"):
        LocalTree(tmp_path / "store").read("LATEST", 4, "fleet store pointer")
    with pytest.raises(StoreProblem, match="over the 4 byte limit"):
        open_tree(f"file://{tmp_path}/store").read("LATEST", 4, "fleet store pointer")
    assert isinstance(open_tree("https://example.invalid/s"), HttpTree)


def _put_tuned(store: PlanStore, n: int) -> None:
    g = _graph()
    key = plan_key(g, g.instance({"N": n}), g.options, *H200)
    store.put(Entry(key, g.name, "eng3", 3, {}, b"plan", 0, True))


def test_require_store_hit_lists_every_shape_without_a_tuned_plan_for_an_h200(tmp_path):
    g = _graph()
    store = PlanStore(tmp_path / "cache" / "plans")
    _put_tuned(store, 8)  # tuned here
    m = merge([_staging(tmp_path / "staging", tune_record(16))], tmp_path / "fleet")  # tuned in the fleet
    key24 = plan_key(g, g.instance({"N": 24}), g.options, *H200)
    store.put(Entry(key24, g.name, "eng1", 1, {}, b"plan", 0, False))  # a heuristic plan: not tuned
    fleet = Fleet((Pin(str(tmp_path / "fleet"), m.digest),))
    d = untuned(g, g.instances, g.options, *H200, store, fleet)
    assert d.loc == g.loc and "2 of 4 shapes have no tuned plan" in d.message and "require_store_hit" in d.message
    assert [t for t, _ in d.notes] == [
        f"N=24 on NVIDIA H200 (plan key {key24.id})",
        f"N=32 on NVIDIA H200 (plan key {plan_key(g, g.instance({'N': 32}), g.options, *H200).id})",
    ]
    assert untuned(g, g.instances[:2], g.options, *H200, store, fleet) is None
    # another GPU has none of them
    assert "4 of 4" in untuned(g, g.instances, g.options, "NVIDIA A100-SXM4-80GB", "8.0", store, fleet).message


def test_run_require_tuned_refuses_before_planning_and_passes_once_the_fleet_has_them(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    m = merge([_staging(tmp_path / "staging", *(tune_record(n) for n in (8, 16, 24)))], tmp_path / "fleet")
    monkeypatch.setenv("CUDNN_DSL_STORE", f"{tmp_path / 'fleet'}@sha256:{m.digest}")
    cdg = EXAMPLES / "dynamic_shapes.cdg"
    r = run_cli("run", cdg, "--require-tuned", "--no-reference")
    assert r.returncode == 1 and "1 of 4 shapes have no tuned plan" in r.stderr and "N=32 on NVIDIA H200" in r.stderr
    assert "plan       for" not in r.stdout  # nothing was planned
    r = run_cli("run", cdg, "--require-tuned", "--no-reference", "--shape", "N=8,24", "--target", "h200")
    assert r.returncode == 0, r.stderr
    # the option in the file asks the same
    text = cdg.read_text().replace("  dim N in", "  option require_store_hit = true\n  dim N in")
    (tmp_path / "served.cdg").write_text(text)
    r = run_cli("run", tmp_path / "served.cdg", "--no-reference", "--target", "a100")
    assert r.returncode == 1 and "4 of 4 shapes" in r.stderr and "NVIDIA A100" in r.stderr
    assert run_cli("run", cdg, "--require-tuned", "--no-cache").returncode == 2
