"""Range dims (`dim T in 16..4096 step 16`): parsed, printed, checked at their ends, typed on first use."""

from pathlib import Path

import pytest

import cudnn_dsl
from cudnn_dsl.run.buffers import BindingError
from dsl.diagnostics import DslError
from dsl.ir import NotFound
from dsl.pipeline import program
from dsl.syntax.printer import summary
from tests.cli_util import run_cli

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "serve_matmul.cdg"


def graph_of(dim: str, body: str):
    return program(text=f"graph g {{\n  {dim}\n{body}\n}}\n", file="r.cdg").graphs[0]


GROUPED = "  input x : half[1, C, 8, 8] nhwc\n  input w : half[24, 4, 3, 3] nhwc\n  output y = conv_fprop(x, w)"


def test_a_range_checks_its_ends_and_types_other_values_on_first_use():
    g = program(EXAMPLE).graphs[0]
    assert [dict(i.binding) for i in g.instances] == [{"T": 16}, {"T": 4096}]
    inst = g.instance({"T": 48})
    assert inst.type("y").shape == (1, 48, 1024)
    assert g.instance({"T": 48}) is inst  # typed once
    assert "256 shapes (2 checked now" in summary(program(EXAMPLE))


def test_a_range_value_types_like_the_same_value_in_a_set():
    body = "  input x : bf16[1, T, 64]\n  input w : bf16[1, 64, 32]\n  output y = relu(matmul(x, w))"
    ranged = graph_of("dim T in 16..4096 step 16", body)
    listed = graph_of("dim T in {48}", body)
    assert ranged.instance({"T": 48}) == listed.instances[0]


def test_a_value_outside_the_range_points_at_the_dim():
    g = program(EXAMPLE).graphs[0]
    for bad in (8, 50, 4112):
        with pytest.raises(
            NotFound, match=rf"serve_matmul.cdg:6:3: graph 'serve_matmul': T={bad} is not in 16..4096 step 16"
        ):
            g.instance({"T": bad})


def test_a_shape_rule_broken_inside_the_range_is_located_with_the_value():
    g = graph_of("dim C in 4..12 step 2", GROUPED)  # C = 6 is not a multiple of the weight's 4 channels
    assert g.instance({"C": 8}).type("y").shape == (1, 24, 6, 6)
    with pytest.raises(DslError) as e:
        g.instance({"C": 6})
    [d] = e.value.diagnostics
    assert "image has 6 channels, weight expects 4" in d.message and d.loc.line == 5
    assert ("with C = 6", None) in d.notes


@pytest.mark.parametrize(
    "dim, message",
    [
        ("dim T in 0..8", "a range runs from a first value of at least 1 up to a last one, got 0..8"),
        ("dim T in 9..8", "got 9..8"),
        ("dim T in 16..100 step 16", "16..100 step 16 never reaches 100; the last value would be 96"),
        ("dim T in 1..8 step 0", "1..8 step 0 never reaches 8"),
    ],
)
def test_bad_ranges_are_located_errors(dim, message):
    with pytest.raises(DslError, match=message) as e:
        graph_of(dim, "  input x : half[T, 8]\n  output y = relu(x)")
    assert e.value.diagnostics[0].loc.line == 2


def test_fmt_prints_a_range_canonically(tmp_path):
    f = tmp_path / "r.cdg"
    f.write_text("graph g {\n  dim T in 1 .. 64 step 1\n  input x : half[T, 8]\n  output y = relu(x)\n}\n")
    p = run_cli("fmt", "--stdout", f)
    assert p.returncode == 0 and "  dim T in 1..64\n" in p.stdout


def test_the_runtime_reads_the_range_value_off_the_inputs():
    cg = cudnn_dsl.compile(EXAMPLE)
    ins = cg.allocate_inputs({"T": 64})
    assert dict(cg.instance_for(ins).binding) == {"T": 64}
    assert tuple(cg.reference(ins)["y"].shape) == (1, 64, 1024)
    ins["x"] = ins["x"][:, :63]
    with pytest.raises(BindingError, match="T=63 is not in 16..4096 step 16"):
        cg.instance_for(ins)


def test_run_takes_values_inside_the_range_and_refuses_those_outside():
    p = run_cli("run", EXAMPLE, "--shape", "T=48", "--no-reference")
    assert p.returncode == 0, p.stderr
    assert "T=48" in p.stdout + p.stderr
    p = run_cli("run", EXAMPLE, "--shape", "T=50")
    assert p.returncode == 2 and "T=50 is not in 16..4096 step 16" in p.stderr


def test_emit_of_a_range_graph_asks_for_one_shape_without_miscounting(tmp_path):
    f = tmp_path / "r.cdg"
    f.write_text("graph g {\n  dim T in 16..64 step 16\n  input a : float[1, T, 8]\n  output y = relu(a)\n}\n")
    p = run_cli("emit", f)
    assert p.returncode == 2 and "has more than one shape (T in 16..64 step 16)" in p.stderr  # it said "2 shapes"


@pytest.mark.parametrize("dim", ["16..100 step 16", "64..16", "{0, 4}"])
def test_a_refused_dim_is_one_error_not_one_more_at_each_use(dim):
    from dsl.pipeline import load

    text = f"graph g {{\n  dim T in {dim}\n  input a : float[1, T, 8]\n  output y = relu(a)\n}}\n"
    errors = [d for d in load(text=text, file="d.cdg").diagnostics if d.severity == "error"]
    assert [e.loc.line for e in errors] == [2], [e.message for e in errors]  # was also "unknown dimension 'T'"


def test_a_range_of_one_value_is_one_shape():
    g = program(
        text="graph g {\n  dim T in 16..16\n  input a : float[1, T, 8]\n  output y = relu(a)\n}\n", file="o.cdg"
    )
    assert "graph g: 1 ops, 1 shape (" in summary(g)


# ---- strides of symbolic dims -------------------------------------------------------------------------------

SYMBOLIC_NHWC = """graph g {
  io half
  dim N in 1..64
  dim H in {28, 56}
  input x : half[N, 64, H, H] strides [64*H*H, 1, H*64, 64]
  input w : half[32, 64, 3, 3] strides [576, 1, 192, 64]
  output y = conv_fprop(x, w, padding=[1, 1])
}
"""


def test_strides_of_symbolic_dims_are_products_of_the_dims_typed_per_shape():
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target
    from dsl.pipeline import load

    r = load(text=SYMBOLIC_NHWC, file="s.cdg")
    assert r.ok and r.diagnostics == (), r.render()  # NHWC strides: no "not channels-last" warning
    g = r.program.graphs[0]
    assert g.instance({"N": 7, "H": 56}).type("x").strides == (64 * 56 * 56, 1, 56 * 64, 64)  # a range value
    assert {dict(i.binding)["H"]: i.type("x").strides for i in g.instances} == {
        28: (50176, 1, 1792, 64),
        56: (200704, 1, 3584, 64),
    }
    compile_shape(g, g.instances[0], g.options, Target.named("h200"))  # cuDNN plans them


def test_numbers_as_strides_serve_a_symbolic_outer_dim_and_strides_print_as_written(tmp_path):
    text = SYMBOLIC_NHWC.replace("64*H*H, 1, H*64, 64", "200704, 1, 3584, 64").replace("{28, 56}", "{56}")
    assert program(text=text, file="s.cdg").graphs[0].instances[-1].type("x").strides == (200704, 1, 3584, 64)
    f = tmp_path / "s.cdg"
    f.write_text(SYMBOLIC_NHWC.replace("[64*H*H,", "[64 * H*H ,"))
    assert run_cli("fmt", f).returncode == 0
    assert f.read_text() == SYMBOLIC_NHWC


@pytest.mark.parametrize(
    "strides,message",
    [
        ("64*H*K, 1, H*64, 64", "s.cdg:5:40: error: unknown dimension 'K' in strides"),
        ("64*H*H, 1, H*64, 64.5", "s.cdg:5:57: error: expected an integer, got 64.5"),
        (
            "H*H*H*H*H*H*H*H*H*H*H*H*H*H, 1, H*64, 64",
            "s.cdg:5:3: error: strides [182059119829942534144, 1, 1792, 64]: a stride past 2^63-1",
        ),
    ],
)
def test_bad_strides_of_symbolic_dims_are_located(strides, message):
    from dsl.pipeline import load

    text = SYMBOLIC_NHWC.replace("64*H*H, 1, H*64, 64", strides)
    assert message in load(text=text, file="s.cdg").render()


def test_strides_that_are_not_channels_last_are_warned_as_a_layout_is():
    from dsl.pipeline import load

    text = SYMBOLIC_NHWC.replace("64*H*H, 1, H*64, 64", "64*H*H, H*H, H, 1")
    [d] = load(text=text, file="s.cdg").diagnostics
    assert d.severity == "warning" and d.message.startswith("convolution input 'x' is not channels-last")
