"""Training norms and their statistics on the GPU, each output against the reference, each graph compiled
whole (split=False): the test is what cuDNN computes for it.

Where no one could know before running whether the H200's cuDNN has an engine for a graph (adaptive layer
norm, the statistics epilogue of a convolution), RECORDED holds what cuDNN 9.19 did: ran the graph and
matched, or refused it at the graph or an op. A change either way fails.
"""

import pytest

from tests.graphs import graph_text
from tests.helpers import ACCEPTED, check, check_as_recorded

pytestmark = pytest.mark.gpu

#: what cuDNN did with each graph whose support no one knew before running it (where: helpers.SEEN_ON)
RECORDED = {
    "adalayernorm training": ACCEPTED,
    "adalayernorm inference": ACCEPTED,
    "conv_fprop + genstats": ACCEPTED,
}


LN = "  input x : bf16[512, 256, 1, 1]\n  input g : float[1, 256, 1, 1]\n  input b : float[1, 256, 1, 1]\n"


def _outputs(*names: str) -> str:
    return "".join(f"  output {n}\n" for n in names)


def test_layernorm_training_statistics():
    check(
        graph_text(LN + "  y, m, iv = layernorm(x, g, b, phase=training)\n" + _outputs("y", "m", "iv"), "bf16"),
        "cuda",
        split=False,
    )


@pytest.mark.parametrize("outputs", [("y", "m"), ("y", "iv")])
def test_layernorm_with_one_statistic_out(outputs):
    # cuDNN writes mean and inv_variance together; the one no output asks for goes to scratch memory.
    check(
        graph_text(LN + "  y, m, iv = layernorm(x, g, b, phase=training)\n" + _outputs(*outputs), "bf16"),
        "cuda",
        split=False,
    )


def test_rmsnorm_training_statistics():
    check(
        graph_text(LN + "  y, iv = rmsnorm(x, g, phase=training)\n" + _outputs("y", "iv"), "bf16"), "cuda", split=False
    )


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_norms_over_the_hidden_dim_of_tokens(norm):
    # The LLM layout of the frontend's own llm_coverage samples: x [B, S, D], scale [1, 1, D].
    body = "  input x : bf16[4, 512, 1024]\n  input g : bf16[1, 1, 1024]\n  input b : bf16[1, 1, 1024]\n"
    if norm == "layernorm":
        body += "  y, m, iv = layernorm(x, g, b, phase=training)\n" + _outputs("y", "m", "iv")
    else:
        body += "  y, iv = rmsnorm(x, g, b, phase=training)\n" + _outputs("y", "iv")
    check(graph_text(body, "bf16"), "cuda", split=False)


def test_layernorm_zero_centered_gamma():
    # The frontend's zero-centred-gamma sample: one is added to the scale inside the graph.
    check(
        graph_text(LN + "  y, m, iv = layernorm(x, g + 1, b, phase=training)\n" + _outputs("y", "m", "iv"), "bf16"),
        "cuda",
        split=False,
    )


BN = "  input x : half[%s] nhwc\n" + "".join(f"  input {n} : float[1, 32, 1, 1] nhwc\n" for n in ("g", "b", "rm", "rv"))
BN_OUT = _outputs("y", "m", "iv", "rm2", "rv2")


def test_batchnorm_training_with_running_statistics():
    body = BN % "8, 32, 16, 16" + "  y, m, iv, rm2, rv2 = batchnorm(x, g, b, rm, rv, epsilon=0.001)\n" + BN_OUT
    check(graph_text(body), "cuda", split=False)


def test_batchnorm_training_y_alone():
    # The statistics and the running ones are written to scratch memory: cuDNN declines the graph without them.
    check(
        graph_text(BN % "8, 32, 16, 16" + "  y, m, iv, rm2, rv2 = batchnorm(x, g, b, rm, rv)\n  output y\n"),
        "cuda",
        split=False,
    )


def test_batchnorm_running_variance_is_the_unbiased_one():
    # 8 values per channel and momentum 1: the next running variance is the batch's variance times 8/7
    # (Bessel's correction), 14% above the biased one, far outside the tolerance.
    check(
        graph_text(BN % "2, 32, 2, 2" + "  y, m, iv, rm2, rv2 = batchnorm(x, g, b, rm, rv, momentum=1)\n" + BN_OUT),
        "cuda",
        split=False,
    )


def test_instancenorm_training_statistics():
    body = BN % "8, 32, 16, 16" + "  y, m, iv = instancenorm(x, g, b, phase=training)\n" + _outputs("y", "m", "iv")
    check(graph_text(body.replace("  input rm", "  # rm").replace("  input rv", "  # rv")), "cuda", split=False)


@pytest.mark.parametrize("phase", ["training", "inference"])
def test_adalayernorm(phase):
    body = "  input x : half[4, 128, 256]\n  input g : half[4, 1, 256]\n  input b : half[4, 1, 256]\n"
    if phase == "training":
        body += "  y, m, iv = adalayernorm(x, g, b, phase=training)\n" + _outputs("y", "m", "iv")
    else:
        body += "  output y = adalayernorm(x, g, b)\n"
    check_as_recorded(RECORDED, f"adalayernorm {phase}", graph_text(body))


def test_conv_genstats():
    # The frontend's own conv + genstats test allows 0.5 absolute on the sums: 1024 half products each.
    body = (
        "  input x : half[4, 32, 16, 16] nhwc\n  input w : half[64, 32, 3, 3] nhwc\n"
        "  y = conv_fprop(x, w, padding=1)\n  s, sq = genstats(y)\n" + _outputs("y", "s", "sq")
    )
    check_as_recorded(RECORDED, "conv_fprop + genstats", graph_text(body), atol={"s": 0.5, "sq": 0.5})


ROPE = (
    "  input q : bf16[2, 4, 128, 64]\n  input k : bf16[2, 4, 128, 64]\n  input v : bf16[2, 4, 128, 64]\n"
    "  input f : float[128, 1, 1, 64]\n"
)


@pytest.mark.parametrize(
    "body",
    [
        "  output qr = rope(q, f)\n  output kr = rope(k, f, rope_dim=32)\n  output o = sdpa(qr, kr, v, causal=true)",
        "  output o = sdpa(rope(q, f, output_scale=0.5), rope(k, f), v)",
    ],
    ids=["outputs", "virtual"],
)
def test_rope_before_sdpa(body):
    # RoPE is a cuDNN operation from 9.23 and fuses with SDPA from 9.24 (the frontend's release notes);
    # cuDNN 9.28 plans both graphs for an H200. An older library must refuse them, located.
    import cudnn_dsl
    from cudnn_dsl.target.library import load_cudnn

    text = graph_text(ROPE + body, "bf16")
    if load_cudnn().backend_version() >= 92400:
        check(text, "cuda", split=False)
        return
    with pytest.raises(cudnn_dsl.DslError) as e:
        check(text, "cuda", split=False)
    d = e.value.diagnostics[0]
    assert "cuDNN" in d.message and d.loc.line in (1, 9, 10, 11), d.message
    check(text, "cuda", split=True)  # rope left to torch, attention in cuDNN, and the outputs still match
