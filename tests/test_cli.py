"""The command line on the CPU: check, fmt, emit, exit codes, JSON. The commands run in-process
(tests/cli_util.py); the exit codes are also checked where a shell sees them, from a `python -m cudnn_dsl`
process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_util import run_cli as cli

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"


def process(*args):
    """The command line as a shell runs it: a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "cudnn_dsl", *map(str, args)], capture_output=True, text=True, cwd=ROOT
    )


# ---- at the process boundary ---------------------------------------------------------------------


def test_check_reports_errors_with_exit_1_and_no_traceback():
    p = process("check", ROOT / "tests" / "golden" / "errors" / "conv_channels.cdg")
    assert p.returncode == 1
    assert "conv_channels.cdg:5:28: error: conv_fprop: image has 64 channels, weight expects 48" in p.stderr
    assert "Traceback" not in p.stderr


def test_usage_errors_exit_2():
    assert process("check", "no/such/file.cdg").returncode == 2
    assert process("frobnicate").returncode == 2
    assert process().returncode == 2


# ---- in-process -----------------------------------------------------------------------------------------


def test_check_summary_lists_every_inferred_type():
    p = cli("check", EX / "dynamic_shapes.cdg")
    assert p.returncode == 0, p.stderr
    assert "half[N, 256, 56, 56]" in p.stdout
    assert "dim      N in {8, 16, 24, 32}" in p.stdout


def test_check_json_and_emit_stages():
    p = cli("check", "--json", "-", EX / "matmul_epilogue.cdg")
    data = json.loads(p.stdout)
    assert data["files"][0]["graphs"][0]["instances"][0]["types"]["amax"]["shape"] == [1, 1, 1]
    assert "Call op='gelu'" in cli("check", "--emit", "ast", EX / "matmul_epilogue.cdg").stdout
    assert (
        "%amax = reduction(%y) {axes=[0, 1, 2], mode=amax}"
        in cli("check", "--emit", "ir", EX / "matmul_epilogue.cdg").stdout
    )


def test_fmt_check_accepts_the_examples_and_rewrites_a_messy_file(tmp_path):
    assert cli("fmt", "--check", *sorted(EX.glob("*.cdg"))).returncode == 0
    messy = tmp_path / "m.cdg"
    messy.write_text(
        "graph g {  # top\n  input x:half[2,3];output y=relu( x )*2  # tail\n\n\n  output z = -x - (x - x)\n}\n"
    )
    assert cli("fmt", "--check", messy).returncode == 1
    assert cli("fmt", messy).returncode == 0
    assert messy.read_text() == (
        "graph g {  # top\n  input x : half[2, 3]\n  output y = relu(x) * 2  # tail\n\n  output z = -x - (x - x)\n}\n"
    )


def test_emit_torch_is_a_standalone_function():
    p = cli("emit", "--format", "torch", EX / "conv_bias_relu.cdg")
    assert p.returncode == 0, p.stderr
    assert "def reference(x, w, b):" in p.stdout and "torch.ops.aten.convolution" in p.stdout
    compile(p.stdout, "emitted.py", "exec")  # valid Python, not run


def test_emit_cudnn_script_is_valid_python():
    p = cli("emit", EX / "matmul_epilogue.cdg")
    assert "g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])" in p.stdout
    compile(p.stdout, "emitted.py", "exec")


def test_run_without_gpu_says_what_it_skipped():
    p = cli("run", EX / "plan_serialization.cdg")
    assert p.returncode == 0, p.stderr
    assert "no CUDA GPU here" in p.stderr
    assert "skipped    cuDNN execution and comparison" in p.stdout
    assert "reference  c: bf16[8, 256, 256] on the CPU" in p.stdout


@pytest.mark.parametrize("cmd", ["tune", "bench"])
def test_gpu_only_commands_fail_clearly_without_gpu(cmd):
    p = cli(cmd, EX / "plan_serialization.cdg")
    assert p.returncode == 1
    assert "no CUDA GPU is usable here" in p.stderr


def test_help_answers():
    p = cli("--help")
    for word in ("check", "fmt", "run", "emit", "tune", "bench", "cache", "device-info"):
        assert word in p.stdout


def test_run_loads_inputs_from_files_and_refuses_a_wrong_shape(tmp_path):
    import numpy as np
    import torch

    good, bad = tmp_path / "a.pt", tmp_path / "b.npy"
    torch.save(torch.ones(8, 256, 512), good)
    np.save(bad, np.ones((4, 4), dtype=np.float32))
    p = cli("run", EX / "plan_serialization.cdg", "--input", f"a={good}")
    assert p.returncode == 0, p.stderr
    p = cli("run", EX / "plan_serialization.cdg", "--input", f"b={bad}")
    assert p.returncode == 1
    assert "--input b: expected shape [8, 512, 256], the file holds [4, 4]" in p.stderr
    assert cli("run", EX / "plan_serialization.cdg", "--input", "zz=x.pt").returncode == 2
    p = cli("run", EX / "plan_serialization.cdg", "--input", f"a={tmp_path / 'missing.pt'}")
    assert p.returncode == 2 and "missing.pt: no such file" in p.stderr  # a usage error, as the README says


def test_run_takes_input_distributions():
    p = cli("run", EX / "plan_serialization.cdg", "--init", "a=full(2)", "--init", "b=uniform(1, 1)")
    assert p.returncode == 0, p.stderr
    assert "mean 1024" in p.stdout  # every element: 512 products of 2 * 1
    assert cli("run", EX / "plan_serialization.cdg", "--init", "a=uniform(3, 1)").returncode == 2


def test_shape_selects_values_of_a_symbolic_dim():
    p = cli("run", EX / "dynamic_shapes.cdg", "--shape", "N=8", "--shape", "N=24")
    assert p.returncode == 0, p.stderr
    assert "graph dynamic_conv [N=8]" in p.stdout and "graph dynamic_conv [N=24]" in p.stdout
    assert "[N=16]" not in p.stdout
    p = cli("run", EX / "dynamic_shapes.cdg", "--shape", "N=12")
    assert p.returncode == 2 and "selects none" in p.stderr
    p = cli("emit", EX / "dynamic_shapes.cdg")
    assert p.returncode == 2 and "choose one with --shape" in p.stderr
    assert cli("emit", EX / "dynamic_shapes.cdg", "--shape", "N=16").returncode == 0
