"""Ejected cuDNN scripts on the GPU: a graph cuDNN declines whole is ejected as its parts (the split
deviceless planning for an H200 finds), runs on its own, and matches the reference; every script draws
the inputs `run` draws, so its outputs are compared with the reference on the same values."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

# MM_RESHAPE's part 2 (the reshape) is a view: the script copies its operand's memory into the output
from tests.graphs import LN_GELU, MM_RESHAPE, READ_AFTER_OVERWRITE
from tests.helpers import ON_H200

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_store")]

ROOT = Path(__file__).resolve().parents[2]

VIEWED_IN_PLACE = (
    "graph viewed {\n  io bf16\n  buffer buf : bf16[2, 8, 1024, 1, 1] init=randn(0, 2)\n"
    "  input x : bf16[8, 1024, 1, 1] strides [1024, 1, 1024, 1024] in buf at 8192\n"
    "  input s : float[1, 1024, 1, 1] nhwc\n  input b : float[1, 1024, 1, 1] nhwc\n"
    "  input acc : bf16[8, 1024, 1, 1] nhwc\n  output y in acc = gelu(layernorm(x, s, b))\n}\n"
)
# a training norm's statistics materialized for part 2
NORM_STATS = (
    "graph lt {\n  io bf16\n  compute float\n  input x : bf16[256, 1024, 1, 1] init=randn(1, 3)\n"
    "  input gamma : float[1, 1024, 1, 1]\n  input beta : float[1, 1024, 1, 1]\n"
    "  y, mean, inv_variance = layernorm(x, gamma, beta, epsilon=1e-5, phase=training)\n"
    "  output z = gelu(y)\n  output m2 = mean * 2.0\n}\n"
)
SPLIT = {
    "ln_gelu": LN_GELU,
    "mm_reshape": MM_RESHAPE,
    "read_after_overwrite": READ_AFTER_OVERWRITE,
    "viewed_in_place": VIEWED_IN_PLACE,
    "norm_stats": NORM_STATS,
    "transformer_block": (ROOT / "examples/training/transformer_block.cdg").read_text(),  # views, a cast folded
}


def _eject(tmp_path: Path, name: str, text: str) -> tuple[Path, Path]:
    cdg, script = tmp_path / f"{name}.cdg", tmp_path / f"{name}_cudnn.py"
    cdg.write_text(text)
    p = subprocess.run(
        [sys.executable, "-m", "cudnn_dsl", "emit", str(cdg), "--target", "h200"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    script.write_text(p.stdout)
    return cdg, script


def _check_script(cdg: Path, script: Path, graph: str | None = None) -> dict:
    """Imports the script, builds and runs it as its __main__ does, and compares its outputs with the
    reference computed on the inputs `run` generates (which the script's make_buffers must equal)."""
    import cudnn
    import torch

    from cudnn_dsl.run.compare import compare_outputs
    from cudnn_dsl.run.inputs import generate_inputs
    from cudnn_dsl.run.reference import run_reference
    from dsl.pipeline import program

    g = next(g for g in program(str(cdg)).graphs if graph in (None, g.name))
    inst = g.instances[0]
    spec = importlib.util.spec_from_file_location(script.stem, script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    graphs = mod.build(handle)
    buffers = mod.make_buffers()
    inputs = generate_inputs(g, inst, "cuda", g.options.seed)
    for name, t in inputs.items():
        assert torch.equal(buffers[name], t), f"{name}: the script drew other values than run"
    want = run_reference(g, inst, inputs)
    parts = graphs if isinstance(graphs, list) else [graphs]
    size = max([1] + [p.get_workspace_size() for p in parts if p is not None])
    workspace = torch.empty(size, dtype=torch.uint8, device="cuda")
    mod.execute(graphs, handle, buffers, workspace, mod.host_scalars())
    torch.cuda.synchronize()
    results = compare_outputs(g, inst, buffers, want, g.options)
    assert all(r.ok for r in results), [str(r) for r in results]
    return vars(mod)


@pytest.mark.parametrize("name", sorted(SPLIT))
def test_a_split_graphs_ejected_script_runs_on_its_own_and_matches_the_reference(name, tmp_path):
    cdg, script = _eject(tmp_path, name, SPLIT[name])
    env = _check_script(cdg, script)
    assert "build_part2" in env or "run_part2" in env  # ejected as its parts
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert all(f"{n}: shape" in proc.stdout for n in env["OUTPUTS"])


@pytest.mark.parametrize("example", ["conv_bias_relu", "matmul_epilogue", "mixed_precision"])
def test_an_ejected_graph_draws_the_files_inits_and_matches_the_reference(example, tmp_path):
    from dsl.pipeline import program

    cdg = ROOT / "examples" / f"{example}.cdg"

    for g in program(str(cdg)).graphs:  # mixed_precision holds several graphs
        p = subprocess.run(
            [sys.executable, "-m", "cudnn_dsl", "emit", str(cdg), "--graph", g.name],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert p.returncode == 0, p.stderr
        script = tmp_path / f"{g.name}_cudnn.py"
        script.write_text(p.stdout)
        _check_script(cdg, script, g.name)


CONV_BIAS_RELU = (
    "graph cbr {\n  io half\n  compute float\n  input x : half[4, 32, 16, 16] nhwc\n"
    "  input w : half[64, 32, 3, 3] nhwc\n  input b : half[1, 64, 1, 1] nhwc\n"
    "  y = conv_fprop(x, w, padding=[1, 1])\n  output out = relu(bias(y, b))\n}\n"
)


def test_an_ejected_derived_backward_runs_on_its_own_and_matches_the_backward_graphs_reference(tmp_path):
    from dsl.autodiff import derive
    from dsl.pipeline import program

    cdg = tmp_path / "cbr.cdg"
    cdg.write_text(CONV_BIAS_RELU)
    g = program(str(cdg)).graph()
    backward = tmp_path / "cbr_backward.cdg"  # the graph the script builds, as check --emit backward prints it
    backward.write_text(derive(g, g.instances[0], avoid=ON_H200).backward_text)
    p = subprocess.run(
        [sys.executable, "-m", "cudnn_dsl", "emit", str(cdg), "--derived", "backward", "--target", "h200"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    assert "g.conv_dgrad(" in p.stdout and "g.conv_wgrad(" in p.stdout
    script = tmp_path / "cbr_backward_cudnn.py"
    script.write_text(p.stdout)
    env = _check_script(backward, script)  # its inputs drawn as run draws them; outputs against the reference
    assert set(env["OUTPUTS"]) == {"grad_x", "grad_w", "grad_b"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert all(f"{n}: shape" in proc.stdout for n in env["OUTPUTS"])
