"""Pass-by-value scalars with declared dims (`scalar s : float[1] = 0.125`, as the C++ frontend's
`graph.tensor(x)` makes them): the language's rules, the dims cuDNN gets, the FE-JSON round trip keeping them,
the reference and the derived graphs unchanged by them, and deviceless planning for an H200.

The checks take a device: tests/gpu/test_scalar_dims_gpu.py runs them on the GPU."""

import json

import pytest
import torch

from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import run_reference
from dsl.diagnostics import DslError
from dsl.pipeline import program
from dsl.syntax.parser import parse
from dsl.syntax.printer import fmt_module
from tests.cli_util import run_cli


def sdpa_text(dims: str = "[1]") -> str:
    """Attention whose scale is a host scalar of `dims` (none: ones at the rank it meets)."""
    return (
        "graph s {\n  input q : bf16[2, 4, 64, 64]\n  input k : bf16[2, 4, 64, 64]\n  input v : bf16[2, 4, 64, 64]\n"
        f"  scalar sc : float{dims} = 0.125 uid=9\n  output o = sdpa(q, k, v, attn_scale=sc)\n}}\n"
    )


def test_declared_dims_are_held_and_printed():
    g = program(text=sdpa_text()).graphs[0]
    assert g.value("sc").dims == (1,)
    assert program(text=sdpa_text("")).graphs[0].value("sc").dims is None
    assert "scalar sc : float[1] = 0.125 uid=9" in fmt_module(parse(sdpa_text(), "s.cdg"))


def test_a_scalar_of_more_than_one_element_is_a_located_error():
    text = sdpa_text("[1, 2]")
    with pytest.raises(DslError, match=r"scalar 'sc' holds one value: its dims are all 1, not 2") as e:
        program(text=text, file="s.cdg")
    [err] = [d for d in e.value.diagnostics if d.severity == "error"]
    line = text.splitlines()[4]
    assert (err.loc.line, err.loc.col) == (5, line.index("2]") + 1)


def test_symbolic_dims_are_refused():
    with pytest.raises(DslError, match="its dims are all 1, not N"):
        program(text=sdpa_text("[N]"), file="s.cdg")


# ---- cuDNN's tensor and the round trip ------------------------------------------------------------------


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target

    return Target.named("h200")


def frontend_tensors(text: str, target) -> dict:
    """The frontend's JSON of the graph's first shape: its tensors by uid."""
    from cudnn_dsl.interop.fe_export import frontend_json

    g = program(text=text).graphs[0]
    j = json.loads(frontend_json(g, g.instances[0], target))
    tensors = j["tensors"]
    return {t["uid"]: t for t in (tensors.values() if isinstance(tensors, dict) else tensors)}


@pytest.mark.parametrize("dims,want", [("[1]", [1]), ("[1, 1]", [1, 1]), ("", [1, 1, 1, 1])])
def test_cudnn_gets_the_declared_dims(dims, want, h200):
    t = frontend_tensors(sdpa_text(dims), h200)[9]
    assert t["is_pass_by_value"] and (t["dim"], t["stride"]) == (want, [1] * len(want))


def test_the_frontend_json_round_trip_keeps_the_dims(tmp_path, h200):
    """Exported, imported and exported again: the scalar's tensor is the same (dims, strides, uid, value)."""
    from cudnn_dsl.interop.fe_export import frontend_json

    g = program(text=sdpa_text()).graphs[0]
    src = tmp_path / "s.json"
    src.write_text(frontend_json(g, g.instances[0], h200))
    p = run_cli("import", src)
    assert p.returncode == 0, p.stderr
    assert "scalar sc : float[1] = 0.125 uid=9" in p.stdout
    before, after = frontend_tensors(sdpa_text(), h200)[9], frontend_tensors(p.stdout, h200)[9]
    assert after == before


def test_an_import_whose_scalar_dims_differ_from_the_file_is_reported():
    from cudnn_dsl.interop.fe_import import to_cdg, verify

    text, imported = to_cdg(json.dumps(_json_with_scalar([1])), "s.json")
    assert "scalar sc : float[1] = 0.125 uid=9" in text
    [t] = [t for t in imported[0].tensors if t.name == "sc"]
    t.json["dim"] = [1, 1]
    with pytest.raises(DslError) as e:
        verify(program(text=text, file="s.cdg"), imported)
    [d] = e.value.diagnostics
    assert d.message == "tensor 'sc': dim [1, 1] contradicts its graph: the imported graph has [1]"
    assert d.loc.file == "s.json"


def _json_with_scalar(dims: list[int]) -> dict:
    """A frontend JSON of one multiplication by a pass-by-value scalar of `dims`."""
    x = {"uid": 1, "name": "x", "data_type": "FLOAT", "dim": [1, 4, 8], "stride": [32, 8, 1], "is_virtual": False}
    sc = {"uid": 9, "name": "sc", "data_type": "FLOAT", "dim": dims, "stride": [1] * len(dims)}
    sc |= {"is_pass_by_value": True, "pass_by_value": {"index": 3, "value": "3E000000"}, "is_virtual": False}
    y = {"uid": 2, "name": "y", "data_type": "FLOAT", "dim": [1, 4, 8], "stride": [32, 8, 1], "is_virtual": False}
    node = {"tag": "POINTWISE", "name": "mul", "mode": "MUL", "inputs": {"IN_0": 1, "IN_1": 9}, "outputs": {"OUT_0": 2}}
    return {"json_version": "2.0", "context": {}, "tensors": [x, sc, y], "nodes": [node]}


# ---- the reference and the derived graphs ---------------------------------------------------------------


def check_scale(device: str) -> None:
    """The scale of a [1] scalar, set per call, is the scale of the undeclared one."""
    from tests.test_sdpa_sink import run_on

    g = program(text=sdpa_text()).graphs[0]
    ins = generate_inputs(g, g.instances[0], device, seed=4)
    for value in (0.125, 0.3):
        got = run_on(device, sdpa_text(), {**ins, "sc": value})["o"]
        ref = program(text=sdpa_text("")).graphs[0]
        want = run_reference(ref, ref.instances[0], {**{k: v.cpu() for k, v in ins.items()}, "sc": value}, "cpu")["o"]
        q, k, v = (ins[n].cpu().float() for n in ("q", "k", "v"))
        by_hand = torch.softmax(q @ k.transpose(-1, -2) * value, -1) @ v
        torch.testing.assert_close(want.float(), by_hand, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)


def test_the_scale_of_a_declared_scalar_is_the_scale():
    check_scale("cpu")


def test_the_derived_graphs_keep_the_dims():
    from dsl.autodiff import derive

    text = (
        "graph m {\n  input a : float[2, 8, 16]\n  input b : float[2, 16, 4]\n  scalar s : float[1, 1, 1] = 0.5\n"
        "  output y = matmul(a, b) * s\n}\n"
    )
    d = derive(program(text=text).graphs[0], avoid=lambda *a: None)
    assert d.forward.value("s").dims == (1, 1, 1)
    assert d.backward.value("s").dims == (1, 1, 1)


def test_h200_plans_attention_with_a_scale_of_one_dim(h200):
    from cudnn_dsl.build.pipeline import compile_shape

    g = program(text=sdpa_text()).graphs[0]
    assert compile_shape(g, g.instances[0], g.options, h200).plan_count >= 1


# ---- a one-element input tensor in a pointwise op, as FE's C++ samples write a scale --------------------------

RANK_ONE = (
    "graph g {\n  io half\n  compute float\n  input x : half[8, 64, 16, 16] nhwc\n  input s : half[1]\n"
    "  output y = x * s\n  output z = relu(x) + s\n}\n"
)


def test_a_rank_one_input_in_a_pointwise_op_reaches_cudnn_at_the_ops_rank(h200):
    """`input s : half[1]` read by `x * s`, x of rank 4: the checker broadcasts it; the lowering declares it
    [1, 1, 1, 1] (cuDNN wants a pointwise op's operands at one rank); its memory is its one element."""
    from cudnn_dsl.build.lower import lifted_ranks
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.interop.emit import emit_cudnn

    g = program(text=RANK_ONE, file="r.cdg").graphs[0]
    inst = g.instances[0]
    assert inst.type("y").shape == (8, 64, 16, 16) and inst.type("s").shape == (1,)
    assert lifted_ranks(g, inst) == {"s": 4}
    assert "s = g.tensor(name='s', dim=[1, 1, 1, 1], stride=[1, 1, 1, 1]" in emit_cudnn(g, inst)
    assert compile_shape(g, inst, g.options, h200).plan_count >= 1  # one graph, planned for the H200
    ins = generate_inputs(g, inst, "cpu", 3)
    out = run_reference(g, inst, ins)
    x, s = ins["x"].float(), ins["s"].float()
    torch.testing.assert_close(out["y"].float(), (x * s).half().float())
    torch.testing.assert_close(out["z"].float(), (torch.relu(x) + s).half().float())


def test_an_input_of_more_elements_at_another_rank_is_still_a_located_error():
    text = RANK_ONE.replace("half[1]", "half[64]")
    with pytest.raises(DslError, match=r"mul: inputs have ranks 4 and 1 \(\[8, 64, 16, 16\] and \[64\]\)") as e:
        program(text=text, file="r.cdg")
    assert (e.value.diagnostics[0].loc.line, e.value.diagnostics[0].loc.col) == (6, 18)


def test_the_gradient_of_a_rank_one_input_is_the_total_reshaped_to_it():
    from dsl.autodiff import derive
    from tests.test_autodiff import ON_H200

    g = program(text=RANK_ONE.replace("  output z = relu(x) + s\n", ""), file="r.cdg").graphs[0]
    d = derive(g, avoid=ON_H200)
    lines = {line.strip() for line in d.backward_text.splitlines()}
    assert "reduction = reduction(mul_0, mode=sum, axes=[0, 1, 2, 3])" in lines
    assert "output grad_s : float[1] strides [1] = reshape(reduction, shape=[1])" in lines
