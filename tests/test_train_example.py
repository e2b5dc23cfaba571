"""The training example (bench/train.py, examples/training/) on the CPU: a few SGD steps of each block
through the graph's torch op against the same model in plain PyTorch, from the same weights.

On CPU tensors the op's kernels are the graph's PyTorch reference and the derived backward's reference:
this checks the derived backward graphs and the training plumbing (augmented forward op, backward op,
register_autograd, master weights cast into the graph's dtypes), not cuDNN. The GPU twin is
tests/gpu/test_train_example_gpu.py."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import load_train

ROOT = Path(__file__).resolve().parents[1]


train = load_train()


@pytest.mark.parametrize("name", sorted(train.SPECS))
def test_three_steps_match_plain_pytorch_and_the_weights_move(name):
    setup = train.Setup(name, "cpu")
    dsl, plain = setup.dsl(), setup.plain()
    got = train.train(setup, dsl, 3, lr=0.05)
    want = train.train(setup, plain, 3, lr=0.05)
    # both round the same values to bf16/half; the graph's reference rounds once per fused op where
    # PyTorch rounds per op, hence a tolerance above float32's
    assert train.max_relative_difference(got, want) < 2e-3, (got, want)
    assert all(torch.isfinite(torch.tensor(got)))
    for k, p in dsl.w.items():  # every weight got a gradient from the derived backward and moved like torch's
        start = setup.weights[k]
        moved, want_moved = p.detach() - start, plain.w[k].detach() - start
        if k == "bk":  # a key bias shifts every score of a row alike: softmax ignores it, its gradient is noise
            assert moved.norm() < 1e-4 and want_moved.norm() < 1e-4
            continue
        assert not torch.equal(p.detach(), start), k
        assert (moved - want_moved).norm() <= 0.03 * want_moved.norm(), k


def test_the_op_runs_the_training_path():
    """The cudnn-dsl twin calls the augmented forward op (not the plain op, and no Python autograd.Function)."""
    setup = train.Setup("resnet", "cpu")
    model = setup.dsl()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, fullgraph=True, backend=backend)
    setup.loss(compiled, 0).backward()
    calls = [str(n.target) for g in graphs for n in g.graph.nodes if "cudnn_dsl" in str(n.target)]
    assert len(graphs) == 1 and calls == [f"cudnn_dsl.{setup.op.name}_ad01111.default"]
    assert all(p.grad is not None for p in model.parameters())


def test_the_script_reports_that_the_cpu_ran_the_reference(tmp_path):
    out = tmp_path / "train.json"
    cmd = [sys.executable, str(ROOT / "bench" / "train.py"), "--steps", "2", "--device", "cpu", "--model", "resnet"]
    done = subprocess.run(
        [*cmd, "--no-compile", "--iterations", "1", "--json", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    import json

    report = json.loads(out.read_text())
    r = report["models"]["resnet"]
    assert r["cudnn"] is False and "not cuDNN" in r["note"] and "not cuDNN" in done.stdout
    assert len(r["losses_dsl"]) == len(r["losses_torch"]) == 2
    assert set(r["step_time_us"]) == {"cudnn-dsl eager", "torch eager"}
    assert set(r["skipped"]) == {c.label for c in train.CONTENDERS} - set(r["step_time_us"])
    assert r["skipped"]["cudnn-dsl captured (torch.cuda.graph)"] == "CUDA-graph capture needs a CUDA device"
    assert r["skipped"]["torch.compile(default)"] == "--no-compile"
    assert "torch" in report["environment"]
    # the H200's parts, planned without a device: none left to torch; the two weight gradients share a graph
    s = r["per_step"]
    assert s["parts_from"] == "deviceless planning for NVIDIA H200"
    assert (s["forward"]["cudnn_launches"], s["backward"]["cudnn_launches"]) == (2, 4)
    assert (s["cudnn_launches"], s["cudnn_graphs"], s["torch_fallbacks"]) == (6, 5, 0)
    assert "cudnn-dsl captured (torch.cuda.graph)" in done.stdout and "6 cuDNN launches" in done.stdout


def test_a_step_issues_torch_ops_the_dispatch_mode_counts_for_both_twins():
    """On the CPU the graph ops' kernels are the reference and are not entered: what cudnn-dsl's step issues around
    them (the weights' casts, the loss) is counted, and each of its two graph ops (augmented forward, backward) once."""
    setup = train.Setup("resnet", "cpu")
    ops = train.torch_ops(setup)
    dsl, plain = ops["cudnn-dsl"], ops["torch"]
    assert dsl["graph_op_calls"] == 2 and not dsl["graph_ops_entered"] and plain["graph_op_calls"] == 0
    assert dsl["by_op"]["aten::mse_loss"] == plain["by_op"]["aten::mse_loss"] == 1
    assert plain["by_op"]["aten::convolution"] == plain["by_op"]["aten::convolution_backward"] == 2
    assert "aten::convolution" not in dsl["by_op"]
    assert dsl["kernels"] == sum(n for op, n in dsl["by_op"].items() if op != "aten::detach")  # detach: a view
    assert dsl["views"] == dsl["by_op"]["aten::detach"]


def test_the_host_cost_of_a_step_runs_apart_with_cudnns_execute_a_no_op():
    """bench/train.py's host-cost contender: an eager step's host path in a process of its own, planned for an H200,
    its six launches (two forward, four backward) made by launch plans that do nothing on the device."""
    h = train.host_cost_apart("resnet", None, 2, "h200")
    assert h["cudnn_launches"] == 6 and h["host_us"] > 0, h


def test_a_step_compiled_by_inductor_gives_eager_gradients():
    """Under torch.compile's default backend the backward op's gradients pass through Inductor's code: the float
    sums of the bf16 biases come back in the biases' dtype, as eager autograd gives them."""
    setup = train.Setup("transformer", "cpu")
    eager, model = setup.dsl(), setup.dsl()
    setup.loss(eager, 0).backward()
    setup.loss(torch.compile(model, fullgraph=True), 0).backward()
    for (k, p), q in zip(eager.named_parameters(), model.parameters()):
        assert torch.equal(p.grad, q.grad), k


def test_the_transformer_blocks_derived_gradients_match_autograd():
    """Through the derived backward's forms (float sums, rank-4 token sums, one weight-gradient matmul over the
    batch), on the CPU reference path, against float64 autograd; bk's gradient is zero (a key bias shifts a
    row's scores alike), so what comes back is rounding noise."""
    from tests.helpers import check_grads

    check_grads((ROOT / "examples" / "training" / "transformer_block.cdg").read_text(), "cpu", frozen=("bk",))
