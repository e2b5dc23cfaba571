"""Comparisons, logic, selects, gen_index, mod/tan/add_square, relu's clips and concatenate on the GPU,
against the reference. Comparisons read integer-valued data, whose matmul is exact in float, so a bool
result has no ties to round either way and is compared exactly."""

import pytest

pytestmark = pytest.mark.gpu

HEAD = "graph t {\n  io half\n  compute float\n  input a : half[4, 64, 64]\n  input b : half[4, 64, 32]\n"


def _ints(shape, lo, hi, seed):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, shape, generator=gen).to("cuda", torch.float16)


def check_fields(text: str, **given):
    """Runs the graph on its generated inputs, with `given` ones in their place; every output must match."""
    import cudnn_dsl

    cg = cudnn_dsl.compile(text)
    inputs = cg.allocate_inputs()
    inputs.update(given)
    results = cg.check(**inputs)
    assert results
    for r in results:
        assert r.ok, str(r)
    return cg, inputs


def _exact_ab():
    # |entries| <= 3, K = 64: every product and partial sum is a small integer, exact in float
    return {"a": _ints((4, 64, 64), -3, 3, 1), "b": _ints((4, 64, 32), -3, 3, 2)}


@pytest.mark.parametrize("op", ["cmp_eq", "cmp_neq", "cmp_gt", "cmp_ge", "cmp_lt", "cmp_le"])
def test_comparison_epilogue_gives_an_exact_bool_mask(op):
    import torch

    import cudnn_dsl

    text = HEAD + f"  input c : half[1, 1, 32]\n  output m = {op}(matmul(a, b), c)\n}}\n"
    cg, inputs = check_fields(text, c=_ints((1, 1, 32), -4, 4, 3), **_exact_ab())
    m = cg(**inputs)["m"]  # as cuDNN writes it: eight elements a byte
    assert m.dtype == torch.uint8 and m.numel() == 4 * 64 * 32 // 8
    mask = cudnn_dsl.unpack_bits(m, (4, 64, 32))
    assert 0 < int(mask.sum()) < mask.numel()  # both values occur


def test_logic_ops_on_masks():
    text = HEAD + (
        "  input c : half[1, 1, 32]\n  input k : bool[4, 64, 32]\n  y = matmul(a, b)\n"
        "  p = cmp_gt(y, c)\n  output both = logical_and(p, k)\n  output either = logical_or(p, logical_not(k))\n}\n"
    )
    check_fields(text, c=_ints((1, 1, 32), -4, 4, 3), **_exact_ab())


def test_binary_select_and_a_masked_clamp():
    text = HEAD + (
        "  input c : half[1, 1, 32]\n  y = matmul(a, b)\n"
        "  output s : float = binary_select(y, c, cmp_lt(y, c))\n"
        "  output z : float = y * cmp_ge(y, 0)\n}\n"  # a bool mask multiplies, as in cuDNN's bitmask samples
    )
    check_fields(text, c=_ints((1, 1, 32), -4, 4, 3), **_exact_ab())


def test_gen_index_masks_columns_and_is_an_output():

    text = HEAD + (
        "  y = matmul(a, b)\n"
        "  output z : float = binary_select(y, 0, cmp_lt(gen_index(y, axis=2), 16))\n}\n"  # int32 against a float
    )
    cg, inputs = check_fields(text)
    out = cg(**inputs)
    assert float(out["z"][..., 16:].abs().max()) == 0.0 and float(out["z"][..., :16].abs().max()) > 0


@pytest.mark.xfail(
    reason="seen on the H200 (cuDNN 9.19): gen_index written out as an int32 output of a matmul epilogue "
    "holds the index for the first batch only (the others read 0)",
    strict=False,
)
def test_gen_index_as_an_output():
    import torch

    cg, inputs = check_fields(HEAD + "  y = matmul(a, b)\n  output i = gen_index(y, axis=1)\n}\n")
    out = cg(**inputs)
    assert out["i"].dtype == torch.int32 and int(out["i"].max()) == 63


@pytest.mark.xfail(
    reason="seen on the H200 (cuDNN 9.19): an int32 gen_index compared with an int32 host scalar selects 0 "
    "for ~5% of the rows it should keep; the reference and the same comparison against a float literal agree",
    strict=False,
)
def test_gen_index_against_an_int32_host_scalar():
    text = HEAD + (
        "  scalar t : int32 = 8\n  y = matmul(a, b)\n"
        "  output w : float = binary_select(y, 0, cmp_ge(gen_index(y, axis=1), t))\n}\n"
    )
    check_fields(text)


def test_mod_tan_add_square():
    text = HEAD + (
        "  input c : half[1, 1, 32]\n  y = matmul(a, b)\n"
        "  output m : float = mod(y, c)\n  output q : float = add_square(y, c)\n"
        "  output t : float = tan(y * 0.01)\n}\n"
    )
    # a positive divisor and exact, partly negative y: exact remainders, with the sign of y (C's fmod)
    check_fields(text, c=_ints((1, 1, 32), 1, 5, 3), **_exact_ab())


@pytest.mark.parametrize(
    "attrs",
    ["upper_clip=0.5", "lower_clip=-0.5, upper_clip=0.5", "negative_slope=0.1", "lower_clip=-0.25, negative_slope=0.2"],
)
def test_relu_clips_are_one_node(attrs):
    text = HEAD + f"  output y : float = relu(matmul(a, b) * 0.125, {attrs})\n}}\n"
    check_fields(text)


def _run_or_refused(text: str, line: int, **given):
    """cuDNN 9.19 on the H200 may have no engine for this graph (the frontend's own samples need
    Blackwell and cuDNN 9.22 for it): then the refusal must be cuDNN's, located; else it must match."""
    import cudnn_dsl

    try:
        check_fields(text, **given)
    except cudnn_dsl.DslError as e:
        d = e.diagnostics[0]
        assert "cuDNN" in d.message and d.loc.line in (1, line), d


def test_concatenate():
    text = (
        "graph t {\n  input x : half[2, 4, 8, 8] nhwc\n  input y : half[2, 4, 8, 8] nhwc\n"
        "  output z = concatenate(x, y, axis=1)\n}\n"
    )
    _run_or_refused(text, 4)


def test_a_standalone_boolean_graph():
    text = (
        "graph t {\n  input x : half[4, 8, 16]\n  input th : float[4, 8, 16]\n  input k : bool[4, 8, 16]\n"
        "  output y = logical_and(cmp_gt(x, th), k)\n}\n"
    )
    _run_or_refused(text, 5)
