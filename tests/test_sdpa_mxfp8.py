"""MXFP8 attention (sdpa_mxfp8): its reference against attention written out one query row at a time on the
block-dequantized values, its shape rules, and cuDNN's deviceless planning for a B200 and the H200."""

import re

import pytest
import torch

from dsl.diagnostics import DslError
from dsl.pipeline import program
from tests.helpers import reference

TEXT = """graph mx {{
  io fp8_e4m3
  input q : fp8_e4m3[{b}, {h}, {s}, {d}]
  input k : fp8_e4m3[{b}, {hk}, {s}, {d}]
  input v : fp8_e4m3[{b}, {hk}, {s}, {d}]
  input sq : fp8_e8m0[{b}, {h}, {s}, {db}]
  input sk : fp8_e8m0[{b}, {hk}, {s}, {db}]
  input sv : fp8_e8m0{sv}
  o, amax, stats = sdpa_mxfp8(q, k, v, sq, sk, sv, {extra})
  output o
  output amax
  output stats
}}
"""


def text(b=1, h=2, hk=1, s=128, d=128, extra="causal=true, stats=true", sv=None):
    sv = sv or f"[{b}, {hk}, {s // 32}, {d}] strides [{hk * s * d // 32}, {s * d // 32}, 1, {s // 32}]"
    return TEXT.format(b=b, h=h, hk=hk, s=s, d=d, db=d // 32, sv=sv, extra=extra)


def by_rows(ins, scale: float):
    """Causal attention one query row at a time in float64, each element times the scale of its block: q's and k's
    blocks of 32 along D, v's along the keys; K/V's one head shared by q's two."""
    q, k, v = (ins[n].double() for n in "qkv")
    sq, sk, sv = (ins[n].double() for n in ("sq", "sk", "sv"))
    _, h, s, d = q.shape
    cols, keys = torch.arange(d) // 32, torch.arange(s) // 32
    o = torch.zeros(1, h, s, d, dtype=torch.float64)
    stats = torch.zeros(1, h, s, 1, dtype=torch.float64)
    kd = k[0, 0] * sk[0, 0][:, cols]
    vd = v[0, 0] * sv[0, 0][keys, :]
    for hh in range(h):
        for i in range(s):
            qi = q[0, hh, i] * sq[0, hh, i, cols]
            scores = (kd[: i + 1] @ qi) * scale
            w = torch.softmax(scores, 0)
            o[0, hh, i] = w @ vd[: i + 1]
            stats[0, hh, i, 0] = torch.logsumexp(scores, 0)
    return o, stats


def _scales(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.exp2(torch.randint(-3, 3, shape, generator=g).float()).to(torch.float8_e8m0fnu)


def test_the_reference_is_attention_on_the_block_dequantized_values():
    t = text()
    g = torch.Generator().manual_seed(0)
    ins = {
        n: torch.randn(1, h, 128, 128, generator=g).to(torch.float8_e4m3fn) for n, h in (("q", 2), ("k", 1), ("v", 1))
    }
    ins.update(sq=_scales((1, 2, 128, 4), 1), sk=_scales((1, 1, 128, 4), 2), sv=_scales((1, 1, 4, 128), 3))
    ins["sv"] = ins["sv"].transpose(-1, -2).contiguous().transpose(-1, -2)  # its declared strides: blocks packed
    _, out = reference(t, seed=0, **ins)
    want_o, want_stats = by_rows(ins, 128**-0.5)
    assert out["o"].dtype == torch.bfloat16
    torch.testing.assert_close(out["o"].double(), want_o.to(torch.bfloat16).double(), atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(out["stats"].double(), want_stats, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        out["amax"].double(), out["o"].double().abs().max().view(1, 1, 1, 1), atol=1e-2, rtol=1e-2
    )


@pytest.mark.parametrize(
    "kw,words",
    [
        (
            {"sv": "[1, 1, 128, 4]"},
            "descale_v [1, 1, 128, 4] must be [1, 1, 4, 128] (one scale per block of 32 along axis -2",
        ),
        ({"s": 64}, "descale_q has 64 rows of 4 blocks; the scales' F8_128x4 layout"),
        ({"d": 64}, "descale_q has 128 rows of 2 blocks"),
    ],
)
def test_scales_the_format_cannot_hold_are_refused_at_the_op(kw, words):
    with pytest.raises(DslError, match=re.escape(words)) as e:
        program(text=text(**kw), file="m.cdg")
    assert str(e.value).startswith("m.cdg:9:")


def test_bf16_values_are_refused():
    t = text().replace("input q : fp8_e4m3", "input q : bf16").replace("input k : fp8_e4m3", "input k : bf16")
    t = t.replace("input v : fp8_e4m3", "input v : bf16")
    with pytest.raises(DslError, match=re.escape("q, k and v must be fp8_e4m3 or fp8_e5m2, got bf16")):
        program(text=t, file="m.cdg")


def test_its_derived_backward_is_refused_with_the_reason():
    from dsl.autodiff import derive
    from tests.helpers import ON_H200

    with pytest.raises(DslError, match="sdpa_mxfp8_backward"):
        derive(program(text=text(), file="m.cdg").graphs[0], avoid=ON_H200)


# ---- deviceless planning ------------------------------------------------------------------------------------

PLANNED = {"b": 2, "h": 2, "hk": 2, "s": 512, "d": 128}


def _plans(t: str, target: str) -> int:
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target, load_cudnn

    load_cudnn()
    g = program(text=t, file="m.cdg").graphs[0]
    return compile_shape(g, g.instances[0], g.options, Target.named(target)).plan_count


@pytest.mark.parametrize("extra", ["causal=true, stats=true", "left_bound=128, right_bound=0, stats=true"])
def test_b200_plans_mxfp8_attention(extra):
    assert _plans(text(**PLANNED, extra=extra), "b200") >= 1


def test_the_h200_refuses_it_at_the_op_saying_it_needs_blackwell():
    with pytest.raises(DslError, match="only supported on Blackwell") as e:
        _plans(text(**PLANNED), "h200")
    assert str(e.value).startswith("m.cdg:9:")
