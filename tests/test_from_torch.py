"""cudnn_dsl.from_torch and `import --from-torch`: a traced PyTorch function or module as a checked .cdg graph.

Round trips: the imported graph's CPU reference, on the function's own inputs (bound as views of their
memory), equals the function. Refusals: every node the language cannot express, located at the user's line.
"""

import copy
import inspect

import pytest
import torch
import torch.nn.functional as F
from cli_util import run_cli
from torch import nn

import cudnn_dsl
from cudnn_dsl.cli.import_ import example_tensor
from cudnn_dsl.interop.from_torch import from_torch
from cudnn_dsl.run.reference import run_reference
from dsl.diagnostics import DslError
from dsl.pipeline import load
from examples.torch_models.gpt2 import Block, GPTConfig
from examples.torch_models.resnet import BasicBlock, Bottleneck, conv1x1

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


def masked_attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


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
    "sdpa_float_mask": (masked_attention, lambda: (*_heads(), torch.randn(1, 1, 6, 6))),
}


def _round_trip(fn, args, tol=1e-5):
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
        torch.testing.assert_close(got[name], w, atol=tol, rtol=tol)
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


# ---- models as people write them ------------------------------------------------------------------------------


def _trained_statistics(model: nn.Module) -> nn.Module:
    """BatchNorms with running statistics and an affine of their own (a fresh one's would hide a swapped pair)."""
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.normal_()
            bn.bias.normal_()
    return model


RESNET_BLOCKS = {
    "basic_block": lambda: BasicBlock(8, 8),
    "basic_block_downsample": lambda: BasicBlock(8, 16, 2, nn.Sequential(conv1x1(8, 16, 2), nn.BatchNorm2d(16))),
    "bottleneck_downsample": lambda: Bottleneck(16, 8, 1, nn.Sequential(conv1x1(16, 32), nn.BatchNorm2d(32))),
}


@pytest.mark.parametrize("block", sorted(RESNET_BLOCKS))
def test_torchvision_resnet_blocks_import_as_written(block):
    """`nn.ReLU(inplace=True)` and `out += identity` are relu and add; each eval BatchNorm is folded into a scale and
    a shift that `bind` computes from its statistics (`y * scale + shift`, which cuDNN fuses after a conv)."""
    model = _trained_statistics(RESNET_BLOCKS[block]()).eval()
    c = model.conv1.in_channels
    imported = _round_trip(model, (torch.randn(2, c, 8, 8),), tol=1e-4)
    assert "batchnorm" not in imported.text
    assert "bn1 = conv2d * bn1_scale + bn1_shift" in imported.text
    bound = imported.bind(torch.randn(2, c, 8, 8))
    want = model.bn1.weight / torch.sqrt(model.bn1.running_var + model.bn1.eps)
    torch.testing.assert_close(bound["bn1_scale"].flatten(), want.detach())


def test_nanogpt_block_imports_as_written():
    """`c_attn(x).split(n_embd, dim=2)` is three slices, `.view(B, T, nh, hs).transpose(1, 2)` reshape and
    transpose, causal scaled_dot_product_attention is sdpa; LayerNorm, the tanh GELU MLP and the residuals."""
    model = Block(GPTConfig(n_embd=64, n_head=4, block_size=16)).eval()
    imported = _round_trip(model, (torch.randn(2, 16, 64),), tol=1e-4)
    text = imported.text
    assert "split_1 = slice(linear, start=[0, 0, 64], end=[2, 16, 128])" in text
    assert "sdpa(transpose_1, transpose, transpose_2, causal=true)" in text
    assert "gelu_tanh(linear_2)" in text and text.count("layernorm(") == 2


def test_hf_transformers_gpt2_mlp_imports_as_written():
    """HF's Conv1D calls torch.addmm(bias, x.view(-1, in), weight): a matmul of its [in, out] weight plus the bias."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    torch.manual_seed(0)
    mlp = GPT2MLP(256, transformers.GPT2Config(n_embd=64)).eval()
    imported = _round_trip(mlp, (torch.randn(2, 16, 64),), tol=1e-4)
    assert imported.text.count("matmul(") == 2 and "c_fc_weight : float[64, 256]" in imported.text


def addmm_scaled(bias, x, w):
    return torch.addmm(bias, x, w, beta=0.5)


def test_an_addmm_that_scales_its_terms_is_refused():
    with pytest.raises(DslError, match="beta=0.5"):
        from_torch(addmm_scaled, (torch.randn(4), torch.randn(3, 5), torch.randn(5, 4)))


def test_a_half_block_reads_each_matmul_operand_in_its_dtype():
    """torch rounds each op's result to half; the language computes in float: the operand of a matmul, conv, norm or
    attention is declared half where torch has it half (cuDNN's ops take their operands in one dtype)."""
    model = Block(GPTConfig(n_embd=64, n_head=4, block_size=16)).eval().half()
    imported = _round_trip(model, (torch.randn(2, 16, 64).half(),), tol=2e-2)
    assert "linear : half = matmul(layer_norm, attn_c_attn_weight) + attn_c_attn_bias" in imported.text
    assert "gelu : half = gelu_tanh(linear_2)" in imported.text


def in_place(x, y):
    h = x * 2
    h.relu_()
    h += y
    h.mul_(0.5)
    y.sub_(1)  # an argument written in place: an output over its memory
    return h


def test_in_place_ops_are_their_pure_ops():
    x, y = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    imported = from_torch(in_place, (x, y))
    assert "output sub in y = y - 1" in imported.text
    graph = imported.program.graphs[0]
    got = run_reference(graph, graph.instances[0], imported.bind(x, y.clone()))
    y_after = y.clone()
    torch.testing.assert_close(got[imported.outputs[0]], in_place(x, y_after))
    torch.testing.assert_close(got["sub"], y_after)


def written_while_read_transposed(x):
    y = x.t() * 2
    x.add_(1)
    return y


def test_a_write_over_an_input_read_through_another_view_is_refused():
    """One kernel would read x transposed while writing x: an element could be read after another thread wrote it."""
    with pytest.raises(DslError) as e:
        from_torch(written_while_read_transposed, (torch.randn(4, 4),))
    (d,) = e.value.diagnostics
    assert "written in place over an input the graph also reads through another view ('x')" in d.message
    assert d.loc.line == _line_of(written_while_read_transposed, "x.add_(1)")


def pieces(x):
    """split, chunk, unbind and select, of a computed value and of an argument."""
    h = torch.tanh(x)
    a, b, c = h.split([1, 2, 1], dim=-1)
    p, q = h.chunk(2, dim=1)
    first, *_ = h.unbind(0)
    return a * c + b.sum(-1, keepdim=True), p - q, first * x[1], x.split(2, dim=-1)[1] * 3


def test_split_chunk_unbind_and_select_are_slices():
    imported = _round_trip(pieces, (torch.randn(2, 4, 4),))
    text = imported.text
    assert "split_with_sizes_1 = slice(tanh, start=[0, 0, 1], end=[2, 4, 3])" in text
    assert "split_1 = slice(tanh, start=[0, 2, 0], end=[2, 4, 4])" in text  # chunk's second half
    assert "unbind_0 = reshape(slice(tanh, start=[0, 0, 0], end=[1, 4, 4]), shape=[4, 4])" in text
    assert "select = reshape(slice(x, start=[1, 0, 0], end=[2, 4, 4]), shape=[4, 4])" in text
    assert "unbind_1" not in text  # the parts nothing reads are not made


class SelfAttention(nn.Module):
    def __init__(self, need_weights: bool):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.need_weights = need_weights

    def forward(self, x):
        return self.attn(x, x, x, need_weights=self.need_weights)[0]


def test_multihead_attention_imports_as_sdpa():
    imported = _round_trip(SelfAttention(need_weights=False).eval(), (torch.randn(2, 6, 32),), tol=1e-5)
    assert imported.text.count("sdpa(") == 1
    assert "input attn_in_proj_weight : float[1, 32, 96] col_major" in imported.text


def test_multihead_attention_returning_its_weights_is_refused_with_what_to_do():
    with pytest.raises(DslError) as e:
        from_torch(SelfAttention(need_weights=True).eval(), (torch.randn(2, 6, 32),))
    (d,) = [d for d in e.value.diagnostics if "softmax" in d.message]
    assert "need_weights=False" in d.message


def test_training_batchnorm_is_the_languages_batchnorm():
    """The running statistics are outputs written over the module's buffers; the batch count is noted, not kept."""
    model = _trained_statistics(BasicBlock(8, 8)).train()
    x = torch.randn(4, 8, 6, 6)
    imported = from_torch(model, (x,))
    assert "output bn1_next_mean in bn1_running_mean" in imported.text
    assert [d.severity for d in imported.notes] == ["warning", "warning"]
    assert "'bn1.num_batches_tracked'" in imported.notes[0].message
    assert imported.notes[0].loc.file.endswith("resnet.py")
    graph = imported.program.graphs[0]
    torch_model = copy.deepcopy(model)
    got = run_reference(graph, graph.instances[0], imported.bind(x))
    torch.testing.assert_close(got[imported.outputs[0]], torch_model(x), atol=1e-4, rtol=1e-4)
    for bn in ("bn1", "bn2"):
        torch.testing.assert_close(got[f"{bn}_next_mean"].flatten(), getattr(torch_model, bn).running_mean)
        torch.testing.assert_close(got[f"{bn}_next_var"].flatten(), getattr(torch_model, bn).running_var)


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
        (["graph.json", "--require-whole"], "go with --from-torch"),
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


HALF_NHWC = "half[8, 64, 16, 16] nhwc"


def _model_file(tmp_path, body: str):
    src = tmp_path / "model.py"
    imports = "import torch\nfrom torch import nn\n\nfrom examples.torch_models.resnet import BasicBlock\n\n"
    src.write_text(imports + body)
    return src


def test_cli_require_whole_refuses_a_graph_cuDNN_splits(tmp_path):
    """A BasicBlock is two convolutions: cuDNN for the H200 runs it as two graphs, planned without a GPU."""
    src = _model_file(tmp_path, "block = BasicBlock(64, 64).half().to(memory_format=torch.channels_last)\n")
    out = tmp_path / "block.cdg"
    r = run_cli("import", "--from-torch", f"{src}:block", "--example", HALF_NHWC, "-o", out)
    assert r.returncode == 0, r.stderr
    assert "graph basicblock: splits into 2 parts for NVIDIA H200, 2 cuDNN launches" in r.stderr
    assert "part 2: conv_fprop (line 18)" in r.stderr and out.exists()
    out.unlink()
    r = run_cli("import", "--from-torch", f"{src}:block", "--example", HALF_NHWC, "-o", out, "--require-whole")
    assert r.returncode == 1
    assert "splits into 2 parts" in r.stderr and "cuDNN declines it whole" in r.stderr
    want = "error: not one cuDNN graph for NVIDIA H200 (--require-whole): graph basicblock splits into 2 parts"
    assert want in r.stderr and "nothing written" in r.stderr
    assert not out.exists()


def test_cli_require_whole_passes_a_graph_cuDNN_fuses(tmp_path):
    """conv -> BatchNorm -> ReLU(inplace=True), half channels-last: one cuDNN graph on the H200."""
    body = (
        "class ConvBnRelu(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)\n"
        "        self.bn = nn.BatchNorm2d(64)\n"
        "        self.relu = nn.ReLU(inplace=True)\n\n"
        "    def forward(self, x):\n"
        "        return self.relu(self.bn(self.conv(x)))\n\n\n"
        "block = ConvBnRelu().half().to(memory_format=torch.channels_last)\n"
    )
    src = _model_file(tmp_path, body)
    r = run_cli("import", "--from-torch", f"{src}:block", "--example", HALF_NHWC, "--require-whole")
    assert r.returncode == 0, r.stderr
    assert "graph convbnrelu: one cuDNN graph for NVIDIA H200" in r.stderr
    assert "output relu : half[8, 64, 16, 16] nhwc = relu(bn)" in r.stdout
