"""The quirks table (cudnn_dsl/target/quirks.py): each row fires on the graphs it describes, on the cuDNN
versions it applies to; a graph a row declines is located at the op and split into parts that run right
(tests/gpu/test_quirks_gpu.py)."""

import ast
import re
from pathlib import Path

import attrs
import pytest

from cudnn_dsl.target.quirks import QUIRKS, Sighting, avoided_backward, declined
from dsl.diagnostics import DslError
from dsl.pipeline import program
from tests.graphs import DEFECTS, defect_text

ROOT = Path(__file__).resolve().parents[1]
ROWS = {q.name: q for q in QUIRKS}
SEEN = 91900  # cuDNN 9.19.0, the H200's, where every row but one was seen
NEWER = 92800  # a library no row is verified clean on


def graph(body: str):
    return program(text=defect_text(body), file="g.cdg").graphs[0]


#: the row that declines each of the graphs cuDNN 9.19 ran wrong
ROW_OF = {
    "made_then_broadcast": "pointwise_made_value_broadcast",
    "two_dims": "pointwise_two_dim_broadcast",
    "unconnected": "unconnected_computations",
}


@pytest.mark.parametrize("case", sorted(DEFECTS))
def test_a_graph_cudnn_runs_wrong_is_declined_at_the_op_naming_the_row(case):
    (body, words), row = DEFECTS[case], ROW_OF[case]
    g = graph(body)
    d = declined(g, g.instances[0], SEEN)
    assert d is not None and words in d.message and "option split = true" in d.message
    # cuDNN was not asked: the project refuses the graph, for a known defect of that version, naming the row
    assert d.message.startswith(
        f"cudnn-dsl refuses to build this graph: a known defect of cuDNN 9.19.0 runs it wrong (quirk {row})"
    )
    assert d.loc.line >= 6  # at an op of the body, not the graph


@pytest.mark.parametrize("case", sorted(DEFECTS))
def test_a_row_does_not_fire_on_a_version_verified_clean(case):
    body, row = DEFECTS[case][0], ROW_OF[case]
    g = graph(body)
    q = ROWS[row]
    assert q.declines(g, g.instances[0], SEEN) is not None
    cleaned = attrs.evolve(q, clean=(Sighting(NEWER, "a test-only row", "-"),))
    assert cleaned.declines(g, g.instances[0], NEWER) is None
    assert cleaned.declines(g, g.instances[0], SEEN) is not None


@pytest.mark.parametrize("case", sorted(DEFECTS))
def test_a_wrong_result_row_verified_clean_nowhere_applies_on_a_newer_library(case):
    body, row = DEFECTS[case][0], ROW_OF[case]
    assert ROWS[row].kind == "wrong_result" and not ROWS[row].clean
    g = graph(body)
    d = declined(g, g.instances[0], NEWER)
    assert d is not None and f"a known defect of cuDNN 9.28.0 runs it wrong (quirk {row})" in d.message


@pytest.mark.parametrize(
    "body",
    [
        "output o = sub(m0, mul(m, r))",  # one way of broadcasting, an input: ran right
        "output o = mul(m, r) + mul(m0, r)",  # two chains joined by the add
        "output o = relu(m * r)\n  output p = sigmoid(m0 * r)",  # pointwise chains sharing an input (as rope)
    ],
)
def test_graphs_that_ran_right_are_left_to_cudnn(body):
    g = graph(body)
    assert declined(g, g.instances[0], SEEN) is None


def test_the_in_place_rope_example_stays_one_graph():
    g = program("examples/rope_in_place.cdg").graphs[0]
    assert declined(g, g.instances[0], SEEN) is None


def test_a_non_pointwise_graph_beside_an_unconnected_op_is_declined():
    text = """graph g {
  io half
  compute float
  input dy : half[4, 64, 8, 8] nhwc
  input x : half[4, 64, 8, 8] nhwc
  input h : half[4, 64, 8, 8] nhwc
  input d : half[4, 64, 8, 8] nhwc
  output dw : half[64, 64, 3, 3] nhwc = conv_wgrad(x, dy, padding=[1, 1], filter=[3, 3])
  output dr = relu_backward(d, h)
}
"""
    g = program(text=text, file="g.cdg").graphs[0]
    d = declined(g, g.instances[0], SEEN)
    assert d is not None and "relu_backward (line 9) shares no value" in d.message


def test_a_per_channel_broadcast_at_rank_4_is_left_to_cudnn():
    """[1, C, 1, 1] over NHWC [N, C, H, W]: a conv's epilogue run alone ran right on the H200 (tune checks it)."""
    text = (
        "graph g {\n  io half\n  compute float\n  input x : half[4, 64, 8, 8] nhwc\n"
        "  input s : half[1, 64, 1, 1] nhwc\n  output o = relu(bias(x, s))\n}\n"
    )
    g = program(text=text, file="g.cdg").graphs[0]
    assert declined(g, g.instances[0], SEEN) is None


def test_attention_gradients_written_as_float_are_declined():
    from tests.graphs import graph_text
    from tests.test_backward_ops import PLANNED

    g = program(text=graph_text(PLANNED["sdpa_causal"], "half"), file="a.cdg").graphs[0]
    inst = g.instances[0]
    assert declined(g, inst, SEEN) is None  # the checker types dq, dk and dv like q, k and v
    # a float dq is what the row guards against, whatever gives it that dtype
    as_float = attrs.evolve(
        inst, types=tuple((n, attrs.evolve(t, dtype="float") if n == "dq" else t) for n, t in inst.types)
    )
    d = declined(g, as_float, SEEN)
    assert d is not None and "sdpa_backward writes 'dq' as float, 'q' being half" in d.message
    assert "quirk sdpa_backward_float_gradients" in d.message and d.loc.line == 10
    assert declined(g, as_float, NEWER) is not None


def test_deviceless_planning_splits_a_declined_graph_into_parts_that_run_right(h200, here):
    """Planning for the H200 with the library here: the graph is split where the row says, and the report names
    the row and this library's version."""
    from cudnn_dsl.run.partition import plan_for_target
    from cudnn_dsl.target.quirks import version_text

    g = graph(DEFECTS["made_then_broadcast"][0])
    low, partition = plan_for_target(g, g.instances[0], g.options, h200)
    assert low is None and "runs it wrong" in partition.declined
    assert f"a known defect of cuDNN {version_text(here)} runs it wrong (quirk pointwise_made_value_broadcast)" in (
        partition.declined
    )
    assert partition.reason.startswith("it is not built whole (cudnn-dsl refuses to build this graph")
    assert [(p.first, p.end) for p in partition.parts] == [(0, 1), (1, 3)]
    for p in partition.parts:
        assert p.graph is None or declined(p.graph, p.graph.instances[0], here) is None


# ---- rows a derived backward consults: which backward op it emits ------------------------------------------

NORM = "graph t {{\n  io half\n  compute float\n{}}}\n"


def _norm_backward(op: str, x: str, scale: str, stats: str, given: str = "m, iv", outs: str = "dx, dg, db") -> str:
    """A graph of one norm backward op over x, scale and statistics of these shapes."""
    body = (
        f"  input dy : half{x}\n  input x : half{x}\n  input g : float{scale}\n"
        + "".join(f"  input {n} : float{stats}\n" for n in given.split(", "))
        + f"  {outs} = {op}(dy, x, g, {given})\n"
        + "".join(f"  output {n}{'' if n == 'dx' else ' : float'}\n" for n in outs.split(", "))
    )
    return NORM.format(body)


#: per 'derive' row, forms of the backward op the row avoids: (the graph, the normalized axes)
FORMS = {
    "layer_norm_backward_forms": [
        (_norm_backward("layernorm_backward", "[4, 128, 512]", "[1, 1, 512]", "[4, 128, 1]"), (2,)),
        (_norm_backward("rmsnorm_backward", "[4, 128, 512]", "[1, 1, 512]", "[4, 128, 1]", "iv", "dx, dg"), (2,)),
        (_norm_backward("layernorm_backward", "[4, 3, 2, 2]", "[1, 1, 1, 2]", "[4, 3, 2, 1]"), (3,)),
    ],
    "channel_norm_backward_rank": [
        (_norm_backward("batchnorm_backward", "[4, 8, 16]", "[1, 8, 1]", "[1, 8, 1]"), (0, 2)),
    ],
    "adalayernorm_backward": [
        (_norm_backward("adalayernorm_backward", "[4, 16, 64]", "[4, 1, 64]", "[4, 16, 1]"), (2,)),
    ],
}
#: the forms the rows leave to the frontend's backward op (they ran right on the H200 with cuDNN 9.19.0)
KEPT = [
    (_norm_backward("layernorm_backward", "[16, 8, 2, 2]", "[1, 8, 2, 2]", "[16, 1, 1, 1]"), (1, 2, 3)),
    (_norm_backward("rmsnorm_backward", "[512, 256, 1, 1]", "[1, 256, 1, 1]", "[512, 1, 1, 1]", "iv", "dx, dg"), (1,)),
    (_norm_backward("batchnorm_backward", "[8, 32, 16, 16]", "[1, 32, 1, 1]", "[1, 32, 1, 1]"), (0, 2, 3)),
    (_norm_backward("instancenorm_backward", "[8, 32, 16, 16]", "[1, 32, 1, 1]", "[8, 32, 1, 1]"), (2, 3)),
]


def _form(text: str, axes):
    g = program(text=text, file="t.cdg").graphs[0]
    n, inst = g.nodes[0], g.instances[0]
    return g, (n.op, inst.type(n.inputs[1]), inst.type(n.inputs[2]), axes)


def test_every_derive_row_has_forms():
    assert set(FORMS) == {q.name for q in QUIRKS if q.stage == "derive"}


@pytest.mark.parametrize("row", sorted(FORMS))
def test_a_derive_row_avoids_its_forms_where_it_applies(row):
    q = ROWS[row]
    assert q.kind == "refusal"
    for text, axes in FORMS[row]:
        _, form = _form(text, axes)
        why = avoided_backward(SEEN, *form)
        assert (
            why == f"not {form[0]}: cuDNN has no engine for it here (quirk {row}, not verified clean on cuDNN 9.19.0)"
        )
        for c in q.clean:
            assert avoided_backward(c.version, *form) is None
        if not q.clean:
            assert avoided_backward(NEWER, *form) is not None


@pytest.mark.parametrize("text, axes", KEPT)
def test_the_forms_cudnn_ran_are_left_to_the_frontends_backward_op(text, axes):
    _, form = _form(text, axes)
    assert avoided_backward(SEEN, *form) is None


@pytest.mark.parametrize("row", sorted(FORMS))
def test_the_library_here_answers_as_the_table_says(row, h200, here):
    """What deviceless planning for the H200 with the library here says of the forms a 'derive' row avoids: for
    a version the row was seen on, cuDNN refuses them; for one it is verified clean on, cuDNN plans them."""
    from cudnn_dsl.build.pipeline import compile_shape

    q = ROWS[row]
    this = f"tests/test_quirks.py::test_the_library_here_answers_as_the_table_says[{row}]"
    refused = {s.version for s in q.seen if s.test == this}
    planned = {c.version for c in q.clean if c.test == this}
    if here not in refused | planned:
        pytest.skip(f"the table records no answer of cuDNN {here} for {row}")
    for text, axes in FORMS[row]:
        g, _ = _form(text, axes)
        if here in planned:
            assert compile_shape(g, g.instances[0], g.options, h200).plan_count >= 1
        else:
            with pytest.raises(DslError, match="create_execution_plans failed"):
                compile_shape(g, g.instances[0], g.options, h200)


# ---- the table itself ------------------------------------------------------------------------------------


def test_every_sighting_names_a_test_that_exists():
    for q in QUIRKS:
        for s in q.seen + q.clean:
            m = re.fullmatch(r"(tests/[\w/]+\.py)::(\w+)(\[[\w-]+\])?", s.test)
            assert m, (q.name, s.test)
            assert f"def {m.group(2)}(" in (ROOT / m.group(1)).read_text(), (q.name, s.test)


def test_a_row_is_verified_clean_only_where_it_was_not_seen():
    for q in QUIRKS:
        assert not {s.version for s in q.seen} & {c.version for c in q.clean}, q.name


#: where a module may compare against a cuDNN version: the table, and override-shape mode's first version (a
#: capability the library gained, not a workaround)
VERSIONS_AT = {"cudnn_dsl/target/quirks.py", "cudnn_dsl/build/override.py"}


def test_no_module_but_the_table_holds_a_cudnn_version():
    found = []
    for path in sorted((ROOT / "dsl").rglob("*.py")) + sorted((ROOT / "cudnn_dsl").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and type(node.value) is int and 90000 <= node.value < 100000:
                found.append(rel)
    assert set(found) <= VERSIONS_AT, sorted(set(found) - VERSIONS_AT)


# ---- unit dims in front of low ranks: cuDNN's rule, not a row ------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        "  input x : half[64, 256]\n  output y = relu(x)",
        "  input a : half[64, 256]\n  input b : half[256, 32]\n  output y = matmul(a, b)",
    ],
    ids=["relu", "matmul"],
)
def test_cudnn_plans_no_rank_2_tensor(body, h200, monkeypatch):
    """build/lower.py gives every tensor at least MIN_RANK dims; lowered at rank 2, cuDNN finds no engine."""
    from cudnn_dsl.build import lower
    from cudnn_dsl.build.pipeline import compile_shape

    g = program(text=NORM.format(body + "\n"), file="t.cdg").graphs[0]
    assert compile_shape(g, g.instances[0], g.options, h200).plan_count >= 1
    monkeypatch.setattr(lower, "MIN_RANK", 2)
    with pytest.raises(DslError, match="create_execution_plans failed"):
        compile_shape(g, g.instances[0], g.options, h200)


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target, load_cudnn

    load_cudnn()
    return Target.named("h200")


@pytest.fixture(scope="module")
def here() -> int:
    from cudnn_dsl.target.library import load_cudnn

    return load_cudnn().backend_version()


# ---- what the commands say of a graph a row declines, and what emit writes for it ---------------------------


def test_the_commands_say_the_project_refuses_a_graph_a_row_declines_and_emit_writes_its_json(tmp_path):
    """cuDNN was not asked, so no report says it declines; emit --format fe-json writes the JSON (what a bug
    report about the defect needs) and exits 1, as its help says, and import reads it back."""
    from tests.cli_util import run_cli

    f = tmp_path / "u.cdg"
    f.write_text(defect_text(DEFECTS["unconnected"][0]))
    for command in (("check", "--target", "h200"), ("support", "--target", "h200"), ("emit",), ("run",)):
        p = run_cli(*command, f)
        said = p.stdout + p.stderr
        assert "is not built whole (cudnn-dsl refuses to build this graph" in said, (command, said)
        assert not re.search(r"cuDNN[^.(]*declines", said), (command, said)
    p = run_cli("emit", f, "--format", "fe-json")
    assert p.returncode == 1 and p.stdout.startswith("{") and '"json_version": "2.0"' in p.stdout
    assert "error: cudnn-dsl refuses to build this graph" in p.stderr and "quirk unconnected_computations" in p.stderr
    assert "taken before planning, as cudnn-dsl refuses to plan it" in p.stderr
    fe = tmp_path / "u.json"
    fe.write_text(p.stdout)
    p = run_cli("import", fe)
    assert p.returncode == 0 and "relu(" in p.stdout, p.stderr


def test_a_graph_of_more_independent_ops_than_cudnn_builds_in_time_is_declined_and_parts_are_bounded():
    """quirk many_independent_ops: ops that read no value made in the graph (roots) number at most MAX_ROOTS a
    graph; part_end says where a part from a node must end, and a version verified clean lets any part through."""
    from cudnn_dsl.target import quirks

    def outputs(n: int):
        text = "graph g {\n  input a : float[8, 64]\n  input b : float[8, 64]\n  t = a * b\n"
        text += "".join(f"  output o{i} = a * b\n" for i in range(n - 1)) + "  output u = t + a\n}\n"
        return program(text=text, file="g.cdg").graphs[0]

    row, n = ROWS["many_independent_ops"], quirks.MAX_ROOTS
    assert row.kind == "slow_build" and declined(outputs(n), outputs(n).instances[0], SEEN) is None
    g = outputs(n + 1)  # t and n outputs of a * b, then u (reads t): n + 1 roots
    d = declined(g, g.instances[0], NEWER)
    assert d is not None and "takes time exponential in its size to build it (quirk many_independent_ops)" in d.message
    assert d.loc.line == 4 + n and "build in time" in d.message
    assert list(quirks.roots(g)) == list(range(n + 1))  # the last node, u, reads t
    assert quirks.part_end(g, 0, NEWER) == n
    assert quirks.part_end(g, 1, NEWER) == n + 1  # from node 1 on, u reads t as an input: a root too
    assert quirks.part_end(g, 2, NEWER) == len(g.nodes)
    clean = attrs.evolve(row, clean=(Sighting(NEWER, "a test-only row", "-"),))
    assert clean.declines(g, g.instances[0], NEWER) is None and row.declines(g, g.instances[0], SEEN) is not None
