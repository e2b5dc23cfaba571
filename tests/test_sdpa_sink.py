"""Attention sinks and the attention scale as a tensor: the language's rules, the reference against attention
with a sink written out independently (the sink as one more logit in each row's softmax, attending to nothing),
the derived backward against torch autograd through that formulation, and deviceless planning for an H200.

The checks take a device: tests/gpu/test_sdpa_sink_gpu.py runs them on the GPU, where cuDNN computes what the
reference computes here."""

from pathlib import Path

import pytest
import torch

from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import run_reference
from dsl.diagnostics import DslError
from dsl.pipeline import program
from tests.helpers import TOL

ROOT = Path(__file__).resolve().parents[1]
SERVING = ROOT / "examples" / "sdpa_sink.cdg"
TRAINING = ROOT / "examples" / "training" / "sdpa_sink.cdg"


def with_sink(q, k, v, sink, scale, *, left=None, right=None, lens=None):
    """Attention with a sink, in float64: the scores of K's heads repeated for their queries, masked by a
    top-left band and the padding (`lens`: per batch (seq_len_q, seq_len_kv)), with the sink appended as one
    more column of logits; the softmax over keys and sink, the sink's column dropped. O and the log-sum-exp
    over keys and sink (a padded query row: O = 0, stats = -inf)."""
    q, k, v, sink = q.double(), k.double(), v.double(), sink.double()
    b, h, sq, _ = q.shape
    skv = k.shape[2]
    k, v = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // v.shape[1], 1)
    s = q @ k.transpose(-1, -2) * scale
    i, j = torch.arange(sq).view(-1, 1), torch.arange(skv).view(1, -1)
    keep = torch.ones(b, 1, sq, skv, dtype=torch.bool)
    if right is not None:
        keep &= j - i <= right
    if left is not None:
        keep &= j - i > -left
    rows = torch.ones(b, 1, sq, 1, dtype=torch.bool)
    if lens is not None:
        for n, (lq, lkv) in enumerate(lens):
            keep[n, :, :, lkv:] = False
            rows[n, :, lq:] = False
    logits = torch.cat([s.masked_fill(~keep, float("-inf")), sink.expand(b, h, sq, 1)], -1)
    p = torch.softmax(logits, -1)[..., :-1]
    o = (p @ v).masked_fill(~rows, 0.0)
    stats = torch.logsumexp(logits, -1, keepdim=True).masked_fill(~rows, float("-inf"))
    return o, stats


def close(got: torch.Tensor, want: torch.Tensor, io: torch.dtype = torch.bfloat16) -> None:
    """`got` against the float64 `want` with the derived-backward tolerances of got's dtype or, where wider, of
    the graph's io dtype (a float sink gradient summed from bf16 O and dO), atol scaled by the largest element:
    as tests.helpers.check_grads compares."""
    atol, rtol = max(TOL[got.dtype], TOL[io], key=lambda tol: tol[1])
    got = got.detach().cpu()
    finite = want.isfinite()
    assert (got.isneginf() == want.isneginf()).all()
    atol *= max(1.0, want[finite].abs().max().item())
    torch.testing.assert_close(got.double()[finite], want[finite], atol=atol, rtol=rtol)


# ---- the language's rules -------------------------------------------------------------------------


def graph_text(call: str, decls: str = "", outputs: str = "o") -> str:
    return (
        "graph s {\n  input q : float[2, 4, 6, 8]\n  input k : float[2, 2, 7, 8]\n  input v : float[2, 2, 7, 8]\n"
        + ("  input sink : float[1, 4, 1, 1]\n" if "sink_token=sink" in call else "")
        + f"{decls}  {outputs} = {call}\n"
        + "".join(f"  output {o}\n" for o in outputs.split(", "))
        + "}\n"
    )


def error(call: str, decls: str = "") -> str:
    with pytest.raises(DslError) as e:
        program(text=graph_text(call, decls), file="s.cdg")
    return str(e.value)


@pytest.mark.parametrize(
    "call,decls,words",
    [
        ("sdpa(q, k, v, sink_token=k)", "", "sink_token must be float[1, 4, 1, 1], one logit per query head"),
        ("sdpa(q, k, v, sink_token=s2)", "  input s2 : half[1, 4, 1, 1]\n", "got half[1, 4, 1, 1]"),
        ("sdpa(q, k, v, attn_scale=sc)", "  scalar sc : half = 0.5\n", "attn_scale must be float[1, 1, 1, 1]"),
        ("sdpa(q, k, v, attn_scale=sc, scale=0.5)", "  scalar sc : float = 0.5\n", "two forms of the scale"),
        ("sdpa(q, sc, v)", "  scalar sc : float = 0.5\n", "only pointwise ops take scalars (and sdpa's dropout_scale"),
        ("sdpa(q, k, v, bias=sc)", "  scalar sc : float = 0.5\n", "is a host scalar"),
    ],
)
def test_a_bad_sink_or_tensor_scale_is_refused(call, decls, words):
    assert words in error(call, decls)


def test_dsink_needs_the_sink():
    text = (
        "graph b {\n  input q : float[2, 4, 6, 8]\n  input o : float[2, 4, 6, 8]\n  input st : float[2, 4, 6, 1]\n"
        "  dq, dk, dv, ds = sdpa_backward(q, q, q, o, o, st, dsink=true)\n  output dq\n}\n"
    )
    with pytest.raises(DslError, match="dsink is the gradient of the sink: give the forward's sink_token"):
        program(text=text, file="b.cdg")


def test_the_tensor_scale_is_an_input_and_no_attribute():
    g = program(text=graph_text("sdpa(q, k, v, attn_scale=sc)", "  scalar sc : float = 0.5 uid=9\n")).graphs[0]
    assert g.instances[0].attrs(0)["scale"] is None
    assert g.value("sc").uid == 9 and g.nodes[0].inputs[-1] == "sc"


# ---- the reference, against the formulation above ------------------------------------------------------


def run_on(device: str, text: str, ins: dict) -> dict:
    """The graph's outputs on `device`: its reference on the CPU, cuDNN's whole graph on a GPU."""
    if device == "cpu":
        g = program(text=text).graphs[0]
        return run_reference(g, g.instances[0], ins, "cpu")
    import cudnn_dsl

    return cudnn_dsl.compile(text=text, device=device, split=False)(ins)


def check_sink_with_padding(device: str) -> None:
    """A sink with a band, padding and grouped heads against `with_sink` (O's padded rows are unspecified)."""
    call = "sdpa(q, k, v, sink_token=sink, seq_len_q=lq, seq_len_kv=lkv, left_bound=3, right_bound=0, stats=true)"
    decls = "  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n"
    text = graph_text(call, decls, "o, st")
    g = program(text=text).graphs[0]
    ins = generate_inputs(g, g.instances[0], device, seed=1)
    ins["sink"] = torch.tensor([2.0, -1.0, 0.5, 4.0], device=device).view(1, 4, 1, 1)
    ins["lq"] = torch.tensor([4, 6], dtype=torch.int32, device=device).view(2, 1, 1, 1)
    ins["lkv"] = torch.tensor([5, 7], dtype=torch.int32, device=device).view(2, 1, 1, 1)
    out = run_on(device, text, ins)
    qkv = (ins[n].cpu() for n in ("q", "k", "v", "sink"))
    o, st = with_sink(*qkv, 8**-0.5, left=3, right=0, lens=[(4, 5), (6, 7)])
    close(out["st"], st, torch.float32)
    rows = st.isfinite().expand(o.shape)
    close(out["o"][rows.to(out["o"].device)], o[rows], torch.float32)


def test_the_sink_is_in_every_denominator_with_a_band_padding_and_grouped_heads():
    check_sink_with_padding("cpu")


SCALES = {"host scalar": "  scalar sc : float = 0.5 uid=9\n", "device tensor": "  input sc : float[1, 1, 1, 1]\n"}
"""the two forms attn_scale takes: a pass-by-value scalar, and a float [1, 1, 1, 1] in device memory"""


def check_scale_set_per_call(device: str, form: str) -> None:
    """attn_scale at two values of two calls, against `with_sink` at each."""
    text = graph_text("sdpa(q, k, v, sink_token=sink, attn_scale=sc)", SCALES[form])
    g = program(text=text).graphs[0]
    ins = generate_inputs(g, g.instances[0], device, seed=2)
    for value in (0.5, 0.2):
        sc = value if form == "host scalar" else torch.full((1, 1, 1, 1), value, device=device)
        out = run_on(device, text, {**ins, "sc": sc})
        o, _ = with_sink(*(ins[n].cpu() for n in ("q", "k", "v", "sink")), value)
        close(out["o"], o, torch.float32)


@pytest.mark.parametrize("form", SCALES)
def test_a_scale_set_per_call_is_the_float_scale(form):
    check_scale_set_per_call("cpu", form)


def test_a_dropout_scale_as_a_host_scalar_is_the_dropout_scale_tensor():
    mask = "  input dm : float[2, 4, 6, 7]\n"
    by_value = graph_text("sdpa(q, k, v, dropout_mask=dm, dropout_scale=ds)", mask + "  scalar ds : float = 1.25\n")
    tensor = graph_text("sdpa(q, k, v, dropout_mask=dm, dropout_scale=ds)", mask + "  input ds : float[1, 1, 1, 1]\n")
    a, b = (program(text=t).graphs[0] for t in (by_value, tensor))
    ins = generate_inputs(b, b.instances[0], "cpu", seed=3)
    ins["dm"] = (ins["dm"] > 0).float()
    ins["ds"] = torch.full((1, 1, 1, 1), 1.25)
    want = run_reference(b, b.instances[0], ins, "cpu")["o"]
    got = run_reference(a, a.instances[0], {k: v for k, v in ins.items() if k != "ds"}, "cpu")["o"]
    torch.testing.assert_close(got, want)


def check_serving_example(device: str) -> None:
    """examples/sdpa_sink.cdg on `device` (the reference on the CPU, cuDNN on a GPU) against `with_sink`."""
    import cudnn_dsl

    cg = cudnn_dsl.compile(str(SERVING), device=device, split=False) if device != "cpu" else None
    g = program(SERVING).graphs[0]
    ins = generate_inputs(g, g.instances[0], device, seed=0)
    out = cg(**ins) if cg is not None else run_reference(g, g.instances[0], ins, device)
    o, st = with_sink(*(ins[n].cpu() for n in ("q", "k", "v", "sinks")), 0.125, left=128, right=0)
    close(out["o"], o)
    close(out["stats"], st)
    plain, _ = with_sink(*(ins[n].cpu() for n in ("q", "k", "v")), torch.full((1, 16, 1, 1), -1e9), 0.125)
    assert (plain - o).abs().max() > 0.1  # the sink moves the output: a reference without it would fail above


def test_the_serving_example_is_attention_with_its_sink():
    check_serving_example("cpu")


def check_training_example(device: str, scale: float = 0.125) -> None:
    """The derived backward of examples/training/sdpa_sink.cdg (cuDNN's on a GPU, its reference on the CPU), with
    its scale set to `scale` for the call, against torch autograd through `with_sink`: dq, dk, dv and the sink's."""
    from cudnn_dsl.torch_op.autograd import differentiable

    f = differentiable(str(TRAINING), device=device)
    ins = generate_inputs(f.graph, f.graph.instances[0], device, seed=0)
    leaves = {k: v.requires_grad_() for k, v in ins.items()}
    out = f({**leaves, "scale": scale})["o"]
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype).to(device)
    out.backward(dy)
    want = {k: v.detach().cpu().double().requires_grad_() for k, v in ins.items()}
    o, _ = with_sink(want["q"], want["k"], want["v"], want["sinks"], scale, left=128, right=0)
    close(out.detach(), o.detach())
    o.backward(dy.cpu().double())
    for name, w in want.items():
        assert leaves[name].grad.dtype == leaves[name].dtype, name
        close(leaves[name].grad, w.grad)


def test_the_training_examples_derived_backward_is_autograd_through_the_sink():
    check_training_example("cpu")
    check_training_example("cpu", scale=0.25)  # the scale of this call, not the declared one


def test_the_derived_backward_is_one_sdpa_backward_returning_the_sinks_gradient():
    from dsl.autodiff import derive

    d = derive(program(TRAINING).graphs[0], avoid=lambda *a: None)
    [node] = d.backward.nodes
    attrs = d.backward.instances[0].attrs(0)
    assert node.op == "sdpa_backward" and attrs["dsink"] and attrs["scale"] is None
    assert "sink_token=sinks, attn_scale=scale" in d.backward_text


# ---- deviceless: cuDNN 9.28 plans each form for an H200 -----------------------------------------------------


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target

    return Target.named("h200")


def plans(text: str, h200) -> int:
    from cudnn_dsl.build.pipeline import compile_shape

    g = program(text=text, file="p.cdg").graphs[0]
    return compile_shape(g, g.instances[0], g.options, h200).plan_count


def test_h200_plans_the_serving_example(h200):
    assert plans(SERVING.read_text(), h200) >= 1


def test_h200_plans_the_training_examples_derived_forward_and_backward():
    from tests.cli_util import run_cli

    p = run_cli("check", "--emit", "backward", "--target", "h200", TRAINING)
    assert p.returncode == 0, p.stderr
    for part in ("forward", "backward"):
        assert f"plans for NVIDIA H200 (sm_90), graph sdpa_sink_training_{part}: " in p.stdout


@pytest.mark.parametrize(
    "call,decls",
    [
        ("sdpa(q, k, v, attn_scale=sc, causal=true)", "  scalar sc : float = 0.125 uid=40\n"),
        ("sdpa(q, k, v, attn_scale=sc, causal=true)", "  input sc : float[1, 1, 1, 1]\n"),
        (
            "sdpa(q, k, v, dropout_mask=dm, dropout_scale=ds)",
            "  input dm : bf16[2, 8, 256, 256]\n  scalar ds : float = 1.25\n",
        ),
        (
            "sdpa(q, k, v, sink_token=sink, seq_len_q=lq, seq_len_kv=lkv, causal=true, left_bound=64)",
            "  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n",
        ),
    ],
    ids=["scalar scale", "device scale", "scalar dropout scale", "sink with padding"],
)
def test_h200_plans_the_sink_and_the_tensor_scales(call, decls, h200):
    text = (
        "graph p {\n  io bf16\n  input q : bf16[2, 8, 256, 128]\n  input k : bf16[2, 2, 256, 128]\n"
        "  input v : bf16[2, 2, 256, 128]\n"
        + ("  input sink : float[1, 8, 1, 1]\n" if "sink_token" in call else "")
        + decls
        + f"  o, st = {call[:-1]}, stats=true)\n  output o\n  output st\n}}\n"
    )
    assert plans(text, h200) >= 1
