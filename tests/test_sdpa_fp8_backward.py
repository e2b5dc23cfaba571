"""FP8 attention's backward (sdpa_fp8_backward) and the derived backward of sdpa_fp8: the op's rules, its reference
against the frontend's backward graph written out element by element, the derived gradients against torch autograd
through the forward's reference, and cuDNN's deviceless planning for the H200."""

import re

import pytest
import torch

from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import run_reference
from dsl.autodiff import derive
from dsl.diagnostics import DslError
from dsl.pipeline import program
from tests.cli_util import run_cli
from tests.helpers import ON_H200

FACTORS = ("dsq", "dsk", "dsv", "dso", "dsdo", "dss", "dsdp", "ss", "sdq", "sdk", "sdv", "sdp")
"""the twelve factors, in the op's order: descale_q ... descale_dp, scale_s, scale_dq ... scale_dp"""
VALUES = dict(zip(FACTORS, (0.5, 2.0, 0.25, 0.5, 4.0, 1 / 256, 1 / 64, 256.0, 2.0, 0.5, 4.0, 64.0)))
"""values far from 1 and from each other, so that a factor applied in the wrong place shows"""


def bwd_text(q="[1, 2, 6, 16]", kv="[1, 1, 9, 16]", dt="fp8_e4m3", factor="float[1, 1, 1, 1]", extra="causal=true"):
    o = q
    stats = q.rsplit(",", 1)[0] + ", 1]"
    decls = "".join(f"  input {n} : {dt if n != 'st' else 'float'}{s}\n" for n, s in (("q", q), ("st", stats)))
    decls += "".join(f"  input {n} : fp8_e4m3{kv}\n" for n in "kv")
    decls += f"  input o : fp8_e4m3{o}\n  input do : {dt}{o}\n"
    decls += "".join(f"  input {n} : {factor}\n" for n in FACTORS)
    outs = ("dq", "dk", "dv", "aq", "ak", "av", "ap")
    call = f"sdpa_fp8_backward(q, k, v, o, do, st, {', '.join(FACTORS)}, {extra})"
    return (
        f"graph b {{\n  io fp8_e4m3\n{decls}  {', '.join(outs)} = {call}\n"
        + "".join(f"  output {n}\n" for n in outs)
        + "}\n"
    )


def by_hand(ins, scale: float):
    """The frontend's sdpa_fp8_bwd.h expansion, one query row and one key at a time, in float64: causal, K/V's one
    head shared by q's two."""
    f = {n: float(ins[n]) for n in FACTORS}
    q, k, v, o, do, st = (ins[n].double() for n in ("q", "k", "v", "o", "do", "st"))
    e4m3 = lambda x: torch.tensor(float(x)).to(torch.float8_e4m3fn).double().item()  # noqa: E731
    _, h, sq, d = q.shape
    skv = k.shape[2]
    dq = torch.zeros(1, h, sq, d, dtype=torch.float64)
    dk, dv = torch.zeros(1, 1, skv, d, dtype=torch.float64), torch.zeros(1, 1, skv, d, dtype=torch.float64)
    amax_dp = 0.0
    for hh in range(h):
        for i in range(sq):
            row = sum(do[0, hh, i, c] * o[0, hh, i, c] for c in range(d)) * f["dsdo"] * f["dso"]
            for j in range(i + 1):  # causal, top left
                s = (q[0, hh, i] @ k[0, 0, j]) * f["dsq"] * f["dsk"] * scale
                p = torch.exp(s - st[0, hh, i, 0])
                dv[0, 0, j] += e4m3(p * f["ss"]) * f["dss"] * do[0, hh, i] * f["dsdo"]
                dp = (do[0, hh, i] @ v[0, 0, j]) * f["dsdo"] * f["dsv"]
                ds = p * (dp - row) * scale
                amax_dp = max(amax_dp, abs(ds.item()))
                ds8 = e4m3(ds * f["sdp"]) * f["dsdp"]
                dq[0, hh, i] += ds8 * k[0, 0, j] * f["dsk"]
                dk[0, 0, j] += ds8 * q[0, hh, i] * f["dsq"]
    amax = [t.abs().max().view(1, 1, 1, 1) for t in (dq, dk, dv)] + [
        torch.tensor(amax_dp, dtype=torch.float64).view(1, 1, 1, 1)
    ]
    return [dq * f["sdq"], dk * f["sdk"], dv * f["sdv"], *amax]


def test_the_reference_is_the_frontends_backward_graph_by_hand():
    g = program(text=bwd_text(), file="b.cdg").graphs[0]
    inst = g.instances[0]
    ins = generate_inputs(g, inst, "cpu", seed=3)
    ins.update({n: torch.full((1, 1, 1, 1), x) for n, x in VALUES.items()})
    # the softmax stats of these scores, as the forward wrote them (log-sum-exp over the causal keys)
    q, k = ins["q"].float() * VALUES["dsq"], ins["k"].float() * VALUES["dsk"]
    s = q @ k.transpose(-1, -2) * inst.attrs(0)["scale"]
    s = s.masked_fill(torch.ones(6, 9, dtype=torch.bool).triu(1), float("-inf"))
    ins["st"] = torch.logsumexp(s, -1, keepdim=True)
    out = run_reference(g, inst, ins, "cpu")
    want = by_hand(ins, inst.attrs(0)["scale"])
    for name, w in zip(("aq", "ak", "av", "ap"), want[3:]):
        torch.testing.assert_close(out[name].double(), w, atol=0, rtol=1e-5, msg=name)
    for name, w in zip(("dq", "dk", "dv"), want[:3]):
        assert out[name].dtype == torch.float8_e4m3fn
        # the same value in e4m3, or its neighbour (float32 against float64 may land either side of a boundary)
        w = w.to(torch.float8_e4m3fn).double()
        torch.testing.assert_close(out[name].double(), w, atol=0, rtol=0.125, msg=name)
        assert (out[name].double() == w).float().mean() > 0.9, name


@pytest.mark.parametrize(
    "kw,words",
    [
        ({"dt": "fp8_e5m2"}, "dtype conflict: q fp8_e5m2, k fp8_e4m3"),
        ({"factor": "float[1, 1, 1, 2]"}, "descale_q must be float[1, 1, 1, 1], got float[1, 1, 1, 2]"),
        ({"factor": "half[1, 1, 1, 1]"}, "descale_q must be float[1, 1, 1, 1], got half"),
        ({"q": "[1, 2, 6, 8]"}, "head dim differs: q has D=8, k has D=16"),
    ],
)
def test_a_bad_fp8_backward_is_refused(kw, words):
    with pytest.raises(DslError, match=re.escape(words)):
        program(text=bwd_text(**kw), file="b.cdg")


def test_an_e5m2_gradient_is_refused_at_do():
    text = bwd_text().replace("input do : fp8_e4m3", "input do : fp8_e5m2")
    with pytest.raises(DslError, match=re.escape("sdpa_fp8_backward: do must be fp8_e4m3, got fp8_e5m2")) as e:
        program(text=text, file="b.cdg")
    assert str(e.value).startswith("b.cdg:21:")


def test_the_gradient_scales_may_be_host_scalars_and_nothing_else():
    text = bwd_text().replace("  input sdp : float[1, 1, 1, 1]\n", "  scalar sdp : float = 64.0\n")
    g = program(text=text, file="b.cdg").graphs[0]
    assert g.value("sdp").kind == "scalar"
    with pytest.raises(DslError, match="'ss' is a host scalar; only pointwise ops take scalars"):
        program(text=bwd_text().replace("  input ss : float[1, 1, 1, 1]\n", "  scalar ss : float = 256.0\n"))


# ---- the derived backward of sdpa_fp8 ---------------------------------------------------------------------

FORWARD = (
    "graph t {{\n  io fp8_e4m3\n  input q : fp8_e4m3{q}\n  input k : fp8_e4m3{kv}\n  input v : fp8_e4m3{kv}\n"
    + "".join(f"  input {n} : float[1, 1, 1, 1]\n" for n in ("dq", "dk", "dv", "ds", "ss", "so"))
    + "  o, amax = sdpa_fp8(q, k, v, dq, dk, dv, ds, ss, so, {extra})\n  output o{o}\n  output amax\n}}\n"
)
SCALES = {"dq": 0.5, "dk": 2.0, "dv": 0.25, "ds": 1 / 256, "ss": 256.0, "so": 4.0}


def small(extra="causal=true", o=""):
    return FORWARD.format(q="[1, 2, 6, 16]", kv="[1, 1, 9, 16]", extra=extra, o=o)


def test_the_derived_backward_is_one_fp8_backward_with_the_forwards_factors():
    d = derive(program(text=small(), file="t.cdg").graphs[0], avoid=ON_H200)
    assert "stats=true" in d.forward_text
    (call,) = [line for line in d.backward_text.splitlines() if "sdpa_fp8_backward(" in line]
    factors = "dq, dk, dv, reciprocal, so, ds, descale_dp, ss, dq, dk, dv, scale_dp"
    assert f"sdpa_fp8_backward(q, k, v, o, grad_o, o_stats, {factors}, " in call
    assert "  reciprocal = reciprocal(so)\n" in d.backward_text
    assert [b for b, kind, of in d.bind if of == "amax"] == []  # the forward's amax is no input of the backward
    assert dict(d.grads) == {"q": "grad_q", "k": "grad_k", "v": "grad_v"}


def autograd(ins, a, grad):
    """q's, k's and v's gradients by torch autograd in float64 through FP8 attention written out: softmax over the
    band of the descaled scores, P quantized with scale_s and descale_s passing its gradient straight through,
    times the descaled v, times scale_o."""
    q, k, v = (ins[n].double().requires_grad_() for n in "qkv")
    f = {n: ins[n].double() for n in SCALES}
    kr, vr = (t.repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (k, v))
    s = (q * f["dq"]) @ (kr * f["dk"]).transpose(-1, -2) * a["scale"]
    i, j = torch.arange(s.shape[2]).view(-1, 1), torch.arange(s.shape[3])
    keep = torch.ones_like(s, dtype=torch.bool)
    if a["right_bound"] is not None:
        keep &= j - i <= a["right_bound"]
    if a["left_bound"] is not None:
        keep &= j - i > -a["left_bound"]
    p = s.masked_fill(~keep, float("-inf")).softmax(-1)
    p8 = p + ((p * f["ss"]).to(torch.float8_e4m3fn).double() * f["ds"] - p).detach()
    o = p8 @ (vr * f["dv"]) * f["so"]
    torch.autograd.backward(o, grad.double())
    return {"q": q.grad, "k": k.grad, "v": v.grad}


@pytest.mark.parametrize("extra", ["causal=true", "left_bound=3, right_bound=1", "scale=0.3"])
def test_the_derived_gradients_are_autograd_through_the_forward(extra):
    g = program(text=small(extra), file="t.cdg").graphs[0]
    inst = g.instances[0]
    d = derive(g, avoid=ON_H200)
    ins = generate_inputs(g, inst, "cpu", 0)
    ins.update({n: torch.full((1, 1, 1, 1), x) for n, x in SCALES.items()})
    fwd = run_reference(d.forward, d.forward.instances[0], ins, "cpu")
    grad = torch.randn(fwd["o"].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grad = grad.to(torch.float8_e4m3fn)
    env = {**ins, **fwd}
    given = {b: grad if kind == "grad" else env[of] for b, kind, of in d.bind}
    given.update(scale_dp=64.0, descale_dp=1 / 64)  # set per call, as a training recipe would
    out = run_reference(d.backward, d.backward.instances[0], given, "cpu")
    want = autograd(ins, inst.attrs(0), grad)
    for name, b in d.grads:
        got, w = out[b].double(), want[name]
        assert out[b].dtype == torch.float8_e4m3fn
        # fp8 twice over: the gradients are e4m3, and so are o, do and dS that they come from
        torch.testing.assert_close(got, w, atol=0.1 * w.abs().max().item(), rtol=0.125, msg=name)
        assert (got - w).norm() < 0.12 * w.norm(), name


@pytest.mark.parametrize(
    "o,wants,words",
    [
        (" : float", None, "sdpa_fp8_backward reads o in fp8_e4m3, as the forward writes it; o is float"),
        ("", ("q", "v"), "sdpa_fp8_backward computes q's, k's and v's gradients together"),
    ],
)
def test_a_derived_backward_the_op_cannot_give_is_refused_at_the_forward(o, wants, words):
    g = program(text=small(o=o), file="t.cdg").graphs[0]
    with pytest.raises(DslError, match=re.escape(words)) as e:
        derive(g, wrt=wants, avoid=ON_H200)
    assert str(e.value).startswith("t.cdg:12:")


# ---- deviceless planning for the H200 ---------------------------------------------------------------------

H200 = {"q": "[2, 4, 256, 128]", "kv": "[2, 2, 256, 128]"}


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target, load_cudnn

    load_cudnn()
    return Target.named("h200")


def plans(text: str, target) -> int:
    from cudnn_dsl.build.pipeline import compile_shape

    g = program(text=text, file="b.cdg").graphs[0]
    return compile_shape(g, g.instances[0], g.options, target).plan_count


@pytest.mark.parametrize("extra", ["causal=true", "left_bound=128, right_bound=0", "deterministic=true"])
def test_h200_plans_fp8_attention_backward(extra, h200):
    text = bwd_text(**H200, extra=extra).replace("  input sdp : float[1, 1, 1, 1]\n", "  scalar sdp : float = 64.0\n")
    assert plans(text, h200) >= 1


def test_h200_refuses_a_head_dim_other_than_128_at_the_op(h200):
    text = bwd_text(q="[2, 4, 256, 64]", kv="[2, 2, 256, 64]")
    with pytest.raises(DslError, match="hidden_dim shoud be equal to 128") as e:
        plans(text, h200)
    assert str(e.value).startswith("b.cdg:21:")


def test_h200_plans_the_derived_backward_as_the_fp8_backward_after_the_reciprocal(tmp_path):
    path = tmp_path / "t.cdg"
    path.write_text(FORWARD.format(**H200, extra="causal=true", o=""))
    p = run_cli("check", "--emit", "backward", "--target", "h200", str(path))
    assert p.returncode == 0, p.stderr
    assert "plans for NVIDIA H200 (sm_90), graph t_forward: " in p.stdout
    # cuDNN has no engine for a [1, 1, 1, 1] reciprocal: 1 / scale_o is torch's, the gradients one cuDNN graph
    assert "part 1: reciprocal (line 19) — torch fallback" in p.stdout
    assert "part 2: sdpa_fp8_backward (line 20) — cuDNN graph" in p.stdout
