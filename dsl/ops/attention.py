"""Attention ops: signatures, shape rules, flop counts and VJP rules of sdpa, sdpa_fp8, sdpa_mxfp8 and rope, and of
their backward ops sdpa_backward, sdpa_fp8_backward and rope_backward."""

from __future__ import annotations

import math

from dsl.diagnostics import RuleError
from dsl.ops import quantize
from dsl.ops.base import (
    SECOND_ORDER,
    Ctx,
    Family,
    Out,
    Recompute,
    Rule,
    Statistics,
    by_name,
    flops_per_element,
    row_major,
    same_shape,
)
from dsl.types import TensorType, broadcast, dense_strides, fmt_shape, is_float, stride_order
from dsl.values import DERIVED, Attr

FAMILY = Family(
    "attention",
    ("sdpa", "attention", "alibi", "causal", "diagonal_band", "padding mask", "seq_len", "dropout", "hidden_dim"),
    "half/bf16 q, k, v with head dims that are multiples of 8 (at most 256)",
)


# ---- shape rules -------------------------------------------------------------------


SDPA_ALIGNMENTS = ("top_left", "bottom_right")


def _given(v) -> bool:
    return v is not None and v is not DERIVED


def _derive_band(ctx: Ctx) -> dict:
    """The scale, and the mask in its one IR form: a diagonal band (left and right bounds, None for
    unbounded) with its alignment. `causal`, `causal_bottom_right` and `sliding_window_length` are
    the frontend's older spellings of the band; they fold in here and the IR drops them."""
    a = ctx.attrs
    out = _derive_scale(ctx)
    left, right, align = a["left_bound"], a["right_bound"], a["diagonal_alignment"]
    if a["causal"] and a["causal_bottom_right"]:
        raise RuleError(
            f"{ctx.op}: 'causal' and 'causal_bottom_right' are two alignments of one mask; give one",
            "causal_bottom_right",
        )
    for flag, want in (("causal", "top_left"), ("causal_bottom_right", "bottom_right")):
        if not a[flag]:
            continue
        if right not in (None, 0):
            raise RuleError(f"{ctx.op}: '{flag}' is right_bound=0, but right_bound={right} is given", "right_bound")
        if _given(align) and align != want:
            raise RuleError(
                f"{ctx.op}: '{flag}' is diagonal_alignment={want}, but {align} is given", "diagonal_alignment"
            )
        right, align = 0, want
    window = a["sliding_window_length"]
    if window is not None:
        if left is not None and left != window:
            raise RuleError(
                f"{ctx.op}: sliding_window_length={window} is left_bound={window}, but left_bound={left} is given",
                "left_bound",
            )
        left = window
    if not _given(align):
        align = "top_left"
    return out | {"left_bound": left, "right_bound": right, "diagonal_alignment": align}


def _port(ctx: Ctx, name: str) -> TensorType | None:
    """The optional input `name` of the op, None where not given or where the op has no such port."""
    ports = OPS[ctx.op].inputs + OPS[ctx.op].optional
    return ctx.inputs[ports.index(name)] if name in ports else None


def _derive_scale(ctx: Ctx) -> dict:
    """The softmax scale: as given, 1/sqrt(D) by default, or None where the attn_scale input carries it
    (a host scalar, set per call)."""
    given = ctx.attrs["scale"]
    if _port(ctx, "attn_scale") is None:
        return {} if given is not DERIVED else {"scale": 1.0 / math.sqrt(ctx.inputs[0].shape[-1])}
    if given is not DERIVED:
        raise RuleError(f"{ctx.op}: scale={given} and attn_scale are two forms of the scale; give one", "scale")
    return {"scale": None}


def _sdpa_sink_and_scale(ctx: Ctx) -> None:
    """sink_token: one float logit per query head, [1, H, 1, 1], in every softmax denominator; attn_scale:
    the scale, one float [1, 1, 1, 1] (a host scalar meets sdpa at rank 4; or an input in device memory)."""
    h = ctx.inputs[0].shape[1]
    for name, want, what in (
        ("sink_token", (1, h, 1, 1), "one logit per query head"),
        ("attn_scale", (1, 1, 1, 1), "one number"),
    ):
        t = _port(ctx, name)
        if t is not None and (t.dtype != "float" or t.shape != want):
            at = (OPS[ctx.op].inputs + OPS[ctx.op].optional).index(name)
            raise RuleError(
                f"{ctx.op}: {name} must be float{fmt_shape(want)}, {what}; got {t.dtype}{fmt_shape(t.shape)}", at
            )


def derive_sdpa(ctx: Ctx) -> dict:
    """The band (_derive_band), and S_kv of paged K/V."""
    a = ctx.attrs
    seq, table, k = a["max_seq_len_kv"], ctx.inputs[8], ctx.inputs[1]
    if table is None and seq is not DERIVED:
        raise RuleError(f"{ctx.op}: max_seq_len_kv is for paged K/V (page_table_k, page_table_v)", "max_seq_len_kv")
    if table is None:
        seq = None
    elif seq is DERIVED:  # the shape rule checks the ranks
        seq = table.shape[2] * k.shape[2] if len(table.shape) == 4 and len(k.shape) == 4 else 1
    return _derive_band(ctx) | {"max_seq_len_kv": seq}


def _sdpa_rank4(ctx: Ctx, i: int, what: str) -> TensorType:
    t = ctx.inputs[i]
    if len(t.shape) != 4:
        raise RuleError(f"{ctx.op}: {what} must be [B, H, S, D], got {fmt_shape(t.shape)}", i)
    return t


def _sdpa_optional(ctx: Ctx, i: int, want: tuple[int, ...], what: str, dtypes: tuple[str, ...] | None) -> None:
    """An optional input that broadcasts to `want`, of one of `dtypes` (None: any float)."""
    t = ctx.inputs[i]
    if t is None:
        return
    name = OPS[ctx.op].optional[i - len(OPS[ctx.op].inputs)]
    if len(t.shape) != 4 or broadcast(t.shape, want) != want:
        raise RuleError(f"{ctx.op}: {name} {fmt_shape(t.shape)} must be {what} (broadcasting to {fmt_shape(want)})", i)
    if dtypes is None and not is_float(t.dtype) or dtypes is not None and t.dtype not in dtypes:
        raise RuleError(f"{ctx.op}: {name} is {t.dtype}; it must be {' or '.join(dtypes or ('a float type',))}", i)


def _sdpa_pair(ctx: Ctx, first: int, second: int) -> None:
    names = OPS[ctx.op].optional
    base = len(OPS[ctx.op].inputs)
    a, b = ctx.inputs[first], ctx.inputs[second]
    if (a is None) != (b is None):
        have, need = (first, second) if a is not None else (second, first)
        raise RuleError(f"{ctx.op}: {names[have - base]} needs {names[need - base]} too", have)


def _sdpa_paging(ctx: Ctx) -> None:
    """Paged K/V: k and v are caches of blocks [N, H_kv, block, D]; each page table, int32
    [B, 1, pages, 1], lists a sequence's blocks; max_seq_len_kv keys fit in its pages."""
    q, k, v = ctx.inputs[:3]
    _sdpa_pair(ctx, 8, 9)
    if ctx.inputs[4] is None:
        raise RuleError(f"{ctx.op}: paged K/V needs seq_len_q and seq_len_kv (cuDNN pages padded batches)", 8)
    b = q.shape[0]
    for i, cache in ((8, k), (9, v)):
        t = ctx.inputs[i]
        name = OPS[ctx.op].optional[i - 3]
        if t.dtype != "int32" or len(t.shape) != 4 or t.shape[0] != b or t.shape[1] != 1 or t.shape[3] != 1:
            raise RuleError(f"{ctx.op}: {name} must be int32[{b}, 1, pages, 1], got {t.dtype}{fmt_shape(t.shape)}", i)
        if t.shape[2] * cache.shape[2] < ctx.attrs["max_seq_len_kv"]:
            raise RuleError(
                f"{ctx.op}: {name} has {t.shape[2]} pages of {cache.shape[2]} keys, fewer than "
                f"max_seq_len_kv={ctx.attrs['max_seq_len_kv']}",
                "max_seq_len_kv",
            )


def domains_sdpa(ctx: Ctx) -> dict[int, tuple[int, int]]:
    """seq_len_q in [1, S_q], seq_len_kv in [1, S_kv]; a page table's entries are K's (V's) blocks."""
    q, k, v = ctx.inputs[:3]
    return {4: (1, q.shape[2]), 5: (1, _kv_len(ctx)), 8: (0, k.shape[0] - 1), 9: (0, v.shape[0] - 1)}


def _paged(ctx: Ctx) -> bool:
    return ctx.inputs[8] is not None


def _kv_len(ctx: Ctx) -> int:
    """S_kv: K's sequence axis, or with page tables the `max_seq_len_kv` the tables cover."""
    return ctx.attrs["max_seq_len_kv"] if ctx.op == "sdpa" and _paged(ctx) else ctx.inputs[1].shape[2]


def infer_sdpa(ctx: Ctx) -> list[Out]:
    q, k, v = _sdpa_qkv(ctx)
    skv = _kv_len(ctx)
    scores = (q.shape[0], q.shape[1], q.shape[2], skv)
    _sdpa_optional(ctx, 3, scores, "[B or 1, H or 1, S_q or 1, S_kv or 1]", None)
    _sdpa_pair(ctx, 4, 5)
    b = q.shape[0]
    for i in (4, 5):
        t = ctx.inputs[i]
        if t is not None and (t.shape != (b, 1, 1, 1) or t.dtype != "int32"):
            raise RuleError(
                f"{ctx.op}: {OPS[ctx.op].optional[i - 3]} must be int32[{b}, 1, 1, 1], one length per batch; "
                f"got {t.dtype}{fmt_shape(t.shape)}",
                i,
            )
    _sdpa_pair(ctx, 6, 7)
    _sdpa_optional(ctx, 6, scores, "[B or 1, H or 1, S_q or 1, S_kv or 1]", None)
    _sdpa_optional(ctx, 7, (1, 1, 1, 1), "[1, 1, 1, 1]", ("float",))
    _sdpa_sink_and_scale(ctx)
    seeded = _sdpa_seeded(ctx)
    _sdpa_ragged(ctx)
    o_order = BSHD if ctx.inputs[13] is not None else stride_order(q.strides)
    outs = [Out((*scores[:3], v.shape[3]), o_order)]
    if ctx.attrs["stats"]:
        outs.append(Out((*scores[:3], 1), BSHD if ctx.inputs[14] is not None else row_major(4), "float"))
    if seeded:
        outs.append(Out(scores, row_major(4), "float"))
    return outs


def _sdpa_seeded(ctx: Ctx) -> bool:
    """Seeded dropout: dropout_probability in [0, 1) with dropout_seed and dropout_offset, int64 [1, 1, 1, 1]
    (the frontend's dropout=(p, seed, offset)); not with the mask form. cuDNN draws the mask."""
    p, names = ctx.attrs["dropout_probability"], OPS[ctx.op].optional
    given = [i for i in (15, 16) if ctx.inputs[i] is not None]
    if p is None:
        if given:
            raise RuleError(
                f"{ctx.op}: {names[given[0] - 3]} is for seeded dropout: give dropout_probability", given[0]
            )
        return False
    if p >= 1:
        raise RuleError(
            f"{ctx.op}: dropout_probability must be below 1 (it drops every value), got {p}", "dropout_probability"
        )
    if ctx.inputs[6] is not None:
        raise RuleError(
            f"{ctx.op}: dropout_mask and dropout_probability are two forms of dropout; give one", "dropout_probability"
        )
    for i in (15, 16):
        t = ctx.inputs[i]
        if t is None:
            raise RuleError(
                f"{ctx.op}: dropout_probability needs dropout_seed and dropout_offset", "dropout_probability"
            )
        if t.dtype != "int64" or t.shape != (1, 1, 1, 1):
            raise RuleError(f"{ctx.op}: {names[i - 3]} must be int64[1, 1, 1, 1], got {t.dtype}{fmt_shape(t.shape)}", i)
    return True


BSHD = (0, 2, 1, 3)
"""the axis order of packed (THD) attention tensors [B, H, S, D]: tokens outermost, heads, head dim"""


def _sdpa_ragged(ctx: Ctx) -> None:
    """Ragged offsets (THD): each int32/int64 [B+1] (as flashinfer passes them) or [B+1, 1, 1, 1], with the
    padding lengths (they say where a sequence ends), on a q, k or v packed as BSHD; ragged_stats with
    stats=true, no paged k/v."""
    names, base, b = OPS[ctx.op].optional, len(OPS[ctx.op].inputs), ctx.inputs[0].shape[0]
    for i in range(10, 15):
        t = ctx.inputs[i]
        if t is None:
            continue
        name = names[i - base]
        if t.dtype not in ("int32", "int64") or t.shape not in ((b + 1,), (b + 1, 1, 1, 1)):
            raise RuleError(
                f"{ctx.op}: {name} must be int32 or int64[{b + 1}] (or [{b + 1}, 1, 1, 1]), each sequence's first "
                f"element and one past the last; got {t.dtype}{fmt_shape(t.shape)}",
                i,
            )
        if ctx.inputs[4] is None:
            raise RuleError(f"{ctx.op}: {name} needs seq_len_q and seq_len_kv (the lengths of the packed sequences)", i)
        if i == 14 and not ctx.attrs["stats"]:
            raise RuleError(f"{ctx.op}: {name} places the stats, which need stats=true", i)
        if i in (11, 12) and _paged(ctx):
            raise RuleError(f"{ctx.op}: {name}: paged k and v are caches of blocks, not packed sequences", i)
        if i < 13:
            x = ctx.inputs[i - 10]
            want = dense_strides(x.shape, BSHD)
            left = x.strides[0] == 0  # the batch stride left to the offsets (`_`): the memory is one batch slice
            if any(d > 1 and s != w for d, s, w in list(zip(x.shape, x.strides, want))[left:]):
                raise RuleError(
                    f"{ctx.op}: {name} packs {'qkv'[i - 10]} as BSHD (THD): its strides must be "
                    f"{_bshd(want, left)}, got {_bshd(x.strides, left)}",
                    i,
                )


def _bshd(strides, left: bool) -> str:
    """Strides as declared: `_` for a batch stride left to the offsets."""
    return "[" + ", ".join(["_" if left else str(strides[0]), *map(str, strides[1:])]) + "]"


def _sdpa_qkv(ctx: Ctx) -> tuple[TensorType, TensorType, TensorType]:
    """q, k, v checked against each other: ranks, dtypes, batch, head dims, grouped heads."""
    q, k, v = (_sdpa_rank4(ctx, i, "qkv"[i]) for i in range(3))
    if not (q.dtype == k.dtype == v.dtype):
        raise RuleError(f"{ctx.op}: dtype conflict: q {q.dtype}, k {k.dtype}, v {v.dtype}", 1)
    b, h, s, d = q.shape
    if ctx.op == "sdpa" and _paged(ctx):
        _sdpa_paging(ctx)
    elif k.shape[0] != b or v.shape[0] != b:
        raise RuleError(
            f"{ctx.op}: batch differs: q {fmt_shape(q.shape)}, k {fmt_shape(k.shape)}, v {fmt_shape(v.shape)}", 1
        )
    if k.shape[3] != d:
        raise RuleError(f"{ctx.op}: head dim differs: q has D={d}, k has D={k.shape[3]}", 1)
    for i, t in ((1, k), (2, v)):
        if h % t.shape[1]:
            raise RuleError(
                f"{ctx.op}: {'qkv'[i]} has {t.shape[1]} heads, which do not divide q's {h} (grouped-query heads)", i
            )
    if k.shape[2] != v.shape[2]:
        what = "keys per block" if ctx.op == "sdpa" and _paged(ctx) else "keys"
        raise RuleError(f"{ctx.op}: k has {k.shape[2]} {what}, v has {v.shape[2]}", 2)
    return q, k, v


def infer_sdpa_fp8(ctx: Ctx) -> list[Out]:
    q, k, v = _sdpa_qkv(ctx)
    if q.dtype != "fp8_e4m3":  # e5m2 would change the dtype P is quantized to: not modelled
        raise RuleError(f"{ctx.op}: q, k and v must be fp8_e4m3, got {q.dtype}", 0)
    _fp8_factors(ctx, range(3, 9))
    b, h, s, _ = q.shape
    outs = [Out((b, h, s, v.shape[3]), stride_order(q.strides)), Out((1, 1, 1, 1), row_major(4), "float")]
    if ctx.attrs["stats"]:
        outs.append(Out((b, h, s, 1), row_major(4), "float"))
    return outs


def _fp8_factors(ctx: Ctx, ports) -> None:
    """FP8 attention's scales and descales: one float each, [1, 1, 1, 1]."""
    for i in ports:
        t = ctx.inputs[i]
        if t.shape != (1, 1, 1, 1) or t.dtype != "float":
            name = OPS[ctx.op].inputs[i]
            raise RuleError(f"{ctx.op}: {name} must be float[1, 1, 1, 1], got {t.dtype}{fmt_shape(t.shape)}", i)


def infer_sdpa_fp8_backward(ctx: Ctx) -> list[Out]:
    """q, k, v as sdpa_fp8 takes them; o (the forward's, times its scale_o) and do [B, H, S_q, D_v] fp8_e4m3 (an
    fp8_e5m2 do would change the dtype dS is quantized to: not modelled); stats [B, H, S_q, 1] float; the twelve
    factors float [1, 1, 1, 1]. Results: dq, dk, dv like q, k, v (cuDNN 9.28 writes half/bf16 ones on Blackwell
    only), then the four amaxes, float [1, 1, 1, 1]."""
    q, k, v = _sdpa_qkv(ctx)
    b, h, s, _ = q.shape
    o_shape = (b, h, s, v.shape[3])
    for i in (0, 3, 4):
        name = OPS[ctx.op].inputs[i]
        if i:
            _sdpa_rank4(ctx, i, name)
            same_shape(ctx, OPS[ctx.op], i, o_shape, "attention's output: [B, H, S_q, D_v]")
        if ctx.inputs[i].dtype != "fp8_e4m3":
            raise RuleError(f"{ctx.op}: {name} must be fp8_e4m3, got {ctx.inputs[i].dtype}", i)
    same_shape(ctx, OPS[ctx.op], 5, (b, h, s, 1), "the forward's softmax stats: [B, H, S_q, 1]")
    if ctx.inputs[5].dtype != "float":
        raise RuleError(f"{ctx.op}: stats is {ctx.inputs[5].dtype}; the forward's softmax stats are float", 5)
    _fp8_factors(ctx, range(6, 18))
    grads = [Out(t.shape, stride_order(t.strides), t.dtype) for t in (q, k, v)]
    return grads + [Out((1, 1, 1, 1), row_major(4), "float")] * 4


def infer_sdpa_mxfp8(ctx: Ctx) -> list[Out]:
    """q, k, v fp8 (MXFP8 values) as sdpa takes them; descale_q [B, H, S_q, D/32] and descale_k [B, H_k, S_kv, D/32]
    their blocks of 32 along D, descale_v [B, H_v, S_kv/32, D_v] its blocks along the keys (the second matmul
    sums over them), each fp8_e8m0 in whole F8_128x4 tiles. O [B, H, S_q, D_v] (bf16 unless declared half), then
    amax_o float [1, 1, 1, 1] and, with stats, the softmax stats."""
    q, k, v = _sdpa_qkv(ctx)
    if q.dtype not in quantize.VALUES:
        raise RuleError(f"{ctx.op}: q, k and v must be {' or '.join(quantize.VALUES)}, got {q.dtype}", 0)
    for i, (t, axis) in enumerate(((q, -1), (k, -1), (v, -2))):
        if t.shape[axis] % quantize.BLOCK:
            raise RuleError(
                f"{ctx.op}: {'qkv'[i]} {fmt_shape(t.shape)} is not in blocks of {quantize.BLOCK} along axis {axis}", i
            )
        quantize.block_scales(ctx, 3 + i, f"descale_{'qkv'[i]}", t.shape, axis)
    b, h, s, _ = q.shape
    outs = [Out((b, h, s, v.shape[3]), stride_order(q.strides)), Out((1, 1, 1, 1), row_major(4), "float")]
    if ctx.attrs["stats"]:
        outs.append(Out((b, h, s, 1), row_major(4), "float"))
    return outs


def derive_rope(ctx: Ctx) -> dict:
    """rope_dim left out, or 0 as the frontend spells it: the whole head dim, written down."""
    return {"rope_dim": ctx.inputs[0].shape[-1]} if ctx.attrs["rope_dim"] in (DERIVED, 0) else {}


def infer_rope(ctx: Ctx) -> list[Out]:
    """x [B, H, S, D] rotated by the raw angles freqs [S', 1, 1, F] (S' >= S, F >= rope_dim), cuDNN's layout."""
    x, freqs = ctx.inputs
    if len(x.shape) != 4:
        raise RuleError(f"{ctx.op}: x must be [B, H, S, D], got {fmt_shape(x.shape)}", 0)
    s, d = x.shape[2], x.shape[3]
    r = ctx.attrs["rope_dim"]
    if r % 2 or not 2 <= r <= d:
        raise RuleError(f"{ctx.op}: rope_dim must be even and within the head dim {d}, got {r}", "rope_dim")
    if not is_float(freqs.dtype):
        raise RuleError(f"{ctx.op}: freqs holds angles and must be a float dtype, got {freqs.dtype}", 1)
    if len(freqs.shape) != 4 or freqs.shape[1:3] != (1, 1) or freqs.shape[0] < s or freqs.shape[3] < r:
        raise RuleError(
            f"{ctx.op}: freqs must be [S, 1, 1, F] with S >= {s} positions and F >= rope_dim {r} angles, "
            f"got {fmt_shape(freqs.shape)}",
            1,
        )
    return [Out(x.shape, stride_order(x.strides), x.dtype)]  # cuDNN wants y in x's dtype


def flops_sdpa(ctx: Ctx, outs) -> int:
    """2 * (d_qk + d_v) per (query, key) pair the band lets through (padding not counted)."""
    q, k, v = ctx.inputs[:3]
    b, h, s, d = q.shape
    skv = _kv_len(ctx)
    left, right = ctx.attrs["left_bound"], ctx.attrs["right_bound"]
    shift = skv - s if ctx.attrs["diagonal_alignment"] == "bottom_right" else 0
    pairs = sum(
        max(
            0,
            min(skv, i + shift + 1 + (skv if right is None else right))
            - max(0, i + shift + 1 - (skv + s if left is None else left)),
        )
        for i in range(s)
    )
    return 2 * b * h * pairs * (d + v.shape[3])


def infer_sdpa_backward(ctx: Ctx) -> list[Out]:
    """q, k, v as sdpa takes them; o and do [B, H, S_q, D_v]; stats [B, H, S_q, 1] float; the optional
    inputs as sdpa's. Results: dq, dk, dv like q, k, v, in their dtypes (on the H200, cuDNN 9.19 wrote float
    dq, dk and dv wrong: a derived backward whose gradients went on to a reshape materialized them float)."""
    q, k, v = _sdpa_qkv(ctx)
    b, h, s, _ = q.shape
    o_shape = (b, h, s, v.shape[3])
    for i in (3, 4):
        _sdpa_rank4(ctx, i, ("o", "do")[i - 3])
        same_shape(ctx, OPS[ctx.op], i, o_shape, "attention's output: [B, H, S_q, D_v]")
        if ctx.inputs[i].dtype != q.dtype:
            raise RuleError(f"{ctx.op}: dtype conflict: q {q.dtype}, {('o', 'do')[i - 3]} {ctx.inputs[i].dtype}", i)
    same_shape(ctx, OPS[ctx.op], 5, (b, h, s, 1), "the forward's softmax stats: [B, H, S_q, 1]")
    if ctx.inputs[5].dtype != "float":
        raise RuleError(f"{ctx.op}: stats is {ctx.inputs[5].dtype}; the forward's softmax stats are float", 5)
    scores = (b, h, s, k.shape[2])
    _sdpa_optional(ctx, 6, scores, "[B or 1, H or 1, S_q or 1, S_kv or 1]", None)
    _sdpa_pair(ctx, 7, 8)
    for i in (7, 8):
        same_shape(ctx, OPS[ctx.op], i, (b, 1, 1, 1), "one length per batch")
        if ctx.inputs[i] is not None and ctx.inputs[i].dtype != "int32":
            raise RuleError(f"{ctx.op}: {OPS[ctx.op].optional[i - 6]} must be int32, got {ctx.inputs[i].dtype}", i)
    _sdpa_pair(ctx, 9, 10)
    _sdpa_pair(ctx, 9, 11)
    _sdpa_optional(ctx, 9, scores, "[B or 1, H or 1, S_q or 1, S_kv or 1]", None)
    _sdpa_optional(ctx, 10, (1, 1, 1, 1), "[1, 1, 1, 1]", ("float",))
    _sdpa_optional(ctx, 11, (1, 1, 1, 1), "[1, 1, 1, 1]", ("float",))
    _sdpa_sink_and_scale(ctx)
    outs = [Out(t.shape, stride_order(t.strides), t.dtype) for t in (q, k, v)]
    if ctx.attrs["dbias"]:
        bias = ctx.inputs[6]
        if bias is None:
            raise RuleError(f"{ctx.op}: dbias is the gradient of the bias: give the forward's bias (bias=...)", "dbias")
        outs.append(Out(bias.shape, stride_order(bias.strides)))
    if ctx.attrs["dsink"]:
        sink = ctx.inputs[12]
        if sink is None:
            raise RuleError(f"{ctx.op}: dsink is the gradient of the sink: give the forward's sink_token", "dsink")
        outs.append(Out(sink.shape, row_major(4), "float"))
    return outs


def domains_sdpa_backward(ctx: Ctx) -> dict[int, tuple[int, int]]:
    return {7: (1, ctx.inputs[0].shape[2]), 8: (1, ctx.inputs[1].shape[2])}


def flops_sdpa_backward(ctx: Ctx, outs) -> int:
    """Two and a half times the forward's: P recomputed, then dV, dP, dQ and dK, one matmul each."""
    return 5 * flops_sdpa(ctx, outs) // 2


# ---- the rows ----------------------------------------------------------------------

_BAND_ATTRS = (
    Attr(
        "scale",
        "float",
        DERIVED,
        doc="softmax scale, attn_scale (default 1/sqrt(D); none where the attn_scale input carries it)",
        hi=None,
        optional=True,
    ),
    Attr(
        "diagonal_alignment",
        "enum",
        DERIVED,
        SDPA_ALIGNMENTS,
        doc="where the band's diagonal starts: query 0 at key 0, or the last query at the last key "
        "(per sequence with padding) (default top_left)",
    ),
    Attr(
        "left_bound",
        "int",
        None,
        doc="key j is seen by query i only if j > i - left_bound (diagonal_band_left_bound; default: none)",
        lo=1,
        optional=True,
    ),
    Attr(
        "right_bound",
        "int",
        None,
        doc="key j is seen by query i only if j <= i + right_bound (diagonal_band_right_bound; default: none)",
        lo=0,
        optional=True,
    ),
    Attr("causal", "bool", False, doc="right_bound=0, top_left (use_causal_mask)"),
    Attr("causal_bottom_right", "bool", False, doc="right_bound=0, bottom_right (use_causal_mask_bottom_right)"),
    Attr("sliding_window_length", "int", None, doc="left_bound, in the frontend's older spelling", lo=1, optional=True),
)
"""the attributes sdpa and sdpa_fp8 share: the scale and the diagonal band in every spelling"""
_FOLDED = ("causal", "causal_bottom_right", "sliding_window_length")
"""the band's older spellings, which _derive_band folds into the bounds"""

OPS = by_name(
    FAMILY.op(
        "sdpa",
        ("q", "k", "v"),
        infer_sdpa,
        inner_tensors=True,
        optional=(
            "bias",
            "seq_len_q",
            "seq_len_kv",
            "dropout_mask",
            "dropout_scale",
            "page_table_k",
            "page_table_v",
            "ragged_q",
            "ragged_k",
            "ragged_v",
            "ragged_o",
            "ragged_stats",
            "dropout_seed",
            "dropout_offset",
            "sink_token",
            "attn_scale",
        ),
        by_value=("dropout_scale", "attn_scale"),
        ragged=((10, 0, 4), (11, 1, 5), (12, 2, 5), (13, -1, 4), (14, -2, 4)),
        flops=flops_sdpa,
        derive=derive_sdpa,
        folded=_FOLDED,
        domains=domains_sdpa,
        block_tables=(8, 9),
        attrs=(
            *_BAND_ATTRS,
            Attr("alibi", "bool", False, doc="add the ALiBi bias, slope per head (use_alibi_mask)"),
            Attr(
                "max_seq_len_kv",
                "int",
                DERIVED,
                doc="with page tables: the keys a sequence may have (paged_attention_max_seq_len_kv; default "
                "pages * block)",
                lo=1,
            ),
            Attr(
                "stats",
                "bool",
                False,
                doc="also return the softmax stats (log-sum-exp) [B,H,S,1] float (generate_stats)",
            ),
            Attr(
                "dropout_probability",
                "float",
                None,
                lo=0,
                hi=None,
                optional=True,
                doc="seeded dropout, with dropout_seed and dropout_offset: cuDNN draws the mask (keep with "
                "1 - p) and returns it last, float [B,H,S_q,S_kv] (dropout=(p, seed, offset), rng_dump)",
            ),
        ),
        outputs=("o", "stats"),  # the results a stats switch gives (autodiff); seeded dropout's mask comes last
        statistics=Statistics(switch=("stats", True)),
        # the given attributes: stats defaults to false; seeded dropout adds the mask cuDNN drew
        results=lambda a: 1 + bool(a.get("stats")) + (a.get("dropout_probability") is not None),
        doc="scaled dot-product attention: softmax(q k^T * scale + bias + masks) v. seq_len_q/seq_len_kv "
        "(int32 [B,1,1,1], both or neither) mask padding; dropout_mask and dropout_scale ([1,1,1,1] float, or a "
        "float scalar) "
        "multiply the probabilities, or dropout_seed and dropout_offset (int64 [1,1,1,1]) with "
        "dropout_probability draw the mask on the GPU; sink_token (float [1,H,1,1]) adds a logit per head to every "
        "softmax denominator (attention sinks); attn_scale (a float scalar, set per call) is the scale in place of "
        "`scale`; page_table_k/page_table_v (int32 [B,1,pages,1]) make k and v "
        "caches of blocks [N,H,block,D]; ragged_q/k/v/o/stats (int32 or int64 [B+1] or [B+1,1,1,1], with the lengths) "
        "place each sequence of a packed (THD) tensor",
    ),
    FAMILY.op(
        "sdpa_fp8",
        ("q", "k", "v", "descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"),
        infer_sdpa_fp8,
        inner_tensors=True,
        flops=flops_sdpa,
        derive=_derive_band,
        folded=_FOLDED,
        positive=(3, 4, 5, 6, 7, 8),
        attrs=(
            *_BAND_ATTRS,
            Attr("stats", "bool", False, doc="also return the softmax stats [B,H,S,1] float, third (generate_stats)"),
        ),
        outputs=("o", "amax_o", "stats"),
        statistics=Statistics(switch=("stats", True)),
        results=lambda a: 3 if a.get("stats") else 2,
        doc="FP8 attention: q, k, v fp8_e4m3 with their float [1,1,1,1] descales; the probabilities quantized "
        "with scale_s (descale_s undoes it), O scaled by scale_o; amax_o = max |O| before scale_o",
    ),
    FAMILY.op(
        "rope",
        ("x", "freqs"),
        infer_rope,
        derive=derive_rope,
        attrs=(
            Attr("rope_dim", "int", DERIVED, lo=0, doc="the trailing dims rotated (default, or 0: all of D)"),
            Attr("output_scale", "float", 1.0, hi=None, doc="multiplies the whole output"),
        ),
        flops=flops_per_element(4),
        doc="rotary embedding, halves rotated by the angles freqs[s, 0, 0, :rope_dim/2]; x [B, H, S, D], "
        "freqs [S, 1, 1, F]; the first D - rope_dim dims pass through (scaled)",
    ),
)
OPS |= by_name(
    FAMILY.op(
        "sdpa_mxfp8",
        ("q", "k", "v", "descale_q", "descale_k", "descale_v"),
        infer_sdpa_mxfp8,
        inner_tensors=True,
        flops=flops_sdpa,
        derive=_derive_band,
        folded=_FOLDED,
        positive=(3, 4, 5),
        attrs=OPS["sdpa_fp8"].attrs,
        outputs=("o", "amax_o", "stats"),
        statistics=Statistics(switch=("stats", True)),
        results=lambda a: 3 if a.get("stats") else 2,
        result_dtype="bf16",
        doc="MXFP8 attention (sm_100+): q, k, v fp8 with fp8_e8m0 block scales (blocks of 32 along D for q and k, "
        "along the keys for v); softmax(q k^T * scale) v on the dequantized values, O bf16 or half; "
        "amax_o = max |O|",
    ),
)

BACKWARD_OPS = by_name(
    FAMILY.op(
        "rope_backward",
        ("dy", "freqs"),
        infer_rope,
        derive=derive_rope,
        attrs=OPS["rope"].attrs,
        flops=flops_per_element(4),
        doc="the gradient of rope(x, freqs) from dy: dy rotated back by the same angles (times output_scale)",
    ),
    FAMILY.op(
        "sdpa_backward",
        ("q", "k", "v", "o", "do", "stats"),
        infer_sdpa_backward,
        inner_tensors=True,
        optional=(
            "bias",
            "seq_len_q",
            "seq_len_kv",
            "dropout_mask",
            "dropout_scale",
            "dropout_scale_inv",
            "sink_token",
            "attn_scale",
        ),
        by_value=("dropout_scale", "dropout_scale_inv", "attn_scale"),
        flops=flops_sdpa_backward,
        derive=_derive_band,
        folded=_FOLDED,
        domains=domains_sdpa_backward,
        attrs=(
            *_BAND_ATTRS,
            Attr("alibi", "bool", False, doc="the ALiBi bias was added (use_alibi_mask)"),
            Attr(
                "deterministic",
                "bool",
                False,
                doc="the same bits every run: no atomic accumulation of dq (use_deterministic_algorithm)",
            ),
            Attr("dbias", "bool", False, doc="also return the bias's gradient, bias's shape, fourth (dBias)"),
            Attr(
                "dsink",
                "bool",
                False,
                doc="also return the sink's gradient, float [1,H,1,1], after dbias (dSink_token)",
            ),
        ),
        outputs=("dq", "dk", "dv", "dbias", "dsink_token"),  # dbias and dsink_token each where asked for
        results=lambda a: 3 + bool(a.get("dbias")) + bool(a.get("dsink")),
        doc="the gradients of sdpa(q, k, v, ...) from do, its output o and its softmax stats (sdpa's `stats=true`), "
        "with the forward's scale (or attn_scale), masks, bias, sink and dropout (the frontend's backward also takes "
        "dropout_scale_inv, 1 / dropout_scale): dq, dk, dv like q, k, v",
    ),
)
BACKWARD_OPS |= by_name(
    FAMILY.op(
        "sdpa_fp8_backward",
        (
            "q",
            "k",
            "v",
            "o",
            "do",
            "stats",
            "descale_q",
            "descale_k",
            "descale_v",
            "descale_o",
            "descale_do",
            "descale_s",
            "descale_dp",
            "scale_s",
            "scale_dq",
            "scale_dk",
            "scale_dv",
            "scale_dp",
        ),
        infer_sdpa_fp8_backward,
        inner_tensors=True,
        flops=flops_sdpa_backward,
        derive=_derive_band,
        folded=_FOLDED,
        positive=tuple(range(6, 18)),
        by_value=("descale_dp", "scale_dp"),
        attrs=(*_BAND_ATTRS, BACKWARD_OPS["sdpa_backward"].attr("deterministic")),
        outputs=("dq", "dk", "dv", "amax_dq", "amax_dk", "amax_dv", "amax_dp"),
        results=lambda a: 7,
        doc="the gradients of sdpa_fp8(q, k, v, ...) from do (fp8, do * descale_do the loss gradient of the "
        "forward's O before scale_o), its output o (o * descale_o that O) and its stats (sdpa_fp8's `stats=true`), "
        "with the forward's scale, band, descales and scale_s: P is quantized as the forward did, dS with scale_dp "
        "(descale_dp undoes it; a float scalar may feed either); dq, dk, dv like q, k, v, times scale_dq, scale_dk, "
        "scale_dv; each amax the max |x| before its scale",
    ),
)
"""the frontend's backward ops of attention: the loss gradient and what the forward saved"""
OPS |= BACKWARD_OPS


# ---- VJP rules ---------------------------------------------------------------------


def _rope(e, n):
    """The rotation's transpose is the rotation by the negated angles (output_scale and the unrotated
    leading dims as in the forward)."""
    if n.need[1]:
        raise RuleError("rope: the gradient in freqs (the angles) is not derived; only x's")
    return (e.call("rope", n.dy, e.call("neg", e.fwd(n.inputs[1])), **n.attrs), None)


def _sdpa_keep(e, n, s, transposed: bool):
    """The diagonal band's mask over scores s ([S_q, S_kv], or [S_kv, S_q] transposed); None: no band."""
    a = n.attrs
    if a["left_bound"] is None and a["right_bound"] is None:
        return None
    i = e.call("gen_index", s, axis=3 if transposed else 2)  # the query
    j = e.call("gen_index", s, axis=2 if transposed else 3)  # the key
    diagonal = e.call("sub", j, i)
    if a["diagonal_alignment"] == "bottom_right":
        q, k = n.ins[0], n.ins[1]
        diagonal = e.call("sub", diagonal, float(k.shape[2] - q.shape[2]))
    keep = [e.call("cmp_le", diagonal, float(a["right_bound"]))] if a["right_bound"] is not None else []
    keep += [e.call("cmp_gt", diagonal, float(-a["left_bound"]))] if a["left_bound"] is not None else []
    return keep[0] if len(keep) == 1 else e.call("logical_and", *keep)


_SDPA_BACKWARD_TAKES = ("bias", "seq_len_q", "seq_len_kv", "sink_token", "attn_scale")
"""sdpa's optional inputs that sdpa_backward is given as they are (dropout would need 1 / dropout_scale,
pages and ragged offsets it does not take)"""


def _sdpa(e, n):
    """sdpa_backward from the saved output and softmax statistics, with the forward's scale (or attn_scale),
    band, ALiBi, bias (dbias where the bias wants a gradient), sink (dsink where it wants one), padding and
    grouped heads, when dq, dk and dv are all wanted (an unread result of the fused op is not left dangling)
    and the output is in q's dtype (as the op reads it); else the composite below."""
    q = n.ins[0]
    optional = OPS["sdpa"].optional
    given = dict(zip(optional, n.inputs[3:]))
    if (
        not all(n.need[:3])
        or n.outs[0].dtype != q.dtype
        or any(a is not None for k, a in given.items() if k not in _SDPA_BACKWARD_TAKES)
    ):
        return _sdpa_composite(e, n)
    (stats,) = e.stats(n, 1)
    bwd = OPS["sdpa_backward"]
    attrs = {a.name: n.attrs[a.name] for a in bwd.attrs if n.attrs.get(a.name) is not None and a.name not in bwd.folded}
    want = {k: given[k] is not None and n.need[3 + optional.index(k)] for k in ("bias", "sink_token")}
    ins = [e.fwd(i) for i in n.inputs[:3]] + [e.fwd(n.out), e.cast(n.dy, q.dtype), stats]
    ins += [e.fwd(given[k]) if k in _SDPA_BACKWARD_TAKES and given[k] else None for k in bwd.optional]
    grads = e.call("sdpa_backward", *ins, **attrs, dbias=want["bias"], dsink=want["sink_token"])
    out: list[str | None] = [*grads[:3]] + [None] * len(optional)
    extra = iter(grads[3:])
    for k in ("bias", "sink_token"):  # the results after dv, in the op's order
        if want[k]:
            out[3 + optional.index(k)] = next(extra)
    return tuple(out)


def _sdpa_composite(e, n):
    """From the saved softmax statistics (log-sum-exp), with P = exp(q k^T * scale - stats):
    dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = dS K scale, dK = dS^T Q scale. Each transposed
    matrix is computed as such (P^T from k q^T, dS^T from v dO^T) so that every operand is a saved
    value or a view of one. It materializes the score matrices; for some of q, k, v's gradients only."""
    q, k, v = n.ins[:3]
    if any(i is not None for i in n.inputs[3:]) or n.attrs["alibi"] or k.shape[1] != q.shape[1]:
        raise RuleError(
            "sdpa: dropout, pages and ragged offsets have no derived gradient; with a bias, padding, ALiBi, a "
            "sink, attn_scale or grouped heads, q, k and v must all want theirs (sdpa_backward computes the three)"
        )
    qs, ks, vs = (e.fwd(i) for i in n.inputs[:3])
    (stats,) = e.stats(n, 1)
    scale = n.attrs["scale"]

    def probs(a, b, lse, transposed):
        s = e.call("matmul", a, b)
        x = e.call("sub", e.call("mul", s, scale), lse)
        keep = _sdpa_keep(e, n, s, transposed)
        return e.call("exp", x if keep is None else e.call("binary_select", x, -1e30, keep))

    dy = e.cast(n.dy, v.dtype)
    grads = [None, None, None]
    pt = probs(ks, e.fwd_t(n.inputs[0]), e.fwd_t(stats), True) if n.need[1] or n.need[2] else None
    if n.need[0]:
        p = probs(qs, e.fwd_t(n.inputs[1]), stats, False)
        rows = e.call("reduction", e.call("mul", n.dy, e.fwd(n.out)), mode="sum", axes=(3,))
        ds = e.call("mul", p, e.call("sub", e.call("matmul", dy, e.fwd_t(n.inputs[2])), rows))
        grads[0] = e.call("mul", e.call("matmul", e.cast(ds, k.dtype), ks), scale)
    if n.need[1]:
        dyt = e.transposed(n.dy)
        rows_t = e.call("reduction", e.call("mul", dyt, e.fwd_t(n.out)), mode="sum", axes=(2,))
        dst = e.call("mul", pt, e.call("sub", e.call("matmul", vs, e.cast(dyt, v.dtype)), rows_t))
        grads[1] = e.call("mul", e.call("matmul", e.cast(dst, q.dtype), qs), scale)
    if n.need[2]:
        grads[2] = e.call("matmul", e.cast(pt, v.dtype), dy)
    return (*grads, *(None,) * (len(n.inputs) - 3))


def _sdpa_fp8(e, n):
    """sdpa_fp8_backward, for the gradients of the forward as written, P's quantization passed straight through.
    The forward's O before scale_o is o * (1 / scale_o) and its loss gradient grad_o * scale_o (descale_o, descale_do);
    q's gradient is descale_q times that of q * descale_q, which cuDNN computes (scale_dq = descale_q; k, v alike).
    dS is quantized with the host scalars scale_dp and descale_dp, 1.0 unless a call sets them; the amaxes go unread."""
    if not all(n.need[:3]):
        raise RuleError(
            "sdpa_fp8: sdpa_fp8_backward computes q's, k's and v's gradients together; all three must want theirs"
        )
    if n.outs[0].dtype != "fp8_e4m3":
        raise RuleError(
            f"sdpa_fp8: sdpa_fp8_backward reads o in fp8_e4m3, as the forward writes it; o is {n.outs[0].dtype}"
        )
    (stats,) = e.stats(n, 2, first=1)  # after the amax
    q, k, v, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o = (e.fwd(i) for i in n.inputs)
    bwd = OPS["sdpa_fp8_backward"]
    attrs = {a.name: n.attrs[a.name] for a in bwd.attrs if n.attrs.get(a.name) is not None and a.name not in bwd.folded}
    grads = e.call(
        "sdpa_fp8_backward",
        *(q, k, v, e.fwd(n.out), n.dy, stats),
        *(descale_q, descale_k, descale_v, e.call("reciprocal", scale_o), scale_o, descale_s),
        *(e.scalar(1.0, "descale_dp"), scale_s, descale_q, descale_k, descale_v, e.scalar(1.0, "scale_dp")),
        **attrs,
    )
    return (*grads[:3], *(None,) * 6)


VJPS: dict[str, Rule] = {"rope": _rope, "sdpa": _sdpa, "sdpa_fp8": _sdpa_fp8}
RECOMPUTE: dict[str, Recompute] = {}
NO_VJP = {
    "sdpa_mxfp8": "its backward op (sdpa_mxfp8_backward) reads q, k, v and dO transposed with block scales of their "
    "own, and an O and dO in half precision, which the forward does not write; the registry has no row for it",
    **{op: SECOND_ORDER for op in BACKWARD_OPS},
}
