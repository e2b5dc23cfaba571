"""Declared dtypes of intermediates, where the reference rounds, and how generated inputs are drawn (CPU)."""

import pytest
import torch
from cli_util import run_cli

from cudnn_dsl.run import compare, inputs
from cudnn_dsl.run.compare import compare_outputs, rounded_values
from cudnn_dsl.run.inputs import draw_input, generate_inputs, input_inits
from cudnn_dsl.run.reference import run_reference
from cudnn_dsl.target import portable
from dsl.inits import parse
from dsl.options import Options
from dsl.pipeline import load, program
from dsl.syntax.parser import parse as parse_cdg
from dsl.syntax.printer import fmt_module
from dsl.types import TensorType

ADD_LN = """graph add_layernorm {
  io float
  input x : float[64, 768, 1, 1] nhwc init=randn(0, 1)
  input r : float[64, 768, 1, 1] nhwc init=randn(0, 1)
  input s : float[1, 768, 1, 1] nhwc init=randn
  input b : float[1, 768, 1, 1] nhwc init=randn
  h : bf16 = x + r
  output h
  output y = layernorm(h, s, b, epsilon=0.001)
}
"""


def _graph(text: str):
    g = program(text=text, file="p.cdg").graphs[0]
    return g, g.instances[0]


def _errors(text: str) -> str:
    return load(text=text, file="p.cdg").render()


# ---- declared dtypes of intermediates -----------------------------------------------------


def test_a_named_intermediate_takes_its_declared_dtype_and_the_lowering_stamps_it():
    from cudnn_dsl.interop.emit import emit_cudnn

    g, inst = _graph(ADD_LN.replace("  output h\n", ""))
    assert g.value("h").kind == "virtual" and inst.type("h").dtype == "bf16"
    assert "h.set_data_type(cudnn.data_type.BFLOAT16)" in emit_cudnn(g, inst).replace("add_0", "h")


def test_the_declared_dtype_of_an_intermediate_is_checked_where_it_is_declared():
    text = "graph g {\n  input x : float[4]\n  y : half[3] = x * 2\n  output z = y\n}\n"
    assert "p.cdg:3:7: error: 'y' is declared [3] but mul gives [4]\n    y : half[3] = x * 2\n        ^^^^^^^" in (
        _errors(text)
    )
    text = "graph g {\n  input x : half[4]\n  y : bf16 = x * 2\n  output y : half\n}\n"
    assert "p.cdg:4:3: error: output 'y' is declared bf16 where it is computed, and half here" in _errors(text)
    text = "graph g {\n  input x : float[4]\n  y : bf16 = reshape(x, shape=[2, 2])\n  output z = y * 2\n}\n"
    assert "reshape: cuDNN keeps the input's dtype, float, but 'y' is bf16 (declared); declare 'y : float'" in (
        _errors(text)
    )


LAYOUT_OF_MATMUL = """graph g {
  io half
  input a : half[2, 16, 32]
  input b : half[2, 32, 8]
  output z = %s
}
"""


@pytest.mark.parametrize(
    "expr,producer,layout",
    [
        ("transpose(matmul(a, b), perm=[0, 2, 1])", "matmul", lambda m: m.transpose(1, 2)),
        ("reshape(matmul(a, b), shape=[32, 8])", "matmul", lambda m: m.reshape(32, 8)),
        (  # through two layout ops, to the relu that computes their input (the matmul stays float)
            "reshape(transpose(relu(matmul(a, b)), perm=[0, 2, 1]), shape=[16, 16])",
            "relu",
            lambda m: m.mT.reshape(16, 16),
        ),
    ],
)
def test_a_layout_op_gets_its_virtual_input_computed_in_its_output_dtype(expr, producer, layout):
    """cuDNN's layout ops keep their input's dtype: the op that computes the input writes it in the layout op's
    output dtype (a note says so at that op), cuDNN plans the graph for an H200, and the reference rounds there."""
    from cudnn_dsl.run.partition import plan_for_target
    from cudnn_dsl.target.library import Target

    result = load(text=LAYOUT_OF_MATMUL % expr, file="p.cdg")
    assert result.ok, result.render()
    [note] = result.diagnostics
    assert note.severity == "note" and note.loc.col == 1 + result.text.splitlines()[4].index(producer)
    assert note.message.startswith(f"{producer} writes its result in half, not float: ") and (
        "output 'z' is half" in note.message
    )
    g = result.program.graphs[0]
    inst = g.instances[0]
    k = [n.op for n in g.nodes].index(producer)  # it and the layout ops after it are half, the ops before float
    assert [inst.type(n.outputs[0]).dtype for n in g.nodes] == ["float"] * k + ["half"] * (len(g.nodes) - k)
    plan_for_target(g, inst, g.options, Target.named("h200"))  # whole or split, it plans
    ins = generate_inputs(g, inst, "cpu", seed=3)
    m = (ins["a"].float() @ ins["b"].float()).relu() if producer == "relu" else ins["a"].float() @ ins["b"].float()
    want = layout(m.half().float()).half()
    assert torch.equal(run_reference(g, inst, ins)["z"], want)


def test_a_layout_op_of_a_value_read_elsewhere_is_still_refused():
    """Retyping a value that an output or another op reads would change what they get: the error stays."""
    for body in (
        "y = matmul(a, b)\n  output y : float\n  output z = transpose(y, perm=[0, 2, 1])",
        "y = matmul(a, b)\n  output w = relu(y)\n  output z = transpose(y, perm=[0, 2, 1])",
        "y : float = matmul(a, b)\n  output z = reshape(y, shape=[32, 8])",
    ):
        text = LAYOUT_OF_MATMUL.replace("output z = %s", body)
        assert "cuDNN keeps the input's dtype, float, but output 'z' is half" in _errors(text)


def test_fmt_prints_types_of_intermediates_and_inits_canonically():
    messy = (
        "graph g {\n  input x : half[4,8]   init = randn( 0,0.5 )  uid=3\n  input y : half[4, 8] init=full\n"
        "  t : bf16[4,8] = x+y\n  output o = t\n}\n"
    )
    want = (
        "graph g {\n  input x : half[4, 8] init=randn(0, 0.5) uid=3\n  input y : half[4, 8] init=full\n"
        "  t : bf16[4, 8] = x + y\n  output o = t\n}\n"
    )
    assert fmt_module(parse_cdg(messy)) == want
    assert fmt_module(parse_cdg(want)) == want


# ---- where the reference rounds -------------------------------------------------------------


def test_an_intermediate_output_is_rounded_before_the_op_that_reads_it():
    """The GPU feeds layernorm the bf16 sum it writes; the reference must too."""
    g, inst = _graph(ADD_LN)
    ins = generate_inputs(g, inst, "cpu", seed=7)
    out = run_reference(g, inst, ins)
    h = (ins["x"] + ins["r"]).to(torch.bfloat16)
    y = torch.nn.functional.layer_norm(h.float(), [768, 1, 1], ins["s"][0], ins["b"][0], 1e-3)
    assert torch.equal(out["h"], h)
    torch.testing.assert_close(out["y"], y, atol=1e-5, rtol=1e-5)
    unrounded = run_reference(g, inst, ins, rounded=frozenset())["y"]
    assert (unrounded - y).abs().max() > 1e-3  # the rounding is what makes them agree


def test_which_values_the_reference_rounds():
    text = """graph g {
      input a : float[2, 16, 32]
      input b : half[2, 32, 8]
      a16 : half = identity(a)
      t : half = matmul(a16, b) + 1
      u : half = t * 2
      output o : half = u - 1
      output p = o * 3
    }"""
    g, inst = _graph(text)
    # every value narrower than double, virtual or not, as the H200 shows (tests/gpu/test_precision_gpu.py);
    # the float matmul_0 is named too, a no-op in the float32 reference
    assert rounded_values(g, inst) == {"a16", "matmul_0", "t", "u", "o", "p"}
    ins = generate_inputs(g, inst, "cpu", seed=2)
    out = run_reference(g, inst, ins)
    a16 = ins["a"].half().float()
    t = ((a16 @ ins["b"].float()) + 1).half().float()
    o = ((t * 2).half().float() - 1).half()
    torch.testing.assert_close(out["o"], o, atol=0, rtol=0)
    torch.testing.assert_close(out["p"], (o.float() * 3).half(), atol=0, rtol=0)


def test_in_a_double_graph_a_float_output_read_later_is_rounded_to_float():
    g, inst = _graph("graph g {\n  input x : double[64]\n  output y : float = x / 3\n  output z : double = y * 3\n}\n")
    ins = generate_inputs(g, inst, "cpu")
    out = run_reference(g, inst, ins)
    assert torch.equal(out["z"], (ins["x"] / 3).float().double() * 3)
    assert not torch.equal(out["z"], ins["x"] / 3 * 3)


def test_the_tolerance_floor_follows_the_rounded_values_ops_read():
    g, inst = _graph(ADD_LN)
    assert compare.loosest_read_dtype(g, inst) == "bf16"  # inputs are float; layernorm reads the bf16 h
    g2, inst2 = _graph(ADD_LN.replace("  output h\n", ""))
    assert compare.loosest_read_dtype(g2, inst2) == "bf16"  # a virtual bf16 h is rounded too (seen on the H200)
    g3, inst3 = _graph(ADD_LN.replace("  output h\n", "").replace("h : bf16 = ", "h = "))
    assert compare.loosest_read_dtype(g3, inst3) == "float"


def test_no_compare_leaves_an_output_out():
    g, inst = _graph(ADD_LN)
    ins = generate_inputs(g, inst, "cpu")
    want = run_reference(g, inst, ins)
    got = {"h": want["h"], "y": want["y"] + 1}
    assert [c.name for c in compare_outputs(g, inst, got, want, Options(), skip={"y"})] == ["h"]
    assert not all(c.ok for c in compare_outputs(g, inst, got, want, Options()))


# ---- generated inputs ---------------------------------------------------------------------


def test_the_same_seed_gives_the_same_inputs_and_each_input_its_own_stream():
    g, inst = _graph(ADD_LN)
    one, two = generate_inputs(g, inst, "cpu", seed=3), generate_inputs(g, inst, "cpu", seed=3)
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert not torch.equal(one["x"], generate_inputs(g, inst, "cpu", seed=4)["x"])
    assert not torch.equal(one["x"], one["r"])  # same distribution, same shape: different streams
    other = generate_inputs(g, inst, "cpu", seed=3, inits={"x": parse("uniform(0, 1)")})
    assert torch.equal(other["r"], one["r"]) and not torch.equal(other["x"], one["x"])


def test_big_inputs_are_drawn_in_chunks_that_do_not_depend_on_the_cores(monkeypatch):
    t = TensorType("half", (8, 1000), (1000, 1))
    monkeypatch.setattr(portable, "CHUNK", 1024)
    threaded = draw_input(parse("randn"), t, 0, "x")
    monkeypatch.setattr(inputs.os, "cpu_count", lambda: 1)
    assert torch.equal(draw_input(parse("randn"), t, 0, "x"), threaded)
    flat = threaded.view(-1)
    assert not torch.equal(flat[:1024], flat[1024:2048])  # each chunk has its own stream
    ramp = draw_input(parse("arange(1, 2)"), TensorType("float", (3000,), (1,)), 0, "p")
    assert torch.equal(ramp, torch.arange(3000, dtype=torch.float32) * 2 + 1)  # counted across chunks


@pytest.mark.parametrize(
    "dist, dtype, check",
    [
        ("randn(10, 0.5)", "float", lambda v: abs(v.mean() - 10) < 0.05 and abs(v.std() - 0.5) < 0.05),
        ("uniform(2, 3)", "half", lambda v: v.min() >= 2 and v.max() <= 3),
        ("randint(1, 4)", "int32", lambda v: set(v.unique().tolist()) == {1, 2, 3, 4}),
        ("randint(-2, 2)", "float", lambda v: set(v.unique().tolist()) == {-2.0, -1.0, 0.0, 1.0, 2.0}),
        ("bernoulli(0.25)", "bool", lambda v: v.dtype == torch.bool and abs(v.float().mean() - 0.25) < 0.03),
        ("sparse(0.75)", "bf16", lambda v: abs((v == 0).float().mean() - 0.75) < 0.03 and v.abs().max() <= 1),
        ("full(7)", "int64", lambda v: bool((v == 7).all())),
        ("randn(0, 100)", "int8", lambda v: v.min() == -128 and v.max() == 127),  # rounded, clamped
        ("zeros", "half", lambda v: bool((v == 0).all())),
        ("ones", "bool", lambda v: v.dtype == torch.bool and bool(v.all())),
        ("randint(0, 10, 0.5)", "half", lambda v: set(v.unique().tolist()) == {i / 2 for i in range(11)}),
        ("randint(-2, 2, 3)", "int32", lambda v: set(v.unique().tolist()) == {-6, -3, 0, 3, 6}),
    ],
)
def test_each_distribution_draws_what_it_says(dist, dtype, check):
    v = draw_input(parse(dist), TensorType(dtype, (4096,), (1,)), 0, "x")
    assert check(v.double() if v.dtype != torch.bool else v)


def test_defaults_follow_the_dtype_and_the_registrys_positive_hints():
    text = (
        "graph g {\n  input x : half[64]\n  input v : half[64]\n  input i : int32[64]\n"
        "  input m : bool[64]\n  output y = x / v\n  output j = identity(i)\n  output n = identity(m)\n}\n"
    )
    g, inst = _graph(text)
    assert {k: str(v) for k, v in input_inits(g, inst).items()} == {
        "x": "uniform(-1, 1)",
        "v": "uniform(0.5, 1.5)",  # a divisor
        "i": "randint(-8, 8)",
        "m": "bernoulli(0.5)",
    }
    assert str(input_inits(g, inst, {"v": parse("full(2)")})["v"]) == "full(2)"


@pytest.mark.parametrize(
    "spec, culprit, message",
    [
        ("init=randn(0, -1)", "-1", "init: randn: std must not be negative"),
        (
            "init=rand(1)",
            "init=rand(1)",
            "unknown distribution 'rand' (did you mean 'randn'?); the distributions are uniform, randn, "
            "randint, bernoulli, sparse, full, zeros, ones, permutation, arange, like",
        ),
        ("init=randint(0.5, 2)", "0.5", "init: randint: lo and hi must be integers"),
        ("init=uniform(1, 0)", "0", "init: uniform: lo (1) is greater than hi (0)"),
        ("init=full(1) init=full(2)", "init=full(2)", "init given twice"),
        ("init=randn(0, 1, 2)", "init=randn(0, 1, 2)", "init: randn takes 2 parameters (mean, std), got 3"),
    ],
)
def test_a_bad_init_is_located_with_a_caret(spec, culprit, message):
    line = f"  input x : float[4] {spec}"
    out = _errors(f"graph g {{\n{line}\n  output y = x * 2\n}}\n")
    col = line.rindex(culprit)
    assert f"p.cdg:2:{col + 1}: error: {message}\n  {line}\n  {' ' * col}{'^' * len(culprit)}\n" in out + "\n", out


def test_init_is_for_inputs_and_fits_their_dtype():
    text = "graph g {\n  input i : int8[4] init=full(300)\n  output y = identity(i)\n}\n"
    assert "init: full(300) draws 300, out of range for int8 (-128 to 127)" in _errors(text)
    text = "graph g {\n  input x : half[4]\n  output y : half init=randn = x * 2\n}\n"
    assert "p.cdg:3:19: error: only an input or a buffer takes init=" in _errors(text)
    text = "graph g {\n  input x : half[4] init=randn(0,\n  output y = x\n}\n"
    assert "syntax error" in _errors(text)


LIKE = (
    "graph g {\n  input a : float[2, 8]\n  input b : float[2, 8] strides [1, 2] init=like(a)\n"
    "  input m : bool[2, 8]\n  input n : bool[2, 8] strides [1, 2] init=like(m)\n"
    "  output y = a - b\n  output k = logical_and(m, logical_not(n))\n}\n"
)


def test_an_input_drawn_like_another_takes_its_values_as_generated_or_given():
    g, inst = _graph(LIKE)
    drawn = generate_inputs(g, inst, "cpu", seed=1)
    assert drawn["b"].stride() == (1, 2) and torch.equal(drawn["b"], drawn["a"])  # in its own layout
    out = run_reference(g, inst, drawn)
    assert torch.equal(out["y"], torch.zeros(2, 8)) and not bool(out["k"].any())  # exactly
    given = torch.arange(16.0).view(2, 8)
    assert torch.equal(generate_inputs(g, inst, "cpu", 1, given={"a": given})["b"], given)
    assert bool((generate_inputs(g, inst, "cpu", 1, {"a": parse("full(3)")})["b"] == 3).all())  # run --init a=
    own = generate_inputs(g, inst, "cpu", 1, {"b": parse("full(2)")})  # run --init b= draws b instead
    assert bool((own["b"] == 2).all()) and torch.equal(own["a"], drawn["a"])


def test_a_copy_makes_its_source_positive_where_an_op_wants_the_copy_positive():
    g, inst = _graph("graph g {\n  input a : half[64]\n  input b : half[64] init=like(a)\n  output y = a / b\n}\n")
    assert str(input_inits(g, inst)["a"]) == "uniform(0.5, 1.5)" and "b" not in input_inits(g, inst)


def test_run_copies_a_given_input_into_its_like_and_dumps_both(tmp_path):
    import numpy as np

    f, a = tmp_path / "g.cdg", tmp_path / "a.npy"
    f.write_text(LIKE)
    np.save(a, np.arange(16, dtype=np.float32).reshape(2, 8))
    p = run_cli("run", f, "--input", f"a={a}", "--dump", tmp_path / "d")
    assert p.returncode == 0, p.stderr
    assert "y: float[2, 8] on the CPU, mean 0, max |x| 0" in p.stdout, p.stdout
    dumped = torch.load(tmp_path / "d" / "g.inputs.pt", weights_only=True)
    assert torch.equal(dumped["b"], torch.arange(16.0).view(2, 8))


@pytest.mark.parametrize(
    "decls, culprit, message",
    [
        ("  input b : float[4] init=like(c)", "c", "init: like(c): no input 'c'"),
        ("  input b : float[4] init=like(b)", "b)", "init: input 'b' cannot be drawn like itself"),
        (
            "  buffer w : float[8]\n  input v : float[4] in w at 0\n  input b : float[4] init=like(v)",
            "v)",
            "init: like(v): 'v' is a view, drawn with its buffer",
        ),
        ("  input b : float[5] init=like(a)", "a)", "init: like(a): 'a' is float[4], 'b' is float[5]"),
        ("  input b : float[4] init=like(1)", "1", "init: like takes one input's name: like(x)"),
    ],
)
def test_a_bad_like_is_located_at_the_name(decls, culprit, message):
    text = f"graph g {{\n  input a : float[4]\n{decls}\n  output y = a * 2\n}}\n"
    out = _errors(text)
    line = decls.split("\n")[-1]
    row = 2 + decls.count("\n") + 1
    col = line.rindex(culprit)
    assert f"p.cdg:{row}:{col + 1}: error: {message}" in out and f"\n  {' ' * col}^" in out, out


def test_a_permutation_draws_each_value_once_then_repeats_the_order():
    v = draw_input(parse("permutation(3, 7)"), TensorType("int32", (12,), (1,)), 0, "p").tolist()
    assert sorted(v[:5]) == [3, 4, 5, 6, 7] and v[5:10] == v[:5] and v[10:] == v[:2]
    with pytest.raises(Exception, match="permutation: 16777217 values are too many to order") as e:
        parse("permutation(0, 16777216)")
    assert type(e.value).__name__ == "RuleError"


def test_the_command_line_parses_distributions_without_eval():
    assert str(parse(" randn ( 0 , 0.5 ) ")) == "randn(0, 0.5)"
    assert str(parse("uniform")) == "uniform(-1, 1)"
    for bad in ("randn(0,", "randn(1)(2)", "os.system('x')", "randn(0, 1e999)", "full()"):
        with pytest.raises(Exception) as e:
            parse(bad)
        assert type(e.value).__name__ == "RuleError", bad


def test_run_init_and_no_compare_on_the_command_line(tmp_path):
    f = tmp_path / "g.cdg"
    f.write_text(
        "graph g {\n  input a : half[1, 8, 8] init=full(3)\n  input b : half[1, 8, 8]\n  output y = matmul(a, b)\n}\n"
    )
    p = run_cli("run", f, "--init", "b=full(1)", "--no-compare", "y", "--no-reference")
    assert p.returncode == 0, p.stderr
    assert "mean 24," in run_cli("run", f, "--init", "b=full(1)").stdout  # 8 products of 3 * 1
    p = run_cli("run", f, "--init", "b=randint(1, 2.5)")
    assert p.returncode == 2 and "randint: lo and hi must be integers" in p.stderr
