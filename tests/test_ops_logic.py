"""Comparisons, logic, selects and the other pointwise ops: their checker rules, their
reference against torch written out by hand, and what the lowering sends to cuDNN (no GPU needed)."""

import pytest
import torch

from cudnn_dsl.interop.emit import emit_cudnn
from cudnn_dsl.run.compare import compare
from cudnn_dsl.target.bits import unpack_bits
from dsl.pipeline import load, program
from tests.helpers import reference


def graph(body: str, io: str = "") -> str:
    return "graph t {\n" + (f"  io {io}\n" if io else "") + body + "\n}\n"


def types(text: str) -> dict:
    g = program(text=text, file="t.cdg").graphs[0]
    return {v.name: g.instances[0].type(v.name) for v in g.values}


def errors(text: str) -> list:
    return [(d.loc.line, d.loc.col, d.message) for d in load(None, text=text, file="t.cdg").errors]


# ---- types ---------------------------------------------------------------------------------


def test_a_comparison_gives_bool_unless_the_output_declares_another_dtype():
    t = types(
        graph(
            "  input x : half[4, 8]\n  input y : half[4, 8]\n  m = cmp_gt(x, y)\n  output b = logical_not(m)\n"
            "  output f : float = cmp_le(x, y)",
            io="half",
        )
    )
    assert t["m"].dtype == "bool"  # an intermediate
    assert t["b"].dtype == "bool"  # an output: bool wins over the graph's io dtype
    assert t["f"].dtype == "float"  # declared


def test_a_comparison_mixes_integers_and_floats():
    t = types(graph("  input x : half[2, 8]\n  output m = cmp_lt(gen_index(x, axis=1), 4)"))
    assert t["m"].dtype == "bool"


def test_gen_index_gives_int32_and_concatenate_keeps_the_dtype():
    t = types(
        graph(
            "  input x : half[2, 3, 4]\n  input y : half[2, 5, 4]\n  output i = gen_index(x, axis=1)\n"
            "  output c = concatenate(x, y, x, axis=1)"
        )
    )
    assert (t["i"].dtype, t["i"].shape) == ("int32", (2, 3, 4))
    assert (t["c"].dtype, t["c"].shape) == ("half", (2, 11, 4))


def test_logic_ops_compute_in_bool_and_a_bool_mask_multiplies_a_float():
    g = program(
        text=graph(
            "  input x : half[4, 8]\n  input m : bool[4, 8]\n  output y = logical_and(cmp_gt(x, 0), m)\n"
            "  output z : half = x * m"
        ),
        file="t.cdg",
    ).graphs[0]
    assert [n.compute for n in g.nodes] == ["float", "bool", "float"]


@pytest.mark.parametrize(
    "body,where,words",
    [
        (
            "  input x : half[4]\n  output y = logical_and(x, x)",
            (3, 26),
            "logical_and: input 1 is half; it must be bool",
        ),
        (
            "  input x : half[4]\n  input m : int32[4]\n  output y = binary_select(x, x, m)",
            (4, 34),
            "binary_select: input 3 is int32; it must be bool",
        ),
        (
            "  input x : half[4]\n  input i : int32[4]\n  output y = binary_select(x, i, cmp_eq(x, i))",
            (4, 31),
            "binary_select: dtype conflict: input 1 is half, input 2 is int32",
        ),
        ("  input x : half[4]\n  output y = cmp_eq(x, x, x)", (3, 14), "cmp_eq takes 2 inputs (a, b), got 3"),
        (
            "  input x : half[4]\n  output y = concatenate(x, axis=0)",
            (3, 14),
            "concatenate takes 2 or more inputs (x, x, ...), got 1",
        ),
        (
            "  input x : half[4, 2]\n  input y : half[3, 3]\n  output c = concatenate(x, y, axis=0)",
            (4, 29),
            "concatenate: input 2 [3, 3] differs from input 1 [4, 2] off axis 0",
        ),
        (
            "  input x : half[4, 2]\n  input y : float[3, 2]\n  output c = concatenate(x, y, axis=0)",
            (4, 29),
            "concatenate: dtype conflict: input 1 is half, input 2 is float",
        ),
        (
            "  input x : half[4, 2]\n  output i = gen_index(x, axis=2)",
            (3, 27),
            "gen_index: axis 2 is out of range for rank 2",
        ),
        ("  input x : half[4, 2]\n  output i = gen_index(x)", (3, 14), "gen_index: missing attribute 'axis'"),
        (
            "  input x : half[4, 2]\n  output i = relu(x, upper_clip=true)",
            (3, 33),
            "relu: attribute 'upper_clip' must be a number",
        ),
    ],
)
def test_bad_uses_are_located(body, where, words):
    errs = errors(graph(body))
    assert errs and errs[0][:2] == where and errs[0][2].startswith(words), errs


# ---- reference -------------------------------------------------------------------------------


def test_comparisons_logic_and_select_by_hand():
    text = graph(
        "  input x : float[3, 16]\n  input y : float[3, 16]\n  input m : bool[3, 16]\n"
        "  output ge = cmp_ge(x, y)\n  output ne = cmp_neq(x, y)\n  output a = logical_and(cmp_lt(x, y), m)\n"
        "  output o = logical_or(cmp_eq(x, y), logical_not(m))\n  output s = binary_select(x, y, m)"
    )
    x = torch.tensor([-1.0, 0.0, 2.0, 0.5] * 12).reshape(3, 16)
    y = torch.tensor([0.0, 0.0, 1.0, 0.75] * 12).reshape(3, 16)
    ins, out = reference(text, seed=3, x=x, y=y)
    m = unpack_bits(ins["m"], (3, 16))  # bound as cuDNN keeps bools: eight a byte
    assert ins["m"].dtype == torch.uint8 and ins["m"].numel() == 6
    assert 0 < int(m.sum()) < m.numel()  # random bits from the seed
    assert torch.equal(out["ge"], x >= y) and out["ge"].dtype == torch.bool
    assert torch.equal(out["ne"], x != y)
    assert torch.equal(out["a"], (x < y) & m)
    assert torch.equal(out["o"], (x == y) | ~m)
    assert torch.equal(out["s"], torch.where(m, x, y))


def test_relu_clips_and_slope_by_hand():
    text = graph(
        "  input x : float[8]\n  output y = relu(x, lower_clip=-1, upper_clip=2, negative_slope=0.25)\n"
        "  output r = relu(x)"
    )
    x = torch.tensor([-3.0, -1.0, -0.5, 0.0, 1.0, 2.0, 2.5, 7.0])
    _, out = reference(text, seed=3, x=x)
    # at or below lower_clip: lower_clip + slope * (x - lower_clip); at or above upper_clip: upper_clip
    assert out["y"].tolist() == [-1.5, -1.0, -0.5, 0.0, 1.0, 2.0, 2.0, 2.0]
    assert torch.equal(out["r"], torch.relu(x))


def test_mod_tan_add_square_gen_index_and_concatenate_by_hand():
    text = graph(
        "  input a : float[2, 3]\n  input b : float[2, 3]\n  output m = mod(a, b)\n  output t = tan(a)\n"
        "  output q = add_square(a, b)\n  output i = gen_index(a, axis=1)\n  output c = concatenate(a, b, axis=0)"
    )
    a = torch.tensor([[-7.0, 7.5, 3.0], [0.25, -0.5, 9.0]])
    b = torch.tensor([[3.0, 2.0, 1.5], [0.5, 0.75, 4.0]])
    _, out = reference(text, seed=3, a=a, b=b)
    assert out["m"].tolist() == [[-1.0, 1.5, 0.0], [0.25, -0.5, 1.0]]  # the sign of a, as C's fmod
    torch.testing.assert_close(out["t"], torch.tan(a))
    assert torch.equal(out["q"], a + b * b)
    assert out["i"].dtype == torch.int32 and out["i"].tolist() == [[0, 1, 2], [0, 1, 2]]
    assert torch.equal(out["c"], torch.cat([a, b]))


def test_a_bool_output_is_compared_exactly_whatever_the_inputs_precision():
    want = torch.tensor([True, False, True, True])
    got = torch.tensor([True, False, False, True])
    r = compare("m", got, want, "bool", floor_dtype="fp8_e5m2")
    assert (r.atol, r.rtol, r.mismatches) == (0.0, 0.0, 1)
    assert compare("m", want.clone(), want, "bool", floor_dtype="half").ok


# ---- lowering -------------------------------------------------------------------------------


def _script(text: str) -> str:
    g = program(text=text, file="t.cdg").graphs[0]
    return emit_cudnn(g, g.instances[0])


def test_lowering_passes_what_the_frontend_takes():
    s = _script(
        graph(
            "  input x : half[2, 8]\n  input y : half[2, 8]\n  input m : bool[2, 8]\n"
            "  output r = relu(x)\n  output c = relu(x, upper_clip=6)\n"
            "  output i = gen_index(x, axis=1)\n  output l = logical_and(cmp_gt(x, y), m)\n"
            "  output s = binary_select(x, y, m)\n  output k = concatenate(x, y, axis=0)",
            io="half",
        )
    )
    assert "g.relu(x, name='r', compute_data_type=cudnn.data_type.FLOAT)" in s  # cuDNN's defaults left out
    assert "g.relu(x, upper_clip=6.0, name='c'" in s
    assert "g.gen_index(x, axis=2, name='i'" in s  # rank-2 tensors reach cuDNN as [1, 2, 8]: the axis moves too
    assert "i.set_data_type(cudnn.data_type.INT32)" in s
    assert "compute_data_type=cudnn.data_type.BOOLEAN" in s  # logical_and
    assert "g.binary_select(x, y, m, name='s'" in s
    assert "g.concatenate(inputs=[x, y], axis=1, name='k')" in s
    assert "dim=[1, 2, 8], stride=[16, 8, 1]" in s


def test_a_bool_input_bound_a_byte_per_element_is_refused_with_the_fix():
    from cudnn_dsl.run.buffers import BindingError, check_inputs

    g = program(
        text=graph("  input x : float[3, 16]\n  input m : bool[3, 16]\n  output s = binary_select(x, x, m)")
    ).graphs[0]
    inst = g.instances[0]
    for m in (torch.ones(3, 16, dtype=torch.uint8), torch.ones(7, dtype=torch.uint8)):  # 48 and 7 bytes: 6 wanted
        with pytest.raises(BindingError, match="6 contiguous bytes of packed bools"):
            check_inputs(g, inst, {"x": torch.zeros(3, 16), "m": m}, torch.device("cpu"))


def test_a_bool_input_file_is_read_by_its_size_one_byte_per_element_or_packed():
    from cudnn_dsl.run.buffers import BindingError, converted
    from cudnn_dsl.target.bits import pack_bits
    from dsl.types import TensorType

    want = TensorType("bool", (3, 16), (16, 1))
    mask = torch.rand(3, 16) < 0.5
    assert torch.equal(converted(mask.to(torch.uint8), want), mask)  # 48 bytes: one value each
    assert torch.equal(converted(pack_bits(mask), want), pack_bits(mask))  # 6 bytes: packed, as cuDNN reads
    with pytest.raises(BindingError, match=r"takes 48 uint8 bytes \(one per element.*or 6 \(packed.*holds 7"):
        converted(torch.ones(7, dtype=torch.uint8), want)
    with pytest.raises(BindingError, match="0 \\(false\\) and 1 \\(true\\) only"):
        converted(torch.full((3, 16), 2, dtype=torch.uint8), want)
    with pytest.raises(BindingError, match="expected shape \\[3, 16\\] for one byte per element"):
        converted(torch.ones(48, dtype=torch.uint8), want)
    one = TensorType("bool", (1, 1), (1, 1))  # one byte is both: a 0/1 value, else packed (bit 0)
    assert converted(torch.ones(1, 1, dtype=torch.uint8), one).dtype == torch.bool
    assert torch.equal(converted(torch.tensor([3], dtype=torch.uint8), one), torch.tensor([3], dtype=torch.uint8))


def test_run_input_of_a_bool_tensor_of_the_wrong_size_is_a_located_error(tmp_path):
    from cli_util import run_cli

    f = tmp_path / "m.cdg"
    f.write_text(graph("  input x : float[3, 16]\n  input m : bool[3, 16]\n  output s = binary_select(x, x, m)"))
    torch.save(torch.ones(5, dtype=torch.uint8), tmp_path / "m.pt")
    p = run_cli("run", f, "--input", f"m={tmp_path / 'm.pt'}", "--no-reference")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert f"{f}:" in p.stderr and "--input m: a bool tensor of 48 elements takes 48 uint8 bytes" in p.stderr
    torch.save(torch.ones(6, dtype=torch.uint8), tmp_path / "m.pt")  # packed: every element true
    p = run_cli("run", f, "--input", f"m={tmp_path / 'm.pt'}")
    assert p.returncode == 0, p.stderr
