"""Tune -> store -> reload -> run, recovery from bad entries, dynamic shapes, CUDA-graph capture."""

import json
from pathlib import Path

import pytest

from tests.helpers import matches

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_store")]

ROOT = Path(__file__).resolve().parents[2]
MM = str(ROOT / "examples" / "plan_serialization.cdg")


def test_tune_stores_the_winner_and_a_new_process_reuses_it(private_store):
    import cudnn_dsl
    from cudnn_dsl.tune.heuristics import tune

    cg = cudnn_dsl.compile(MM, iterations=3, warmup=1)
    result = tune(cg, cg.graph.instances[0])
    assert result.winner is not None and len(result.ranked) >= 1
    assert result.ranked[0].median_us <= result.ranked[-1].median_us
    assert result.check.startswith("c: ok"), result.check
    entries = list((private_store / "plans").glob("*.json"))
    assert len(entries) == 1 and json.loads(entries[0].read_text())["tuned"] is True

    again = cudnn_dsl.compile(MM)
    exe = again.executable(again.graph.instances[0])
    assert exe.source == "plan store (serialized plan)", exe.notes
    assert exe.plan_name == result.winner.name
    matches(again, again.allocate_inputs())


def test_a_corrupt_entry_is_reported_and_rebuilt(private_store):
    import cudnn_dsl

    first = cudnn_dsl.compile(MM)
    first.executable(first.graph.instances[0])
    [entry] = (private_store / "plans").glob("*.json")
    entry.write_text(entry.read_text()[: len(entry.read_text()) // 2])  # truncated
    cg = cudnn_dsl.compile(MM)
    exe = cg.executable(cg.graph.instances[0])
    assert exe.source == "heuristics"
    assert any("corrupt plan entry" in n for n in exe.notes)
    matches(cg, cg.allocate_inputs())
    json.loads(entry.read_text())  # rewritten whole


def test_a_blob_that_does_not_load_falls_back_to_engine_and_knobs(private_store):
    import base64
    import hashlib

    import cudnn_dsl

    first = cudnn_dsl.compile(MM)
    first.executable(first.graph.instances[0])
    [entry] = (private_store / "plans").glob("*.json")
    d = json.loads(entry.read_text())
    junk = b"not a cudnn plan" * 8
    d["blob"], d["blob_sha256"] = base64.b64encode(junk).decode(), hashlib.sha256(junk).hexdigest()
    entry.write_text(json.dumps(d))
    cg = cudnn_dsl.compile(MM)
    exe = cg.executable(cg.graph.instances[0])
    assert exe.source == "plan store (engine id + knobs)", exe.notes
    assert any("did not load" in n for n in exe.notes)
    matches(cg, cg.allocate_inputs())


def test_a_foreign_version_entry_is_not_used(private_store):
    import cudnn_dsl

    first = cudnn_dsl.compile(MM)
    first.executable(first.graph.instances[0])
    [entry] = (private_store / "plans").glob("*.json")
    d = json.loads(entry.read_text())
    d["key"]["cudnn_backend"] = 1
    entry.write_text(json.dumps(d))
    cg = cudnn_dsl.compile(MM)
    exe = cg.executable(cg.graph.instances[0])
    assert exe.source == "heuristics"
    assert any("was made for" in n for n in exe.notes)


def test_dynamic_shapes_share_a_kernel_cache_and_all_match(private_store):
    import cudnn_dsl

    cg = cudnn_dsl.compile(str(ROOT / "examples" / "dynamic_shapes.cdg"), shape_mode="dynamic")
    for inst in cg.graph.instances:
        matches(cg, cg.allocate_inputs(dict(inst.binding)))
    assert cg.planner.use_kernel_cache
    assert list((private_store / "kernels").glob("*.cache"))


def test_auto_shape_mode_keeps_static_plans_while_nothing_compiles_at_run_time():
    """The conv's static plans compile nothing at run time: every shape gets one (dynamic-shape plans run
    slower); the matmul's first plan compiles its kernel, so the shapes after it share the kernel cache."""
    import cudnn_dsl

    conv = cudnn_dsl.compile(str(ROOT / "examples" / "dynamic_shapes.cdg"))
    conv.planner.use_store = False  # build every shape here
    notes = [conv.executable(inst).notes for inst in conv.graph.instances]
    assert all(any("static plan for this shape: it compiles nothing" in n for n in shape) for shape in notes), notes
    assert not conv.planner.use_kernel_cache
    for inst in conv.graph.instances:
        matches(conv, conv.allocate_inputs(dict(inst.binding)))
    mm = cudnn_dsl.compile(str(ROOT / "examples" / "dynamic_matmul.cdg"))
    mm.planner.use_store = False
    first, second = (mm.executable(inst).notes for inst in mm.graph.instances[:2])
    assert any("compiled its kernel at run time" in n for n in first), first
    assert any(n.startswith("kernel cache:") for n in second), second


def test_later_shapes_are_not_compiled_from_scratch():
    import cudnn_dsl

    cg = cudnn_dsl.compile(str(ROOT / "examples" / "dynamic_matmul.cdg"), shape_mode="dynamic")
    cg.planner.use_store = False  # build every shape, so that the kernel cache is what is exercised
    notes = [cg.executable(inst).notes for inst in cg.graph.instances]
    assert all(any(n.startswith("kernel cache:") for n in shape) for shape in notes), notes
    # the shapes after the first reuse the cache (where one compiles afresh, the note says so: that is what
    # it is for)
    assert not any("WARNING" in n for n in notes[1]), notes


def test_capture_and_replay_match_the_reference():
    import torch

    import cudnn_dsl
    from cudnn_dsl.run.compare import compare

    cg = cudnn_dsl.compile(str(ROOT / "examples" / "cuda_graph_conv.cdg"))
    ins = cg.allocate_inputs()
    replay = cg.capture(**ins)
    replay.outputs["out"].fill_(float("nan"))
    for _ in range(3):
        out = replay.replay()["out"]
    torch.cuda.synchronize()
    want = cg.reference(**ins)["out"]
    assert compare("out", out, want, "half").ok
    ins["x"].mul_(-1)  # replays read the bound buffers: new data, same graph
    out = replay.replay()["out"]
    torch.cuda.synchronize()
    assert compare("out", out, cg.reference(**ins)["out"], "half").ok


def test_bound_run_matches_plain_call():
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(str(ROOT / "examples" / "matmul_epilogue.cdg"))
    ins = cg.allocate_inputs()
    bound = cg.bind(**ins)
    a = {k: v.clone() for k, v in bound.run().items()}
    b = cg(**ins)
    torch.cuda.synchronize()
    for k in a:
        assert torch.equal(a[k], b[k])


def test_tune_command_prints_a_sorted_table(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cudnn_dsl",
            "tune",
            MM,
            "--iterations",
            "3",
            "--warmup",
            "1",
            "--json",
            str(tmp_path / "t.json"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "winner" in proc.stdout and "TFLOP/s" in proc.stdout
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["files"][0]["graphs"][0]["winner"]["name"]
    assert data["environment"]["gpu"] and data["environment"]["cudnn_backend"]
