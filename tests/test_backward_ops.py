"""The frontend's backward ops in the language: shape rules and located errors, the reference against
torch autograd of the forward op's own reference (same file, same inputs), and whether the real
cuDNN 9.28 plans each for an H200 without a GPU."""

import math

import pytest
import torch

from cudnn_dsl.ops import IMPLS
from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import run_reference
from dsl.diagnostics import DslError
from dsl.ops import BACKWARD_OPS
from dsl.pipeline import program
from tests.graphs import graph_text


def compiled(body: str, io: str = "float"):
    g = program(text=graph_text(body, io), file="b.cdg").graphs[0]
    return g, g.instances[0]


def types(body: str, io: str = "half") -> dict:
    g, inst = compiled(body, io)
    return {v.name: inst.type(v.name) for v in g.values}


def error(body: str, io: str = "half"):
    """The first error of a graph that must not check: (message, line, column)."""
    with pytest.raises(DslError) as e:
        compiled(body, io)
    d = next(d for d in e.value.diagnostics if d.severity == "error")
    return d.message, d.loc.line, d.loc.col


def reference(body: str, seed: int = 5, **given):
    """The graph's reference on seeded inputs; `given` maps an input to a function of the inputs."""
    g, inst = compiled(body)
    ins = generate_inputs(g, inst, "cpu", seed=seed)
    ins.update({name: f(ins) for name, f in given.items()})
    return g, inst, ins, run_reference(g, inst, ins, "cpu")


def autograd(g, inst, ins, node: int, wrt: tuple[int, ...], grads: list[torch.Tensor], values: dict):
    """The gradients of node `node`'s reference (its first outputs, weighted by `grads`) with respect to
    its inputs at `wrt`, by torch autograd; `values` supplies the node's inputs by name."""
    n = g.nodes[node]
    ins_ = [values[i].double().requires_grad_(k in wrt) if i else None for k, i in enumerate(n.inputs)]
    outs = [inst.type(o) for o in n.outputs]
    with torch.enable_grad():
        ys = IMPLS[n.op].ref(ins_, inst.attrs(node), outs)[: len(grads)]
        return torch.autograd.grad(ys, [ins_[k] for k in wrt], [d.double() for d in grads])


# ---- pointwise ----------------------------------------------------------------------------------

POINTWISE = {
    "relu": "",
    "relu_clipped": ", negative_slope=0.2, lower_clip=-0.5, upper_clip=1.0",
    "leaky_relu": ", slope=0.3",
    "gelu": "",
    "gelu_tanh": "",
    "sigmoid": "",
    "tanh": "",
    "elu": "",
    "softplus": "",
    "swish": ", beta=1.7",
}


@pytest.mark.parametrize("case", list(POINTWISE))
def test_pointwise_backward_is_the_forward_ops_derivative_at_its_input(case):
    op, attrs_ = case.removesuffix("_clipped"), POINTWISE[case]
    body = (
        f"  input x : float[4, 8, 16]\n  input dy : float[4, 8, 16]\n  output y = {op}(x{attrs_})\n"
        f"  output dx = {op}_backward(dy, x{attrs_})"
    )
    g, inst, ins, out = reference(body)
    (want,) = autograd(g, inst, ins, 0, (0,), [ins["dy"]], ins)
    torch.testing.assert_close(out["dx"].double(), want, rtol=1e-5, atol=1e-6)
    assert not torch.equal(out["dx"], ins["dy"])  # the derivative is not 1 everywhere


def test_every_pointwise_backward_op_is_tested():
    tested = {f"{c.removesuffix('_clipped')}_backward" for c in POINTWISE}
    assert tested == {n for n, s in BACKWARD_OPS.items() if s.family == "pointwise"}


def test_pointwise_backward_shapes_and_attributes():
    t = types("  input x : half[4, 8, 16]\n  input dy : half[4, 1, 16]\n  output dx = tanh_backward(dy, x)")
    assert t["dx"].shape == (4, 8, 16)
    msg, line, col = error("  input x : half[4, 8, 16]\n  input dy : half[4, 8]\n  output dx = gelu_backward(dy, x)")
    assert msg.startswith("gelu_backward: inputs have ranks 2 and 3") and (line, col) == (6, 33)
    msg, _, col = error("  input x : half[4, 8]\n  output dx = swish_backward(x, x, slope=2)")
    assert "swish_backward" in msg and "slope" in msg and col == 36


# ---- norms ----------------------------------------------------------------------------------------

LN = "  input x : float[16, 8, 2, 2]\n  input g : float[1, 8, 2, 2]\n  input b : float[1, 8, 2, 2]\n"
LN_BSD = "  input x : float[4, 6, 32]\n  input g : float[1, 1, 32]\n  input b : float[1, 1, 32]\n"
CHANNELS = (
    "  input x : float[4, 8, 5, 5] nhwc\n  input g : float[1, 8, 1, 1] nhwc\n  input b : float[1, 8, 1, 1] nhwc\n"
)
ADA = "  input x : float[4, 6, 32]\n  input g : float[4, 1, 32]\n  input b : float[4, 1, 32]\n"
NORMS = {
    "layernorm": (LN, "m, iv = layernorm(x, g, b, epsilon=0.01, phase=training)", "m, iv", "g, b"),
    "layernorm_bsd": (LN_BSD, "m, iv = layernorm(x, g, b, phase=training)", "m, iv", "g, b"),
    "rmsnorm": (LN_BSD, "iv = rmsnorm(x, g, phase=training)", "iv", "g"),
    "rmsnorm_bias": (LN, "iv = rmsnorm(x, g, b, phase=training)", "iv, dbias=true", "g, b"),
    "batchnorm": (
        CHANNELS + "  input rm : float[1, 8, 1, 1] nhwc\n  input rv : float[1, 8, 1, 1] nhwc\n",
        "m, iv, rm2, rv2 = batchnorm(x, g, b, rm, rv, epsilon=0.001)",
        "m, iv",
        "g, b",
    ),
    "instancenorm": (CHANNELS, "m, iv = instancenorm(x, g, b, phase=training)", "m, iv", "g, b"),
    "adalayernorm": (ADA, "m, iv = adalayernorm(x, g, b, phase=training)", "m, iv", "g, b"),
}


@pytest.mark.parametrize("case", list(NORMS))
def test_norm_backward_from_the_saved_statistics_matches_autograd(case):
    decls, forward, stats, params = NORMS[case]
    op = forward.split("= ")[1].split("(")[0]
    grads = "dx, dg, db" if "b" in params else "dx, dg"
    body = (
        decls + "  input dy : " + decls.split(" : ")[1].split("\n")[0] + "\n"
        f"  y, {forward}\n  {grads} = {op}_backward(dy, x, g, {stats})\n  output y\n"
        + "".join(f"  output {n}\n" for n in grads.split(", "))
    )
    g, inst, ins, out = reference(body)
    wrt = (0, 1, 2) if "b" in params else (0, 1)
    want = autograd(g, inst, ins, 0, wrt, [ins["dy"]], ins)
    for name, w in zip(grads.split(", "), want):
        torch.testing.assert_close(out[name].double(), w, rtol=1e-4, atol=1e-5, msg=name)


def test_norm_backward_shapes():
    t = types(
        "  input dy : half[4, 6, 32]\n  input x : half[4, 6, 32]\n  input g : float[1, 1, 32]\n"
        "  input m : float[4, 6, 1]\n  input iv : float[4, 6, 1]\n"
        "  dx, dg, db = layernorm_backward(dy, x, g, m, iv)\n  output dx\n  output dg : float\n  output db : float"
    )
    assert (t["dx"].dtype, t["dx"].shape) == ("half", (4, 6, 32))
    assert (t["dg"].dtype, t["dg"].shape) == ("float", (1, 1, 32)) == (t["db"].dtype, t["db"].shape)
    msg, line, _ = error(
        "  input dy : half[4, 6, 32]\n  input x : half[4, 6, 32]\n  input g : float[1, 1, 32]\n"
        "  input iv : float[4, 6, 1]\n  dx, dg, db = rmsnorm_backward(dy, x, g, iv)\n  output dx"
    )
    assert "rmsnorm_backward returns 2 values here, but 3 names are assigned" in msg and line == 8


@pytest.mark.parametrize(
    "op,decls,want,col",
    [
        (
            "layernorm_backward",
            "dy : half[4, 6, 32]|x : half[4, 6, 32]|g : float[1, 1, 32]|m : float[4, 1, 1]|iv : float[4, 6, 1]",
            "layernorm_backward: mean [4, 1, 1] must be [4, 6, 1] (x with 1 on the normalized axes",
            45,
        ),
        (
            "layernorm_backward",
            "dy : half[4, 6, 16]|x : half[4, 6, 32]|g : float[1, 1, 32]|m : float[4, 6, 1]|iv : float[4, 6, 1]",
            "layernorm_backward: dy [4, 6, 16] must be [4, 6, 32] (the gradient of y",
            35,
        ),
        (
            "layernorm_backward",
            "dy : half[4, 6, 32]|x : half[4, 6, 32]|g : float[4, 1, 32]|m : float[4, 6, 1]|iv : float[4, 6, 1]",
            "layernorm_backward: scale [4, 1, 32] must be 1 on the batch axis",
            42,
        ),
        (
            "batchnorm_backward",
            "dy : half[4, 8, 5, 5]|x : half[4, 8, 5, 5]|"
            "g : float[1, 8, 1, 1]|m : float[1, 8, 1, 1]|iv : half[1, 8, 1, 1]",
            "batchnorm_backward: inv_variance is half; saved statistics are float",
            48,
        ),
        (
            "instancenorm_backward",
            "dy : half[4, 8, 5, 5]|x : half[4, 8, 5, 5]|"
            "g : float[1, 8, 1, 1]|m : float[1, 8, 1, 1]|iv : float[4, 8, 1, 1]",
            "instancenorm_backward: mean [1, 8, 1, 1] must be [4, 8, 1, 1]",
            48,
        ),
        (
            "batchnorm_backward",
            "dy : half[4, 8, 5, 5]|x : half[4, 8, 5, 5]|"
            "g : float[1, 8, 5, 5]|m : float[1, 8, 1, 1]|iv : float[1, 8, 1, 1]",
            "batchnorm_backward: scale [1, 8, 5, 5] must be [1, C, 1, ...] (one value per channel)",
            42,
        ),
    ],
)
def test_norm_backward_errors_are_located(op, decls, want, col):
    body = "".join(f"  input {d}\n" for d in decls.split("|"))
    msg, line, c = error(body + f"  dx, dg, db = {op}(dy, x, g, m, iv)\n  output dx")
    assert msg.startswith(want) and (line, c) == (9, col), (msg, c)


# ---- attention ----------------------------------------------------------------------------------

QKV = {
    "q": "float[2, 4, 6, 8]",
    "k": "float[2, 2, 9, 8]",
    "v": "float[2, 1, 9, 16]",
    "do": "float[2, 4, 6, 16]",
    "bias": "float[1, 4, 6, 9]",
    "lq": "int32[2, 1, 1, 1]",
    "lkv": "int32[2, 1, 1, 1]",
    "dm": "float[2, 4, 6, 9]",
    "ds": "float[1, 1, 1, 1]",
    "dsi": "float[1, 1, 1, 1]",
}
ATTENTION = {
    "plain": ("", ""),
    "causal": ("causal=true", ""),
    "band_bottom_right": ("causal_bottom_right=true, left_bound=3, scale=0.3", ""),
    "bias_alibi": ("bias=bias, alibi=true", ""),
    "padding": ("seq_len_q=lq, seq_len_kv=lkv, causal_bottom_right=true", ""),
    "dropout": ("dropout_mask=dm, dropout_scale=ds", ""),
}


def _attention(case: str):
    """A forward sdpa saving its stats, and sdpa_backward of it with the same attributes."""
    call = ATTENTION[case][0]
    more = f", {call}" if call else ""
    # the frontend's backward also takes 1 / dropout_scale
    inverse = ", dropout_scale_inv=dsi" if "dropout" in call else ""
    used = ["q", "k", "v", "do"] + [n for n in ("bias", "lq", "lkv", "dm", "ds", "dsi") if f"={n}" in call + inverse]
    body = (
        "".join(f"  input {n} : {QKV[n]}\n" for n in used)
        + f"  o, st = sdpa(q, k, v, stats=true{more})\n"
        + f"  dq, dk, dv = sdpa_backward(q, k, v, o, do, st{more}{inverse})\n"
        + "".join(f"  output {n}\n" for n in ("o", "dq", "dk", "dv"))
    )
    return reference(body, **({"dsi": lambda ins: 1 / ins["ds"]} if inverse else {}))


@pytest.mark.parametrize("case", list(ATTENTION))
def test_sdpa_backward_from_the_saved_stats_matches_autograd(case):
    g, inst, ins, out = _attention(case)
    values = dict(ins, o=out["o"])
    want = autograd(g, inst, ins, 0, (0, 1, 2), [ins["do"]], values)
    for name, w in zip(("dq", "dk", "dv"), want):
        assert w.abs().max() > 0.01, name
        torch.testing.assert_close(out[name].double(), w, rtol=1e-4, atol=1e-5, msg=name)


def test_sdpa_backward_bias_gradient_matches_autograd():
    body = (
        "".join(f"  input {n} : {QKV[n]}\n" for n in ("q", "k", "v", "do", "bias"))
        + "  o, st = sdpa(q, k, v, bias=bias, causal=true, stats=true)\n"
        + "  dq, dk, dv, db = sdpa_backward(q, k, v, o, do, st, bias=bias, causal=true, dbias=true)\n"
        + "".join(f"  output {n}\n" for n in ("o", "dq", "db"))
    )
    g, inst, ins, out = reference(body)
    (want,) = autograd(g, inst, ins, 0, (3,), [ins["do"]], dict(ins, o=out["o"]))
    assert out["db"].shape == ins["bias"].shape == (1, 4, 6, 9) and want.abs().max() > 0.01
    torch.testing.assert_close(out["db"].double(), want, rtol=1e-4, atol=1e-5)
    msg, _, _ = error(
        "".join(f"  input {n} : {QKV[n]}\n" for n in ("q", "k", "v", "do"))
        + "  input o : float[2, 4, 6, 16]\n  input st : float[2, 4, 6, 1]\n"
        "  dq, dk, dv, db = sdpa_backward(q, k, v, o, do, st, dbias=true)\n  output dq"
    )
    assert msg == "sdpa_backward: dbias is the gradient of the bias: give the forward's bias (bias=...)"


def test_sdpa_backward_shapes_follow_q_k_v():
    body = "".join(f"  input {n} : {QKV[n].replace('float', 'half')}\n" for n in ("q", "k", "v", "do"))
    t = types(
        body + "  input o : half[2, 4, 6, 16]\n  input st : float[2, 4, 6, 1]\n"
        "  dq, dk, dv = sdpa_backward(q, k, v, o, do, st)\n  output dq\n  output dk\n  output dv"
    )
    assert (t["dq"].shape, t["dk"].shape, t["dv"].shape) == ((2, 4, 6, 8), (2, 2, 9, 8), (2, 1, 9, 16))
    g, inst = compiled(
        body.replace("half", "float") + "  input o : float[2, 4, 6, 16]\n  input st : float[2, 4, 6, 1]\n"
        "  dq, dk, dv = sdpa_backward(q, k, v, o, do, st, causal=true)\n  output dq\n  output dk\n  output dv"
    )
    assert inst.attrs(0) == {
        "scale": 1 / math.sqrt(8),
        "diagonal_alignment": "top_left",
        "left_bound": None,
        "right_bound": 0,
        "alibi": False,
        "deterministic": False,
        "dbias": False,
        "dsink": False,
    }  # the band in its one form, as sdpa's


@pytest.mark.parametrize(
    "change,want,col",
    [
        ("st : float[2, 4, 6, 2]", "sdpa_backward: stats [2, 4, 6, 2] must be [2, 4, 6, 1]", 46),
        ("st : half[2, 4, 6, 1]", "sdpa_backward: stats is half; the forward's softmax stats are float", 46),
        ("o : half[2, 4, 6, 8]", "sdpa_backward: o [2, 4, 6, 8] must be [2, 4, 6, 16]", 39),
    ],
)
def test_sdpa_backward_errors_are_located(change, want, col):
    decls = {n: QKV[n].replace("float", "half") for n in ("q", "k", "v", "do")}
    decls.update(o="half[2, 4, 6, 16]", st="float[2, 4, 6, 1]")
    name, ty = change.split(" : ")
    decls[name] = ty
    body = "".join(f"  input {n} : {t}\n" for n, t in decls.items())
    msg, line, c = error(body + "  dq, dk, dv = sdpa_backward(q, k, v, o, do, st)\n  output dq")
    assert msg.startswith(want) and (line, c) == (10, col), (msg, c)


def test_sdpa_backward_padding_lengths_come_in_pairs():
    decls = {n: QKV[n] for n in ("q", "k", "v", "do", "lq")}
    decls.update(o="float[2, 4, 6, 16]", st="float[2, 4, 6, 1]")
    body = "".join(f"  input {n} : {t}\n" for n, t in decls.items())
    msg, _, _ = error(body + "  dq, dk, dv = sdpa_backward(q, k, v, o, do, st, seq_len_q=lq)\n  output dq")
    assert msg == "sdpa_backward: seq_len_q needs seq_len_kv too"
    body += "".join(f"  input {n} : {QKV[n]}\n" for n in ("dm", "ds"))
    call = "sdpa_backward(q, k, v, o, do, st, dropout_mask=dm, dropout_scale=ds)"
    msg, _, _ = error(body.replace("  input lq : int32[2, 1, 1, 1]\n", "") + f"  dq, dk, dv = {call}\n  output dq")
    assert msg == "sdpa_backward: dropout_mask needs dropout_scale_inv too"


@pytest.mark.parametrize("attrs_", ["", ", rope_dim=4, output_scale=0.5"])
def test_rope_backward_matches_autograd(attrs_):
    body = (
        "  input q : float[2, 3, 16, 8]\n  input f : float[32, 1, 1, 8]\n  input dy : float[2, 3, 16, 8]\n"
        f"  output y = rope(q, f{attrs_})\n  output dq = rope_backward(dy, f{attrs_})"
    )
    g, inst, ins, out = reference(body)
    (want,) = autograd(g, inst, ins, 0, (0,), [ins["dy"]], ins)
    torch.testing.assert_close(out["dq"].double(), want, rtol=1e-5, atol=1e-6)


# ---- what cuDNN 9.28 plans for an H200, without a GPU --------------------------------------------------

PLANNED = {
    "drelu_after_dgrad": "  input dy : half[8, 64, 16, 16] nhwc\n  input w : half[64, 32, 3, 3] nhwc\n"
    "  input x : half[8, 32, 16, 16] nhwc\n  output dx = relu_backward(conv_dgrad(dy, w, padding=1), x)",
    "dgelu_after_matmul": "  input a : half[4, 64, 64]\n  input b : half[4, 64, 32]\n  input x : half[4, 64, 32]\n"
    "  output dx = gelu_backward(matmul(a, b), x)",
    "layernorm": "  input dy : half[512, 256, 1, 1]\n  input x : half[512, 256, 1, 1]\n"
    "  input g : float[1, 256, 1, 1]\n"
    "  input m : float[512, 1, 1, 1]\n  input iv : float[512, 1, 1, 1]\n"
    "  dx, dg, db = layernorm_backward(dy, x, g, m, iv)\n  output dx\n  output dg : float\n  output db : float",
    "rmsnorm": "  input dy : half[4, 128, 512]\n  input x : half[4, 128, 512]\n  input g : float[1, 1, 512]\n"
    "  input iv : float[4, 128, 1]\n  dx, dg = rmsnorm_backward(dy, x, g, iv)\n  output dx\n  output dg : float",
    "batchnorm": "  input dy : half[8, 32, 16, 16] nhwc\n  input x : half[8, 32, 16, 16] nhwc\n"
    "  input g : float[1, 32, 1, 1] nhwc\n  input m : float[1, 32, 1, 1] nhwc\n  input iv : float[1, 32, 1, 1] nhwc\n"
    "  dx, dg, db = batchnorm_backward(dy, x, g, m, iv)\n  output dx\n  output dg : float\n  output db : float",
    "sdpa_causal": "  input q : half[2, 4, 128, 64]\n  input k : half[2, 4, 128, 64]\n  input v : half[2, 4, 128, 64]\n"
    "  input o : half[2, 4, 128, 64]\n  input do : half[2, 4, 128, 64]\n  input st : float[2, 4, 128, 1]\n"
    "  dq, dk, dv = sdpa_backward(q, k, v, o, do, st, causal=true)\n  output dq\n  output dk\n  output dv",
    "rope_after_sdpa": "  input q : half[2, 4, 128, 64]\n  input k : half[2, 4, 128, 64]\n"
    "  input v : half[2, 4, 128, 64]\n"
    "  input o : half[2, 4, 128, 64]\n  input do : half[2, 4, 128, 64]\n  input st : float[2, 4, 128, 1]\n"
    "  input f : float[128, 1, 1, 64]\n  dqr, dk, dv = sdpa_backward(q, k, v, o, do, st, causal=true)\n"
    "  output dq = rope_backward(dqr, f)\n  output dk\n  output dv",
}


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target, load_cudnn

    load_cudnn()
    return Target.named("h200")


@pytest.mark.parametrize("case", list(PLANNED))
def test_cudnn_9_28_plans_the_backward_ops_for_an_h200(case, h200):
    from cudnn_dsl.build.pipeline import compile_shape

    g, inst = compiled(PLANNED[case], "half")
    assert compile_shape(g, inst, g.options, h200).plan_count >= 1
