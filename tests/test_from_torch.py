"""cudnn_dsl.from_torch and `import --from-torch`: a traced PyTorch function or module as a checked .cdg graph.

Round trips: the imported graph's CPU reference, on the function's own inputs (bound as views of their
memory), equals the function. Refusals: every node the language cannot express, located at the user's line.
"""

import inspect

import pytest
import torch
import torch.nn.functional as F
from cli_util import run_cli
from torch import nn

import cudnn_dsl
from cudnn_dsl.interop.from_torch import example_tensor, from_torch
from cudnn_dsl.run.reference import run_reference
from dsl.diagnostics import DslError
from dsl.pipeline import load

torch.manual_seed(0)


class ConvBiasRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1, stride=2)

    def forward(self, x):
        return F.relu(self.conv(x))


class LinearGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 32)

    def forward(self, x):
        return F.gelu(self.lin(x), approximate="tanh")


class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16, eps=1e-6)
        with torch.no_grad():  # not the ones and zeros a fresh norm has: a swapped scale and bias would pass
            self.ln.weight.normal_()
            self.ln.bias.normal_()

    def forward(self, x):
        return self.ln(x)


def attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)


class Residual(nn.Module):
    """conv -> eval BatchNorm -> + x -> relu, the basic block of a ResNet."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.normal_()

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)) + x)


def pointwise(x, y):
    """Numbers (a negative one too), broadcasting of a lower-rank operand, reductions, a transposed matmul."""
    h = torch.sigmoid(x) * -2.0 + torch.maximum(x, y) - 0.5
    return h.sum(dim=-1), h.mean(dim=1, keepdim=True), torch.matmul(h, y.transpose(-1, -2))


def _heads(b=2, s=6, h=4, d=8):
    """q, k and v as an attention block's projections give them: [B, S, H, D] viewed as [B, H, S, D]."""
    return tuple(torch.randn(b, s, h * d).view(b, s, h, d).transpose(1, 2) for _ in range(3))


CASES = {
    "conv_bias_relu": (ConvBiasRelu(), lambda: (torch.randn(2, 4, 9, 9).to(memory_format=torch.channels_last),)),
    "linear_gelu": (LinearGelu(), lambda: (torch.randn(2, 5, 16),)),
    "linear_gelu_2d": (LinearGelu(), lambda: (torch.randn(5, 16),)),
    "layernorm": (Norm(), lambda: (torch.randn(2, 5, 16),)),
    "sdpa": (attention, _heads),
    "residual_block": (Residual().eval(), lambda: (torch.randn(2, 8, 6, 6),)),
    "pointwise": (pointwise, lambda: (torch.randn(2, 3, 4), torch.randn(3, 4))),
}


def _round_trip(fn, args):
    imported = from_torch(fn, args)
    again = load(text=imported.text, file="again.cdg")
    assert again.ok, again.render()
    graph = imported.program.graphs[0]
    got = run_reference(graph, graph.instances[0], imported.bind(*args))
    want = fn(*args)
    want = want if isinstance(want, tuple) else (want,)
    assert len(imported.outputs) == len(want)
    for name, w in zip(imported.outputs, want):
        assert got[name].shape == w.shape and got[name].dtype == w.dtype
        torch.testing.assert_close(got[name], w, atol=1e-5, rtol=1e-5)
    return imported


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_equals_the_function(case):
    fn, make = CASES[case]
    _round_trip(fn, make())


def test_layouts_come_from_the_example_inputs():
    text = from_torch(*(lambda f, m: (f, m()))(*CASES["conv_bias_relu"])).text
    assert "input x : float[2, 4, 9, 9] nhwc" in text
    assert "input conv_bias : float[1, 8, 1, 1]" in text  # torch's [K] bias with the language's unit dims
    assert "conv_fprop(x, conv_weight, padding=[1, 1], stride=[2, 2])" in text
    text = from_torch(LinearGelu(), (torch.randn(2, 5, 16),)).text
    assert "input lin_weight : float[1, 16, 32] col_major" in text  # nn.Linear's weight as docs/pytorch.md says
    text = from_torch(attention, _heads()).text
    assert "input q : float[2, 4, 6, 8] strides [192, 8, 32, 1]" in text
    assert "sdpa(q, k, v, causal=true, scale=0.3)" in text


def test_bound_inputs_are_views_of_the_callers_memory():
    model = LinearGelu()
    x = torch.randn(2, 5, 16)
    bound = from_torch(model, (x,)).bind(x)
    assert bound["x"] is x
    assert bound["lin_weight"].data_ptr() == model.lin.weight.data_ptr()
    assert bound["lin_weight"].shape == (1, 16, 32) and bound["lin_weight"].stride()[1:] == (1, 16)


def test_a_module_traced_once_is_imported_as_the_same_text():
    """An ExportedProgram is taken as it is; the public name is the same function."""
    model, x = Residual().eval(), torch.randn(2, 8, 6, 6)
    ep = torch.export.export(model, (x,))

    def statements(imported):
        return [line for line in imported.text.splitlines() if not line.startswith("#")]

    assert statements(cudnn_dsl.from_torch(ep, (x,), name="block")) == statements(from_torch(model, (x,), name="block"))


# ---- refusals ----------------------------------------------------------------------------------------------


def _line_of(fn, needle: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if needle in line)


def unsupported(x, mask):
    y = torch.softmax(x, -1)
    z = torch.cumsum(y, 0)
    a = F.scaled_dot_product_attention(x, x, x, attn_mask=mask)
    return z + 1, a


def test_every_node_it_cannot_express_is_named_at_its_line():
    with pytest.raises(DslError) as e:
        from_torch(unsupported, (torch.randn(2, 2, 4, 4), torch.ones(4, 4, dtype=torch.bool)))
    ds = e.value.diagnostics
    assert [d.loc.line for d in ds] == [_line_of(unsupported, s) for s in ("softmax", "cumsum", "attn_mask")]
    assert all(d.loc.file == __file__ for d in ds)
    assert "node 'softmax' (aten.softmax.int, at `y = torch.softmax(x, -1)`)" in ds[0].message
    assert "the language has no op for aten.cumsum.default" in ds[1].message
    assert "a boolean attention mask" in ds[2].message


def test_training_batchnorm_is_refused_with_why():
    with pytest.raises(DslError) as e:
        from_torch(Residual().train(), (torch.randn(2, 8, 6, 6),))
    # the running statistics' update, and the batch count's (an in-place add the language has no op for)
    (d,) = [d for d in e.value.diagnostics if "node 'batch_norm'" in d.message]
    assert "batch norm in training mode" in d.message and "eval mode" in d.message
    assert (d.loc.file, d.loc.line) == (__file__, _line_of(Residual.forward, "self.bn("))


def returns_input(x):
    return x.transpose(0, 1), x * 2


def test_an_input_returned_is_refused():
    with pytest.raises(DslError) as e:
        from_torch(returns_input, (torch.randn(2, 3),))
    assert "returns an input" in str(e.value)


def mixed(x, n):
    return x + n


def test_a_rule_the_checker_enforces_is_told_at_the_node():
    """torch promotes an int32 operand of a float sum; the language does not: the checker's error, at the node."""
    with pytest.raises(DslError) as e:
        from_torch(mixed, (torch.ones(2, 4), torch.ones(2, 4, dtype=torch.int32)))
    (d,) = e.value.diagnostics
    assert (d.loc.file, d.loc.line) == (__file__, _line_of(mixed, "x + n"))
    assert "cannot express node 'add'" in d.message
    assert "the language refuses it: add: dtype conflict: input 1 is float, input 2 is int32" in d.message


# ---- the command line --------------------------------------------------------------------------------------


def test_example_types_are_cdg_types():
    t = example_tensor("half[2, 4, 3, 3] nhwc")
    assert t.dtype == torch.float16 and t.shape == (2, 4, 3, 3) and t.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="DTYPE"):
        example_tensor("float(2, 3)")


def test_cli_imports_a_module_of_a_python_file(tmp_path):
    src = tmp_path / "model.py"
    imports = "import torch.nn.functional as F\nfrom torch import nn\n\n\n"
    src.write_text(imports + inspect.getsource(ConvBiasRelu))
    out = tmp_path / "block.cdg"
    r = run_cli("import", "--from-torch", f"{src}:ConvBiasRelu", "--example", "float[2, 4, 9, 9] nhwc", "-o", out)
    assert r.returncode == 0, r.stderr
    assert load(str(out)).ok and "input x : float[2, 4, 9, 9] nhwc" in out.read_text()
    r = run_cli("fmt", "--check", out)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_refusal_quotes_the_users_line(tmp_path):
    src = tmp_path / "model.py"
    src.write_text("import torch\n\n\ndef block(x):\n    return torch.softmax(x, -1)\n")
    r = run_cli("import", "--from-torch", f"{src}:block", "--example", "float[2, 4]")
    assert r.returncode == 1
    assert f"{src}:5:5: error: cannot express node 'softmax'" in r.stderr
    assert "\n      return torch.softmax(x, -1)\n      ^^^^" in r.stderr  # the user's line, with the caret


@pytest.mark.parametrize(
    "args, message",
    [
        (["--from-torch", "model.txt:f"], "FILE.py:NAME"),
        (["--example", "float[2]"], "--from-torch FILE.py:NAME takes"),
        (["--from-torch", "nowhere.py:f"], "no such file"),
    ],
)
def test_cli_usage_errors(args, message):
    r = run_cli("import", *args)
    assert r.returncode == 2 and message in r.stderr


def scaled(x, k: int):
    return x * k


def test_an_argument_that_is_not_a_tensor_is_refused():
    with pytest.raises(DslError, match="'k' is not a tensor"):
        from_torch(scaled, (torch.randn(2, 3), 3))
