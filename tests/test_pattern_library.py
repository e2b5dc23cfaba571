"""The bundled pattern library (cudnn_dsl.patterns.install_library) on unmodified models as people write them,
on the CPU (the ops run the graphs' references): torchvision's BasicBlock and Bottleneck stacks, nanoGPT's
Block, MLP blocks and HF transformers' layers, region by region, with outputs and gradients equal to the model's,
and every compute op left to torch named in the report; bench/models.py --tiny, whose numerics checks are its exit
code."""

import contextlib
import copy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from cudnn_dsl import patterns
from cudnn_dsl.patterns import library
from cudnn_dsl.torch_op.layout import LayoutWarning
from dsl.pipeline import load
from examples.torch_models.gpt2 import Block, GPTConfig
from examples.torch_models.llama import DecoderLayer, FeedForward, LlamaConfig
from examples.torch_models.resnet import BasicBlock, Bottleneck, conv1x1

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _resnet_stack() -> torch.nn.Module:
    torch.manual_seed(0)
    downsample = torch.nn.Sequential(conv1x1(16, 32, 2), torch.nn.BatchNorm2d(32))
    model = torch.nn.Sequential(BasicBlock(16, 16), Bottleneck(16, 8, 2, downsample=downsample)).eval()
    with torch.no_grad():  # statistics and affines of their own: a fresh BatchNorm's are the identity
        for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return model


def _graphs(report) -> list[str]:
    return sorted(r.graph.split()[0] for r in report.replaced)


# BasicBlock: conv-bn-relu, conv-bn-add-relu; Bottleneck with a strided downsample: 1x1, 3x3 stride 2, 1x1 +
# residual, and the downsample's 1x1 stride 2 + BatchNorm
_EVERY_CONV = [
    "conv1x1_bn_add_relu_float",
    "conv1x1_bn_relu_float",
    "conv1x1s2_bn_float",
    "conv3x3_bn_add_relu_float",
    "conv3x3_bn_relu_float",
    "conv3x3s2_bn_relu_float",
]


def test_every_convolution_of_basic_and_bottleneck_blocks_is_replaced_in_eval():
    model = _resnet_stack()
    x = torch.randn(2, 16, 8, 8)
    with patterns.install_library("resnet", dtype="float", channels_last=False) as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(y, model(x))
    assert _graphs(installed.report) == _EVERY_CONV
    assert installed.report.missed == [] and installed.report.unmatched == []


def test_a_batchnorm_of_another_eps_is_replaced_for_inference():
    """Without gradients an eval BatchNorm is matched as the pointwise ops it computes, whatever its eps (with
    them, as F.batch_norm with torch's default eps)."""
    model = _resnet_stack()
    for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
        bn.eps = 1e-3
    x = torch.randn(2, 16, 8, 8)
    with patterns.install_library("resnet", dtype="float", channels_last=False) as installed, torch.no_grad():
        torch.testing.assert_close(torch.compile(model, fullgraph=True)(x), model(x))
    assert _graphs(installed.report) == _EVERY_CONV


def test_an_eval_model_run_with_autograd_on_is_replaced_with_the_models_gradients():
    """Without torch.no_grad() the regions are matched with their backward (the BatchNorm's as torch computes it
    from the running variance), and every parameter's gradient is the unmodified model's."""
    model, twin = _resnet_stack(), _resnet_stack()
    x = torch.randn(2, 16, 8, 8)
    installed = patterns.install_library("resnet", dtype="float", channels_last=False)
    _trains_alike(model, twin, x, installed)
    assert _graphs(installed.report) == _EVERY_CONV
    assert all(r.training for r in installed.report.replaced)
    assert installed.report.missed == [] and installed.report.unmatched == []


def test_under_autocast_a_float_resnet_takes_the_autocast_graphs_with_its_gradients():
    """Autocast runs each convolution in bf16 and its BatchNorm on the model's float parameters; the BasicBlock's
    residual (its float input) is added in float, so its second convolution takes the graph without the add."""
    model, twin = (_resnet_stack().to(memory_format=torch.channels_last) for _ in range(2))
    x = torch.randn(2, 16, 8, 8).to(memory_format=torch.channels_last)
    installed = patterns.install_library("resnet", dtype="bf16", autocast=True)
    _trains_alike(model, twin, x, installed, autocast=torch.bfloat16)
    assert _graphs(installed.report) == [
        "conv1x1_bn_add_relu_bf16_autocast",
        "conv1x1_bn_relu_bf16_autocast",
        "conv1x1s2_bn_bf16_autocast",
        "conv3x3_bn_bf16_autocast",
        "conv3x3_bn_relu_bf16_autocast",
        "conv3x3s2_bn_relu_bf16_autocast",
    ]
    assert all(r.training for r in installed.report.replaced) and installed.report.unmatched == []


def _trains_alike(model, twin, x, installed_library, autocast=None) -> None:
    """One step of the model compiled with the library and of its twin (the same weights, both with autograd):
    outputs, every gradient and the BatchNorms' running statistics alike. Under autocast, where the two round
    differently (torch rounds a convolution's result to bf16 before its BatchNorm, the fused graph does not), each
    is held to a float twin: the library's values no further from it than torch's, give or take bf16's rounding."""
    exact = copy.deepcopy(twin) if autocast else None
    ctx = torch.autocast(x.device.type, dtype=autocast) if autocast else contextlib.nullcontext()
    with installed_library, ctx:
        y = torch.compile(model, fullgraph=True)(x)
        y.float().square().mean().backward()
        want = twin(x)
        want.float().square().mean().backward()
    pairs = [("output", y, want)]
    pairs += [(name, p.grad, q.grad) for (name, p), q in zip(model.named_parameters(), twin.parameters())]
    pairs += [(name, a, b) for (name, a), b in zip(model.named_buffers(), twin.buffers())]
    if exact is None:
        for name, got, expected in pairs:
            torch.testing.assert_close(got, expected, msg=name)
        return
    ref = exact(x)
    ref.square().mean().backward()
    refs = [ref] + [p.grad for p in exact.parameters()] + list(exact.buffers())
    for (name, got, expected), r in zip(pairs, refs):
        if not got.is_floating_point():
            assert torch.equal(got, expected), name  # the batches counted
            continue
        ours, theirs = ((t.float() - r.float()).abs().max().item() for t in (got, expected))
        scale = r.float().abs().max().item()
        assert ours <= 2 * theirs + 2**-8 * scale, f"{name}: {ours:.3g} from float, torch's autocast {theirs:.3g}"


def test_resnet_blocks_in_training_mode_train_through_their_convolutions_and_batch_statistics():
    """A BatchNorm in training mode: its batch's statistics, its running statistics written back by the model
    (the graph returns their next values), its backward from the saved statistics."""
    model, twin = _resnet_stack().train(), _resnet_stack().train()
    library_ = patterns.install_library("resnet", dtype="float", channels_last=False)
    _trains_alike(model, twin, torch.randn(4, 16, 8, 8), library_)
    assert all(r.training for r in library_.report.replaced)
    assert _graphs(library_.report) == sorted(g.replace("_float", "_train_float") for g in _EVERY_CONV)
    assert library_.report.unmatched == []


def test_a_layernorm_is_not_named_a_batchnorm_in_training_mode():
    """LayerNorm's decomposition takes a var_mean too: only a BatchNorm's is batch statistics."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    with patterns.install_library("resnet", dtype="float", channels_last=False) as installed:
        torch.compile(model, fullgraph=True)(torch.randn(4, 8)).sum().backward()
    assert installed.report.unmatched and not any("batch statistics" in str(u) for u in installed.report.unmatched)


class _Twice(torch.nn.Module):
    """One block run on two inputs (a Siamese encoder): its BatchNorms' second run reads the first's running
    statistics."""

    def __init__(self, block: torch.nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x):
        a, b = x.chunk(2)
        return self.block(a) * self.block(b)


def test_a_block_run_twice_in_training_mode_trains_alike():
    model, twin = (_Twice(BasicBlock(16, 16).train()) for _ in range(2))
    twin.load_state_dict(model.state_dict())
    library_ = patterns.install_library("resnet", dtype="float", channels_last=False)
    _trains_alike(model, twin, torch.randn(8, 16, 8, 8), library_)
    assert len(library_.report.replaced) == 4


def test_under_autocast_resnet_blocks_train_through_the_autocast_graphs():
    model, twin = (_resnet_stack().train().to(memory_format=torch.channels_last) for _ in range(2))
    x = torch.randn(4, 16, 8, 8).to(memory_format=torch.channels_last)
    library_ = patterns.install_library("resnet", dtype="bf16", autocast=True)
    _trains_alike(model, twin, x, library_, autocast=torch.bfloat16)
    assert len(library_.report.replaced) == 6 and all(
        "_train_bf16_autocast" in r.graph for r in library_.report.replaced
    )


def test_a_batchnorm_in_training_mode_of_a_low_precision_model_is_named_for_each_convolution_it_normalizes():
    """The training-mode graphs are a float model's or an autocast one's (float parameters and statistics)."""
    model = _resnet_stack().train().to(torch.bfloat16)
    x = torch.randn(4, 16, 8, 8, dtype=torch.bfloat16)
    with patterns.install_library("resnet", dtype="bf16", channels_last=False) as installed:
        torch.compile(model, fullgraph=True)(x).float().sum().backward()
    assert installed.report.replaced == []
    convs = [u for u in installed.report.unmatched if u.op == "aten.convolution"]
    assert len(convs) == 6 and all("batch statistics (a BatchNorm in training mode)" in str(u) for u in convs)


def test_a_channels_last_model_is_not_replaced_by_nchw_graphs_and_the_report_says_why():
    model = _resnet_stack().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 8, 8).to(memory_format=torch.channels_last)
    with patterns.install_library("resnet", dtype="float", channels_last=False) as installed, torch.no_grad():
        torch.testing.assert_close(torch.compile(model, fullgraph=True)(x), model(x))
    assert installed.report.replaced == []
    assert installed.report.missed and all("has strides" in m.why for m in installed.report.missed)


def _gpt_block() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Block(GPTConfig(block_size=16, n_embd=64, n_head=4)), torch.randn(2, 16, 64)


def test_a_gpt_block_is_replaced_region_by_region_for_inference():
    model, x = _gpt_block()
    with patterns.install_library("gpt", dtype="float", channels_last=False) as installed, torch.no_grad():
        with warnings.catch_warnings():  # q, k and v are taken as the split gives them, not copied
            warnings.simplefilter("error", LayoutWarning)
            y = torch.compile(model.eval(), fullgraph=True)(x)
    torch.testing.assert_close(y, model(x))
    assert _graphs(installed.report) == [
        "add_layernorm_float",  # ln_2 with the residual add it reads
        "causal_attention_packed_float",
        "layernorm_float",
        "linear_gelu_tanh_float",
    ]
    # the Linears without an activation are no graph of the library's: named, with their lines and modules (the
    # MLP's c_proj is on the line of the region replaced before it)
    left = installed.report.unmatched
    assert all("aten.addmm: no installed graph" in str(u) for u in left)
    assert sorted((u.where.split(":")[1].split()[0], u.module) for u in left) == [
        ("38", "c_attn"),
        ("45", "c_proj"),
        ("57", "c_proj"),
    ]


@pytest.mark.parametrize("add", ["alpha", "number"])
def test_an_add_that_is_no_residual_add_before_a_norm_leaves_the_norm_alone(add):
    """`torch.add(x, r, alpha=0.5)` has the ops of a residual add (Inductor's match ignores alpha) and `x + 1.0` adds
    a Python number: the norm is replaced alone, the add left as the model wrote it."""
    norm = torch.nn.LayerNorm(64)
    x, r = torch.randn(2, 16, 64), torch.randn(2, 16, 64)

    def f(x, r):
        s = torch.add(x, r, alpha=0.5) if add == "alpha" else x + 1.0
        return s + norm(s)

    with patterns.install_library("gpt", dtype="float", channels_last=False) as installed, torch.no_grad():
        y = torch.compile(f, fullgraph=True)(x, r)
    torch.testing.assert_close(y, f(x, r))
    assert _graphs(installed.report) == ["layernorm_float"], str(installed.report)


def test_a_region_whose_ops_take_arguments_no_search_passes_is_left_to_torch():
    """Inductor's match ignores keyword arguments its pattern lacks: an addmm scaling its bias (`beta`) before
    gelu_new, and a spelled-out RMSNorm whose mean computes in float64, are near misses, computed as written."""
    from cudnn_dsl.patterns.search import _new_gelu

    torch.manual_seed(0)
    w, b, scale = torch.randn(64, 256), torch.randn(256), torch.rand(64) + 0.5

    def mlp(x):
        return _new_gelu(torch.addmm(b, x.view(-1, 64), w, beta=0.5).view(2, 16, 256))

    def norm(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True, dtype=torch.float64) + 1e-5) * scale

    x = torch.randn(2, 16, 64)
    for family, f, why in (("gpt", mlp, "beta=0.5"), ("llama", norm, "computes in torch.float64")):
        with patterns.install_library(family, dtype="float", channels_last=False) as installed, torch.no_grad():
            y = torch.compile(f, fullgraph=True)(x)
        want = f(x)
        assert y.dtype == want.dtype
        torch.testing.assert_close(y, want)
        assert installed.report.replaced == [] and any(why in m.why for m in installed.report.missed), installed.report
        torch._dynamo.reset()


def test_a_norm_of_fewer_dims_than_the_graph_declares_is_left_to_torch():
    """A single [D] token: the graph would take it as [1, 1, D] and return its rows, [1, D], not the model's [D]
    ([N, D] rows are taken: test_a_2d_input_is_taken_as_the_graphs_tokens_for_inference_and_in_training)."""
    norm, x = torch.nn.LayerNorm(64), torch.randn(64)
    with patterns.install_library("gpt", dtype="float", channels_last=False) as installed, torch.no_grad():
        y = torch.compile(norm, fullgraph=True)(x)
    torch.testing.assert_close(y, norm(x))
    assert installed.report.replaced == [] and "a 1-dim result, the graph a 2-dim one" in installed.report.missed[0].why


def test_under_autocast_the_matmuls_take_the_bf16_graphs_and_the_norms_the_float_ones():
    model, x = _gpt_block()
    library_ = patterns.install_library("gpt", dtype="bf16", autocast=True, channels_last=False)
    with library_ as installed, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.compile(model.eval(), fullgraph=True)(x)
        want = model(x)
    torch.testing.assert_close(y, want, atol=2e-2, rtol=2e-2)
    assert _graphs(installed.report) == [
        "add_layernorm_bf16_autocast",  # the float residual stream and the bf16 projection's result
        "causal_attention_packed_bf16",
        "layernorm_float",
        "linear_gelu_tanh_bf16",
    ]


def test_a_near_miss_hides_its_own_regions_ops_only_and_a_functional_rms_norm_is_named():
    """A double GPT block beside the float graphs: the MLP's Linear + GELU is a near miss (its dtype), and its c_proj,
    on the same model line, is still named; an RMSNorm a module of the model's own writes with F.rms_norm, which no
    installed graph holds, is named too."""

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(64))

        def forward(self, x):
            return torch.nn.functional.rms_norm(x, (64,), self.weight, 1e-5)

    block, x = _gpt_block()
    model = torch.nn.Sequential(Norm(), block).double().eval()
    with patterns.install_library("gpt", dtype="float", channels_last=False) as installed, torch.no_grad():
        torch.compile(model, fullgraph=True)(x.double())
    assert any(":57 " in m.where and "linear_gelu" in m.graph for m in installed.report.missed)
    left = {(u.op, u.where.split(":")[1].split()[0], u.module) for u in installed.report.unmatched}
    assert ("aten.addmm", "57", "c_proj") in left and ("aten.addmm", "57", "c_fc") not in left
    assert any(op == "aten.rms_norm" for op, _, _ in left), installed.report


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_gpt_block_trains_through_the_replaced_regions_with_the_models_gradients(mode):
    """In eval mode too, autograd on (the docs' snippet without torch.no_grad()): each region with its backward."""
    model, x = _gpt_block()
    twin = Block(GPTConfig(block_size=16, n_embd=64, n_head=4))
    twin.load_state_dict(model.state_dict())
    installed = patterns.install_library("gpt", dtype="float", channels_last=False)
    _trains_alike(model.train(mode == "train"), twin.train(mode == "train"), x, installed)
    assert all(r.training for r in installed.report.replaced)
    assert _graphs(installed.report) == [
        "causal_attention_packed_float",  # its q, k and v split from one projection want gradients through it
        "layernorm_float",
        "layernorm_float",
        "linear_gelu_tanh_float",
    ]
    assert sorted(u.op for u in installed.report.unmatched) == ["aten.addmm"] * 3  # the plain Linears


def test_under_autocast_a_gpt_block_trains_through_the_bf16_graphs_and_the_float_norms():
    model, x = _gpt_block()
    twin = Block(GPTConfig(block_size=16, n_embd=64, n_head=4))
    twin.load_state_dict(model.state_dict())
    library_ = patterns.install_library("gpt", dtype="bf16", autocast=True, channels_last=False)
    _trains_alike(model, twin, x, library_, autocast=torch.bfloat16)
    assert all(r.training for r in library_.report.replaced)
    assert _graphs(library_.report) == [
        "causal_attention_packed_bf16",
        "layernorm_float",
        "layernorm_float",
        "linear_gelu_tanh_bf16",
    ]


class _Mlp(torch.nn.Module):
    """timm's and torchvision's MLP block: fc1, its activation, fc2."""

    def __init__(self, act: torch.nn.Module, bias: bool = True, dim: int = 32, hidden: int = 64):
        super().__init__()
        self.fc1, self.act = torch.nn.Linear(dim, hidden, bias=bias), act
        self.fc2 = torch.nn.Linear(hidden, dim, bias=bias)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


_ACTIVATIONS = {"relu": torch.nn.ReLU, "silu": torch.nn.SiLU, "gelu": torch.nn.GELU}


def _mlp(act: str, bias: bool = True) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return _Mlp(_ACTIVATIONS[act](), bias), torch.randn(2, 8, 32)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("act", sorted(_ACTIVATIONS))
def test_an_mlp_blocks_linear_and_activation_are_one_region_for_inference_and_in_training(act, bias):
    model, x = _mlp(act, bias)
    graph = f"linear_{'' if bias else 'nobias_'}{act}_float"
    with patterns.install_library("mlp", dtype="float") as installed, torch.no_grad():
        y = torch.compile(model.eval(), fullgraph=True)(x)
    torch.testing.assert_close(y, model(x))
    assert _graphs(installed.report) == [graph]
    assert [u.module for u in installed.report.unmatched] == ["fc2"]  # a Linear alone is cuBLAS's in torch
    torch._dynamo.reset()
    twin = _Mlp(_ACTIVATIONS[act](), bias)
    twin.load_state_dict(model.state_dict())
    trained = patterns.install_library("mlp", dtype="float")
    _trains_alike(model.train(), twin, x, trained)
    assert [(r.graph.split()[0], r.training) for r in trained.report.replaced] == [(graph, True)]


@pytest.mark.parametrize("gated", ["swiglu", "geglu"])
def test_with_every_family_installed_a_gated_mlp_is_taken_whole(gated):
    """linear_nobias_silu and linear_nobias_gelu_tanh hold a gated MLP's first Linear and activation; the gated
    graph, which holds them and the rest, takes the region."""
    torch.manual_seed(0)
    model = FeedForward(LlamaConfig(dim=64, hidden_dim=160)).eval()
    if gated == "geglu":
        model.forward = lambda x: model.w2(F.gelu(model.w1(x), approximate="tanh") * model.w3(x))
    x = torch.randn(2, 16, 64)
    with patterns.install_library(dtype="float") as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(y, model(x))
    assert _graphs(installed.report) == [f"{gated}_float"]


def _hf_t5_mlp(gated: bool) -> torch.nn.Module:
    """HF transformers' T5 feed-forward: T5's (a Linear without bias, ReLU) or T5 v1.1's and Flan-T5's (gated, its
    GELU gelu_new spelled out), dropout off."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.t5 import modeling_t5

    act = "gelu_new" if gated else "relu"
    config = transformers.T5Config(d_model=64, d_ff=160, dropout_rate=0.0, dense_act_fn=act, is_gated_act=gated)
    torch.manual_seed(0)
    return (modeling_t5.T5DenseGatedActDense if gated else modeling_t5.T5DenseActDense)(config)


@pytest.mark.parametrize(("gated", "family", "graph"), [(False, "mlp", "linear_nobias_relu"), (True, "llama", "geglu")])
def test_hf_transformers_t5_feed_forward_is_replaced_and_trains_with_the_models_gradients(gated, family, graph):
    model, x = _hf_t5_mlp(gated).eval(), torch.randn(2, 16, 64)
    with patterns.install_library(family, dtype="float") as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(y, model(x))
    assert _graphs(installed.report) == [f"{graph}_float"]
    torch._dynamo.reset()
    trained = patterns.install_library(family, dtype="float")
    _trains_alike(model.train(), _hf_t5_mlp(gated), x, trained)
    assert _graphs(trained.report) == [f"{graph}_float"]


@pytest.mark.parametrize("families", [("gpt",), ("gpt", "mlp")])
def test_nanogpts_mlp_with_the_erf_gelu_is_replaced_by_the_gpt_family_whatever_else_is_installed(families):
    """nanoGPT's MLP calls nn.GELU() (erf): a graph of the gpt family and of mlp, installed once with both."""
    model, x = _mlp("gelu")
    with patterns.install_library(*families, dtype="float") as installed, torch.no_grad():
        y = torch.compile(model.eval(), fullgraph=True)(x)
    torch.testing.assert_close(y, model(x))
    assert _graphs(installed.report) == ["linear_gelu_float"]


@pytest.mark.parametrize("act", sorted(_ACTIVATIONS))
def test_a_2d_input_is_taken_as_the_graphs_tokens_for_inference_and_in_training(act):
    """A Linear and its activation, and a LayerNorm, over [N, D] rows (a classifier head's, a recommender's):
    the graphs over [B, T, D] tokens, at B = 1; the report names only the Linear left to torch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), _ACTIVATIONS[act](), torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)
    )
    twin = copy.deepcopy(model)
    x = torch.randn(8, 32)
    with patterns.install_library("mlp", "gpt", dtype="float") as installed, torch.no_grad():
        y = torch.compile(model.eval(), fullgraph=True)(x)
    torch.testing.assert_close(y, model(x))
    assert _graphs(installed.report) == ["layernorm_float", f"linear_{act}_float"]
    assert [u.op for u in installed.report.unmatched] == ["aten.addmm"] and installed.report.missed == []
    torch._dynamo.reset()
    trained = patterns.install_library("mlp", "gpt", dtype="float")
    _trains_alike(model.train(), twin.train(), x.requires_grad_(), trained)
    assert _graphs(trained.report) == ["layernorm_float", f"linear_{act}_float"]
    assert all(r.training for r in trained.report.replaced)


def test_under_autocast_an_mlp_block_trains_through_the_bf16_graph():
    model, x = _mlp("silu")
    twin = _Mlp(torch.nn.SiLU())
    twin.load_state_dict(model.state_dict())
    installed = patterns.install_library("mlp", dtype="bf16", autocast=True)
    _trains_alike(model, twin, x, installed, autocast=torch.bfloat16)
    assert _graphs(installed.report) == ["linear_silu_bf16"]


def test_an_activation_other_than_the_graphs_leaves_the_linear_to_torch():
    model, x = _mlp("relu")
    model.act = torch.nn.LeakyReLU(0.1)
    with patterns.install_library("mlp", dtype="float") as installed, torch.no_grad():
        y = torch.compile(model.eval(), fullgraph=True)(x)
    torch.testing.assert_close(y, model(x))
    assert installed.report.replaced == []
    assert sorted(u.module for u in installed.report.unmatched) == ["fc1", "fc2"]


@pytest.mark.parametrize("dtype", ["float", "bf16"])
def test_a_llama_layer_is_replaced_region_by_region_for_inference(dtype):
    """nn.RMSNorm, the SwiGLU MLP and grouped-query attention (enable_gqa) after RoPE; in bf16 torch computes
    the norm in float and rounds it, as the search does."""
    torch.manual_seed(0)
    dt = {"float": torch.float, "bf16": torch.bfloat16}[dtype]
    model = DecoderLayer(LlamaConfig(dim=64, n_heads=8, n_kv_heads=2, hidden_dim=160), max_seq_len=32).to(dt).eval()
    x = torch.randn(2, 32, 64, dtype=dt)
    with patterns.install_library("llama", dtype=dtype, channels_last=False) as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
    tol = {} if dtype == "float" else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(y, model(x), **tol)
    assert _graphs(installed.report) == [
        f"add_rmsnorm_{dtype}",  # the norm before the MLP, with the residual add it reads
        f"causal_attention_gqa_{dtype}",
        f"rmsnorm_{dtype}",
        f"swiglu_{dtype}",
    ]
    # where the report points: the model's lines (nn.RMSNorm's call, not torch's F.rms_norm inside it)
    assert all("llama.py:" in r.where for r in installed.report.replaced)
    # the projections without an activation (wq, wk, wv, wo, and the MLP's w2) stay cuBLAS's
    assert sorted((u.op, u.module) for u in installed.report.unmatched) == [
        ("aten.mm", m) for m in ("w2", "wk", "wo", "wq", "wv")
    ]


def test_a_llama_layer_trains_through_its_mlp_and_attention_with_the_models_gradients():
    """The RMSNorm before the MLP stays in torch: autograd adds the residual's gradient into its backward's sum,
    so no traced pattern holds it; the one on the layer's input (whose gradient nothing asks) is replaced."""
    torch.manual_seed(0)
    config = LlamaConfig(dim=64, n_heads=8, n_kv_heads=2, hidden_dim=160)
    model, twin = DecoderLayer(config, max_seq_len=32), DecoderLayer(config, max_seq_len=32)
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 32, 64)
    installed = patterns.install_library("llama", dtype="float", channels_last=False)
    _trains_alike(model, twin, x, installed)
    assert all(r.training for r in installed.report.replaced)
    assert _graphs(installed.report) == ["causal_attention_gqa_float", "rmsnorm_float", "swiglu_float"]
    norms = [u for u in installed.report.unmatched if u.op == "aten.rms_norm"]
    assert len(norms) == 1 and norms[0].joint  # named in the report, with why


def test_under_autocast_a_llama_layer_trains_through_its_mlp_whose_linears_each_cast_its_input():
    """Autocast casts the float input of the MLP once per Linear (w1's and w3's): the autocast SwiGLU graph takes it
    in float and casts it once, is searched with a cast per Linear, and trains with torch's autocast gradients."""
    torch.manual_seed(0)
    config = LlamaConfig(dim=64, n_heads=8, n_kv_heads=2, hidden_dim=160)
    model, twin = DecoderLayer(config, max_seq_len=32), DecoderLayer(config, max_seq_len=32)
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 32, 64)
    installed = patterns.install_library("llama", dtype="bf16", channels_last=False, autocast=True)
    _trains_alike(model, twin, x, installed, autocast=torch.bfloat16)
    assert all(r.training for r in installed.report.replaced)
    assert "swiglu_bf16_autocast" in _graphs(installed.report)
    # the attention's four projections and the MLP's w2 are plain Linears, which no graph holds: not a region to run
    # without autograd;
    # the RMSNorm before the MLP is one, not taken with its backward
    left = {u.op: [] for u in installed.report.unmatched}
    for u in installed.report.unmatched:
        left[u.op].append(str(u))
    assert len(left["aten.mm"]) == 5 and all("no installed graph has" in u for u in left["aten.mm"])
    assert len(left["aten.rms_norm"]) == 1 and "took this region with its backward" in left["aten.rms_norm"][0]


class _MetaRMSNorm(torch.nn.Module):
    """RMSNorm spelled out as Meta's Llama reference (and torchtune) writes it."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


class _HFRMSNorm(_MetaRMSNorm):
    """RMSNorm spelled out as HF transformers' LlamaRMSNorm writes it: the weight first."""

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        return self.weight * hidden_states.to(input_dtype)


def _llama_written(norm, dtype=torch.float, eps: float = 1e-5) -> DecoderLayer:
    """A small Llama layer whose RMSNorms are `norm` modules (weights of their own), with nn.RMSNorm's weights."""
    torch.manual_seed(0)
    model = DecoderLayer(LlamaConfig(dim=64, n_heads=8, n_kv_heads=2, hidden_dim=160), max_seq_len=32)
    for name in ("attention_norm", "ffn_norm"):
        written = norm(64, eps)
        with torch.no_grad():
            written.weight.uniform_(0.5, 1.5)
        setattr(model, name, written)
    return model.to(dtype)


@pytest.mark.parametrize(("norm", "dtype"), [(_MetaRMSNorm, "float"), (_HFRMSNorm, "bf16")])
def test_a_llama_layer_whose_rms_norm_is_spelled_out_is_replaced_as_with_nn_rms_norm(norm, dtype):
    """In bf16 the written norm rounds to bf16 before its weight's product, the graph after it: within bf16's
    tolerance."""
    dt = {"float": torch.float, "bf16": torch.bfloat16}[dtype]
    model = _llama_written(norm, dt).eval()
    x = torch.randn(2, 32, 64, dtype=dt)
    with patterns.install_library("llama", dtype=dtype, channels_last=False) as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
    tol = {} if dtype == "float" else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(y, model(x), **tol)
    graphs = _graphs(installed.report)
    assert {f"add_rmsnorm_{dtype}", f"rmsnorm_{dtype}"} <= set(graphs), installed.report
    assert not any("rms_norm" in u.op for u in installed.report.unmatched)


def test_a_llama_layer_whose_rms_norm_is_spelled_out_trains_with_the_models_gradients():
    model, twin = _llama_written(_HFRMSNorm), _llama_written(_HFRMSNorm)
    installed = patterns.install_library("llama", dtype="float", channels_last=False)
    _trains_alike(model, twin, torch.randn(2, 32, 64), installed)
    assert _graphs(installed.report) == ["causal_attention_gqa_float", "rmsnorm_float", "swiglu_float"]
    # the norm before the MLP, whose input's gradient autograd sums with the residual's, is named
    norms = [u for u in installed.report.unmatched if "rms_norm" in u.op]
    assert len(norms) == 1 and norms[0].joint, installed.report


class _HFConv1DMlp(torch.nn.Module):
    """HF transformers' GPT-2 MLP: Conv1D projections and gelu_new spelled out."""

    def __init__(self):
        super().__init__()
        pytest.importorskip("transformers")
        from transformers.activations import NewGELUActivation
        from transformers.pytorch_utils import Conv1D

        self.c_fc, self.act, self.c_proj = Conv1D(64, 32), NewGELUActivation(), Conv1D(32, 64)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


@pytest.mark.parametrize(
    ("make", "graph"),
    [(lambda: _HFRMSNorm(32), "rmsnorm_float"), (_HFConv1DMlp, "linear_kn_gelu_tanh_float")],
    ids=["rms_norm written out", "conv1d and gelu_new"],
)
def test_a_2d_input_is_taken_in_each_spelling_a_model_writes(make, graph):
    torch.manual_seed(0)
    model = make()
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(0.5, 1.5)
    twin, x = copy.deepcopy(model), torch.randn(8, 32)
    with patterns.install_library("gpt", "llama", dtype="float") as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(y, model(x))
    assert _graphs(installed.report) == [graph] and installed.report.missed == []
    torch._dynamo.reset()
    trained = patterns.install_library("gpt", "llama", dtype="float")
    _trains_alike(model, twin, x, trained)
    assert _graphs(trained.report) == [graph]


def test_a_norm_of_another_eps_is_named_and_left_to_torch_unless_the_library_is_given_it():
    model = _llama_written(_MetaRMSNorm, eps=1e-6).eval()
    model.ffn_norm = torch.nn.RMSNorm(64, eps=1e-6)
    x = torch.randn(2, 32, 64)
    with patterns.install_library("llama", dtype="float", channels_last=False) as installed, torch.no_grad():
        torch.testing.assert_close(torch.compile(model, fullgraph=True)(x), model(x))
    assert not any("rmsnorm" in g for g in _graphs(installed.report))
    norms = sorted(u.op for u in installed.report.unmatched if "rms_norm" in u.op)
    assert norms == ["aten.rms_norm", "rms_norm (written out)"], installed.report
    assert "norm_eps" in str(installed.report)
    library_ = patterns.install_library("llama", dtype="float", channels_last=False, norm_eps=1e-6)
    with library_ as installed, torch.no_grad():
        torch.testing.assert_close(torch.compile(model, fullgraph=True)(x), model(x))
    assert {"add_rmsnorm_float", "rmsnorm_float"} <= set(_graphs(installed.report)), installed.report


@pytest.mark.parametrize("eps", [0, -1e-5, 1.5, True, "1e-5"])
def test_a_norm_eps_that_is_no_eps_is_refused(eps):
    with pytest.raises(ValueError, match="norm_eps"):
        patterns.install_library("llama", norm_eps=eps)


class _HFLlamaLayer(torch.nn.Module):
    """HF transformers' LlamaDecoderLayer as its model calls it: SDPA attention, rotary embeddings of the positions."""

    def __init__(self):
        super().__init__()
        transformers = pytest.importorskip("transformers")
        from transformers.models.llama import modeling_llama

        config = transformers.LlamaConfig(
            hidden_size=64, intermediate_size=160, num_attention_heads=8, num_key_value_heads=2, rms_norm_eps=1e-5
        )
        config._attn_implementation = "sdpa"
        self.layer = modeling_llama.LlamaDecoderLayer(config, layer_idx=0)
        self.rotary = modeling_llama.LlamaRotaryEmbedding(config)

    def forward(self, x):
        positions = torch.arange(x.shape[1], device=x.device)[None]
        cos_sin = self.rotary(x, positions)
        out = self.layer(x, attention_mask=None, position_ids=positions, position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out


def _hf_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    model = _HFLlamaLayer()
    with torch.no_grad():
        for norm in (model.layer.input_layernorm, model.layer.post_attention_layernorm):
            norm.weight.uniform_(0.5, 1.5)
    return model


def test_hf_transformers_llama_layer_trains_with_the_models_gradients():
    model, twin = _hf_llama(), _hf_llama()
    installed = patterns.install_library("llama", dtype="float", channels_last=False)
    _trains_alike(model, twin, torch.randn(2, 32, 64), installed)
    assert _graphs(installed.report) == ["causal_attention_gqa_float", "rmsnorm_float", "swiglu_float"]


class _HFGPT2Block(torch.nn.Module):
    """HF transformers' GPT2Block: Conv1D projections ([in, out] weights), gelu_new spelled out, SDPA attention."""

    def __init__(self):
        super().__init__()
        transformers = pytest.importorskip("transformers")
        from transformers.models.gpt2 import modeling_gpt2

        # no dropout, as GPT-2 is trained today (llm.c, nanoGPT): a dropout would make every run its own
        config = transformers.GPT2Config(n_embd=64, n_head=4, n_positions=32, resid_pdrop=0.0, attn_pdrop=0.0)
        config._attn_implementation = "sdpa"
        self.block = modeling_gpt2.GPT2Block(config, layer_idx=0)

    def forward(self, x):
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


def _hf_gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    return _HFGPT2Block()


_HF_GPT2_GRAPHS = ["causal_attention_packed_{t}", "layernorm_{a}", "layernorm_{a}", "linear_kn_gelu_tanh_{t}{amp}"]


#: HF transformers' layers: the model, its family, the regions replaced for inference, and the modules whose Linear
#: (without an activation) stays cuBLAS's
_HF = {
    "llama": (
        _hf_llama,
        ["add_rmsnorm_{t}", "causal_attention_gqa_{t}", "rmsnorm_{t}", "swiglu_{t}"],
        ["down_proj", "k_proj", "o_proj", "q_proj", "v_proj"],
    ),
    "gpt": (
        _hf_gpt2,
        ["add_layernorm_{t}", "causal_attention_packed_{t}", "layernorm_{t}", "linear_kn_gelu_tanh_{t}"],
        ["c_attn", "c_proj"],
    ),
}


@pytest.mark.parametrize("dtype", ["float", "bf16"])
@pytest.mark.parametrize("family", sorted(_HF))
def test_hf_transformers_layers_are_replaced_region_by_region_for_inference(family, dtype):
    """HF's LlamaDecoderLayer (its RMSNorm spelled out) and GPT2Block (its MLP a Conv1D and gelu_new spelled out)."""
    make, graphs, left = _HF[family]
    dt = {"float": torch.float, "bf16": torch.bfloat16}[dtype]
    model = make().to(dt).eval()
    x = torch.randn(2, 16, 64, dtype=dt)
    with patterns.install_library(family, dtype=dtype, channels_last=False) as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
    tol = {} if dtype == "float" else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(y, model(x), **tol)
    assert _graphs(installed.report) == [g.format(t=dtype) for g in graphs]
    assert sorted(u.module for u in installed.report.unmatched) == left


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["float", "autocast"])
def test_hf_transformers_gpt2_block_trains_with_the_models_gradients(autocast):
    """Under autocast the Conv1D's float input is viewed, then cast by autocast's addmm: the autocast graph casts
    it; the GELU stays bf16 on the CPU, whose autocast leaves pow alone."""
    model, twin = _hf_gpt2(), _hf_gpt2()
    dtype = "float" if autocast is None else "bf16"
    installed = patterns.install_library("gpt", dtype=dtype, channels_last=False, autocast=autocast is not None)
    _trains_alike(model, twin, torch.randn(2, 16, 64), installed, autocast=autocast)
    amp = "" if autocast is None else "_autocast"
    want = sorted(g.format(t=dtype, a="float", amp=amp) for g in _HF_GPT2_GRAPHS)
    assert _graphs(installed.report) == want, installed.report


class _HFGemmaLayer(torch.nn.Module):
    """HF transformers' GemmaDecoderLayer (SDPA attention) with its rotary embedding: a GeGLU MLP (the tanh GELU),
    RMSNorms of eps 1e-6 that scale by 1 + weight."""

    def __init__(self):
        super().__init__()
        transformers = pytest.importorskip("transformers")
        from transformers.models.gemma import modeling_gemma

        config = transformers.GemmaConfig(
            hidden_size=64, intermediate_size=160, num_attention_heads=8, num_key_value_heads=2, head_dim=8
        )
        config._attn_implementation = "sdpa"
        self.layer = modeling_gemma.GemmaDecoderLayer(config, layer_idx=0)
        self.rotary = modeling_gemma.GemmaRotaryEmbedding(config)
        with torch.no_grad():  # a fresh norm's weight is 0: a scale of 1
            for norm in (self.layer.input_layernorm, self.layer.post_attention_layernorm):
                norm.weight.uniform_(-0.5, 0.5)

    def forward(self, x):
        positions = torch.arange(x.shape[1], device=x.device)[None]
        cos_sin = self.rotary(x, positions)
        return self.layer(x, attention_mask=None, position_ids=positions, position_embeddings=cos_sin)


def _hf_gemma() -> torch.nn.Module:
    torch.manual_seed(0)
    return _HFGemmaLayer()


@pytest.mark.parametrize("dtype", ["float", "bf16"])
def test_hf_transformers_gemma_layer_is_replaced_region_by_region_for_inference(dtype):
    """Gemma's norm computes 1 + weight, then in float multiplies the normalized input by it: in a float model the
    spelled-out RMSNorm with that scale; in bf16 it casts back after the product, where the graphs' forms cast
    before it, so its norms are left to torch and named."""
    dt = {"float": torch.float, "bf16": torch.bfloat16}[dtype]
    model = _hf_gemma().to(dt).eval()
    x = torch.randn(2, 16, 64, dtype=dt)
    with patterns.install_library("llama", dtype=dtype, channels_last=False, norm_eps=1e-6) as installed:
        with torch.no_grad():
            y = torch.compile(model, fullgraph=True)(x)
    tol = {} if dtype == "float" else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(y, model(x), **tol)
    norms = ["add_rmsnorm_float", "rmsnorm_float"] if dtype == "float" else []
    assert _graphs(installed.report) == sorted([f"causal_attention_gqa_{dtype}", f"geglu_{dtype}", *norms])
    left = [u.op for u in installed.report.unmatched if u.module not in ("q_proj", "k_proj", "v_proj", "o_proj")]
    assert sorted(left) == ["aten.mm"] + ["rms_norm (written out)"] * (2 if dtype == "bf16" else 0), left


def test_hf_transformers_gemma_layer_trains_with_the_models_gradients():
    model, twin = _hf_gemma(), _hf_gemma()
    installed = patterns.install_library("llama", dtype="float", channels_last=False, norm_eps=1e-6)
    _trains_alike(model, twin, torch.randn(2, 16, 64), installed)
    assert _graphs(installed.report) == ["causal_attention_gqa_float", "geglu_float", "rmsnorm_float"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_under_autocast_a_gemma_mlp_trains_through_the_graph_that_casts_its_input_once(device):
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma import modeling_gemma

    config = transformers.GemmaConfig(hidden_size=64, intermediate_size=160)
    torch.manual_seed(0)
    model, twin = modeling_gemma.GemmaMLP(config), modeling_gemma.GemmaMLP(config)
    twin.load_state_dict(model.state_dict())
    installed = patterns.install_library("llama", dtype="bf16", channels_last=False, autocast=True, device=device)
    x = torch.randn(2, 16, 64, device=device)
    _trains_alike(model.to(device), twin.to(device), x, installed, autocast=torch.bfloat16)
    assert _graphs(installed.report) == ["geglu_bf16_autocast"]


@pytest.mark.gpu
@pytest.mark.parametrize("norm", [None, _HFRMSNorm], ids=["nn.RMSNorm", "spelled out"])
def test_on_cuda_a_llama_layers_norms_are_replaced_as_torch_traces_them_there(norm):
    """On CUDA F.rms_norm dispatches to one fused op (aten._fused_rms_norm), which a compiled model's graph holds as
    Inductor's decomposition of it, not as the CPU's composite: the search is traced so too."""
    torch.manual_seed(0)
    config = LlamaConfig(dim=64, n_heads=8, n_kv_heads=2, hidden_dim=160)
    model = DecoderLayer(config, max_seq_len=32) if norm is None else _llama_written(norm)
    model = model.cuda().bfloat16().eval()
    x = torch.randn(2, 32, 64, device="cuda", dtype=torch.bfloat16)
    library_ = patterns.install_library("llama", dtype="bf16", channels_last=False, device="cuda")
    with library_ as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(y, model(x), atol=2e-2, rtol=2e-2)
    graphs = _graphs(installed.report)
    assert {"add_rmsnorm_bf16", "rmsnorm_bf16", "swiglu_bf16"} <= set(graphs), str(installed.report)


@pytest.mark.gpu
def test_on_cuda_a_gpt_block_trains_under_autocast_through_its_norms_and_mlp():
    """In training the norm after a residual add is taken alone (library.INFERENCE_ONLY), its backward one graph."""
    model, x = _gpt_block()
    twin = Block(GPTConfig(block_size=16, n_embd=64, n_head=4))
    twin.load_state_dict(model.state_dict())
    installed = patterns.install_library("gpt", dtype="bf16", autocast=True, channels_last=False, device="cuda")
    _trains_alike(model.cuda(), twin.cuda(), x.cuda(), installed, autocast=torch.bfloat16)
    graphs = _graphs(installed.report)
    assert graphs.count("layernorm_float") == 2 and "linear_gelu_tanh_bf16" in graphs, graphs


@pytest.mark.gpu
@pytest.mark.parametrize("act", sorted(_ACTIVATIONS))
def test_on_cuda_an_mlp_block_trains_under_autocast_through_its_linear_and_activation(act):
    model, x = _mlp(act)
    twin = _Mlp(_ACTIVATIONS[act]())
    twin.load_state_dict(model.state_dict())
    installed = patterns.install_library("mlp", dtype="bf16", autocast=True, device="cuda")
    _trains_alike(model.cuda(), twin.cuda(), x.cuda(), installed, autocast=torch.bfloat16)
    assert _graphs(installed.report) == [f"linear_{act}_bf16"]


@pytest.mark.gpu
def test_on_cuda_a_llama_layer_trains_under_autocast_through_both_norms():
    """On CUDA nn.RMSNorm's backward is one op (aten._fused_rms_norm_backward), whose input gradient autograd then
    adds to the residual's: the norm before the MLP is matched with its backward there, as the CPU's pointwise
    backward, summed with the residual's gradient term by term, is not."""
    torch.manual_seed(0)
    config = LlamaConfig(dim=64, n_heads=8, n_kv_heads=2, hidden_dim=160)
    model, twin = DecoderLayer(config, max_seq_len=32), DecoderLayer(config, max_seq_len=32)
    twin.load_state_dict(model.state_dict())
    installed = patterns.install_library("llama", dtype="bf16", autocast=True, channels_last=False, device="cuda")
    x = torch.randn(2, 32, 64, device="cuda")
    _trains_alike(model.cuda(), twin.cuda(), x, installed, autocast=torch.bfloat16)
    graphs = _graphs(installed.report)
    assert graphs.count("rmsnorm_float") == 2 and "swiglu_bf16_autocast" in graphs, installed.report


@pytest.mark.gpu
def test_on_cuda_hf_transformers_gpt2_block_trains_under_autocast_through_its_mlp():
    """CUDA's autocast takes gelu_new's pow in float, so the GELU is float to its end: the `_float` autocast graph."""
    model, twin = _hf_gpt2(), _hf_gpt2()
    installed = patterns.install_library("gpt", dtype="bf16", channels_last=False, autocast=True, device="cuda")
    x = torch.randn(2, 16, 64, device="cuda")
    _trains_alike(model.cuda(), twin.cuda(), x, installed, autocast=torch.bfloat16)
    assert "linear_kn_gelu_tanh_bf16_autocast_float" in _graphs(installed.report), installed.report


class _CastOnce(torch.nn.Module):
    """A SwiGLU MLP of bf16 Linears whose float input is cast once, by the model, for both."""

    def __init__(self, mlp: torch.nn.Module):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        h = x.to(torch.bfloat16)
        return self.mlp.w2(torch.nn.functional.silu(self.mlp.w1(h)) * self.mlp.w3(h))


def test_a_float_input_cast_once_for_its_linears_is_matched_as_one_cast_per_linear_is(tmp_path):
    """A graph whose float input is cast once and read by two Linears is searched both ways: with a cast per
    Linear (as autocast writes it) and with one (as a model that casts once does); each trains through it."""
    graph = tmp_path / "swiglu.cdg"
    graph.write_text(
        "graph swiglu_cast {\n  io bf16\n  compute float\n  input x : float[2, 32, 64]\n"
        "  input w1 : bf16[1, 64, 160] col_major\n  input w3 : bf16[1, 64, 160] col_major\n"
        "  xt : bf16 = identity(x)\n  output y = swish(matmul(xt, w1)) * matmul(xt, w3)\n}\n"
    )
    config = LlamaConfig(dim=64, n_heads=8, n_kv_heads=2, hidden_dim=160)
    x = torch.randn(2, 32, 64)
    torch.manual_seed(0)
    mlp = DecoderLayer(config, max_seq_len=32).feed_forward
    installed = patterns.install(graph)
    _trains_alike(mlp, copy.deepcopy(mlp), x, installed, autocast=torch.bfloat16)  # a cast per Linear
    assert _graphs(installed.report) == ["swiglu_cast"], str(installed.report)
    # cast once: the graph rounds nothing between its matmuls and silu, the bf16 model rounds each
    once = _CastOnce(copy.deepcopy(mlp).bfloat16())
    twin = copy.deepcopy(once)
    installed = patterns.install(graph)
    with installed:
        y = torch.compile(once, fullgraph=True)(x)
        y.float().square().mean().backward()
    want = twin(x)
    want.float().square().mean().backward()
    assert _graphs(installed.report) == ["swiglu_cast"], str(installed.report)
    for got, expected in [(y, want)] + [(p.grad, q.grad) for p, q in zip(once.parameters(), twin.parameters())]:
        torch.testing.assert_close(got.float(), expected.float(), atol=2**-6 * expected.abs().max().item(), rtol=0)


def test_the_library_is_every_family_in_every_dtype_and_names_what_it_lacks():
    for dtype in library.DTYPES:
        for autocast in (False, True):
            result = load(text=library.source(tuple(library.FAMILIES), dtype, autocast=autocast), file="lib")
            assert not result.diagnostics, result.render()
    with pytest.raises(ValueError, match="no pattern family 'vgg'; the families are resnet, gpt, llama, mlp"):
        library.source(("vgg",), "half")
    with pytest.raises(ValueError, match="dtype 'fp8'"):
        library.source(("gpt",), "fp8")


def test_tuning_is_asked_of_every_op_the_library_makes_and_of_their_backward_ops():
    with patterns.install_library("gpt", dtype="float", channels_last=False, tune=True) as installed:
        ops = [g.op for g in installed.graphs]
    assert ops and all(op.tune for op in ops)
    other = load(text="graph twice { input x : float[4, 8]\n output y = x * 2.0 }").program.graph("twice")
    assert ops[0].derived(other).tune  # a region's training ops (its augmented forward, its backward) tune too
    with patterns.install_library("gpt", dtype="float", channels_last=False) as installed:
        assert not any(g.op.tune for g in installed.graphs)


@pytest.mark.gpu
def test_a_replaced_region_is_tuned_on_its_first_run_and_its_plan_kept():
    model = _resnet_stack().half().cuda().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 8, 8, device="cuda").half().to(memory_format=torch.channels_last)
    library_ = patterns.install_library("resnet", dtype="half", device="cuda", tune=True)
    with library_ as installed, torch.no_grad():
        y = torch.compile(model, fullgraph=True)(x)
        torch.testing.assert_close(y, model(x), atol=2e-2, rtol=2e-2)
    replaced = set(_graphs(installed.report))
    assert replaced == {g.replace("_float", "_half") for g in _EVERY_CONV}
    tuned = {
        row.graph
        for g in installed.graphs
        for cg in g.op.compiled.values()
        for row in cg.planner.store.listing()
        if row.tuned
    }
    assert replaced <= tuned


_WRONG_ON_CUDA = pytest.mark.xfail(
    not library.TRAINING_ON_CUDA,
    reason="seen on an H100 (cuDNN 9.19): NaN weight gradients (library.TRAINING_ON_CUDA)",
    strict=True,
)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "training", [False, pytest.param(True, marks=_WRONG_ON_CUDA)], ids=["eval-with-autograd", "training-mode"]
)
def test_on_cuda_resnet_blocks_under_autocast_run_cudnn_graphs_with_the_models_gradients(training):
    """cuDNN's convolutions, BatchNorms (their running statistics too) and their derived backward against
    torch's, as AMP trains: autocast to bf16, channels-last. The training-mode graphs asked for: on CUDA they are
    installed by default only once this passes."""
    model, twin = (_resnet_stack().train(training).cuda().to(memory_format=torch.channels_last) for _ in range(2))
    x = torch.randn(8, 16, 8, 8, device="cuda").to(memory_format=torch.channels_last)
    library_ = patterns.install_library("resnet", dtype="bf16", autocast=True, device="cuda", training=True)
    _trains_alike(model, twin, x, library_, autocast=torch.bfloat16)
    assert len(library_.report.replaced) == 6 and all(r.training for r in library_.report.replaced)


def test_bench_models_tiny_runs_and_its_numerics_hold(tmp_path):
    out = tmp_path / "models.json"
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "models.py"),
            "--device",
            "cpu",
            "--tiny",
            "--models",
            "resnet50,gpt2,hf_gpt2",
        ]
        + ["--contenders", "eager,default+cudnn", "--steps", "3", "--iterations", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    import json

    results = json.loads(out.read_text())["results"]
    assert [(r["model"], r["phase"]) for r in results] == [
        ("resnet (tiny) batch 8", "inference"),
        ("resnet (tiny) batch 8", "training"),
        ("gpt2 (tiny)", "inference"),
        ("gpt2 (tiny)", "training"),
        ("hf gpt2 (tiny)", "inference"),
        ("hf gpt2 (tiny)", "training"),
    ]
    replaced = {(r["model"], r["phase"]): r["contenders"][1] for r in results}
    # every convolution but the stem's (torch's): in the tiny model, a fifth of its FLOPs
    assert replaced[("resnet (tiny) batch 8", "inference")]["flops_in_cudnn"] > 0.75
    assert replaced[("resnet (tiny) batch 8", "training")]["flops_in_cudnn"] > 0.75  # BatchNorm in training mode
    assert replaced[("gpt2 (tiny)", "training")]["flops_in_cudnn"] > 0.1
    assert replaced[("hf gpt2 (tiny)", "training")]["flops_in_cudnn"] > 0.1  # its Conv1D MLP and attention


def test_the_training_mode_graphs_are_left_out_when_asked():
    """install_library(training=False), the default on CUDA (library.TRAINING_ON_CUDA), has no graph of a
    BatchNorm in training mode; the eval ones stay."""
    with_training, without = (library.source(("resnet",), "bf16", autocast=True, training=t) for t in (True, False))
    assert "_train_" in with_training and "_train_" not in without
    assert without.count("graph ") == with_training.count("graph ") - len(library.FAMILIES["resnet"].training)
