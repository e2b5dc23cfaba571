"""`bench` on the GPU: the torch.compile modes as contenders, a cold L2, and percentiles in the report."""

import json
from pathlib import Path

import pytest

from tests.cli_util import run_cli

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_store")]

MM = str(Path(__file__).resolve().parents[2] / "examples" / "plan_serialization.cdg")


def test_cold_l2_bench_with_reduce_overhead_reports_percentiles(tmp_path):
    report = tmp_path / "bench.json"
    p = run_cli(
        "bench", MM, "--no-peak", "--rounds", "2", "--samples", "5", "--cold-l2",
        "--against", "torch,reduce-overhead", "--json", str(report),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    [res] = json.loads(report.read_text())["results"]
    assert res["l2"] == "cold"
    rows = {r["name"]: r for r in res["rows"]}
    assert set(rows) == {"cudnn-dsl", "torch", "reduce-overhead"}
    for r in rows.values():
        assert r["check"] == "ok", r
        assert r["samples"] == 10
        assert r["gpu_us_min"] <= r["gpu_us_median"] <= r["gpu_us_p90"] <= r["gpu_us_p99"] <= r["gpu_us_max"]
    assert "p90" in p.stdout and "cold L2" in p.stdout


def test_the_cudnn_contender_binds_scratch_statistics(tmp_path):
    """A layernorm whose inv_variance no output asks for: cuDNN writes it to scratch memory, which the ejected
    script binds; the bench bound the script's inputs and outputs only, so cuDNN had no buffer for it."""
    f = tmp_path / "ln.cdg"
    f.write_text(
        "graph ln_mean {\n  io half\n  compute float\n  input x : half[512, 256, 1, 1]\n"
        "  input g : float[1, 256, 1, 1]\n  input b : float[1, 256, 1, 1]\n"
        "  y, m, iv = layernorm(x, g, b, phase=training)\n  output y\n  output m\n}\n"
    )
    report = tmp_path / "bench.json"
    p = run_cli(
        "bench", str(f), "--no-peak", "--rounds", "2", "--samples", "3", "--against", "cudnn", "--json", str(report)
    )
    assert p.returncode == 0, p.stdout + p.stderr
    [res] = json.loads(report.read_text())["results"]
    rows = {r["name"]: r for r in res["rows"]}
    assert rows["cudnn"]["check"] == "ok", rows["cudnn"]
