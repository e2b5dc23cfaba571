"""Derived backward graphs (dsl/autodiff.py, the VJP rules in dsl/ops/, cudnn_dsl/torch_op/autograd.py), on the
CPU: the derived text round-trips, and the gradients of the derived backward, run through its reference, match
torch autograd on the forward's reference."""

import functools

import pytest
import torch

from cudnn_dsl.target.quirks import avoided_backward
from cudnn_dsl.torch_op.autograd import differentiable
from dsl.autodiff import derive
from dsl.diagnostics import DslError
from dsl.ops import EMIT_STATISTICS, OPS, VJPS
from dsl.pipeline import program
from dsl.syntax.parser import parse
from dsl.syntax.printer import fmt_module
from tests.cli_util import run_cli
from tests.helpers import ON_H200, check_grads


def test_statistics_switches_name_real_attributes():
    for op, (attr, value) in EMIT_STATISTICS.items():
        assert OPS[op].attr(attr) is not None
        assert OPS[op].count_results({attr: value}) == len(OPS[op].outputs)


POSITIVE = "init=uniform(0.5, 2)"
UNARY = [op for op, s in OPS.items() if s.family == "pointwise" and s.inputs == ("x",) and op in VJPS]
UNARY = [op for op in UNARY if op not in ("gen_index", "logical_not", "floor", "ceil")]
BINARY = ["add", "sub", "mul", "div", "max", "min", "pow", "mod", "add_square"]


def _graph(body: str, a: str = "float[2, 3, 4]", b: str = "float[2, 3, 4]", init: str = "") -> str:
    return (
        f"graph g {{\n  input a : {a} {init}\n  input b : {b} {init}\n  input c : float[2, 3, 4] {init}\n  {body}\n}}\n"
    )


@pytest.mark.parametrize("op", UNARY)
def test_unary_vjp_matches_autograd(op):
    init = POSITIVE if OPS[op].positive else ""
    check_grads(_graph(f"output y = {op}(a) * b + c", init=init), "cpu")


@pytest.mark.parametrize("op", BINARY)
def test_binary_vjp_matches_autograd_with_broadcast(op):
    init = POSITIVE if OPS[op].positive else ""
    check_grads(_graph(f"output y = {op}(a, b) * c", b="float[1, 3, 1]", init=init), "cpu")


@pytest.mark.parametrize(
    "body",
    [
        "output y = relu(a, negative_slope=0.1, lower_clip=-0.5, upper_clip=0.7) + b * c",
        "output y = leaky_relu(a, slope=0.2) * b + c",
        "output y = binary_select(a, b, cmp_gt(c, 0)) * c",
        "output y = bias(a, reduction(b, mode=sum, axes=[0, 2])) * c",
        "output y = scale(a, reduction(b, mode=avg, axes=[0, 2])) * c",
        "r = reduction(a * b, mode=sum, axes=[1])\n  output y = r * reduction(c, mode=max, axes=[1])",
        "output y = reduction(a * b + c, mode=amax)",
        "output y = floor(a) * b + c",
        "s, q = genstats(a)\n  output y = s * b + q * c",
        "s, q = genstats(a)\n  output y = s * b + c\n  output z = cmp_gt(q, 1)",
        "s, q = genstats(a * b)\n  output y = q * c\n  output z = cmp_gt(s, 0)",
        "h : float = concatenate(a, b, c, axis=1)\n  output y = h * h",
        "output y = transpose(a, perm=[2, 0, 1]) * transpose(b + c, perm=[2, 0, 1])",
        "output y = reshape(a, shape=[6, 4]) * reshape(b * c, shape=[6, 4])",
    ],
)
def test_rules_match_autograd(body):
    check_grads(_graph(body), "cpu")


def test_matmul_with_broadcast_batch_and_scalar():
    text = """graph mm {
  input a : float[3, 4, 5]
  input b : float[1, 5, 6]
  input bias : float[1, 1, 6]
  scalar alpha : float = 0.5
  output y = gelu_tanh(matmul(a, b) * alpha + bias)
}
"""
    f = check_grads(text, "cpu")
    d = next(iter(f._pairs.values())).derived
    assert ("b_t", "transposed", "b") in d.bind and ("a_t", "flat_transposed", "a") in d.bind
    assert "input b_t : float[1, 6, 5] strides [30, 1, 6]" in d.backward_text
    # b's gradient: one matmul over the batch's 12 rows, a [1, 5, 12] view of a, writing [1, 5, 6]: no batch sum
    assert "input a_t : float[1, 5, 12] strides [60, 1, 5]" in d.backward_text
    assert "output grad_b : float[1, 5, 6] strides [30, 6, 1] = matmul(a_t, reshape_3)" in d.backward_text
    assert "reshape_3 = reshape(mul, shape=[1, 12, 6])" in d.backward_text


def test_matmul_of_intermediates_reads_saved_values_transposed():
    text = "graph g {\n  input a : float[2, 3, 4]\n  input b : float[2, 4, 5]\n"
    text += "  output y = matmul(relu(a) * 2, tanh(b))\n}\n"
    f = check_grads(text, "cpu")
    d = next(iter(f._pairs.values())).derived
    saved = {v.name for v in d.forward.outputs if v.name != "y"}  # the matmul's operands
    assert {of for _, kind, of in d.bind if kind == "transposed"} == saved and len(saved) == 2
    # relu's result, which its mask reads, is recomputed from the input beside it
    assert "recomputes relu_0 (relu) in the backward, fused with what reads it: 96 bytes unsaved" in d.choices


def test_conv_bias_relu_example_half(tmp_path):
    """examples/conv_bias_relu.cdg, smaller: the same ops, layouts and dtypes."""
    src = open("examples/conv_bias_relu.cdg").read()
    small = src.replace("[32, 128, 56, 56]", "[2, 8, 6, 6]").replace("[256, 128, 3, 3]", "[16, 8, 3, 3]")
    small = small.replace("[1, 256, 1, 1]", "[1, 16, 1, 1]").replace("stride=[1, 1]", "stride=[2, 2]")
    f = check_grads(small, "cpu")
    pair = next(iter(f._pairs.values()))
    assert pair.forward is f.cg  # nothing saved: the forward is the graph as compiled
    d = pair.derived
    assert {w for w, _ in d.grads} == {"x", "w", "b"}
    assert "output_padding=[1, 1]" in d.backward_text  # stride 2 over 6: two input sizes give one dy
    # the bias's sum is written in float (autograd returns it in half: check_grads checks the dtype)
    assert "output grad_b : float[1, 16, 1, 1] strides [16, 1, 16, 16] = reduction(" in d.backward_text


# ---- the forms cuDNN plans (deviceless for an H200: tests/test_training_counts.py plans the blocks) ----------

LINEAR = """graph lin {
  io bf16
  compute float
  input x : bf16[2, 3, 8]
  input w : bf16[1, 8, 16]
  input b : bf16[1, 1, 16]
  output y = matmul(x, w) + b
}
"""


def _backward(text: str, wrt=None):
    g = program(text=text).graph()
    return derive(g, wrt=wrt, avoid=ON_H200)


def _lines(d) -> set[str]:
    return {line.strip() for line in d.backward_text.splitlines()}


def _h200_parts(d) -> tuple[tuple[int, int], list[str]]:
    """The derived backward as it runs planned for an H200 without a GPU: (cuDNN launches, torch parts), its parts."""
    from cudnn_dsl.run.partition import plan_for_target
    from cudnn_dsl.target.library import Target

    b = d.backward
    _, partition = plan_for_target(b, b.instances[0], b.options, Target.named("h200"))
    return (partition.counts.launches, partition.counts.fallbacks), partition.lines(b)


def test_a_token_sum_of_a_backward_input_is_a_float_sum_of_its_rank_4_view():
    """The bias's gradient sums grad_y [2, 3, 16] over its tokens: as the channels-last view [6, 16, 1, 1] summed
    over [0, 2, 3] to float (cuDNN declines the sum at rank 3, and with a bf16 output), reshaped back."""
    d = _backward(LINEAR)
    assert {
        "reshape = reshape(grad_y, shape=[6, 16, 1, 1])",
        "reduction : float = reduction(reshape, mode=sum, axes=[0, 2, 3])",
        "output grad_b : float[1, 1, 16] strides [16, 16, 1] = reshape(reduction, shape=[1, 1, 16])",
    } <= _lines(d)
    assert d.backward.instances[0].type("reshape").strides == (16, 1, 16, 16)  # channels-last
    check_grads(LINEAR, "cpu")  # autograd returns b's gradient in bf16


def test_a_weight_gradient_is_one_matmul_over_the_batch_in_the_weights_dtype():
    """w [1, 8, 16] is broadcast over x's batch: its gradient is x viewed as [1, 8, 6] (no copy) times grad_y
    reshaped to [1, 6, 16], written in bf16, with no batched product [2, 8, 16] to sum over the batch."""
    d = _backward(LINEAR)
    assert ("x_t", "flat_transposed", "x") in d.bind
    assert {
        "input x_t : bf16[1, 8, 6] strides [48, 1, 8]",
        "reshape_1 = reshape(grad_y, shape=[1, 6, 16])",
        "output grad_w : bf16[1, 8, 16] strides [128, 16, 1] = matmul(x_t, reshape_1)",
    } <= _lines(d)
    assert [n.op for n in d.backward.nodes].count("reduction") == 1  # b's only


def test_a_weight_gradient_whose_rows_make_no_view_stays_batched():
    """x's batch axis lies inside its rows (strides [5, 15, 1]): [1, 5, 12] is no view of it, so w's gradient is
    the batched product and its sum over the batch."""
    text = """graph g {
  input x : float[3, 4, 5] strides [5, 15, 1]
  input w : float[1, 5, 6]
  output y = matmul(x, w)
}
"""
    d = _backward(text)
    assert ("x_t", "transposed", "x") in d.bind and "flat_transposed" not in {kind for _, kind, _ in d.bind}
    assert "output grad_w : float[1, 5, 6] strides [30, 6, 1] = reduction(matmul_0, mode=sum, axes=[0])" in _lines(d)
    check_grads(text, "cpu")


@pytest.mark.parametrize(
    "y,written",
    [
        (
            "gelu(matmul(x, w) + b)",
            {
                "reshape = reshape(grad_y, shape=[6, 16, 1, 1])",
                "reshape_0 = reshape(add_1, shape=[6, 16, 1, 1])",
                "gelu_backward_0 : bf16 = gelu_backward(reshape, reshape_0)",
                "reduction : float = reduction(gelu_backward_0, mode=sum, axes=[0, 2, 3])",
                "output grad_b : float[1, 1, 16] strides [16, 16, 1] = reshape(reduction, shape=[1, 1, 16])",
                "gelu_backward = reshape(gelu_backward_0, shape=[2, 3, 16])",
                "output grad_x : bf16[2, 3, 8] strides [24, 8, 1] = matmul(gelu_backward, w_t)",
                "reshape_3 = reshape(gelu_backward_0, shape=[1, 6, 16])",
            },
        ),
        (
            "gelu(matmul(x, w) + b) * c",
            {
                "mul_0 = mul(reshape, reshape_0)",
                "gelu_backward_0 : bf16 = gelu_backward(mul_0, reshape_1)",
                "reduction : float = reduction(gelu_backward_0, mode=sum, axes=[0, 2, 3])",
            },
        ),
    ],
    ids=["activation", "chain"],
)
def test_after_pointwise_ops_on_backward_inputs_a_token_sum_is_fused_with_them_at_rank_4(y, written):
    """The bias's sum over the tokens of what gelu_backward makes (from grad_y, or grad_y * c first): the pointwise
    ops over the channels-last views [6, 16, 1, 1] of their inputs (which come first), summed over [0, 2, 3] to
    float, the matmuls reading the result as the same memory in their shapes. Planned for an H200: three cuDNN
    graphs, no torch part (at rank 3 cuDNN declines the sum after pointwise ops, and even alone)."""
    scaled = y.endswith("* c")
    text = LINEAR.replace("input b", "input c : bf16[2, 3, 16]\n  input b" if scaled else "input b")
    text = text.replace("matmul(x, w) + b", y)
    d = _backward(text, wrt=("x", "w", "b"))
    assert written <= _lines(d)
    counts, lines = _h200_parts(d)
    assert counts == (3, 0), lines
    check_grads(text, "cpu", frozen=("c",) if scaled else ())


@pytest.mark.parametrize("io", ["float", "bf16"])
def test_a_token_sum_fused_at_rank_4_is_also_a_narrower_inputs_gradient(io):
    """gelu(x + b): gelu_backward's result is x's gradient (in x's dtype) and, summed over the tokens, b's: the op
    writes it in x's dtype over the rank-4 views, x's gradient a reshape of it."""
    text = (
        f"graph g {{\n  io {io}\n  intermediate float\n  compute float\n  input x : {io}[2, 3, 16]\n"
        f"  input b : {io}[1, 1, 16]\n  output y = gelu(x + b)\n}}\n"
    )
    d = _backward(text)
    assert {
        f"gelu_backward_0{' : bf16' if io == 'bf16' else ''} = gelu_backward(reshape, reshape_0)",
        f"output grad_x : {io}[2, 3, 16] strides [48, 16, 1] = reshape(gelu_backward_0, shape=[2, 3, 16])",
    } <= _lines(d)
    check_grads(text, "cpu")


def test_a_cast_is_written_by_the_matmul_that_computes_the_value_through_its_reshape():
    """x's gradient needs dt in bf16 (a matmul operand); dt is a reshape of the matmul dU: dU is written in bf16,
    with no identity op. w1's gradient reads dt flattened to [1, 8, 8], dU's own shape: dU itself, no reshape of
    the reshape."""
    text = """graph two {
  io bf16
  compute float
  input x : bf16[2, 4, 8]
  input w1 : bf16[1, 8, 8]
  input w2 : bf16[1, 8, 8]
  t : bf16 = matmul(x, w1)
  u = reshape(t, shape=[1, 8, 8])
  output y = matmul(u, w2)
}
"""
    d = _backward(text)
    assert {
        "matmul : bf16 = matmul(grad_y, w2_t)",
        "reshape = reshape(matmul, shape=[2, 4, 8])",
        "output grad_x : bf16[2, 4, 8] strides [32, 8, 1] = matmul(reshape, w1_t)",
        "output grad_w1 : bf16[1, 8, 8] strides [64, 8, 1] = matmul(x_t, matmul)",
    } <= _lines(d)
    assert "identity" not in d.backward_text
    check_grads(text, "cpu")


def test_the_derived_forward_keeps_an_input_drawn_like_another():
    text = (
        "graph g {\n  io float\n  compute float\n  input a : float[2, 8] init=randint(0, 4, 0.5)\n"
        "  input b : float[2, 8] init=like(a)\n  output y = a * b\n}\n"
    )
    d = _backward(text)
    assert "input b : float[2, 8] strides [8, 1] init=like(a)" in d.forward_text
    assert "input a : float[2, 8] strides [8, 1] init=randint(0, 4, 0.5)" in d.forward_text


def test_the_transformer_blocks_backward_takes_the_forms_cuDNN_plans():
    """examples/training/transformer_block.cdg (its gradients against plain PyTorch: tests/test_train_example.py):
    the output projection's dA written in bf16 for sdpa_backward through its reshape, every bias's gradient a float
    sum of the rank-4 view of what sdpa_backward (or grad_y) wrote, every weight's one matmul over the batch, the
    layer norm's gamma and beta sums at rank 3 in their pointwise chain; and no reshape of a reshape."""
    g = program("examples/training/transformer_block.cdg").graph()
    d = derive(g, avoid=ON_H200)
    lines, b = _lines(d), d.backward
    assert {"matmul : bf16 = matmul(grad_y, wo_t)", "reshape_2 = reshape(matmul, shape=[8, 1, 128, 128])"} <= lines
    assert "identity" not in d.backward_text
    made = {o: n for n in b.nodes for o in n.outputs}
    for c, n in (("q", 128), ("k", 128), ("v", 128), ("o", 256)):
        sum_ = made[made[f"grad_b{c}"].inputs[0]]
        assert made[f"grad_b{c}"].op == "reshape" and b.instances[0].type(f"grad_b{c}").dtype == "float"
        assert sum_.op == "reduction" and b.instances[0].type(sum_.inputs[0]).shape == (1024, n, 1, 1)
        matmul = made[f"grad_w{c}"]
        assert matmul.op == "matmul" and b.instances[0].type(f"grad_w{c}").dtype == "bf16"
        assert b.instances[0].type(matmul.inputs[0]).shape[-1] == 1024  # [1, K, B*S]: the batch in K
    for p in ("gamma", "beta"):
        node = made[f"grad_{p}"]
        assert node.op == "reduction" and b.instances[0].attrs(b.nodes.index(node))["axes"] == (0, 1)
    reshaped = {n.outputs[0] for n in b.nodes if n.op == "reshape"}
    assert not any(n.op == "reshape" and n.inputs[0] in reshaped for n in b.nodes)
    assert {kind for _, kind, of in d.bind if of in ("h", "o")} == {"flat_transposed"}


def test_matmul_epilogue_example_bf16():
    src = open("examples/matmul_epilogue.cdg").read()
    small = src.replace("[16, 512, 1024]", "[2, 8, 16]").replace("[16, 1024, 512]", "[2, 16, 8]")
    check_grads(small.replace("[1, 1, 512]", "[1, 1, 8]"), "cpu")


@pytest.mark.parametrize(
    "body",
    [
        "output y = layernorm(a, b, c, epsilon=1e-3) * a",
        "y, m, v = layernorm(a, b, c, phase=training)\n  output y\n  output m\n  output v",
        "output y = rmsnorm(a, b + 1, epsilon=1e-3) * c",
        "output y = rmsnorm(a, b, c)",
    ],
)
def test_norm_vjps_match_autograd(body):
    """Over the last axis ([1, 1, D] scale) and over all but the first ([1, C, H] scale)."""
    for scale in ("float[1, 1, 4]", "float[1, 3, 4]"):
        text = f"graph g {{\n  input a : float[2, 3, 4]\n  input b : {scale}\n  input c : {scale}\n  {body}\n}}\n"
        check_grads(text, "cpu")


@pytest.mark.parametrize(
    "x, scale, body",
    [
        ("[2, 3, 4, 5]", "[1, 3, 1, 1]", "output y = instancenorm(a, b, c, epsilon=1e-3) * a"),
        (
            "[2, 3, 4, 5]",
            "[1, 3, 1, 1]",
            "y, m, v = instancenorm(a, b, c, phase=training)\n  output y\n  output m\n  output v",
        ),
        ("[2, 3, 4]", "[2, 1, 4]", "output y = adalayernorm(a, b, c) * a"),
        (
            "[2, 3, 4]",
            "[2, 1, 4]",
            "h, m, v = adalayernorm(a, b, phase=training)\n  output y = h * c\n  output m\n  output v",
        ),
    ],
)
def test_instance_and_ada_norm_vjps_match_autograd(x, scale, body):
    text = f"graph g {{\n  input a : float{x}\n  input b : float{scale}\n  input c : float{scale}\n  {body}\n}}\n"
    check_grads(text, "cpu")


def test_inference_norm_saves_statistics_by_computing_them():
    text = "graph g {\n  input a : float[2, 3, 4]\n  input b : float[1, 1, 4]\n  input c : float[1, 1, 4]\n"
    d = derive(program(text=text + "  output y = layernorm(a, b, c)\n}\n").graph(), avoid=ON_H200)
    [n] = d.forward.nodes
    assert n.outputs == ("y", "y_mean", "y_inv_variance") and d.forward.instances[0].attrs(0)["phase"] == "training"
    assert {v.name for v in d.forward.outputs} == {"y", "y_mean", "y_inv_variance"}


def test_batchnorm_inference_vjp_matches_autograd():
    text = """graph bn {
  input x : float[2, 3, 4, 4]
  input mean : float[1, 3, 1, 1]
  input inv_variance : float[1, 3, 1, 1] init=uniform(0.5, 2)
  input scale : float[1, 3, 1, 1]
  input bias : float[1, 3, 1, 1]
  output y = batchnorm_inference(x, mean, inv_variance, scale, bias)
}
"""
    check_grads(text, "cpu")


def test_batchnorm_training_example_updates_running_stats_in_place():
    src = open("examples/batchnorm_training.cdg").read().replace("[16, 64, 32, 32]", "[4, 8, 3, 3]")
    src = src.replace("[1, 64, 1, 1]", "[1, 8, 1, 1]")
    f = differentiable(text=src)
    inputs = f.cg.allocate_inputs()
    running = inputs["running_mean"]
    before = running.clone()
    x = inputs["x"].requires_grad_()
    outs = f(inputs)
    assert outs["next_mean"] is running and not torch.equal(running, before)  # written over its input
    assert not outs["saved_mean"].requires_grad  # statistics pass no gradient
    check_grads(src, "cpu", frozen=("running_mean", "running_var"))
    assert x.grad is None  # only the checked call's backward ran


def test_layernorm_training_example_bf16():
    src = open("examples/layernorm_training.cdg").read().replace("[4096, 1024, 1, 1]", "[8, 16, 1, 1]")
    check_grads(src.replace("[1, 1024, 1, 1]", "[1, 16, 1, 1]"), "cpu", graph="layernorm_training")
    check_grads(src.replace("[1, 1024, 1, 1]", "[1, 16, 1, 1]"), "cpu", graph="rmsnorm_training")


@pytest.mark.parametrize(
    "example",
    ["conv_bias_relu", "matmul_epilogue", "residual_block", "dynamic_matmul", "layernorm", "layernorm_training"],
)
def test_derived_text_round_trips(example):
    prog = program(f"examples/{example}.cdg")
    for g in prog.graphs:
        for inst in g.instances:
            d = derive(g, inst, avoid=ON_H200)
            for text, graph in ((d.forward_text, d.forward), (d.backward_text, d.backward)):
                assert fmt_module(parse(text, "<t>")) == text  # canonical
                again = program(text=text, file=graph.file).graphs[0]
                assert again == graph
            saved = {of for _, kind, of in d.bind if kind == "value"}
            assert saved <= {v.name for v in d.forward.values if v.kind in ("input", "output")}
            assert len(d.forward.nodes) == len(g.nodes)  # saving adds outputs, not ops


def test_saved_values_are_forward_outputs():
    d = derive(program("examples/matmul_epilogue.cdg").graph(), avoid=ON_H200)
    assert d.forward.value("add_2").kind == "output"  # gelu's input
    assert d.backward.value("add_2").kind == "input"
    assert [v.name for v in d.backward.outputs] == ["grad_bias", "grad_a", "grad_b"]


def test_relu_reads_its_result_not_a_saved_input():
    g = program("examples/conv_bias_relu.cdg").graph()
    d = derive(g, avoid=ON_H200)
    assert [v.name for v in d.forward.outputs] == ["out"]  # nothing saved: the mask reads `out`
    assert {of for _, kind, of in d.bind if kind == "value"} == {"out", "w", "x"}
    assert [v.name for v in d.backward.outputs] == ["grad_b", "grad_x", "grad_w"]


def test_pointwise_ops_use_the_frontends_backward_modes():
    d = derive(program("examples/conv_bias_relu.cdg").graph(), avoid=ON_H200)
    assert "= relu_backward(grad_out, out, " in d.backward_text  # the mode reads the result, as the mask did
    d = derive(program("examples/matmul_epilogue.cdg").graph(), avoid=ON_H200)
    assert "gelu_backward(" in d.backward_text and "erf(" not in d.backward_text


def _norm_graph(x: str, scale: str, body: str) -> str:
    decls = "".join(f"  input {n} : float{scale}\n" for n in ("b", "c") if f", {n}" in body)
    return f"graph g {{\n  input a : float{x}\n{decls}  {body}\n}}\n"


@pytest.mark.parametrize(
    "x, scale, body, op",
    [
        ("[4, 3, 2, 2]", "[1, 3, 2, 2]", "output y = layernorm(a, b, c)", "layernorm_backward"),
        ("[4, 3, 2, 2]", "[1, 3, 2, 2]", "output y = rmsnorm(a, b)", "rmsnorm_backward"),
        ("[4, 3, 2, 2]", "[1, 3, 2, 2]", "output y = rmsnorm(a, b, c)", "rmsnorm_backward"),
        ("[4, 8, 1, 1]", "[1, 8, 1, 1]", "output y = layernorm(a, b, c)", "layernorm_backward"),  # the examples'
        ("[4, 3, 2, 2]", "[1, 3, 1, 1]", "output y = batchnorm(a, b, c, c, c)", "batchnorm_backward"),
        ("[4, 3, 2, 2]", "[1, 3, 1, 1]", "output y = instancenorm(a, b, c)", "instancenorm_backward"),
        ("[2, 3, 4]", "[1, 1, 4]", "output y = layernorm(a, b, c)", "layernorm_backward"),  # tokens, read per sample
        ("[2, 3, 4]", "[1, 1, 4]", "output y = rmsnorm(a, b)", "rmsnorm_backward"),
        ("[4, 3, 2, 2]", "[1, 1, 1, 2]", "output y = layernorm(a, b, c)", "layernorm_backward"),
        ("[2, 3, 4]", "[1, 1, 4]", "output y = layernorm(a, b, c) * a", None),  # dx summed with another: float
        ("[4, 3, 2, 2]", "[1, 3, 1, 2]", "output y = layernorm(a, b, c)", None),  # not the last axes
        ("[2, 3, 4]", "[2, 1, 4]", "output y = adalayernorm(a, b, c)", None),  # no engine on 9.19
    ],
)
def test_norms_use_their_backward_op_where_cudnn_runs_it(x, scale, body, op):
    text = _norm_graph(x, scale, body)
    g = program(text=text).graph()
    if op is not None and "batchnorm" in op:  # the running statistics want no gradient
        d = derive(g, wrt=("a", "b", "c"), avoid=ON_H200)
        assert [n.op for n in d.backward.nodes if n.op.endswith("_backward")] == [op]
        return
    d = derive(g, avoid=ON_H200)
    ops = [n.op for n in d.backward.nodes]
    if op is None:
        assert not any(o.endswith("_backward") for o in ops)
    else:
        assert ops == [op]  # the gradients are its results, no copy after it
        assert "float(" not in d.backward_text
        if "[1, 1, " in scale:  # over the last axes: read per sample, [rows, columns, 1, 1], by views of the memory
            [node] = d.backward.nodes
            assert d.backward.instances[0].type(node.inputs[0]).shape[2:] == (1, 1)
            assert {kind for _, kind, _ in d.bind} == {"rows", "grad_rows"}
    check_grads(text, "cpu")
    if op is not None:  # the scale frozen: dscale would be left unread, so the chain
        d = derive(g, avoid=ON_H200, wrt=("a",) + (("c",) if body.count(",") > 1 else ()))
        assert op not in d.backward_text
        check_grads(text, "cpu", frozen=("b",))


@pytest.mark.parametrize(
    "x, scale, body, op",
    [
        ("[2, 3, 4]", "[1, 1, 4]", "output y = layernorm(a, b, c)", "layernorm_backward"),
        ("[2, 3, 4]", "[1, 1, 4]", "output y = rmsnorm(a, b)", "rmsnorm_backward"),
        ("[2, 3, 4]", "[2, 1, 4]", "output y = adalayernorm(a, b, c)", "adalayernorm_backward"),
    ],
)
def test_where_a_quirk_is_verified_clean_the_backward_op_is_used(x, scale, body, op, monkeypatch):
    # a 'derive' row is lifted on a version a test verified clean (here a made-up one, 9.99.0): the
    # frontend's backward op is used there, the chain everywhere else
    import attrs

    from cudnn_dsl.target import quirks

    later = quirks.Sighting(99900, "a later library", "tests/test_autodiff.py")
    rows = [attrs.evolve(q, clean=(*q.clean, later)) if q.stage == "derive" else q for q in quirks.QUIRKS]
    monkeypatch.setattr(quirks, "QUIRKS", rows)
    g = program(text=_norm_graph(x, scale, body)).graph()

    def forms(d):
        return [(n.op, d.backward.instances[0].type(n.inputs[0]).shape) for n in d.backward.nodes if n.op == op]

    tokens = tuple(int(d) for d in x.strip("[]").split(", "))
    rows = [(op, (tokens[0] * tokens[1], tokens[2], 1, 1))] if op != "adalayernorm_backward" else []
    assert forms(derive(g, avoid=ON_H200)) == rows  # per sample, or the chain
    assert forms(derive(g, avoid=functools.partial(avoided_backward, 99900))) == [(op, tokens)]
    check_grads(_norm_graph(x, scale, body), "cpu")


def test_gradients_of_a_value_read_twice_add():
    text = _graph("h = a * b\n  output y = h * h + sin(h) * c")
    d = derive(program(text=text).graph(), avoid=ON_H200)
    assert "add(" in d.backward_text
    check_grads(text, "cpu")


def test_op_without_vjp_is_reported_at_the_op():
    text = _graph("h = slice(a, start=[0, 0, 0], end=[2, 3, 2])\n  output y = h * h")
    with pytest.raises(DslError) as e:
        derive(program(text=text).graph(), avoid=ON_H200)
    [diag] = e.value.diagnostics
    assert "slice has no derived backward" in diag.message and diag.loc.line == 5


def test_rule_refusal_is_located():
    text = "graph g {\n  input x : float[1, 4, 5, 5]\n  input w : float[4, 2, 3, 3]\n  output y = conv_fprop(x, w)\n}\n"
    with pytest.raises(DslError, match="grouped convolution") as e:
        derive(program(text=text).graph(), avoid=ON_H200)
    assert e.value.diagnostics[0].loc.line == 4


def test_no_gradient_past_a_comparison():
    """Only ops a gradient reaches need a VJP: a slice that only a comparison reads is never differentiated."""
    text = _graph("m = cmp_gt(slice(b, start=[0, 0, 0], end=[2, 3, 1]), 0)\n  output y = binary_select(a, c, m)")
    d = derive(program(text=text).graph(), avoid=ON_H200)
    assert {w for w, _ in d.grads} == {"a", "c"}


def test_cli_emit_backward():
    r = run_cli("check", "--emit", "backward", "examples/conv_bias_relu.cdg")
    assert r.returncode == 0, r.stderr
    prog = program(text=r.stdout)
    assert [g.name for g in prog.graphs] == ["conv_bias_relu_forward", "conv_bias_relu_backward"]
    r = run_cli("check", "--emit", "backward", "examples/sdpa_masked.cdg")  # padding and grouped heads
    assert r.returncode == 0 and "= sdpa_backward(q, k, v, o, grad_o, stats, seq_len_q=seq_q" in r.stdout
    r = run_cli("check", "--emit", "backward", "examples/sdpa_ragged.cdg")
    assert r.returncode == 1 and "examples/sdpa_ragged.cdg:19:7: error: no derived backward: sdpa" in r.stderr
    assert "ragged offsets have no derived gradient" in r.stderr and "^^^" in r.stderr


def test_dynamic_shapes_derive_one_pair_per_shape():
    text = """graph dyn {
  dim B in {1, 3}
  input a : float[B, 4, 5]
  input b : float[1, 5, 6]
  output y = sigmoid(matmul(a, b))
}
"""
    f = differentiable(text=text)
    for batch in (1, 3):
        a = torch.randn(batch, 4, 5, requires_grad=True)
        b = torch.randn(1, 5, 6, requires_grad=True)
        f(a=a, b=b)["y"].sum().backward()
        a0, b0 = a.detach().requires_grad_(), b.detach().requires_grad_()
        torch.sigmoid(a0 @ b0).sum().backward()
        torch.testing.assert_close(a.grad, a0.grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b.grad, b0.grad, atol=1e-5, rtol=1e-5)
    assert len(f._pairs) == 2
    r = run_cli("check", "--emit", "backward", "examples/dynamic_matmul.cdg")
    names = [g.name for g in program(text=r.stdout).graphs]
    assert r.returncode == 0 and "dynamic_matmul_backward_B8" in names and len(names) % 2 == 0


def test_a_value_read_plainly_and_transposed():
    """a feeds a matmul (read as a_t) and a mul (read as a): the backward binds both."""
    text = "graph g {\n  input a : float[2, 3, 3]\n  input b : float[2, 3, 3]\n  output y = matmul(a, b) * a\n}\n"
    f = check_grads(text, "cpu")
    bind = next(iter(f._pairs.values())).derived.bind
    assert ("a", "value", "a") in bind and ("a_t", "transposed", "a") in bind


def test_only_the_wanted_gradients_are_derived():
    text = _graph("output y = slice(b, start=[0, 0, 0], end=[2, 3, 1]) + a * c")
    f = differentiable(text=text)
    ins = f.cg.allocate_inputs()
    out = f(ins)["y"]  # nothing requires grad: the graph as written, nothing derived
    assert not out.requires_grad and not f._pairs
    c = ins["c"].requires_grad_()
    f(ins)["y"].sum().backward()  # only c's gradient: slice, which has no VJP, is never differentiated
    torch.testing.assert_close(c.grad, ins["a"])
    [(_, wrt)] = f._pairs
    assert wrt == ("c",)
    ins["b"].requires_grad_()
    with pytest.raises(DslError, match="slice has no derived backward"):
        f(ins)


def test_cli_emit_backward_with_target_plans_the_derived_graphs(tmp_path):
    """Deviceless: the backward of conv + bias + relu runs split (dgrad and wgrad are graphs of their own)."""
    src = tmp_path / "cbr.cdg"
    text = open("examples/conv_bias_relu.cdg").read().replace("[32, 128, 56, 56]", "[8, 64, 16, 16]")
    src.write_text(text.replace("[256, 128, 3, 3]", "[64, 64, 3, 3]").replace("[1, 256, 1, 1]", "[1, 64, 1, 1]"))
    r = run_cli("check", "--emit", "backward", "--target", "h200", src)
    assert r.returncode == 0, r.stderr
    assert "graph conv_bias_relu_forward:" in r.stdout
    assert "declines graph conv_bias_relu_backward whole" in r.stdout and "conv_dgrad (line" in r.stdout


@pytest.mark.parametrize("mask", ["", ", causal=true", ", left_bound=3, right_bound=1", ", causal_bottom_right=true"])
def test_sdpa_vjp_matches_autograd(mask):
    text = f"""graph a {{
  input q : float[2, 2, 6, 8]
  input k : float[2, 2, 7, 8]
  input v : float[2, 2, 7, 8]
  output o = sdpa(q, k, v{mask})
}}
"""
    f = check_grads(text, "cpu")
    d = next(iter(f._pairs.values())).derived
    assert {v.name for v in d.forward.outputs} == {"o", "o_stats"}  # the forward made to save its statistics
    assert [n.op for n in d.backward.nodes] == ["sdpa_backward"]
    f = check_grads(text, "cpu", frozen=("q",))  # dk and dv only: the composite
    d = next(iter(f._pairs.values())).derived
    assert "sdpa_backward" not in d.backward_text
    assert ("grad_o_t", "grad_transposed", "o") in d.bind  # dO^T: a view of the incoming gradient


@pytest.mark.parametrize(
    "extra, decls",
    [
        (", bias=b, causal=true", "  input b : float[1, 4, 6, 7]\n"),
        (", alibi=true, causal=true", ""),
        (", seq_len_q=lq, seq_len_kv=lkv", "  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n"),
    ],
    ids=["bias", "alibi", "padding"],
)
def test_sdpa_backward_op_with_grouped_heads_bias_alibi_padding(extra, decls):
    """sdpa_backward takes what the composite refuses: the bias (and its gradient), ALiBi, padding, and K/V
    with fewer heads than Q."""
    text = f"""graph a {{
  input q : float[2, 4, 6, 8]
  input k : float[2, 2, 7, 8]
  input v : float[2, 2, 7, 8]
{decls}  output o = sdpa(q, k, v{extra})
}}
"""
    f = check_grads(text, "cpu")
    d = next(iter(f._pairs.values())).derived
    assert [n.op for n in d.backward.nodes] == ["sdpa_backward"]


def test_sdpa_vjp_of_a_computed_gradient_and_saved_stats():
    text = """graph a {
  io half
  compute float
  input q : half[1, 2, 8, 16]
  input k : half[1, 2, 8, 16]
  input v : half[1, 2, 8, 16]
  input c : half[1, 2, 8, 16]
  o, st = sdpa(q, k, v, causal=true, stats=true)
  output y = o * c
  output st
}
"""
    f = check_grads(text, "cpu")
    d = next(iter(f._pairs.values())).derived
    assert "transpose(" in d.backward_text and ("st", "value", "st") in d.bind


def test_rope_vjp_rotates_back():
    text = """graph r {
  input x : float[2, 2, 6, 8]
  input freqs : float[8, 1, 1, 8]
  input c : float[2, 2, 6, 8]
  output y = rope(x, freqs, rope_dim=6, output_scale=0.5) * c
}
"""
    check_grads(text, "cpu", frozen=("freqs",))
    with pytest.raises(DslError, match="gradient in freqs"):
        derive(program(text=text).graph(), avoid=ON_H200)
