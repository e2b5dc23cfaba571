"""`cudnn-dsl emit --derived forward|backward`: the graphs `check --emit backward` prints, ejected in every
format emit writes. The torch scripts, run on the CPU, give the gradients cudnn_dsl.torch_op.autograd gives; the
cuDNN scripts are compiled and their module bodies run (building them needs a GPU: tests/gpu)."""

import ast
import json
from pathlib import Path

import pytest
import torch

from cudnn_dsl.cli.common import derive
from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.memory import empty
from cudnn_dsl.torch_op.autograd import differentiable
from cudnn_dsl.torch_op.training import backward_inputs
from cudnn_dsl.tune.bench import import_script
from dsl.pipeline import program
from tests.cli_util import run_cli

ROOT = Path(__file__).resolve().parents[1]
CONV = ROOT / "examples" / "conv_bias_relu.cdg"
RESNET = ROOT / "examples" / "training" / "resnet_block.cdg"
# matmul's backward reads its saved operands transposed (views): the bindings of kind "transposed"; with b a
# weight broadcast over a's batch, a flattened over the batch too ("flat_transposed")
MATMUL = (
    "graph mm {\n  input a : float[2, 8, 16]\n  input b : float[2, 16, 4]\n  input c : float[1, 1, 4]\n"
    "  output y = gelu(matmul(a, b) + c)\n}\n"
)
MATMUL_WEIGHT = MATMUL.replace("b : float[2, 16, 4]", "b : float[1, 16, 4]")
VIEWS = {"matmul": {"a_t": "transposed", "b_t": "transposed"}, "matmul_weight": {"a_t": "flat_transposed"}}
LAYERNORM = (
    "graph ln {\n  input x : float[8, 64, 1, 1] init=randn(1, 3)\n  input gamma : float[1, 64, 1, 1]\n"
    "  input beta : float[1, 64, 1, 1]\n"
    "  y, mean, inv_variance = layernorm(x, gamma, beta, epsilon=1e-5, phase=training)\n  output z = gelu(y)\n}\n"
)
INT_INPUT = "graph gi {\n  input x : float[4, 8]\n  input i : int32[4, 8]\n  output y = relu(x) * identity(i)\n}\n"


def emitted(*args) -> str:
    p = run_cli("emit", *args)
    assert p.returncode == 0, p.stderr
    return p.stdout


def calls(script: str) -> set[str]:
    """The frontend methods the script calls on its graphs (`g.conv_dgrad(...)`)."""
    tree = ast.parse(script)
    return {
        n.func.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
        if n.func.value.id == "g"
    }


@pytest.mark.parametrize("source, shape", [(CONV, []), (RESNET, ["--shape", "N=4"])])
def test_the_ejected_backward_script_builds_the_gradient_ops(source, shape):
    script = emitted(source, "--derived", "backward", *shape)
    compile(script, "backward.py", "exec")
    assert {"conv_dgrad", "conv_wgrad"} <= calls(script)
    g = program(str(source)).graph()
    inst = g.instance({"N": 4}) if shape else g.instances[0]
    want = derive(g, inst).backward  # named as check --emit backward names it: resnet_block_backward_N4
    mod = import_script(script, want.name)  # the module body: names and buffers, no GPU needed
    assert mod.INPUTS == [v.name for v in want.device_inputs]
    assert set(mod.OUTPUTS) == {v.name for v in want.outputs} >= {"grad_x", "grad_w" if shape == [] else "grad_w1"}
    assert want.name in script.split('"""')[1]


def _reference(script: str):
    return import_script(script, "derived_torch").reference


@pytest.mark.parametrize("case", ["resnet_block", "matmul", "matmul_weight"])
def test_the_ejected_torch_forward_and_backward_give_autograds_gradients(case, tmp_path):
    if case in VIEWS:
        source = tmp_path / "mm.cdg"
        source.write_text(MATMUL if case == "matmul" else MATMUL_WEIGHT)
        shape = []
    else:
        source, shape = RESNET, ["--shape", "N=4"]
    g = program(str(source)).graph()
    inst = g.instance({"N": 4}) if shape else g.instances[0]
    d = derive(g, inst)
    assert VIEWS.get(case, {}).items() <= {(name, kind) for name, kind, _ in d.bind}
    forward = _reference(emitted(source, "--derived", "forward", "--format", "torch", *shape))
    backward = _reference(emitted(source, "--derived", "backward", "--format", "torch", *shape))

    inputs = generate_inputs(g, inst, "cpu", 3)
    torch.manual_seed(4)
    grads = {v.name: empty(inst.type(v.name), "cpu").copy_(torch.randn(inst.type(v.name).shape)) for v in g.outputs}
    # cudnn_dsl.torch_op.autograd without a GPU: the derived graphs' references, under torch.autograd
    f = differentiable(str(source))
    leaves = {k: t.clone().requires_grad_(True) for k, t in inputs.items()}
    outs = f(leaves)
    torch.autograd.backward([outs[o] for o in grads], list(grads.values()))

    # the ejected scripts, bound as derive's `bind` says (the views both training paths bind)
    saved = dict(zip((v.name for v in d.forward.outputs), forward(*(inputs[v.name] for v in d.forward.inputs))))
    bound = backward_inputs(d, {**inputs, **saved}, grads, {}, "cpu")
    got = dict(zip((v.name for v in d.backward.outputs), backward(*(bound[v.name] for v in d.backward.inputs))))
    assert {i for i, _ in d.grads} == set(inputs)
    for i, out in d.grads:
        assert got[out].dtype == torch_dtype(d.backward.instances[0].type(out).dtype)
        # torch autograd casts a gradient to its input's dtype (a bias's sum is written in float)
        want = leaves[i].grad
        torch.testing.assert_close(got[out].to(want.dtype), want, msg=lambda m, i=i: f"grad of {i}: {m}")
    for o in g.outputs:
        torch.testing.assert_close(saved[o.name], outs[o.name].detach())


def test_the_derived_forward_of_a_training_layernorm_outputs_its_statistics(tmp_path):
    source = tmp_path / "ln.cdg"
    source.write_text(LAYERNORM)
    script = emitted(source, "--derived", "forward", "--format", "torch")
    g = program(str(source)).graph()
    names = [v.name for v in derive(g, g.instances[0]).forward.outputs]
    assert {"z", "mean", "inv_variance"} <= set(names)
    x = generate_inputs(g, g.instances[0], "cpu")["x"]
    out = dict(zip(names, _reference(script)(x, torch.ones(1, 64, 1, 1), torch.zeros(1, 64, 1, 1))))
    torch.testing.assert_close(out["mean"], x.mean(dim=(1, 2, 3), keepdim=True))
    var = x.var(dim=(1, 2, 3), keepdim=True, unbiased=False)
    torch.testing.assert_close(out["inv_variance"], (var + 1e-5).rsqrt())
    cudnn = emitted(source, "--derived", "forward", "--format", "cudnn")
    assert import_script(cudnn, "ln_forward").OUTPUTS == names


def test_wrt_chooses_the_gradients(tmp_path):
    source = tmp_path / "mm.cdg"
    source.write_text(MATMUL)
    script = emitted(source, "--derived", "backward", "--format", "torch", "--wrt", "b", "--wrt", "b")
    assert "Returns (grad_b,)" in script
    fe = json.loads(emitted(source, "--derived", "backward", "--format", "fe-json", "--wrt", "a"))
    assert {t["name"] for t in fe["tensors"] if t.get("is_virtual") is False} >= {"grad_a", "grad_y"}


def test_derived_flag_errors(tmp_path):
    mm = tmp_path / "mm.cdg"
    mm.write_text(MATMUL)
    gi = tmp_path / "gi.cdg"
    gi.write_text(INT_INPUT)
    p = run_cli("emit", mm, "--derived", "backward", "--wrt", "q")
    assert (
        p.returncode == 2 and "--wrt q: names no input of graph 'mm' (the inputs with a gradient: a, b, c)" in p.stderr
    )
    p = run_cli("emit", gi, "--derived", "backward", "--format", "torch", "--wrt", "i")
    assert (
        p.returncode == 2 and "--wrt i: is not a float input of graph 'gi' (the inputs with a gradient: x)" in p.stderr
    )
    p = run_cli("emit", mm, "--wrt", "a")
    assert p.returncode == 2 and "--wrt goes with --derived" in p.stderr
    p = run_cli("emit", RESNET, "--derived", "backward", "--format", "torch")
    assert p.returncode == 2 and "has more than one shape (N in {4, 32}); choose one with --shape" in p.stderr
    p = run_cli("emit", ROOT / "examples" / "sdpa_ragged.cdg", "--derived", "forward", "--format", "torch")
    assert p.returncode == 1 and p.stdout == "" and "Traceback" not in p.stderr
    assert "sdpa_ragged.cdg:19:7: error: no derived backward: sdpa:" in p.stderr and "^^^" in p.stderr
    p = run_cli("emit", mm, "--derived", "sideways")
    assert p.returncode == 2 and "invalid choice: 'sideways'" in p.stderr
