"""Graphs cuDNN declines whole run as parts on the GPU: each part a cuDNN graph built here (or an
op left to torch), intermediates materialized, the outputs matching the reference."""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_store")]

LN_GELU = (
    "graph ln_gelu {\n  io bf16\n  input x : bf16[8, 1024, 1, 1] nhwc\n  input s : float[1, 1024, 1, 1] nhwc\n"
    "  input b : float[1, 1024, 1, 1] nhwc\n  output y = gelu(layernorm(x, s, b))\n}\n"
)
RESHAPE_AFTER_MATMUL = (
    "graph mm_reshape {\n  io half\n  input a : half[4, 64, 128]\n  input b : half[4, 128, 32]\n"
    "  output y : float[4, 2048] = reshape(matmul(a, b), shape=[4, 2048])\n}\n"
)
GENSTATS = (
    "graph gs {\n  io half\n  input x : half[8, 64, 16, 16] nhwc\n  s, sq = genstats(x)\n  output s\n  output sq\n}\n"
)

# a view read by one part, an output in place written by another (the parts' plan keys and binding)
VIEWED_IN_PLACE = (
    "graph viewed {\n  io bf16\n  buffer buf : bf16[2, 8, 1024, 1, 1]\n"
    "  input x : bf16[8, 1024, 1, 1] strides [1024, 1, 1024, 1024] in buf at 8192\n"
    "  input s : float[1, 1024, 1, 1] nhwc\n  input b : float[1, 1024, 1, 1] nhwc\n"
    "  input acc : bf16[8, 1024, 1, 1] nhwc\n  output y in acc = gelu(layernorm(x, s, b))\n}\n"
)
# x is overwritten by one part and read by a later one: that part must see x as it was
READ_AFTER_OVERWRITE = (
    "graph rao {\n  io bf16\n  input x : bf16[8, 1024, 1, 1] nhwc\n  input s : float[1, 1024, 1, 1] nhwc\n"
    "  input b : float[1, 1024, 1, 1] nhwc\n  output y in x = gelu(layernorm(x, s, b))\n"
    "  output z = layernorm(x, s, b)\n}\n"
)
# a training norm's mean read by a later part: its statistics materialized alike
NORM_STATS = (
    "graph lt {\n  io bf16\n  compute float\n  input x : bf16[256, 1024, 1, 1]\n"
    "  input gamma : float[1, 1024, 1, 1]\n  input beta : float[1, 1024, 1, 1]\n"
    "  y, mean, inv_variance = layernorm(x, gamma, beta, epsilon=1e-5, phase=training)\n"
    "  output z = gelu(y)\n  output m2 = mean * 2.0\n}\n"
)


def _check(text: str, **options):
    import cudnn_dsl

    cg = cudnn_dsl.compile(text=text, split=True, **options)
    ins = cg.allocate_inputs()
    results = cg.check(ins)
    assert all(r.ok for r in results), [str(r) for r in results]
    return cg, cg.staged(cg.graph.instances[0])


@pytest.mark.parametrize(
    "text",
    [LN_GELU, RESHAPE_AFTER_MATMUL, GENSTATS, VIEWED_IN_PLACE, READ_AFTER_OVERWRITE, NORM_STATS],
    ids=["ln_gelu", "mm_reshape", "genstats", "viewed_in_place", "read_after_overwrite", "norm_stats"],
)
def test_a_graph_cudnn_declines_whole_runs_in_parts_and_matches(text):
    cg, staged = _check(text)
    if staged is None:  # this cuDNN fuses it after all: nothing to split, and it matched above
        pytest.skip(f"cuDNN {cg.graph.name}: fused whole here")
    assert len(staged.partition.parts) >= 2 or staged.partition.fallbacks
    assert all(line.startswith(f"part {k}:") for k, line in enumerate(staged.lines, 1))


def test_layernorm_then_gelu_is_two_cudnn_graphs():
    _, staged = _check(LN_GELU)
    assert staged is not None and [p.graph is not None for p in staged.partition.parts] == [True, True]


def test_bind_of_a_split_graph_says_it_runs_in_parts():
    import cudnn_dsl

    cg = cudnn_dsl.compile(text=LN_GELU, split=True)
    with pytest.raises(cudnn_dsl.DslError, match=r"splits into 2 parts .* call the compiled graph instead"):
        cg.bind(cg.allocate_inputs())


def test_with_splitting_off_cudnns_refusal_is_the_error():
    import cudnn_dsl

    cg = cudnn_dsl.compile(text=LN_GELU, split=False)
    with pytest.raises(cudnn_dsl.DslError, match="failed"):
        cg(cg.allocate_inputs())
