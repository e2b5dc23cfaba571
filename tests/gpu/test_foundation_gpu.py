"""The one build path on the GPU: store checks, workspace limits, imported plans, kernel caches after
tuning, alignment, and errors that reach the user located and without a traceback."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_store")]

ROOT = Path(__file__).resolve().parents[2]
MM = str(ROOT / "examples" / "plan_serialization.cdg")


def _entry(private_store) -> Path:
    [entry] = (private_store / "plans").glob("*.json")
    return entry


def test_a_stored_plan_over_the_workspace_limit_is_not_reused(private_store):
    import cudnn_dsl

    first = cudnn_dsl.compile(MM)
    first.executable(first.graph.instances[0])
    d = json.loads(_entry(private_store).read_text())
    d["workspace"] = 1 << 30  # as if the stored plan needed a GiB
    _entry(private_store).write_text(json.dumps(d))
    cg = cudnn_dsl.compile(MM, workspace_limit=1 << 20)
    exe = cg.executable(cg.graph.instances[0])
    assert exe.source == "heuristics" and exe.workspace_bytes <= 1 << 20
    assert any("over the limit of 1048576" in n for n in exe.notes), exe.notes


def test_an_imported_plan_is_rebuilt_here_from_its_engine_and_knobs(private_store, tmp_path):
    import cudnn_dsl
    from cudnn_dsl.store.plans import PlanStore

    first = cudnn_dsl.compile(MM)
    first.executable(first.graph.instances[0])
    store = PlanStore()
    store.export(tmp_path / "bundle.json")
    store.clear()
    store.import_(tmp_path / "bundle.json")
    cg = cudnn_dsl.compile(MM)
    exe = cg.executable(cg.graph.instances[0])
    assert exe.source == "plan store (imported engine id + knobs, rebuilt here)", exe.notes
    assert json.loads(_entry(private_store).read_text())["imported"] is False  # replaced by one made here
    results = cg.check(cg.allocate_inputs())
    assert all(r.ok for r in results)


def test_tune_saves_the_shared_kernel_cache_and_builds_on_the_planners_device(private_store):
    import torch

    import cudnn_dsl
    from cudnn_dsl.tune.heuristics import tune

    cg = cudnn_dsl.compile(str(ROOT / "examples" / "dynamic_matmul.cdg"), iterations=3, warmup=1)
    r = tune(cg, cg.graph.instances[0])
    assert r.winner is not None, r.check
    assert list((private_store / "kernels").glob("*.cache"))
    assert cg.planner.handle is not None and cg.device == torch.device("cuda", 0)


def test_a_merged_kernel_cache_loads(private_store, tmp_path, monkeypatch):
    import cudnn_dsl
    from cudnn_dsl.store.kernels import load_kernel_cache_text, save_kernel_cache_text

    dyn = str(ROOT / "examples" / "dynamic_matmul.cdg")
    texts = []
    for i, inst_index in enumerate((0, 1)):  # two processes' worth, each from an empty cache
        monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / f"c{i}"))
        cg = cudnn_dsl.compile(dyn, shape_mode="dynamic")
        cg.executable(cg.graph.instances[inst_index])
        [path] = (tmp_path / f"c{i}" / "kernels").glob("*.cache")
        texts.append((path.name, load_kernel_cache_text(path)))
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(private_store))
    target = private_store / "kernels" / texts[0][0]
    for _, text in texts:
        save_kernel_cache_text(target, text)
    merged = json.loads(load_kernel_cache_text(target))
    assert len(merged["kernel_cache"]) >= max(len(json.loads(t)["kernel_cache"]) for _, t in texts)
    cg = cudnn_dsl.compile(dyn, shape_mode="dynamic")
    for inst in cg.graph.instances[:2]:
        cg.executable(inst)
    assert cg.planner.kernel_cache_loaded and not cg.planner.kernel_cache_notes, cg.planner.kernel_cache_notes
    for inst in cg.graph.instances[:2]:
        results = cg.check(cg.allocate_inputs(dict(inst.binding)))
        assert all(r.ok for r in results)


def test_a_misaligned_buffer_is_refused():
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(MM)
    ins = cg.allocate_inputs()
    raw = torch.empty(ins["a"].numel() + 1, dtype=torch.bfloat16, device="cuda")
    ins["a"] = raw[1:].view(ins["a"].shape)  # 2 bytes past a 16-byte boundary
    with pytest.raises(cudnn_dsl.BindingError, match="aligned to 16 bytes, given one 2 past it"):
        cg(ins)


def test_inputs_are_checked_before_anything_is_built():
    import cudnn_dsl

    cg = cudnn_dsl.compile(MM)
    with pytest.raises(cudnn_dsl.BindingError, match="no input zz"):
        cg(zz=1, **cg.allocate_inputs())
    assert not cg.planner.built  # nothing was compiled for a misspelt name


def test_bench_of_a_graph_cudnn_declines_is_an_error_not_a_traceback(tmp_path):
    bad = tmp_path / "bn.cdg"
    bad.write_text(
        "graph bn {\n  io half\n  input x : half[8, 64, 16, 16] nhwc\n"
        + "".join(f"  input {n} : float[1, 64, 1, 1] nhwc\n" for n in ("mean", "inv_var", "gamma", "beta"))
        + "  output y = batchnorm_inference(x, mean, inv_var, gamma, beta)\n"
        + "  option split = false\n}\n"  # else it runs as its op left to torch
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "cudnn_dsl",
            "bench",
            str(bad),
            MM,
            "--no-peak",
            "--rounds",
            "1",
            "--samples",
            "2",
            "--against",
            "torch",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert f"{bad}:" in p.stderr and "graph plan_serialization" in p.stdout  # the other graph still ran


def test_the_api_reference_runs_on_the_inputs_device():
    import cudnn_dsl

    cg = cudnn_dsl.compile(MM)
    ins = cg.allocate_inputs()
    assert cg.reference(ins)["c"].device.type == "cuda"
    cpu = {k: v.cpu() for k, v in ins.items()}
    assert cg.reference(cpu)["c"].device.type == "cpu"


def test_a_dump_reproduces_the_outputs_bit_for_bit_on_the_same_gpu(tmp_path, private_store):
    """run --dump on one store, then --inputs-from on another (as another machine would): same plan, same bits."""
    import os

    d = tmp_path / "dump"
    env = {**os.environ, "CUDNN_DSL_CACHE_DIR": str(tmp_path / "first")}
    for example in ("matmul_epilogue", "conv_bias_relu"):
        f = str(ROOT / "examples" / f"{example}.cdg")
        p = subprocess.run(
            [sys.executable, "-m", "cudnn_dsl", "run", f, "--dump", str(d), "--seed", "5"],
            env=env,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert p.returncode == 0, p.stderr
        assert (d / f"{example}.outputs.pt").is_file() and (d / f"{example}.plan.json").is_file()
        env2 = {**os.environ, "CUDNN_DSL_CACHE_DIR": str(tmp_path / "second")}
        p = subprocess.run(
            [sys.executable, "-m", "cudnn_dsl", "run", f, "--inputs-from", str(d)],
            env=env2,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert p.returncode == 0, p.stderr
        assert "the dump's plan" in p.stdout and "outputs identical to the dump's, bit for bit" in p.stdout, p.stdout
