"""The generated PyTorch reference on the CPU, against formulas written out by hand."""

import math

import pytest
import torch

from cudnn_dsl.run.buffers import BindingError, check_binding
from cudnn_dsl.run.compare import compare
from cudnn_dsl.run.inputs import generate_inputs
from dsl.diagnostics import DslError
from dsl.pipeline import program
from tests.helpers import check, reference


def test_matmul_epilogue_by_hand():
    text = (
        "graph m {\n  input a : float[2, 8, 16]\n  input b : float[2, 16, 4]\n  input c : float[1, 1, 4]\n"
        "  scalar s : float = 0.5\n  output y = gelu(matmul(a, b) * s + c)\n"
        "  output m : float[1, 1, 1] = reduction(y, mode=amax)\n}\n"
    )
    ins, out = reference(text, seed=1)
    want = torch.nn.functional.gelu((ins["a"] @ ins["b"]) * 0.5 + ins["c"])
    torch.testing.assert_close(out["y"], want)
    assert out["m"].item() == pytest.approx(want.abs().max().item())


def test_conv_grouped_strided_nhwc_by_hand():
    text = (
        "graph c {\n  input x : float[2, 8, 9, 9] nhwc\n  input w : float[4, 2, 3, 3] nhwc\n"
        "  output y = conv_fprop(x, w, padding=[1, 1], stride=[2, 2])\n}\n"
    )
    ins, out = reference(text, seed=1)
    assert ins["x"].stride() == (648, 1, 72, 8)
    want = torch.nn.functional.conv2d(ins["x"].contiguous(), ins["w"].contiguous(), stride=2, padding=1, groups=4)
    torch.testing.assert_close(out["y"], want)


def test_sdpa_stats_are_logsumexp():
    text = (
        "graph s {\n  input q : float[1, 2, 8, 4]\n  input k : float[1, 2, 8, 4]\n  input v : float[1, 2, 8, 4]\n"
        "  o, st = sdpa(q, k, v, causal=true, stats=true)\n  output o\n  output st\n}\n"
    )

    def by_hand(ins):
        s = ins["q"] @ ins["k"].transpose(-1, -2) / math.sqrt(4)
        s = s.masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), float("-inf"))
        return {"st": torch.logsumexp(s, -1, keepdim=True), "o": torch.softmax(s, -1) @ ins["v"]}

    check(text, "cpu", seed=1, expect=by_hand)


def test_norms_by_hand():
    text = (
        "graph n {\n  input x : float[4, 6, 1, 1]\n  input g : float[1, 6, 1, 1]\n  input b : float[1, 6, 1, 1]\n"
        "  output y = layernorm(x, g, b, epsilon=0.001)\n  output z = rmsnorm(x, g)\n}\n"
    )

    def by_hand(ins):
        x = ins["x"]
        ln = (x - x.mean((1, 2, 3), keepdim=True)) / torch.sqrt(x.var((1, 2, 3), unbiased=False, keepdim=True) + 1e-3)
        return {
            "y": ln * ins["g"] + ins["b"],
            "z": x / torch.sqrt((x * x).mean((1, 2, 3), keepdim=True) + 1e-5) * ins["g"],
        }

    check(text, "cpu", seed=1, expect=by_hand)


def test_outputs_are_rounded_once_to_their_dtype():
    text = "graph h {\n  input a : half[64]\n  output y : half = a * 3 + 1\n}\n"
    ins, out = reference(text, seed=1)
    assert out["y"].dtype == torch.float16
    torch.testing.assert_close(out["y"], (ins["a"].float() * 3 + 1).half())


def test_positive_domains_get_positive_inputs():
    g = program(text="graph p {\n  input a : float[100]\n  output y = rsqrt(a)\n}\n", file="p.cdg").graphs[0]
    x = generate_inputs(g, g.instances[0], "cpu")["a"]
    assert x.min() >= 0.5


def test_binding_checks_name_the_tensor_and_both_sides():
    from dsl.types import TensorType

    want = TensorType("half", (4, 8), (8, 1))
    t = torch.zeros(4, 8, dtype=torch.float16)
    check_binding("a", t, want, torch.device("cpu"))
    with pytest.raises(BindingError, match=r"'a': expected shape \[4, 8\], given \[8, 4\]"):
        check_binding("a", t.t(), want, torch.device("cpu"))
    with pytest.raises(BindingError, match="strides"):
        check_binding("a", torch.zeros(8, 4, dtype=torch.float16).t(), want, torch.device("cpu"))


def test_compare_counts_mismatches_and_nans():
    a = torch.tensor([1.0, 2.0, float("nan"), 4.0])
    b = torch.tensor([1.0, 2.5, 3.0, 4.0])
    c = compare("y", a, b, "float")
    assert not c.ok and c.mismatches == 2 and c.max_abs == pytest.approx(0.5)
    assert compare("y", b, b, "float").ok


def test_conv_gradients_match_autograd():
    text = (
        "graph g {\n  input x : float[2, 4, 9, 9]\n  input w : float[6, 4, 3, 3]\n"
        "  input dy : float[2, 6, 5, 5]\n"
        "  output dx = conv_dgrad(dy, w, padding=1, stride=2)\n"
        "  output dw = conv_wgrad(x, dy, padding=1, stride=2)\n}\n"
    )
    ins, out = reference(text, seed=1)
    x, w = ins["x"].clone().requires_grad_(), ins["w"].clone().requires_grad_()
    torch.nn.functional.conv2d(x, w, padding=1, stride=2).backward(ins["dy"])
    torch.testing.assert_close(out["dx"], x.grad)
    torch.testing.assert_close(out["dw"], w.grad, atol=1e-4, rtol=1e-4)


def test_conv_dgrad_output_padding_picks_the_larger_input_size():
    """With stride 2, inputs of 9 and 10 rows both give a 5-row gradient; output_padding says which."""
    text = (
        "graph g {\n  input w : float[6, 4, 3, 3]\n  input dy : float[2, 6, 5, 5]\n"
        "  output dx : float[2, 4, 10, 10] = conv_dgrad(dy, w, padding=1, stride=2, output_padding=[1, 1])\n}\n"
    )
    by_hand = torch.nn.functional.conv_transpose2d
    check(
        text,
        "cpu",
        seed=1,
        expect=lambda ins: {"dx": by_hand(ins["dy"], ins["w"], stride=2, padding=1, output_padding=1)},
    )


def test_conv_dgrad_output_padding_must_stay_below_the_stride():
    bad = (
        "graph g {\n  input w : float[6, 4, 3, 3]\n  input dy : float[2, 6, 5, 5]\n"
        "  output dx = conv_dgrad(dy, w, stride=2, output_padding=2)\n}\n"
    )
    with pytest.raises(DslError, match=r"output_padding \[2, 2\] must be below the stride \[2, 2\]") as e:
        program(text=bad, file="r.cdg")
    [err] = [d for d in e.value.diagnostics if d.severity == "error"]
    assert (err.loc.line, err.loc.col) == (4, bad.splitlines()[3].index("output_padding") + 1)


def test_a_mismatch_says_where_and_by_how_much():
    want = torch.zeros(4, 5)
    got = want.clone()
    got[2, 3], got[1, 1] = 0.5, 0.02
    c = compare("y", got, want, "float")
    assert (c.mismatches, c.worst) == (2, ((2, 3), 0.5, 0.0))
    assert "MISMATCH in 2 of 20 (10%); worst at [2, 3]: 0.5, want 0" in str(c) and "mean 0.026" in str(c)
    nan = want.clone()
    nan[0, 4] = float("nan")
    assert compare("y", nan, want, "float").worst[0] == (0, 4)  # a NaN is the worst there is


def test_outputs_of_another_shape_are_a_mismatch_not_a_crash():
    c = compare("dg", torch.zeros(1, 768, 1, 1), torch.zeros(768), "float")
    assert not c.ok and c.mismatches == 768
    assert str(c) == "dg: MISMATCH of shape: [1, 768, 1, 1] where the reference is [768]"
