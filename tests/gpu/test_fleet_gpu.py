"""The serving path on a GPU: a plan tuned here, merged into a fleet store served over HTTP on loopback, found by a
fresh process through its pin (rebuilt from engine id + knobs; loaded as it is when the manifest is signed by a
trusted key), copied into the local store; require_store_hit passing and refusing on the same GPU."""

import base64
import functools
import http.server
import threading
from pathlib import Path

import pytest

from tests.cli_util import run_cli
from tests.helpers import matches

pytestmark = [pytest.mark.gpu]

ROOT = Path(__file__).resolve().parents[2]
MM = str(ROOT / "examples" / "plan_serialization.cdg")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """A fleet store holding the winner `tune` found for the matmul here, served on 127.0.0.1: (its pin, the
    winner's plan name). The test then runs in a fresh, empty local cache."""
    import torch

    import cudnn_dsl
    from cudnn_dsl.store.plans import PlanStore
    from cudnn_dsl.sweep.merge import merge
    from cudnn_dsl.sweep.records import Record, write
    from cudnn_dsl.tune.heuristics import tune

    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "tuning"))
    cg = cudnn_dsl.compile(MM, iterations=3, warmup=1)
    inst = cg.graph.instances[0]
    winner = tune(cg, inst).winner
    key = cg.planner.key(inst)
    entry = PlanStore(tmp_path / "tuning" / "plans").get(key)
    result = {
        "plan_name": entry.plan_name,
        "engine_id": entry.engine_id,
        "knobs": entry.knobs,
        "workspace": entry.workspace,
        "blob": base64.b64encode(entry.blob).decode(),
        "blob_sha256": entry.to_json()["blob_sha256"],
        "samples_us": winner.times_us,
        "p50_us": winner.median_us,
        "p90_us": max(winner.times_us),
        "check": {"passed": True, "text": "ok"},
    }
    uuid = str(torch.cuda.get_device_properties(cg.device).uuid)
    record = Record("tune", key, cg.graph.name, {}, "0" * 64, "ok", result, {"gpu_uuid": uuid, "time": 1.0})
    write(tmp_path / "staging", record)
    served = tmp_path / "served"
    m = merge([tmp_path / "staging"], served)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "serving"))
    yield f"http://127.0.0.1:{server.server_address[1]}@sha256:{m.digest}", entry.plan_name, served, m.digest
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_a_pinned_remote_plan_is_rebuilt_here_and_copied_into_the_local_store(fleet, tmp_path, monkeypatch):
    import cudnn_dsl

    pin, plan_name, _, _ = fleet
    monkeypatch.setenv("CUDNN_DSL_STORE", pin)
    cg = cudnn_dsl.compile(MM, require_store_hit=True)  # the fleet has it: no refusal
    exe = cg.executable(cg.graph.instances[0])
    assert exe.source.startswith("fleet store http://127.0.0.1:") and "rebuilt here" in exe.source, exe.notes
    assert exe.plan_name == plan_name and any("copied into the local plan store" in n for n in exe.notes)
    matches(cg, cg.allocate_inputs())
    # the next process finds it in the local store, a plan made here
    again = cudnn_dsl.compile(MM)
    assert again.executable(again.graph.instances[0]).source == "plan store (serialized plan)"
    # run --require-tuned looks it up for this GPU, then serves it
    r = run_cli("run", MM, "--require-tuned")
    assert r.returncode == 0 and "from plan store (serialized plan)" in r.stdout, r.stderr
    assert run_cli("run", ROOT / "examples" / "conv_bias_relu.cdg", "--require-tuned").returncode == 1


def test_a_signed_manifest_from_a_trusted_key_loads_the_serialized_plan(fleet, tmp_path, monkeypatch):
    pytest.importorskip("cryptography")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    import cudnn_dsl
    from cudnn_dsl.store import signing
    from cudnn_dsl.store.remote import open_tree

    pin, plan_name, served, digest = fleet
    key = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "k").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    line = signing.sign(open_tree(served), digest, str(tmp_path / "k"))
    (tmp_path / "trusted").write_text(f"{line} fleet\n")
    monkeypatch.setenv("CUDNN_DSL_STORE", pin)
    monkeypatch.setenv("CUDNN_DSL_TRUSTED_KEYS", str(tmp_path / "trusted"))
    cg = cudnn_dsl.compile(MM)
    exe = cg.executable(cg.graph.instances[0])
    assert "serialized plan; manifest signed by fleet" in exe.source, (exe.source, exe.notes)
    assert exe.plan_name == plan_name
    matches(cg, cg.allocate_inputs())


def test_require_store_hit_refuses_an_untuned_graph_before_building(fleet, monkeypatch):
    import cudnn_dsl
    from cudnn_dsl.build.planner import NotTuned

    pin, _, _, _ = fleet
    monkeypatch.setenv("CUDNN_DSL_STORE", pin)
    with pytest.raises(NotTuned, match="1 of 1 shapes have no tuned plan") as e:
        cudnn_dsl.compile(str(ROOT / "examples" / "conv_bias_relu.cdg"), require_store_hit=True)
    assert "NVIDIA" in e.value.diagnostics[0].notes[0][0]
