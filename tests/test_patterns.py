"""torch.compile patterns from .cdg graphs (cudnn_dsl.patterns), on the CPU: unmodified models compiled with
fullgraph=True, their regions replaced by the graphs' ops (whose CPU kernel runs the reference), the report's
replacements and near misses, and what docs/pytorch.md says of calling an op from PyTorch code."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._inductor import config as inductor_config

import cudnn_dsl
from cudnn_dsl import patterns
from cudnn_dsl.target.dtypes import tolerance
from dsl.diagnostics import DslError
from examples.torch_models.models import Attention, ConvBnRelu

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "torch_models"


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_conv_batchnorm_relu_is_replaced_and_a_channels_last_input_is_not():
    torch.manual_seed(0)
    model = ConvBnRelu().eval()
    x = torch.randn(3, 4, 16, 16)  # N = 3: inside the graph's range 1..8
    with patterns.install(EXAMPLES / "conv_bn_relu.cdg") as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
        torch.testing.assert_close(y, model(x))
        assert [r.training for r in installed.report.replaced] == [False]
        assert "models.py:" in installed.report.replaced[0].where  # the model's line
        torch._dynamo.reset()
        nhwc = x.to(memory_format=torch.channels_last)
        torch.testing.assert_close(torch.compile(model, fullgraph=True)(nhwc), model(nhwc))
    assert len(installed.report.replaced) == 1
    [missed] = installed.report.missed
    assert "'x' has strides" in missed.why


def test_half_channels_last_conv_batchnorm_relu_is_replaced():
    """The form cuDNN fuses whole on an H200: the model after `.half()` and channels_last, its inputs so."""
    torch.manual_seed(0)
    model = ConvBnRelu().eval().half().to(memory_format=torch.channels_last)
    x = torch.randn(5, 4, 16, 16, dtype=torch.half).to(memory_format=torch.channels_last)
    with patterns.install(EXAMPLES / "conv_bn_relu_half.cdg") as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
    assert [r.graph.split()[0] for r in installed.report.replaced] == ["conv_bn_relu_half"]
    assert installed.report.missed == []
    # the graph keeps the convolution's sum in float where the model rounds it to half: half's tolerance
    atol, rtol = tolerance("half")
    torch.testing.assert_close(y, model(x), atol=atol, rtol=rtol)


def test_a_model_in_another_dtype_is_a_near_miss():
    """The float graph's ops, op for op, in a double model: reported with the dtype, not replaced."""
    torch.manual_seed(0)
    model = ConvBnRelu().eval().double()
    x = torch.randn(2, 4, 16, 16, dtype=torch.double)
    with patterns.install(EXAMPLES / "conv_bn_relu.cdg") as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
    assert installed.report.replaced == []
    [missed] = installed.report.missed
    assert "'x' is torch.float64, the graph declares torch.float32" in missed.why
    torch.testing.assert_close(y, model(x))


def test_attention_is_replaced_for_inference_and_for_training():
    torch.manual_seed(0)
    model = Attention()
    x = torch.randn(2, 16, 64)
    with patterns.install(EXAMPLES / "*.cdg") as installed:
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(model, fullgraph=True)(x), model(x))
        torch._dynamo.reset()
        torch.compile(model, fullgraph=True)(x).square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for got, p in zip(grads, model.parameters()):
        torch.testing.assert_close(got, p.grad)
    assert [r.training for r in installed.report.replaced] == [False, True]
    assert all("attention" in r.graph for r in installed.report.replaced)


def test_a_graph_written_in_place_is_refused_at_its_declaration(tmp_path):
    src = tmp_path / "inplace.cdg"
    src.write_text("graph g {\n  input x : float[4]\n  output y in x = relu(x)\n}\n")
    with pytest.raises(DslError, match="cannot be a torch.compile pattern: an output is written in place") as e:
        patterns.install(src)
    assert "inplace.cdg:1:1" in str(e.value)


def test_a_graph_reading_a_buffer_through_views_is_refused_at_its_declaration(tmp_path):
    src = tmp_path / "views.cdg"
    src.write_text(
        "graph g {\n  buffer q : float[8]\n  input q1 : float[4] in q at 0\n  input q2 : float[4] in q at 4\n"
        "  output y = q1 + q2\n}\n"
    )
    with pytest.raises(DslError, match="cannot be a torch.compile pattern: an input is a view of a buffer") as e:
        patterns.install(src)
    assert "views.cdg:1:1" in str(e.value)


PAGED = """graph paged {
  input q : float[2, 2, 4, 8]
  input kc : float[6, 2, 3, 8]
  input vc : float[6, 2, 3, 8]
  input lq : int32[2, 1, 1, 1]
  input lkv : int32[2, 1, 1, 1]
  input tk : int32[2, 1, 3, 1]
  input tv : int32[2, 1, 3, 1]
  output o = sdpa(q, kc, vc, seq_len_q=lq, seq_len_kv=lkv, page_table_k=tk, page_table_v=tv)
}
"""


def test_a_paged_graph_is_traced_on_valid_page_tables_and_lengths(tmp_path):
    """Inductor runs the search on its examples: drawn as `run` draws inputs, index inputs within their op's
    values (uninitialised, a page table indexes outside the cache)."""
    src = tmp_path / "paged.cdg"
    src.write_text(PAGED)
    with patterns.install(src) as installed:
        [graph] = installed.graphs
        ex = dict(zip(graph.op.tensor_names, graph.examples))
        assert sorted(ex["tk"].flatten().tolist()) == list(range(6))  # the cache's blocks, each once
        assert 1 <= int(ex["lkv"].min()) and int(ex["lkv"].max()) <= 9


def test_installed_sets_uninstall_in_any_order():
    src = EXAMPLES / "conv_bn_relu.cdg"
    before = inductor_config.joint_custom_post_pass
    a, b = patterns.install(src), patterns.install(src)
    a.uninstall()
    assert inductor_config.joint_custom_post_pass.sets == [b]
    b.uninstall()
    assert inductor_config.joint_custom_post_pass is before
    c = patterns.install(src)
    with patterns.install(src) as d:
        assert inductor_config.joint_custom_post_pass.sets == [c, d]
    c.uninstall()
    c.uninstall()  # twice: nothing more to remove
    assert inductor_config.joint_custom_post_pass is before


def test_a_model_compiled_before_the_install_is_compiled_again_with_its_patterns():
    """torch.compile would serve the frame compiled before (another instance of the class too) without Inductor's
    passes: the install starts it afresh."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 16, 16)
    with torch.no_grad():
        torch.compile(ConvBnRelu().eval(), fullgraph=True)(x)
        with patterns.install(EXAMPLES / "conv_bn_relu.cdg") as installed:
            model = ConvBnRelu().eval()
            torch.testing.assert_close(torch.compile(model, fullgraph=True)(x), model(x))
    assert len(installed.report.replaced) == 1, installed.report


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without CUDA")
def test_patterns_for_cuda_without_a_gpu_are_a_clear_error():
    with pytest.raises(ValueError, match="device='cuda': torch here sees no CUDA GPU"):
        patterns.install_library("llama", dtype="bf16", device="cuda")


def test_no_file_matching_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        patterns.install(tmp_path / "*.cdg")


# ---- docs/pytorch.md: calling a graph's op from PyTorch code ----------------------------------------


def test_batchnorm_folded_into_scale_and_shift():
    torch.manual_seed(0)
    bn = ConvBnRelu().bn.eval()
    cg = cudnn_dsl.compile(text=FOLDED)
    op = cudnn_dsl.as_torch_op(cg)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    shift = bn.bias - bn.running_mean * scale
    y = torch.randn(2, 8, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(op(y, scale.view(1, -1, 1, 1), shift.view(1, -1, 1, 1)), bn(y))
        with pytest.raises(cudnn_dsl.BindingError, match="expected shape"):  # [C] is not [1, C, 1, 1]
            op(y, scale, shift)


FOLDED = """graph folded {
  io float
  input y : float[2, 8, 4, 4]
  input scale : float[1, 8, 1, 1]
  input shift : float[1, 8, 1, 1]
  output out = y * scale + shift
}
"""


def test_linear_weight_is_col_major():
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 16)
    cg = cudnn_dsl.compile(
        text="graph lin {\n  io float\n  input x : float[1, 8, 32]\n  input w : float[1, 32, 16] col_major\n"
        "  input b : float[1, 1, 16]\n  output y = matmul(x, w) + b\n}\n"
    )
    w = linear.weight.t().unsqueeze(0)  # the weight's own memory: no copy
    assert w.data_ptr() == linear.weight.data_ptr() and w.stride()[1:] == (1, 32)
    x = torch.randn(1, 8, 32)
    with torch.no_grad():
        torch.testing.assert_close(cudnn_dsl.as_torch_op(cg)(x, w, linear.bias.view(1, 1, -1)), linear(x))


def test_padding_lengths_are_a_key_padding_mask():
    torch.manual_seed(0)
    cg = cudnn_dsl.compile(
        text="graph pad {\n  io float\n  input q : float[2, 2, 8, 16]\n  input k : float[2, 2, 8, 16]\n"
        "  input v : float[2, 2, 8, 16]\n  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n"
        "  output o = sdpa(q, k, v, seq_len_q=lq, seq_len_kv=lkv)\n}\n"
    )
    q, k, v = (torch.randn(2, 2, 8, 16) for _ in range(3))
    lengths = torch.tensor([8, 5], dtype=torch.int32)
    keep = torch.arange(8)[None, :] < lengths[:, None]  # [B, S_kv]: the keys a sequence has
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
    full = torch.full((2, 1, 1, 1), 8, dtype=torch.int32)
    got = cudnn_dsl.as_torch_op(cg)(q, k, v, full, lengths.view(2, 1, 1, 1))
    torch.testing.assert_close(got, want)
