"""Fleet stores anywhere, on this CPU: one merge into a directory, a file:// URL or an fsspec memory:// store gives one
manifest; a store served over HTTP on loopback is read by its pin and refuses writes; a manifest or an entry that
does not match its hash is never used; links are not read through; require_store_hit's listing for an H200 key."""

import base64
import functools
import hashlib
import http.server
import json
import os
import sys
import threading
from pathlib import Path

import pytest
import sweep_util
from cli_util import run_cli

from cudnn_dsl.build.planner import plan_key, untuned
from cudnn_dsl.store.files import LOCK_NAME, StoreProblem
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
    return sweep_util.tune_record(key, g.name, {"N": n}, b"plan-%d-%d" % (n, engine), engine, p50, host)


def _staging(root: Path, *records: Record) -> Path:
    for r in records:
        rec.write(root, r)
    return root


def _files(tree, rel="") -> dict[str, bytes]:
    """The store's files, but a local store's lock file (an object store has no locks)."""
    out = {}
    for name, is_dir in tree.listing(rel):
        if name == LOCK_NAME:
            continue
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


# ---- signed manifests, cache verify, cache pull ----


def _key_pair(tmp_path, name="fleet"):
    """An Ed25519 key in OpenSSH's format (as ssh-keygen -t ed25519 writes it) and a trusted-keys file of its
    public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    private = tmp_path / f"{name}.key"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    trusted = tmp_path / f"{name}.trusted"
    trusted.write_text(f"# the fleet's keys\n{public.decode()} {name} signer\n")
    return private, trusted


def test_a_manifest_signed_by_a_trusted_key_lets_its_plans_load_as_they_are(tmp_path, served):
    from cudnn_dsl.store import signing

    pytest.importorskip("cryptography")
    root, url = served
    m = merge([_staging(tmp_path / "staging", tune_record(8))], root)
    key, trusted = _key_pair(tmp_path)
    other_key, other_trusted = _key_pair(tmp_path, "other")
    r = run_cli("cache", "sign", f"{root}@sha256:{m.digest}", "--key", key)
    assert r.returncode == 0, r.stderr
    assert signing.check(open_tree(url), m.digest, str(trusted)) == signing.Status(
        "fleet signer", "signed by trusted key fleet signer"
    )
    assert "none of them trusted" in signing.check(open_tree(url), m.digest, str(other_trusted)).text
    g = _graph()
    key8 = plan_key(g, g.instance({"N": 8}), g.options, *H200)
    hit = Fleet((Pin(url, m.digest),), str(trusted)).lookup(key8, [])
    assert hit.signer == "fleet signer" and not hit.entry.imported and "serialized plan" in hit.source
    notes = []
    untrusted = Fleet((Pin(url, m.digest),), str(other_trusted)).lookup(key8, notes)
    assert untrusted.entry.imported and "none of them trusted here" in notes[0]
    # a second signer is added beside the first; a changed signature is damage
    assert run_cli("cache", "sign", f"{root}@sha256:{m.digest}", "--key", other_key).returncode == 0
    sig = root / "manifests" / f"{m.digest}.sig"
    assert len(json.loads(sig.read_text())["signatures"]) == 2
    d = json.loads(sig.read_text())
    d["signatures"][0]["signature"] = base64.b64encode(b"\0" * 64).decode()
    sig.write_text(json.dumps(d))
    status = signing.check(open_tree(url), m.digest, str(trusted))
    assert status.bad and not status.signer and "does not verify" in status.text
    # a manifest that is not there, or a key that is not Ed25519, is not signed
    assert run_cli("cache", "sign", f"{root}@sha256:{'0' * 64}", "--key", key).returncode == 1
    (tmp_path / "rsa").write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    assert "private key" in run_cli("cache", "sign", f"{root}@sha256:{m.digest}", "--key", tmp_path / "rsa").stderr


def test_without_cryptography_a_signed_manifest_is_treated_as_unsigned(tmp_path, monkeypatch):
    from cudnn_dsl.store import signing

    pytest.importorskip("cryptography")
    m = merge([_staging(tmp_path / "staging", tune_record(8))], tmp_path / "store")
    key, trusted = _key_pair(tmp_path)
    signing.sign(open_tree(tmp_path / "store"), m.digest, str(key))
    for name in [n for n in sys.modules if n.split(".")[0] == "cryptography"] + ["cryptography"]:
        monkeypatch.setitem(sys.modules, name, None)  # an import of it fails, as where it is not installed
    status = signing.check(open_tree(tmp_path / "store"), m.digest, str(trusted))
    assert not status.signer and not status.bad and "cryptography" in status.text and "unsigned" in status.text
    with pytest.raises(StoreProblem, match="cudnn-dsl\\[fleet\\]"):
        signing.sign(open_tree(tmp_path / "store"), m.digest, str(key))


def test_cache_verify_checks_what_the_manifest_names_and_its_coverage(tmp_path, memory_store):
    staging = _staging(tmp_path / "staging", tune_record(8), tune_record(16))
    m = merge([staging], memory_store)
    cdg = EXAMPLES / "dynamic_shapes.cdg"
    r = run_cli("cache", "verify", memory_store, "--coverage", cdg, "--json", tmp_path / "v.json")
    assert r.returncode == 1 and "coverage: 2 of 4" in r.stdout and "missing  " in r.stdout
    v = json.loads((tmp_path / "v.json").read_text())
    assert v["verify"]["manifest"] == f"sha256:{m.digest}" and v["verify"]["entries"] == 2
    assert v["verify"]["measurements"] == 2 and not v["verify"]["problems"]
    assert [c["shape"] for c in v["coverage"] if c["cudnn"]] == ["N=8", "N=16"]
    assert run_cli("cache", "verify", f"{memory_store}@sha256:{m.digest}").returncode == 0
    other = run_cli("cache", "verify", memory_store, "--coverage", cdg, "--gpu", "NVIDIA A100-SXM4-80GB")
    assert other.returncode == 1 and "coverage: 0 of 4" in other.stdout
    # a manifest with no tuned plan at all covers nothing, on any GPU
    merge([], tmp_path / "empty")
    none = run_cli("cache", "verify", tmp_path / "empty", "--coverage", cdg)
    assert none.returncode == 1 and "coverage: 0 of 4" in none.stdout and "on any GPU" in none.stdout
    # a measurement changed, and an entry gone: damage, exit 1
    tree = open_tree(memory_store)
    (keydir, _), *_ = tree.listing("measurements")
    ((record, _),) = tree.listing(f"measurements/{keydir}")
    tree.write(f"measurements/{keydir}/{record}", b"{}")
    r = run_cli("cache", "verify", memory_store)
    assert r.returncode == 1 and "changed since it was written" in r.stderr
    entry = tree.listing("entries")[0][0]
    tree.fs.rm(f"{tree.root}/entries/{entry}")
    r = run_cli("cache", "verify", memory_store)
    assert r.returncode == 1 and "which is missing" in r.stderr
    # a pin that matches no manifest is refused
    assert run_cli("cache", "verify", f"{memory_store}@sha256:{'0' * 64}").returncode == 1
    assert run_cli("cache", "verify", f"{memory_store}@sha256:xyz").returncode == 2


def test_cache_pull_copies_one_gpu_types_plans_into_the_local_store(tmp_path, monkeypatch, served):
    from cudnn_dsl.sweep.local import local_gpus

    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    root, url = served
    a100 = attrs_evolve_gpu(tune_record(8), "NVIDIA A100-SXM4-80GB")
    m = merge([_staging(tmp_path / "staging", tune_record(8), tune_record(16), a100)], root)
    pin = f"{url}@sha256:{m.digest}"
    r = run_cli("cache", "pull", pin, "--gpu", "NVIDIA H200", "--json", tmp_path / "p.json")
    assert r.returncode == 0, r.stderr
    assert "pulled 2 plans for NVIDIA H200" in r.stdout and "left 1 plans" in r.stdout
    rows = PlanStore(tmp_path / "cache" / "plans").listing()
    assert len(rows) == 2 and all(row.tuned and row.imported and row.gpu == "NVIDIA H200" for row in rows)
    again = run_cli("cache", "pull", pin, "--gpu", "NVIDIA H200")
    assert "pulled 0 plans" in again.stdout and "2 were already here" in again.stdout
    # only the graphs of some files: none of these is the conv
    r = run_cli("cache", "pull", pin, "--gpu", "NVIDIA A100-SXM4-80GB", "--graphs", EXAMPLES / "sdpa.cdg")
    assert "pulled 0 plans" in r.stdout and "left 3 plans of other GPUs or graphs" in r.stdout
    if not local_gpus():
        r = run_cli("cache", "pull", pin, "--gpu", "auto")
        assert r.returncode == 2 and "nvidia-smi lists no GPU" in r.stderr
    assert run_cli("cache", "pull", url, "--gpu", "NVIDIA H200").returncode == 2  # a deployment pins a manifest
    assert run_cli("cache", "pull", pin).returncode == 2
    assert run_cli("cache", "ls", "--gpu", "x").returncode == 2


def attrs_evolve_gpu(r: Record, gpu: str) -> Record:
    import attrs

    return attrs.evolve(r, key=attrs.evolve(r.key, gpu=gpu, compute_capability="8.0"))


def test_sweep_merge_of_a_source_with_damage_reports_it_and_fails(tmp_path):
    staging = _staging(tmp_path / "staging", tune_record(8))
    keydir = next((staging / "measurements").iterdir())
    os.mkfifo(keydir / f"{'b' * 64}.json")  # a FIFO named like a record: never opened
    (keydir / f"{'c' * 64}.json").symlink_to("/etc/hostname")
    r = run_cli("sweep", "merge", staging, "--into", tmp_path / "store", "--json", tmp_path / "out.json")
    assert r.returncode == 1, r.stderr
    damaged = json.loads((tmp_path / "out.json").read_text())["merge"]["damaged"]
    assert [(Path(d["path"]).name, d["why"].rsplit("(", 1)[1]) for d in damaged] == [
        (f"{'b' * 64}.json", "a FIFO)"),
        (f"{'c' * 64}.json", "a symbolic link)"),
    ]
    assert "damaged:" in r.stderr and (tmp_path / "store" / "LATEST").is_file()


def _lying(store: Path, edit) -> str:
    """A manifest made by hand from the store's newest one (`edit` changes it), written under its own digest and
    made LATEST: the pin matches it, what it says is what a hostile or careless writer put there."""
    digest = (store / "LATEST").read_text().strip().removeprefix("sha256:")
    manifest = json.loads((store / "manifests" / f"{digest}.json").read_bytes())
    edit(manifest)
    data = json.dumps(manifest).encode()
    digest = hashlib.sha256(data).hexdigest()
    (store / "manifests" / f"{digest}.json").write_bytes(data)
    (store / "LATEST").write_text(f"sha256:{digest}\n")
    return digest


def _row(manifest: dict) -> dict:
    (row,) = manifest["plans"].values()
    return row


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda m: _row(m).update(cudnn_backend="x"), "field 'cudnn_backend' is 'x'"),
        (lambda m: _row(m).update(gpu="NVIDIA A100-SXM4-80GB"), "its fields are those of key"),
        (lambda m: m["support"].update(k={"sha256": "../../../etc/hostname"}), "names no entry by its sha256"),
        (lambda m: m["support"].update(k=5), "not a JSON object"),
    ],
)
def test_a_manifest_whose_rows_lie_about_their_key_is_not_used(tmp_path, edit, words):
    store = tmp_path / "store"
    merge([_staging(tmp_path / "staging", tune_record(8))], store)
    digest = _lying(store, edit)
    with pytest.raises(StoreProblem, match="is not a fleet store manifest: .*key"):
        read_manifest(LocalTree(store), digest)
    r = run_cli("cache", "verify", store, "--coverage", EXAMPLES / "dynamic_shapes.cdg")
    assert r.returncode == 1 and words in r.stderr and "covered" not in r.stdout, r.stderr
    spec = tmp_path / "sweep.toml"
    spec.write_text(f'[sweep]\ngraphs = ["{EXAMPLES}/sdpa.cdg"]\nstore = "store"\n[plan_targets]\ntargets = ["h200"]\n')
    r = run_cli("sweep", spec, "--dry-run")
    assert r.returncode == 1 and words in r.stderr


class _Trickle(http.server.BaseHTTPRequestHandler):
    """Sends a file's headers, then a byte at a time, each well within the per-request timeout."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        for _ in range(1000):
            self.wfile.write(b" ")
            self.wfile.flush()
            threading.Event().wait(0.1)

    def log_message(self, *args):
        pass


def test_an_http_store_that_trickles_is_given_up_on_not_waited_for(monkeypatch):

    from cudnn_dsl.store import remote

    monkeypatch.setattr(remote, "HTTP_FILE_S", 1.0)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(StoreProblem, match=r"LATEST: not sent whole within 1 s"):
            HttpTree(url).read("LATEST", 1 << 20, "fleet store pointer")
    finally:
        server.shutdown()
        server.server_close()


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Fails the first `failures` requests as `how` says ('503', '429', '403' or 'drop': the connection closed with
    no answer), then serves b'sha256:...' for every path; counts the requests."""

    failures, how, seen = 0, "503", 0

    def do_GET(self):
        cls = type(self)
        cls.seen += 1
        if cls.seen <= cls.failures:
            if cls.how == "drop":
                self.close_connection = True
                return
            self.send_response(int(cls.how))
            if cls.how == "429":
                self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"sha256:" + b"a" * 64 + b"\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "how, failures, read, requests",
    [
        ("503", 2, True, 3),  # transient: retried until it answers
        ("429", 3, True, 4),
        ("drop", 1, True, 2),
        ("503", 9, False, 4),  # bounded: 1 + HTTP_RETRIES attempts, then the last failure, said
        ("403", 1, False, 1),  # a 4xx is the answer: never retried
    ],
)
def test_an_http_store_read_is_retried_on_transient_failures_only_and_boundedly(
    monkeypatch, how, failures, read, requests
):
    from cudnn_dsl.store import remote

    monkeypatch.setattr(remote, "HTTP_BACKOFF_S", 0.01)
    handler = type("Handler", (_Flaky,), {"failures": failures, "how": how, "seen": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tree = HttpTree(f"http://127.0.0.1:{server.server_address[1]}")
        if read:
            assert tree.read("LATEST", 1 << 20, "fleet store pointer") == b"sha256:" + b"a" * 64 + b"\n"
        else:
            with pytest.raises(
                StoreProblem, match=f"HTTP {how}" + (" .* \\(after 4 attempts\\)" if requests > 1 else "")
            ):
                tree.read("LATEST", 1 << 20, "fleet store pointer")
        assert handler.seen == requests
    finally:
        server.shutdown()
        server.server_close()
