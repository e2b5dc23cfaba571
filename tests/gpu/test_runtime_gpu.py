"""The runtime on the GPU: the Python API, binding checks before launch, and the ejected script."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
MATMUL = """
graph mm {
  io half
  compute float
  input a : half[4, 64, 128]
  input b : half[4, 128, 32]
  scalar alpha : float = 0.5
  output c = matmul(a, b) * alpha
}
"""


@pytest.fixture(scope="module")
def cg():
    import cudnn_dsl

    return cudnn_dsl.compile(MATMUL)


def test_call_by_name_returns_outputs(cg):
    import torch

    ins = cg.allocate_inputs()
    out = cg(**ins)["c"]
    want = (ins["a"].float() @ ins["b"].float()) * 0.5
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)


def test_scalar_given_at_call_time(cg):
    import torch

    ins = cg.allocate_inputs()
    out = cg(alpha=2.0, **ins)["c"]
    torch.testing.assert_close(out.float(), (ins["a"].float() @ ins["b"].float()) * 2.0, atol=5e-2, rtol=1e-2)


def test_out_buffers_are_written_in_place(cg):
    import torch

    ins = cg.allocate_inputs()
    out = torch.full((4, 64, 32), float("nan"), dtype=torch.float16, device="cuda")
    res = cg(ins, {"c": out})
    assert res["c"].data_ptr() == out.data_ptr()
    assert not out.isnan().any()


@pytest.mark.parametrize(
    "bad,message",
    [
        (lambda t: t[:, :32], "shape [4, 64, 128], given [4, 32, 128]"),
        (lambda t: t.float(), "dtype half, given float"),
        (lambda t: t.cpu(), "device cuda"),
        (lambda t: t.transpose(1, 2).contiguous().transpose(1, 2), "strides [8192, 128, 1]"),
        (lambda t: "not a tensor", "expected a torch.Tensor"),
    ],
)
def test_wrong_buffers_are_refused_before_launch(cg, bad, message):
    import cudnn_dsl

    ins = cg.allocate_inputs()
    ins["a"] = bad(ins["a"])
    with pytest.raises(cudnn_dsl.BindingError, match="'a'") as e:
        cg(**ins)
    assert message in str(e.value)


def test_storage_too_small_is_refused(cg):
    import cudnn_dsl

    ins = cg.allocate_inputs()
    ins["a"].untyped_storage().resize_(1000)  # the view now claims more bytes than its storage has
    with pytest.raises(cudnn_dsl.BindingError, match="buffer of 65536 bytes, given 1000"):
        cg(**ins)


def test_missing_and_unknown_inputs(cg):
    import cudnn_dsl

    ins = cg.allocate_inputs()
    with pytest.raises(cudnn_dsl.BindingError, match="'b' is not bound"):
        cg(a=ins["a"])
    with pytest.raises(cudnn_dsl.BindingError, match="no input zz"):
        cg(zz=ins["a"], **ins)


def test_dynamic_shape_outside_declared_set():
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(str(ROOT / "examples" / "dynamic_shapes.cdg"))
    ins = cg.allocate_inputs({"N": 8})
    ins["x"] = torch.empty_strided((12, 128, 56, 56), (401408, 1, 7168, 128), dtype=torch.float16, device="cuda")
    with pytest.raises(cudnn_dsl.BindingError, match="match none of the declared shapes"):
        cg(**ins)


@pytest.mark.parametrize("example", ["conv_bias_relu", "matmul_epilogue"])
def test_emitted_cudnn_script_runs_standalone(example, tmp_path):
    script = tmp_path / f"{example}.py"
    emitted = subprocess.run(
        [sys.executable, "-m", "cudnn_dsl", "emit", str(ROOT / "examples" / f"{example}.cdg")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    script.write_text(emitted)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "max |x|" in proc.stdout


def test_run_command_reports_saves_and_exits_zero(tmp_path):
    import json

    import torch

    report, saved = tmp_path / "r.json", tmp_path / "outs"
    torch.save(torch.full((1, 256, 1, 1), -100.0), tmp_path / "b.pt")  # a bias that zeroes every ReLU
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cudnn_dsl",
            "run",
            str(ROOT / "examples" / "conv_bias_relu.cdg"),
            "--json",
            str(report),
            "--save-outputs",
            str(saved),
            "--input",
            f"b={tmp_path / 'b.pt'}",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "compare    out: ok" in proc.stdout
    data = json.loads(report.read_text())
    assert data["environment"]["gpu"] and data["files"][0]["graphs"][0]["ok"]
    out = torch.load(saved / "conv_bias_relu.out.pt")
    assert out.shape == (32, 256, 56, 56) and float(out.float().abs().max()) == 0.0


def test_run_command_exits_1_on_a_mismatch():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cudnn_dsl",
            "run",
            str(ROOT / "examples" / "matmul_epilogue.cdg"),
            "--atol",
            "0",
            "--rtol",
            "0",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert "MISMATCH" in proc.stdout
