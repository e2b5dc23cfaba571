"""Norms in training phase with their statistics, batchnorm with running statistics, instancenorm,
adalayernorm and genstats: shape rules and errors, the reference on the CPU against PyTorch's own
norms, and whether the real cuDNN 9.28 plans each graph for an H200 without a GPU."""

import pytest
import torch
import torch.nn.functional as F

from dsl.diagnostics import DslError
from dsl.pipeline import program
from tests.graphs import graph_text
from tests.helpers import reference


def types(body: str) -> dict:
    g = program(text=graph_text(body), file="n.cdg").graphs[0]
    inst = g.instances[0]
    return {v.name: inst.type(v.name) for v in g.values}


def error(body: str):
    """The first diagnostic of a graph that must not check, as (message, line, column)."""
    with pytest.raises(DslError) as e:
        program(text=graph_text(body), file="n.cdg")
    d = next(d for d in e.value.diagnostics if d.severity == "error")
    return d.message, d.loc.line, d.loc.col


LN = "  input x : bf16[64, 256, 1, 1]\n  input g : float[1, 256, 1, 1]\n  input b : float[1, 256, 1, 1]\n"
NCHW = "  input x : half[8, 32, 6, 6] nhwc\n" + "".join(
    f"  input {n} : float[1, 32, 1, 1] nhwc\n" for n in ("g", "b", "rm", "rv")
)
ADA = "  input x : half[4, 16, 64]\n  input g : half[4, 1, 64]\n  input b : half[4, 1, 64]\n"


# ---- shape and dtype rules -----------------------------------------------------------------


def test_layernorm_training_returns_float_statistics_per_sample():
    t = types(LN + "  y, m, iv = layernorm(x, g, b, phase=training)\n  output y\n  output m\n  output iv")
    assert (t["y"].dtype, t["y"].shape) == ("half", (64, 256, 1, 1))
    assert (t["m"].dtype, t["m"].shape) == ("float", (64, 1, 1, 1)) == (t["iv"].dtype, t["iv"].shape)


def test_rmsnorm_training_returns_inv_variance_only():
    t = types(LN + "  y, iv = rmsnorm(x, g, b, phase=training)\n  output y\n  output iv")
    assert (t["iv"].dtype, t["iv"].shape) == ("float", (64, 1, 1, 1))
    msg, line, _ = error(LN + "  y, m, iv = rmsnorm(x, g, phase=training)\n  output y")
    assert "rmsnorm returns 2 values here, but 3 names are assigned" in msg and line == 7


BSD = "  input x : bf16[4, 16, 64]\n  input g : float[1, 1, 64]\n  input b : float[1, 1, 64]\n"


def test_norms_take_cudnns_rule_for_their_axes():
    # cuDNN normalizes the axes scale spans: [1, 1, D] against x [B, S, D] (the LLM layout) is over D.
    t = types(
        BSD + "  y, m, iv = layernorm(x, g, b, phase=training)\n  z, ziv = rmsnorm(x, g, phase=training)\n"
        "  output y\n  output m\n  output iv\n  output z\n  output ziv"
    )
    assert t["m"].shape == t["iv"].shape == t["ziv"].shape == (4, 16, 1)
    msg, _, col = error(
        BSD.replace("input g : float[1, 1, 64]", "input g : float[4, 1, 64]") + "  output y = layernorm(x, g, b)"
    )
    assert msg.startswith("layernorm: scale [4, 1, 64] must be 1 on the batch axis") and col == 27
    msg, _, _ = error(
        BSD.replace("input b : float[1, 1, 64]", "input b : float[1, 16, 64]") + "  output y = layernorm(x, g, b)"
    )
    assert msg == "layernorm: bias [1, 16, 64] differs from scale [1, 1, 64]"


def test_inference_is_the_default_and_returns_y_alone():
    msg, line, col = error(LN + "  y, m, iv = layernorm(x, g, b)\n  output y")
    assert "layernorm returns 1 value here, but 3 names are assigned" in msg and (line, col) == (7, 14)


def test_phase_is_an_enum():
    msg, _, col = error(LN + "  output y = layernorm(x, g, b, phase=train)")
    assert "'phase' must be one of inference, training; got train" in msg and col == 39


def test_statistics_must_be_declared_float():
    msg, line, _ = error(LN + "  y, m, iv = layernorm(x, g, b, phase=training)\n  output y\n  output m : half\n")
    assert "output 'm' is declared half but layernorm gives float" in msg and line == 9


def test_batchnorm_returns_five_per_channel_results():
    t = types(
        NCHW
        + "  y, m, iv, rm2, rv2 = batchnorm(x, g, b, rm, rv, momentum=0.01)\n"
        + "".join(f"  output {n}\n" for n in ("y", "m", "iv", "rm2", "rv2"))
    )
    assert t["y"].shape == (8, 32, 6, 6) and t["y"].strides == (1152, 1, 192, 32)
    for n in ("m", "iv", "rm2", "rv2"):
        assert (t[n].dtype, t[n].shape) == ("float", (1, 32, 1, 1))


def test_batchnorm_rules_are_located():
    bad = NCHW.replace("input rv : float[1, 32, 1, 1]", "input rv : float[1, 16, 1, 1]")
    msg, line, col = error(bad + "  output y = batchnorm(x, g, b, rm, rv)")
    assert msg == "batchnorm: running_var must be [1, 32, 1, 1] (one value per channel), got [1, 16, 1, 1]"
    assert (line, col) == (9, 37)
    msg, _, _ = error(
        NCHW.replace("half[8, 32, 6, 6]", "half[1, 32, 1, 1]") + "  output y = batchnorm(x, g, b, rm, rv)"
    )
    assert msg == "batchnorm: [1, 32, 1, 1] holds one value per channel; the unbiased variance needs 2"
    msg, _, _ = error(NCHW + "  output y = batchnorm(x, g, b, rm, rv, momentum=1.5)")
    assert "'momentum' must be >= 0 and <= 1, got 1.5" in msg


def test_instancenorm_statistics_are_per_sample_and_channel():
    t = types(NCHW + "  y, m, iv = instancenorm(x, g, b, phase=training)\n  output y\n  output m\n  output iv")
    assert (t["m"].dtype, t["m"].shape) == ("float", (8, 32, 1, 1))
    msg, _, _ = error("  input x : half[8, 32]\n  input g : float[1, 32]\n  output y = instancenorm(x, g, g)")
    assert msg == "instancenorm: input needs rank >= 3, got [8, 32]"


def test_adalayernorm_normalizes_where_scale_spans():
    t = types(ADA + "  y, m, iv = adalayernorm(x, g, b, phase=training)\n  output y\n  output m\n  output iv")
    assert (t["m"].dtype, t["m"].shape) == ("float", (4, 16, 1))
    t = types(ADA + "  output y = adalayernorm(x, g)")  # bias is optional, as in the frontend
    assert t["y"].shape == (4, 16, 64)


@pytest.mark.parametrize(
    "scale,bias,want",
    [
        ("half[4, 1, 1]", "half[4, 1, 1]", "adalayernorm: scale [4, 1, 1] is 1 on every axis after the first"),
        (
            "half[4, 1, 32]",
            "half[4, 1, 32]",
            "adalayernorm: scale [4, 1, 32] must broadcast onto the input [4, 16, 64]",
        ),
        ("half[4, 1, 64]", "half[1, 1, 64]", "adalayernorm: bias [1, 1, 64] differs from scale [4, 1, 64]"),
    ],
)
def test_adalayernorm_rules(scale, bias, want):
    body = f"  input x : half[4, 16, 64]\n  input g : {scale}\n  input b : {bias}\n  output y = adalayernorm(x, g, b)"
    assert error(body)[0].startswith(want)


def test_genstats_returns_per_channel_sums():
    t = types("  input x : half[4, 32, 6, 6] nhwc\n  s, sq = genstats(x)\n  output s\n  output sq")
    assert (t["s"].dtype, t["s"].shape, t["sq"].shape) == ("float", (1, 32, 1, 1), (1, 32, 1, 1))


# ---- the reference, against PyTorch's own norms -------------------------------------------------------


def test_layernorm_and_rmsnorm_statistics_match_torch():
    body = (
        "  input x : float[16, 8, 2, 2]\n  input g : float[1, 8, 2, 2]\n  input b : float[1, 8, 2, 2]\n"
        "  y, m, iv = layernorm(x, g, b, epsilon=0.01, phase=training)\n  z, riv = rmsnorm(x, g, b, phase=training)\n"
        + "".join(f"  output {n}\n" for n in ("y", "m", "iv", "z", "riv"))
    )
    ins, out = reference(graph_text(body, "float"), seed=3)
    x, g, b = ins["x"], ins["g"], ins["b"]
    torch.testing.assert_close(out["y"], F.layer_norm(x, (8, 2, 2), g[0], b[0], 0.01))
    torch.testing.assert_close(out["m"], x.mean((1, 2, 3), keepdim=True))
    torch.testing.assert_close(out["iv"], torch.rsqrt(x.var((1, 2, 3), unbiased=False, keepdim=True) + 0.01))
    torch.testing.assert_close(out["z"], F.rms_norm(x, (8, 2, 2), g[0], 1e-5) + b)
    torch.testing.assert_close(out["riv"], torch.rsqrt(x.square().mean((1, 2, 3), keepdim=True) + 1e-5))


def test_norms_over_the_last_axis_match_torch():
    body = BSD.replace("bf16", "float") + (
        "  y, m, iv = layernorm(x, g, b, phase=training)\n  z, ziv = rmsnorm(x, g, phase=training)\n"
        "  output w = layernorm(x, g, b)\n" + "".join(f"  output {n}\n" for n in ("y", "m", "iv", "z", "ziv"))
    )
    ins, out = reference(graph_text(body, "float"), seed=3)
    x, g, b = ins["x"], ins["g"].flatten(), ins["b"].flatten()
    torch.testing.assert_close(out["y"], F.layer_norm(x, (64,), g, b))
    torch.testing.assert_close(out["w"], out["y"])  # torch's one kernel (inference) and the training formula
    torch.testing.assert_close(out["m"], x.mean(2, keepdim=True))
    torch.testing.assert_close(out["z"], F.rms_norm(x, (64,), g, 1e-5))
    torch.testing.assert_close(out["ziv"], torch.rsqrt(x.square().mean(2, keepdim=True) + 1e-5))


def test_batchnorm_matches_torch_training_step():
    """y, saved mean and inv_variance as torch.native_batch_norm saves them; the next running statistics as
    F.batch_norm updates them in place (the unbiased variance), from the same momentum."""
    body = NCHW.replace("half", "float") + (
        "  y, m, iv, rm2, rv2 = batchnorm(x, g, b, rm, rv, epsilon=0.001, momentum=0.25)\n"
        + "".join(f"  output {n}\n" for n in ("y", "m", "iv", "rm2", "rv2"))
    )
    ins, out = reference(graph_text(body, "float"), seed=3)
    assert ins["rv"].min() >= 0.5  # a variance is drawn positive
    x, g, b = ins["x"], ins["g"].flatten(), ins["b"].flatten()
    rm, rv = ins["rm"].flatten().clone(), ins["rv"].flatten().clone()
    y, save_mean, save_invstd = torch.native_batch_norm(x, g, b, rm, rv, True, 0.25, 0.001)
    torch.testing.assert_close(out["y"], y)
    torch.testing.assert_close(out["m"].flatten(), save_mean)
    torch.testing.assert_close(out["iv"].flatten(), save_invstd)
    torch.testing.assert_close(out["rm2"].flatten(), rm)  # updated in place by torch
    torch.testing.assert_close(out["rv2"].flatten(), rv)
    assert not torch.equal(rv, ins["rv"].flatten())


def test_instancenorm_matches_torch():
    body = NCHW.replace("half", "float") + (
        "  y, m, iv = instancenorm(x, g, b, epsilon=0.001, phase=training)\n  output y\n  output m\n  output iv"
    )
    ins, out = reference(graph_text(body, "float"), seed=3)
    x = ins["x"]
    want = F.instance_norm(x, weight=ins["g"].flatten(), bias=ins["b"].flatten(), eps=0.001)
    torch.testing.assert_close(out["y"], want)
    torch.testing.assert_close(out["m"], x.mean((2, 3), keepdim=True))
    torch.testing.assert_close(out["iv"], torch.rsqrt(x.var((2, 3), unbiased=False, keepdim=True) + 0.001))


def test_adalayernorm_matches_layer_norm_with_per_sample_scale():
    body = ADA.replace("half", "float") + "  y, m, iv = adalayernorm(x, g, b, phase=training)\n  output y\n  output m"
    ins, out = reference(graph_text(body + "\n  output iv", "float"), seed=3)
    x = ins["x"]
    torch.testing.assert_close(out["y"], F.layer_norm(x, (64,)) * ins["g"] + ins["b"])
    torch.testing.assert_close(out["m"], x.mean(2, keepdim=True))


def test_genstats_sums_per_channel():
    body = "  input x : float[4, 8, 5, 5] nhwc\n  s, sq = genstats(x)\n  output s\n  output sq"
    ins, out = reference(graph_text(body, "float"), seed=3)
    x = ins["x"]
    torch.testing.assert_close(out["s"], x.sum((0, 2, 3), keepdim=True))
    torch.testing.assert_close(out["sq"], (x * x).sum((0, 2, 3), keepdim=True))


def test_zero_centered_gamma_is_scale_plus_one():
    """The frontend has no flag for it: its sample adds one to the scale in the graph, as the language does."""
    body = LN.replace("bf16", "float") + "  output y = layernorm(x, g + 1, b)\n  output z = layernorm(x, g, b)"
    ins, out = reference(graph_text(body, "float"), seed=3, g=torch.zeros(1, 256, 1, 1))
    x = ins["x"]
    torch.testing.assert_close(out["y"], F.layer_norm(x, (256, 1, 1), None, ins["b"][0]))
    torch.testing.assert_close(out["z"], ins["b"].expand_as(x))


def _rotate_half_reference(x, theta):
    """The usual rotate-half RoPE (as the frontend's own test writes it), angles repeated over both halves."""
    cos, sin = torch.cat((theta.cos(), theta.cos()), -1), torch.cat((theta.sin(), theta.sin()), -1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


ROPE = "  input q : float[2, 3, 16, 8]\n  input f : float[32, 1, 1, 8]\n"


def test_rope_rotates_halves_by_the_raw_angles():
    body = ROPE + "  output y = rope(q, f)\n  output z = rope(q, f, rope_dim=4, output_scale=0.5)"
    ins, out = reference(graph_text(body, "float"), seed=3)
    q, theta = ins["q"], ins["f"][:16, 0, 0, :4]  # the first 16 positions, the first D/2 angles
    torch.testing.assert_close(out["y"], _rotate_half_reference(q, theta))
    # rope_dim=4: the leading 4 dims pass through, the trailing 4 rotate by the first 2 angles; all scaled
    want = torch.cat((q[..., :4], _rotate_half_reference(q[..., 4:], theta[:, :2])), -1) * 0.5
    torch.testing.assert_close(out["z"], want)


def test_rope_rules():
    t = types(ROPE + "  output y = rope(q, f)")
    assert t["y"].shape == (2, 3, 16, 8)
    g = program(text=graph_text(ROPE + "  output y = rope(q, f)"), file="n.cdg").graphs[0]
    assert g.instances[0].attrs(0) == {"rope_dim": 8, "output_scale": 1.0}  # the whole head, written down
    g = program(text=graph_text(ROPE + "  output y = rope(q, f, rope_dim=0)"), file="n.cdg").graphs[0]
    assert g.instances[0].attrs(0)["rope_dim"] == 8  # the frontend's spelling of the same
    msg, _, col = error(ROPE + "  output y = rope(q, f, rope_dim=3)")
    assert msg == "rope: rope_dim must be even and within the head dim 8, got 3" and col == 25
    msg, _, col = error(ROPE.replace("[32, 1, 1, 8]", "[8, 1, 1, 8]") + "  output y = rope(q, f)")
    assert msg.startswith("rope: freqs must be [S, 1, 1, F] with S >= 16 positions") and col == 22
    msg, _, _ = error(ROPE.replace("float[32", "int32[32") + "  output y = rope(q, f)")
    assert msg == "rope: freqs holds angles and must be a float dtype, got int32"
    msg, _, _ = error(ROPE.replace("float[2", "bf16[2") + "  output y : half = rope(q, f)")
    assert msg == "output 'y' is declared half but rope gives bf16"  # cuDNN wants y in x's dtype


# ---- what cuDNN 9.28 plans for an H200, without a GPU --------------------------------------------------

PLANNED = {
    "layernorm": LN + "  y, m, iv = layernorm(x, g, b, phase=training)\n  output y\n  output m\n  output iv",
    "layernorm_zero_centered": LN + "  y, m, iv = layernorm(x, g + 1, b, phase=training)\n  output y\n  output m\n"
    "  output iv",
    "rmsnorm": LN + "  y, iv = rmsnorm(x, g, phase=training)\n  output y\n  output iv",
    "batchnorm": NCHW
    + "  y, m, iv, rm2, rv2 = batchnorm(x, g, b, rm, rv)\n"
    + "".join(f"  output {n}\n" for n in ("y", "m", "iv", "rm2", "rv2")),
    "instancenorm": NCHW.replace("  input rm", "  # rm").replace("  input rv", "  # rv")
    + "  y, m, iv = instancenorm(x, g, b, phase=training)\n  output y\n  output m\n  output iv",
    "instancenorm_inference": NCHW.replace("  input rm", "  # rm").replace("  input rv", "  # rv")
    + "  output y = instancenorm(x, g, b)",
    "adalayernorm": ADA + "  y, m, iv = adalayernorm(x, g, b, phase=training)\n  output y\n  output m\n  output iv",
    "layernorm_bsd": BSD + "  y, m, iv = layernorm(x, g, b, phase=training)\n  output y\n  output m\n  output iv",
    "rmsnorm_bsd": BSD + "  y, iv = rmsnorm(x, g, phase=training)\n  output y\n  output iv",
    "conv_genstats": "  input x : half[4, 32, 16, 16] nhwc\n  input w : half[64, 32, 3, 3] nhwc\n"
    "  y = conv_fprop(x, w, padding=1)\n  s, sq = genstats(y)\n  output y\n  output s\n  output sq",
    # cuDNN writes a layernorm's statistics together and a batchnorm's always: the ones no output asks
    # for go to scratch memory (OpSig.statistics), else it declines the graph.
    "layernorm_mean_only": "  input x : half[512, 256, 1, 1]\n  input g : float[1, 256, 1, 1]\n"
    "  input b : float[1, 256, 1, 1]\n  y, m, iv = layernorm(x, g, b, phase=training)\n  output y\n  output m",
    "batchnorm_y_only": "  input x : half[8, 32, 16, 16] nhwc\n"
    + "".join(f"  input {n} : float[1, 32, 1, 1] nhwc\n" for n in ("g", "b", "rm", "rv"))
    + "  y, m, iv, rm2, rv2 = batchnorm(x, g, b, rm, rv)\n  output y",
    "rope_sdpa": "  input q : bf16[2, 4, 128, 64]\n  input k : bf16[2, 4, 128, 64]\n  input v : bf16[2, 4, 128, 64]\n"
    "  input f : float[128, 1, 1, 64]\n  output qr = rope(q, f)\n  output kr = rope(k, f, rope_dim=32)\n"
    "  output o = sdpa(qr, kr, v, causal=true)",
    "rope_virtual_sdpa": "  input q : bf16[2, 4, 128, 64]\n  input k : bf16[2, 4, 128, 64]\n"
    "  input v : bf16[2, 4, 128, 64]\n  input f : float[4096, 1, 1, 64]\n"
    "  output o = sdpa(rope(q, f, output_scale=0.5), rope(k, f), v)",
}


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target, load_cudnn

    load_cudnn()
    return Target.named("h200")


def _plan(body: str, h200):
    from cudnn_dsl.build.pipeline import compile_shape

    g = program(text=graph_text(body), file="n.cdg").graphs[0]
    return compile_shape(g, g.instances[0], g.options, h200)


@pytest.mark.parametrize("case", list(PLANNED))
def test_cudnn_9_28_plans_the_training_norms_for_an_h200(case, h200):
    assert _plan(PLANNED[case], h200).plan_count >= 1


def test_statistics_no_output_asks_for_are_written_to_scratch(h200):
    assert set(_plan(PLANNED["layernorm_mean_only"], h200).scratch) == {"iv"}
    assert set(_plan(PLANNED["batchnorm_y_only"], h200).scratch) == {"m", "iv", "rm2", "rv2"}
    assert _plan(PLANNED["layernorm"], h200).scratch == {}


@pytest.mark.parametrize(
    "body",
    [
        "  input x : half[4, 32, 16, 16] nhwc\n  s, sq = genstats(x)\n  output s\n  output sq",
        "  input q : bf16[2, 4, 128, 64]\n  input f : float[128, 1, 1, 64]\n  output qr = rope(q, f)",
    ],
    ids=["genstats", "rope"],
)
def test_alone_there_is_no_engine_and_cudnn_says_so_at_the_graph(body, h200):
    # genstats is the statistics epilogue of a convolution, rope the prologue of an attention: on its
    # own, cuDNN 9.28 offers an H200 no engine for either.
    with pytest.raises(DslError, match="create_execution_plans failed") as e:
        _plan(body, h200)
    assert e.value.diagnostics[0].loc.file == "n.cdg"
