"""One small graph per registry op (or op family): lowered, run on the GPU, compared with torch; compiled
whole (split=False), so that an op cuDNN declines fails instead of running as its torch fallback."""

import pytest

from dsl.ops import BACKWARD_OPS, OPS
from tests.graphs import graph_text
from tests.helpers import check

pytestmark = pytest.mark.gpu

# ops with a domain, a result dtype or a required attribute of their own: tests/gpu/test_logic_gpu.py;
# the backward ops: tests/gpu/test_backward_gpu.py
_OWN_TESTS = {"tan", "mod", "gen_index", *BACKWARD_OPS}
UNARY = [
    n
    for n, s in OPS.items()
    if s.family == "pointwise" and s.inputs == ("x",) and s.result_dtype is None and n not in _OWN_TESTS
]
BINARY = [
    n
    for n, s in OPS.items()
    if s.family == "pointwise" and len(s.inputs) == 2 and s.result_dtype is None and n not in _OWN_TESTS
]


@pytest.mark.parametrize("op", UNARY)
def test_unary_after_matmul(op):
    # A pointwise op as a matmul epilogue, the fusion cuDNN's runtime engines are built for.
    body = (
        f"  input a : half[4, 64, 64]\n  input b : half[4, 64, 32]\n  output y : float = {op}(matmul(a, b) * 0.125 + 2)"
    )
    check(graph_text(body), "cuda", split=False)


@pytest.mark.parametrize("op", BINARY)
def test_binary_after_matmul(op):
    body = (
        "  input a : half[4, 64, 64]\n  input b : half[4, 64, 32]\n  input c : half[1, 1, 32]\n"
        f"  output y : float = {op}(matmul(a, b) * 0.125 + 2, c + 2)"
    )
    check(graph_text(body), "cuda", split=False)


def _reduction(mode: str) -> str:
    return graph_text(
        "  input a : half[4, 64, 64]\n  input b : half[4, 64, 32]\n"
        f"  y = matmul(a, b)\n  output s : float[4, 64, 1] = reduction(y, mode={mode}, axes=[2])"
    )


@pytest.mark.parametrize("mode", ["sum", "max", "min", "amax"])
def test_reduction_epilogue(mode):
    check(_reduction(mode), "cuda", atol=5e-2, rtol=2e-2, split=False)


@pytest.mark.parametrize("mode", ["avg", "norm1", "norm2"])
def test_reduction_modes_cudnn_declines_are_reported_at_the_op(mode):
    # cuDNN 9.19 has these modes but no engine for them in a matmul epilogue (seen on the H200): with
    # splitting off, the user gets cuDNN's refusal located at the reduction, not a crash; by default the
    # graph runs in parts and matches.
    import cudnn_dsl

    with pytest.raises(cudnn_dsl.DslError, match="cuDNN build_operation_graph failed") as e:
        check(_reduction(mode), "cuda", split=False)
    assert e.value.diagnostics[0].loc.line == 7  # the reduction's line
    check(_reduction(mode), "cuda", atol=5e-2, rtol=2e-2, split=True)


@pytest.mark.parametrize("conv", ["conv_fprop", "conv_dgrad", "conv_wgrad"])
def test_convolutions(conv):
    shapes = {
        "conv_fprop": ("half[4, 32, 16, 16] nhwc", "half[64, 32, 3, 3] nhwc"),
        "conv_dgrad": ("half[4, 64, 16, 16] nhwc", "half[64, 32, 3, 3] nhwc"),
        "conv_wgrad": ("half[4, 32, 16, 16] nhwc", "half[4, 64, 16, 16] nhwc"),
    }[conv]
    out = ": float" if conv == "conv_wgrad" else ""
    body = f"  input p : {shapes[0]}\n  input q : {shapes[1]}\n  output y {out} = {conv}(p, q, padding=[1, 1])"
    check(graph_text(body), "cuda", atol=5e-2, rtol=2e-2, split=False)


def test_conv_dgrad_with_stride_and_output_padding():
    body = (
        "  input dy : half[4, 64, 8, 8] nhwc\n  input w : half[64, 32, 3, 3] nhwc\n"
        "  output dx : half[4, 32, 16, 16] nhwc = conv_dgrad(dy, w, padding=1, stride=2, output_padding=1)"
    )
    check(graph_text(body), "cuda", atol=5e-2, rtol=2e-2, split=False)


def test_grouped_conv_with_stride_and_dilation():
    body = (
        "  input x : half[4, 32, 17, 17] nhwc\n  input w : half[64, 8, 3, 3] nhwc\n"
        "  output y = relu(conv_fprop(x, w, padding=[2, 2], stride=[2, 2], dilation=[2, 2]))"
    )
    check(graph_text(body), "cuda", split=False)


@pytest.mark.parametrize("variant", ["plain", "causal", "stats", "bias"])
def test_sdpa(variant):
    attrs = {"plain": "", "causal": ", causal=true", "stats": ", causal=true, stats=true", "bias": ""}[variant]
    bias = ", bias" if variant == "bias" else ""
    lines = ["  input q : half[2, 4, 128, 64]", "  input k : half[2, 4, 128, 64]", "  input v : half[2, 4, 128, 64]"]
    if variant == "bias":
        lines.append("  input bias : half[1, 4, 128, 128]")
    if variant == "stats":
        lines += [f"  o, st = sdpa(q, k, v{attrs})", "  output o", "  output st : float"]
    else:
        lines.append(f"  output o = sdpa(q, k, v{bias}{attrs})")
    check(graph_text("\n".join(lines)), "cuda", split=False)


def test_sdpa_grouped_query():
    body = (
        "  input q : half[2, 8, 128, 64]\n  input k : half[2, 2, 128, 64]\n  input v : half[2, 2, 128, 64]\n"
        "  output o = sdpa(q, k, v, causal=true)"
    )
    check(graph_text(body), "cuda", split=False)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_norms(norm):
    extra = "  input beta : float[1, 256, 1, 1]\n" if norm == "layernorm" else ""
    args = "x, gamma, beta" if norm == "layernorm" else "x, gamma"
    body = f"  input x : bf16[512, 256, 1, 1]\n  input gamma : float[1, 256, 1, 1]\n{extra}  output y = {norm}({args})"
    check(graph_text(body, "bf16"), "cuda", split=False)


def _declined(text: str, match: str, line: int) -> None:
    """cuDNN refuses this graph on this GPU and version: with splitting off the user gets that refusal,
    located; by default the graph runs in parts (or as torch fallbacks) and matches the reference."""
    import cudnn_dsl

    with pytest.raises(cudnn_dsl.DslError, match=match) as e:
        check(text, "cuda", split=False)
    assert e.value.diagnostics[0].loc.line == line
    check(text, "cuda", atol=5e-2, rtol=2e-2, split=True)


def test_batchnorm_inference():
    body = (
        "  input x : half[8, 64, 16, 16] nhwc\n"
        + "".join(f"  input {n} : float[1, 64, 1, 1] nhwc\n" for n in ("mean", "inv_var", "gamma", "beta"))
        + "  output y = batchnorm_inference(x, mean, inv_var, gamma, beta)"
    )
    # cuDNN 9.19 on the H200 offers no engine for a standalone inference batch norm.
    _declined(graph_text(body), "no engine", 1)


def _backend_version() -> int:
    from cudnn_dsl.target.library import load_cudnn

    return load_cudnn().backend_version()


@pytest.mark.parametrize("op", ["transpose(y, perm=[0, 2, 1])", "slice(y, start=[0, 0, 0], end=[4, 32, 32])"])
def test_transpose_and_slice(op):
    text = graph_text(
        f"  input a : half[4, 64, 64]\n  input b : half[4, 64, 32]\n  y = matmul(a, b)\n  output z : float = {op}"
    )
    if _backend_version() < 92200:  # the library says these need cuDNN 9.22
        _declined(text, "9.22", 7)
    else:
        check(text, "cuda", split=False)


def test_reshape_after_matmul_is_declined_by_cudnn():
    text = graph_text(
        "  input a : half[4, 64, 64]\n  input b : half[4, 64, 32]\n  y = matmul(a, b)\n"
        "  output z : float = reshape(y, shape=[4, 2048])"
    )
    _declined(text, "no engine", 1)
