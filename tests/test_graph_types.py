"""Graph-level `intermediate` and `compute` left unset: what the checker asks for, the lowering (planned for an H200
without a device), the emitters, the reference on the CPU, and the round trip of a frontend graph that never sets
them."""

import json

import pytest
import torch
from cli_util import run_cli

from cudnn_dsl.interop.fe_import import to_cdg, verify
from dsl.diagnostics import DslError
from dsl.pipeline import load, program
from dsl.syntax.parser import parse
from dsl.syntax.printer import fmt_module
from tests.helpers import reference

UNSET = """graph mm {
  io half
  intermediate unset
  compute unset

  input a : half[2, 16, 32]
  input b : half[2, 32, 8]
  input bias : half[1, 1, 8]

  y : float = matmul(a, b, compute=float)
  z : float = add(y, bias, compute=float)
  output c = relu(z, compute=float)
}
"""


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target, load_cudnn

    load_cudnn()
    return Target.named("h200")


def _errors(text: str) -> list[tuple[int, int, str, list]]:
    res = load(text=text, file="t.cdg")
    return [
        (d.loc.line, d.loc.col, d.message, [(n, loc.line if loc else None) for n, loc in d.notes])
        for d in res.diagnostics
        if d.severity == "error"
    ]


def test_a_file_without_the_lines_means_float_and_unset_is_none():
    plain = program(text=UNSET.replace("  intermediate unset\n  compute unset\n", ""), file="t.cdg").graphs[0]
    assert (plain.intermediate, plain.compute) == ("float", "float")
    g = program(text=UNSET, file="t.cdg").graphs[0]
    assert (g.io, g.intermediate, g.compute) == ("half", None, None)
    assert [n.compute for n in g.nodes] == ["float"] * 3
    assert [g.instances[0].type(v).dtype for v in ("y", "z", "c")] == ["float", "float", "half"]
    assert fmt_module(parse(UNSET, "t.cdg")) == UNSET  # canonical as written


def test_each_value_and_op_lacking_a_type_is_a_located_error_naming_what_to_add():
    text = UNSET.replace("y : float = matmul(a, b, compute=float)", "y = matmul(a, b, compute=float)")
    text = text.replace("z : float = add(y, bias, compute=float)", "z : float = y + bias")
    text = text.replace("}\n", "  output d = relu(exp(a, compute=float), compute=float)\n}\n")
    assert _errors(text) == [
        (
            11,
            15,
            "add has no compute type: the graph's is unset; give it one ('add(..., compute=float)')",
            [("the graph's compute type is unset here", 4)],
        ),
        (
            10,
            7,
            "'y' has no dtype: the graph's intermediate type is unset; declare it ('y : DTYPE = ...')",
            [("the graph's intermediate type is unset here", 3)],
        ),
        (
            13,
            19,
            "the result of exp has no dtype: the graph's intermediate type is unset; name it and declare its dtype "
            "('NAME : DTYPE = exp(...)')",
            [("the graph's intermediate type is unset here", 3)],
        ),
    ]


def test_what_the_op_or_a_layout_op_gives_needs_no_declaration():
    """The layout ops keep their input's dtype, a comparison gives bool, the logic ops compute in bool: none of
    them needs the graph's types."""
    text = UNSET.replace(
        "  output c = relu(z, compute=float)\n",
        "  t = transpose(z, perm=[0, 2, 1], compute=float)\n"
        "  m = cmp_gt(t, 0, compute=float)\n"
        "  output c = logical_not(m)\n",
    )
    g = program(text=text, file="t.cdg").graphs[0]
    inst = g.instances[0]
    assert [inst.type(v).dtype for v in ("t", "m", "c")] == ["float", "bool", "bool"]
    assert g.nodes[-1].compute == "bool"


def test_several_results_without_a_dtype_say_how_they_can_get_one():
    text = """graph ln {
  intermediate unset
  compute float
  input x : float[4, 64, 1, 1]
  input s : float[1, 64, 1, 1]
  input b : float[1, 64, 1, 1]
  y, mean, inv = layernorm(x, s, b, epsilon=0.001, phase=training)
  output o = relu(y)
  output mean
  output inv
}
"""
    [(line, _, message, _)] = _errors(text)
    assert line == 7
    assert message == (
        "'y' has no dtype: the graph's intermediate type is unset; make it an output ('output y : DTYPE'), or give "
        "the graph an intermediate type"
    )


def test_io_is_unset_by_leaving_it_out():
    [(line, col, message, _)] = _errors(UNSET.replace("io half", "io unset"))
    assert (line, col) == (2, 3)
    assert message == "'io' is unset where no line gives it: leave out 'io unset'"


def test_no_derived_backward_while_unset():
    from cudnn_dsl.cli.common import derive

    g = program(text=UNSET, file="t.cdg").graphs[0]
    with pytest.raises(DslError) as e:
        derive(g, g.instances[0])
    [d] = e.value.diagnostics
    assert (d.loc.line, d.message) == (
        1,
        "graph 'mm' has no derived backward while its intermediate and compute types are unset; give them "
        "('intermediate float', 'compute float')",
    )


def _write(tmp_path, text: str):
    path = tmp_path / "t.cdg"
    path.write_text(text)
    return path


def test_the_lowering_sets_no_graph_type_and_cudnn_plans_it_for_an_h200(h200, tmp_path):
    """The frontend graph is told NOT_SET (the pygraph would fill an omitted type from io_data_type): its own JSON
    says null, and every tensor and node carries its own type."""
    from cudnn_dsl.interop.fe_export import frontend_json

    p = run_cli("check", "--target", "h200", _write(tmp_path, UNSET))
    assert p.returncode == 0, p.stderr
    assert "plans for NVIDIA H200" in p.stdout
    g = program(text=UNSET, file="t.cdg").graphs[0]
    j = json.loads(frontend_json(g, g.instances[0], h200))
    ctx = j["context"]
    assert (ctx["io_data_type"], ctx["intermediate_data_type"], ctx["compute_data_type"]) == ("HALF", None, None)
    assert [n["compute_data_type"] for n in j["nodes"]] == ["FLOAT"] * 3
    assert {t["name"]: t["data_type"] for t in j["tensors"] if t["is_virtual"]} == {"y": "FLOAT", "z": "FLOAT"}


def test_the_emitted_script_and_cpp_follow_the_lowering(tmp_path):
    from cudnn_dsl.interop.emit import emit_cudnn

    g = program(text=UNSET, file="t.cdg").graphs[0]
    script = emit_cudnn(g, g.instances[0])
    assert (
        "cudnn.pygraph(name='mm', intermediate_data_type=cudnn.data_type.NOT_SET, "
        "compute_data_type=cudnn.data_type.NOT_SET, io_data_type=cudnn.data_type.HALF" in script
    )
    p = run_cli("emit", _write(tmp_path, UNSET), "--format", "cpp", "-o", tmp_path / "cpp")
    assert p.returncode == 0, p.stderr
    cpp = (tmp_path / "cpp" / "graphs.cpp").read_text()
    assert "g.set_io_data_type(fe::DataType_t::HALF);" in cpp
    assert "intermediate_data_type" not in cpp and "g.set_compute_data_type" not in cpp  # a C++ graph's start unset
    assert cpp.count("set_compute_data_type(fe::DataType_t::FLOAT)") == 3  # each op's own


def test_the_reference_needs_no_graph_types():
    ins, out = reference(UNSET, seed=3)
    want = torch.relu((ins["a"].float() @ ins["b"].float()) + ins["bias"].float()).half()
    assert out["c"].dtype == torch.float16
    torch.testing.assert_close(out["c"], want, atol=1e-2, rtol=1e-2)


def _frontend_graph(h200) -> str:
    """A graph built with the frontend itself that sets no intermediate or compute type (NOT_SET, the C++ graph's
    default), each tensor and node its own, planned for an H200 without a device: the frontend's JSON of it.
    Names are the language's and uids given, so that the export can give the same JSON."""
    from cudnn_dsl.target.library import device_properties, load_cudnn

    cudnn = load_cudnn()
    dt = cudnn.data_type
    g = cudnn.pygraph(
        name="fe",
        io_data_type=dt.HALF,
        intermediate_data_type=dt.NOT_SET,
        compute_data_type=dt.NOT_SET,
        device_property=device_properties(h200),
        sm_version=h200.sm_version,
    )
    a = g.tensor(name="a", dim=[2, 16, 32], stride=[512, 32, 1], data_type=dt.HALF, uid=1)
    b = g.tensor(name="b", dim=[2, 32, 8], stride=[256, 8, 1], data_type=dt.HALF, uid=2)
    bias = g.tensor(name="bias", dim=[1, 1, 8], stride=[8, 8, 1], data_type=dt.HALF, uid=3)
    y = g.matmul(a, b, name="y", compute_data_type=dt.FLOAT)
    y.set_name("y").set_uid(4).set_data_type(dt.BFLOAT16)
    c = g.add(y, bias, name="c", compute_data_type=dt.FLOAT)
    c.set_name("c").set_uid(5).set_data_type(dt.HALF).set_output(True)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return repr(g)


def test_a_frontend_graph_without_graph_types_round_trips(h200):
    from cudnn_dsl.interop.fe_export import frontend_json

    fe = _frontend_graph(h200)
    original = json.loads(fe)
    assert (original["context"]["intermediate_data_type"], original["context"]["compute_data_type"]) == (None, None)
    cdg, imported = to_cdg(fe, "fe.json", name="fe")
    assert "  intermediate unset\n  compute unset\n" in cdg
    assert "  y : bf16 = matmul(a, b, compute=float)\n" in cdg
    assert "= add(y, bias, compute=float)\n" in cdg
    back = program(text=cdg, file="fe.cdg")
    verify(back, imported)
    g = back.graphs[0]
    assert (g.intermediate, g.compute) == (None, None)
    again = json.loads(frontend_json(g, g.instances[0], h200))
    for j in (original, again):
        j.pop("gid")  # the frontend numbers the graphs of a process
    assert again == original


def test_a_node_without_its_compute_type_in_an_unset_graph_is_refused_at_it(h200):
    j = json.loads(_frontend_graph(h200))
    j["nodes"][1]["compute_data_type"] = None
    with pytest.raises(DslError) as e:
        to_cdg(json.dumps(j, indent=1), "fe.json", name="fe")
    [d] = e.value.diagnostics
    assert "has no compute_data_type, and the graph's is unset" in d.message
    assert d.loc.file == "fe.json"


def test_a_context_type_the_language_lacks_is_refused_at_it(h200):
    j = json.loads(_frontend_graph(h200))
    j["context"]["compute_data_type"] = "FP4_E2M1"
    with pytest.raises(DslError) as e:
        to_cdg(json.dumps(j, indent=1), "fe.json", name="fe")
    [d] = e.value.diagnostics
    assert d.message == 'context compute_data_type "FP4_E2M1": the language has no such dtype'


ATTENTION = """graph s {
  io bf16
  intermediate unset
  compute unset

  input q : bf16[2, 4, 128, 64]
  input k : bf16[2, 4, 128, 64]
  input v : bf16[2, 4, 128, 64]

  output o = sdpa(q, k, v, causal=true, compute=float)
}
"""


def test_attention_needs_the_graph_intermediate_type_where_cudnn_plans_it_with_one(h200):
    """The frontend makes attention's inner tensors in the graph's intermediate type and refuses the op without one
    ("Intermediate tensor data type needs to be set"): an error at the op; with the type given (compute still
    unset), cuDNN plans it for an H200."""
    from cudnn_dsl.build.pipeline import compile_shape

    assert _errors(ATTENTION) == [
        (
            10,
            14,
            "sdpa needs the graph's intermediate type: cuDNN makes the tensors inside it in that type; give the graph "
            "one ('intermediate float')",
            [("the graph's intermediate type is unset here", 3)],
        )
    ]
    g = program(text=ATTENTION.replace("intermediate unset", "intermediate float"), file="t.cdg").graphs[0]
    assert g.compute is None
    assert compile_shape(g, g.instances[0], g.options, h200).plan_count >= 1
