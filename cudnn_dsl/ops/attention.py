"""Attention ops: the torch references and cuDNN lowerings of sdpa, sdpa_fp8, sdpa_mxfp8 and rope, and of their backward
ops sdpa_backward, sdpa_fp8_backward and rope_backward."""

from __future__ import annotations

import math

from cudnn_dsl.ops.base import OpImpl, sum_to
from cudnn_dsl.ops.quantize import f8_128x4
from cudnn_dsl.target.dtypes import cudnn_type
from cudnn_dsl.target.lazy_torch import F, torch
from dsl.ops import BSHD
from dsl.ops.quantize import BLOCK
from dsl.types import dense_strides, storage_elements


def _positions(t: torch.Tensor, dim: int) -> torch.Tensor:
    """0, 1, 2, ... along `dim` of `t` (size 1 elsewhere), on t's device without naming it: the traced
    reference (`emit --format torch`) must not hold a device."""
    index = [slice(0, 1)] * t.dim()
    index[dim] = slice(None)
    return torch.ones_like(t[tuple(index)]).cumsum(dim) - 1


def _alibi(s: torch.Tensor) -> torch.Tensor:
    """ALiBi's bias (j - i) * m_h for scores [B, H, S_q, S_kv], with the slopes of the cuDNN Frontend's
    reference: m_h = 2^(-8 h / n) for the first n heads (n the largest power of two <= H), then
    2^(-4 (2 k - 1) / n) for the k-th head past n."""
    heads = s.shape[1]
    n = 2 ** math.floor(math.log2(heads))
    h = _positions(s, 1) + 1
    slopes = torch.where(h <= n, torch.exp2(-8.0 / n * h), torch.exp2(-4.0 / n * (2 * (h - n) - 1)))
    return (_positions(s, 3) - _positions(s, 2)) * slopes


def _sdpa_keep(a, b: int, s: torch.Tensor, len_q, len_kv) -> torch.Tensor:
    """Which (query, key) scores survive the masks, [B or 1, 1, S_q, S_kv]: the padding (keys past
    seq_len_kv, queries past seq_len_q) and the diagonal band, bottom-right aligned per sequence
    when padded."""
    sq, skv = s.shape[2], s.shape[3]
    i, j = _positions(s, 2), _positions(s, 3)
    keep = torch.ones_like(i * j, dtype=torch.bool)
    if len_kv is not None:
        len_q, len_kv = len_q.view(b, 1, 1, 1), len_kv.view(b, 1, 1, 1)
        keep = keep & (j < len_kv) & (i < len_q)
    diagonal = j - i  # how far right of the diagonal, 0 on it
    if a["diagonal_alignment"] == "bottom_right":
        diagonal = diagonal - (len_kv - len_q if len_q is not None else skv - sq)
    if a["right_bound"] is not None:
        keep = keep & (diagonal <= a["right_bound"])
    if a["left_bound"] is not None:
        keep = keep & (diagonal > -a["left_bound"])
    return keep


def _unpage(cache: torch.Tensor, table: torch.Tensor, keys: int) -> torch.Tensor:
    """[B, H, keys, D] from a cache of blocks [N, H, block, D] and a page table [B, 1, pages, 1]:
    key s of sequence b is row s % block of block table[b, 0, s // block, 0]."""
    pages = cache[table[:, 0, :, 0].long()]  # [B, pages, H, block, D]
    seq = pages.transpose(1, 2).reshape(table.shape[0], cache.shape[1], -1, cache.shape[3])
    return seq[:, :, :keys]


def _ragged_index(t: torch.Tensor, offsets: torch.Tensor, strides) -> torch.Tensor:
    """Where element (b, h, s, d) of a ragged tensor lies in its buffer: offsets[b] in place of b
    times the batch stride (int64, shaped like t)."""
    index = offsets[:-1].long().view(-1, 1, 1, 1)
    for dim in (1, 2, 3):
        index = index + _positions(t, dim).long() * strides[dim]
    return index


def _unpack(x: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The padded [B, H, S, D] that cuDNN reads from a packed (BSHD) buffer holding x's logical
    values: sequence b's rows below lengths[b] from offsets[b], zeros past them (the masks drop those
    rows; what the buffer holds there, another sequence or anything, NaN too, reaches no result). With a
    batch stride left to the offsets every batch of x is the memory, so the first batch's is read."""
    flat = x.transpose(1, 2).reshape(-1)
    strides = dense_strides(tuple(x.shape), BSHD)
    values = flat.take(_ragged_index(x, offsets, strides).clamp(0, flat.numel() - 1))
    return values.masked_fill(_positions(x, 2) >= lengths.view(-1, 1, 1, 1), 0)


def _pack(values: torch.Tensor, out, offsets: torch.Tensor, lengths: torch.Tensor):
    """The buffer cuDNN writes for a ragged output, read as its declared type `out`: sequence b's rows
    below lengths[b] from offsets[b]; and the mask of the elements nothing writes (unspecified)."""
    n = storage_elements(out.shape, out.strides)
    index = _ragged_index(values, offsets, out.strides)
    rows = _positions(values, 2) < lengths.view(-1, 1, 1, 1)
    index = index.masked_fill(~rows, n).flatten()  # rows not written go to a slot past the end
    zero = torch.zeros_like(values.flatten()[:1])  # on values' device without naming it (see _positions)
    buf = zero.expand(n + 1).contiguous().scatter(0, index, values.flatten())
    seen = (zero != 0).expand(n + 1).contiguous().scatter(0, index, rows.expand(values.shape).flatten())
    return buf[:n].as_strided(out.shape, out.strides), ~seen[:n].as_strided(out.shape, out.strides)


def _scores(q, k, scale, bias, a, len_q, len_kv):
    """sdpa's scaled scores with its bias, ALiBi and masks (-inf where masked), as the forward computes them
    and its backward recomputes them; k has q's heads."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    if a["alibi"]:
        s = s + _alibi(s)
    return s.masked_fill(~_sdpa_keep(a, q.shape[0], s, len_q, len_kv), float("-inf"))


def _scale(a, attn_scale):
    """The softmax scale: the attribute, or the attn_scale input (a host scalar: cuDNN's pass-by-value tensor)
    where it is given."""
    return a["scale"] if attn_scale is None else attn_scale


def _log_sum_exp(s, sink, len_q):
    """The softmax stats: log(sum exp(s)) over the keys, with exp(sink) added to the sum where there is a sink
    (per head); -inf in a query row past seq_len_q, as cuDNN writes there."""
    stats = torch.logsumexp(s, -1, keepdim=True)
    if sink is None:
        return stats
    stats = torch.logaddexp(stats, sink.expand_as(stats))
    if len_q is None:
        return stats
    return stats.masked_fill(_positions(s, 2) >= len_q.view(-1, 1, 1, 1), float("-inf"))


def ref_sdpa(ins, a, outs):
    """softmax(q k^T * scale + bias + ALiBi, masked) [* dropout mask * scale] v, as the cuDNN Frontend's
    own test reference computes it. Rows with no key left (padded queries, an empty band) give O = 0
    and stats = -inf, which is what cuDNN writes for padded queries since 9.14. A sink adds exp(sink) to
    every row's denominator (an in-sequence row with no key left: O = 0, stats = sink). Ragged (packed)
    tensors are unpacked to padded ones, and O and the stats packed back (_pack)."""
    q, k, v, bias, len_q, len_kv, drop_mask, drop_scale, table_k, table_v = ins[:10]
    ragged_q, ragged_k, ragged_v, ragged_o, ragged_stats = ins[10:15]
    sink, scale = ins[17], _scale(a, ins[18])
    drawn = ins[19:]  # seeded dropout: the mask cuDNN drew (OpImpl.drawn)
    if drawn:
        drop_mask, drop_scale = drawn[0], 1.0 / (1.0 - a["dropout_probability"])
    placed = ((q, ragged_q, len_q), (k, ragged_k, len_kv), (v, ragged_v, len_kv))
    q, k, v = (x if r is None else _unpack(x, r, n) for x, r, n in placed)
    h = q.shape[1]
    causal = a["right_bound"] == 0 and a["left_bound"] is None and a["diagonal_alignment"] == "top_left"
    plain = not a["stats"] and not a["alibi"] and all(t is None for t in (len_q, drop_mask, table_k, sink, ins[18]))
    if plain and (a["right_bound"] is None and a["left_bound"] is None or causal and bias is None):
        # what a PyTorch user writes (and what torch eager and torch.compile run in `bench`, and what a pattern
        # searches for: patterns): grouped heads as `enable_gqa` (K and V repeated where their head counts differ),
        # the scale given only when not 1/sqrt(D)
        gqa = {}
        if k.shape[1] != h or v.shape[1] != h:
            if k.shape[1] == v.shape[1]:
                gqa = {"enable_gqa": True}
            else:
                k, v = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // v.shape[1], 1)
        scale = None if a["scale"] == 1.0 / math.sqrt(q.shape[-1]) else a["scale"]
        return [F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal, scale=scale, **gqa)]
    if table_k is not None:
        k, v = _unpage(k, table_k, a["max_seq_len_kv"]), _unpage(v, table_v, a["max_seq_len_kv"])
    k = k.repeat_interleave(h // k.shape[1], 1)
    v = v.repeat_interleave(h // v.shape[1], 1)
    s = _scores(q, k, scale, bias, a, len_q, len_kv)
    stats = _log_sum_exp(s, sink, len_q)
    p = torch.exp(s - stats).masked_fill(stats.isneginf(), 0.0)  # an empty row: -inf - -inf
    if drop_mask is not None:
        p = p * drop_mask * drop_scale
    o = torch.matmul(p, v)
    results = [o, stats] if a["stats"] else [o]
    packed = [r if off is None else _pack(r, t, off, len_q)[0] for r, t, off in zip(results, outs, ins[13:15])]
    return packed + list(drawn)


def undefined_sdpa(ins, a, outs):
    """O's rows past seq_len_q: cuDNN does not say what it writes there (the frontend's tests zero
    them on both sides). The stats there are defined: -inf. In a ragged O or stats, every element
    no sequence's row lands on."""
    len_q = ins[4]
    if len_q is None:
        return [None] * len(outs)
    rows = _positions(ins[0], 2) >= len_q.view(-1, 1, 1, 1)
    masks = [rows.expand(outs[0].shape)] + [None] * (len(outs) - 1)
    for i, (t, off) in enumerate(zip(outs, ins[13:15])):
        if off is not None:
            values = torch.zeros_like(ins[0][..., :1]).expand(*t.shape[:3], t.shape[3])
            masks[i] = _pack(values, t, off, len_q)[1]
    return masks


def drawn_sdpa(a) -> tuple[int, ...]:
    """Seeded dropout's mask, the last result: what cuDNN's Philox generator drew."""
    return (1 + a["stats"],) if a["dropout_probability"] is not None else ()


def ref_sdpa_fp8(ins, a, outs):
    """The frontend's FP8 reference (test/python/sdpa/fp8_ref.py) without its tiling: the
    unnormalized probabilities exp(s - rowmax) times scale_s rounded to e4m3, times descale_s, @ v,
    times descale_v, over the row sum. cuDNN quantizes them per 128-key tile against the running
    max; for S_kv <= 128 that is the same number, beyond it the two differ within fp8 rounding."""
    q, k, v, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o = ins
    h = q.shape[1]
    k = k.repeat_interleave(h // k.shape[1], 1)
    v = v.repeat_interleave(h // v.shape[1], 1)
    s = torch.matmul(q, k.transpose(-1, -2)) * (descale_q * descale_k * a["scale"])
    s = s.masked_fill(~_sdpa_keep(a, q.shape[0], s, None, None), float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m).masked_fill(m.isneginf(), 0.0)
    total = p.sum(-1, keepdim=True)
    p8 = (p * scale_s).to(torch.float8_e4m3fn).to(p.dtype) * descale_s
    o = torch.matmul(p8, v) * descale_v / total.clamp(min=1.0)  # an empty row: 0 / 1
    amax = o.abs().amax().reshape(1, 1, 1, 1)
    return [o * scale_o, amax, m + torch.log(total)] if a["stats"] else [o * scale_o, amax]


def lower_sdpa_fp8(ctx, ins, a):
    kw = {"attn_scale": a["scale"], "generate_stats": a["stats"], **_band(ctx, a, "")}
    res = ctx.g.sdpa_fp8(*ins, **kw, **ctx.kw)  # O, Stats, Amax_S (left virtual, as the frontend advises), Amax_O
    return [res[0], res[3], res[1]] if a["stats"] else [res[0], res[3]]


def ref_sdpa_mxfp8(ins, a, outs):
    """softmax(q k^T * scale) v on the block-dequantized q, k, v, as the frontend's MXFP8 reference
    (test/python/test_sdpa_mxfp8.py) computes it: the kernel's own rounding of P is not modelled."""
    q, k, v = (t * s.repeat_interleave(BLOCK, dim=axis) for t, s, axis in zip(ins[:3], ins[3:], (-1, -1, -2)))
    h = q.shape[1]
    k, v = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // v.shape[1], 1)
    s = torch.matmul(q, k.transpose(-1, -2)) * a["scale"]
    s = s.masked_fill(~_sdpa_keep(a, q.shape[0], s, None, None), float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m).masked_fill(m.isneginf(), 0.0)
    total = p.sum(-1, keepdim=True)
    o = torch.matmul(p, v) / total.clamp(min=1.0)  # an empty row: 0 / 1
    amax = o.abs().amax().reshape(1, 1, 1, 1)
    return [o, amax, m + torch.log(total)] if a["stats"] else [o, amax]


def lower_sdpa_mxfp8(ctx, ins, a):
    q, k, v = ins[:3]
    scales = {f"descale_{n}": f8_128x4(ctx, t) for n, t in zip("qkv", ins[3:])}
    kw = {"attn_scale": a["scale"], "generate_stats": a["stats"], **_band(ctx, a, "diagonal_band_")}
    res = ctx.g.sdpa_mxfp8(q=q, k=k, v=v, **scales, **kw, **ctx.kw)  # O, Stats, Amax_O
    return [res[0], res[2], res[1]] if a["stats"] else [res[0], res[2]]


def _masks(ctx, a, bias, len_q, len_kv, sink) -> dict:
    """The frontend's arguments for what sdpa and sdpa_backward both take: bias, ALiBi, padding, band, sink."""
    kw = {}
    if bias is not None:
        kw["bias"] = bias
    if a["alibi"]:
        kw["use_alibi_mask"] = True
    if len_q is not None:
        kw.update(use_padding_mask=True, seq_len_q=len_q, seq_len_kv=len_kv)
    kw.update(_band(ctx, a, "diagonal_band_"))
    if sink is not None:
        kw["sink_token"] = sink
    return kw


def _band(ctx, a, prefix: str) -> dict:
    """A diagonal band's bounds and alignment, under the frontend's names for them (prefix: sdpa's
    `diagonal_band_`, none for sdpa_fp8). A bottom-right alignment is passed without a band too, as the file
    writes it: the frontend's graph then says what a hand-written one does."""
    if a["left_bound"] is None and a["right_bound"] is None and a["diagonal_alignment"] == "top_left":
        return {}
    kw = {"diagonal_alignment": getattr(ctx.cudnn.diagonal_alignment, a["diagonal_alignment"].upper())}
    for side in ("left", "right"):
        if a[f"{side}_bound"] is not None:
            kw[f"{prefix}{side}_bound"] = a[f"{side}_bound"]
    return kw


def lower_sdpa(ctx, ins, a):
    q, k, v, bias, len_q, len_kv, drop_mask, drop_scale, table_k, table_v = ins[:10]
    for off, t in zip(ins[10:15], ctx.in_types[10:15]):
        if t is not None and len(t.shape) == 1:  # cuDNN takes offsets of the placed tensor's rank: [B+1, 1, 1, 1]
            off.set_dim([t.shape[0], 1, 1, 1])
            off.set_stride([1, 1, 1, 1])
    for t, off in zip((q, k, v), ins[10:13]):
        if off is not None:
            t.set_ragged_offset(off)
    kw = {
        "attn_scale": _scale(a, ins[18]),
        "generate_stats": a["stats"],
        **_masks(ctx, a, bias, len_q, len_kv, ins[17]),
    }
    if drop_mask is not None:
        kw["dropout"] = (drop_mask, drop_scale)
    mask = None
    if a["dropout_probability"] is not None:
        # cuDNN draws the mask with Philox from the seed and offset; rng_dump writes it out, always: the
        # reference cannot compute it, it reads it (OpImpl.drawn). Dims and dtype: lower._stamp's.
        mask = ctx.g.tensor(name=f"{ctx.name}_mask", dim=[1] * 4, stride=[1] * 4, data_type=ctx.cudnn.data_type.FLOAT)
        kw.update(dropout=(a["dropout_probability"], ins[15], ins[16]), rng_dump=mask)
    if table_k is not None:
        kw.update(
            paged_attention_k_table=table_k,
            paged_attention_v_table=table_v,
            paged_attention_max_seq_len_kv=a["max_seq_len_kv"],
        )
    res = ctx.g.sdpa(q, k, v, **kw, **ctx.kw)
    outs = [res[0], res[1]] if a["stats"] else [res[0]]
    for t, off in zip(outs, ins[13:15]):
        if off is not None:
            t.set_ragged_offset(off)
    return outs + ([mask] if mask is not None else [])


def ref_rope(ins, a, outs):
    """cuDNN's non-interleaved rotation of the trailing rope_dim dims; the leading ones pass through."""
    x, freqs = ins
    r, d = a["rope_dim"], x.shape[-1]
    theta = freqs[: x.shape[2], 0, 0, : r // 2]  # [S, r/2], broadcast over batch and heads
    cos, sin = torch.cos(theta), torch.sin(theta)
    lo, hi = x[..., d - r : d - r // 2], x[..., d - r // 2 :]
    y = torch.cat((x[..., : d - r], lo * cos - hi * sin, hi * cos + lo * sin), -1)
    return [y * a["output_scale"]]


def lower_rope(ctx, ins, a):
    return [ctx.g.rope(ins[0], ins[1], output_scale=a["output_scale"], rope_dim=a["rope_dim"], **ctx.kw)]


def ref_sdpa_backward(ins, a, outs):
    """dq, dk, dv from P = exp(s - stats) (s the forward's masked scores, stats its log-sum-exp) as cuDNN
    recomputes it: dv = Pd^T do, dP = (do v^T) * dropout, dS = P * (dP - rowsum(do * o)), dq = dS k * scale,
    dk = dS^T q * scale; grouped K/V heads sum their queries' gradients. A row with no key has P = 0. With
    dropout, cuDNN's graph scales rowsum(do * o) by dropout_scale_inv (the frontend's sdpa_backward node), and
    so does this: dS = P * (dP - rowsum(do * o) * scale * scale_inv), the usual gradient when scale_inv is
    1 / scale. The stats hold the sink (the forward's); its gradient, per head, is the sink's probability
    times -rowsum, summed over the batch and the queries (a row past seq_len_q, stats -inf, adds none)."""
    q, k, v, o, do, stats, bias, len_q, len_kv, drop_mask, drop_scale, drop_scale_inv, sink, attn_scale = ins
    scale = _scale(a, attn_scale)
    h, hk, hv = q.shape[1], k.shape[1], v.shape[1]
    kr, vr = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hv, 1)
    s = _scores(q, kr, scale, bias, a, len_q, len_kv)
    p = torch.exp(s - stats).masked_fill(stats.isneginf() | s.isneginf(), 0.0)
    keep = 1.0 if drop_mask is None else drop_mask * drop_scale
    rescale = 1.0 if drop_mask is None else drop_scale * drop_scale_inv
    dv = torch.matmul((p * keep).transpose(-1, -2), do)
    dp = torch.matmul(do, vr.transpose(-1, -2)) * keep
    rows = (do * o).sum(-1, keepdim=True) * rescale
    ds = p * (dp - rows)
    dq = torch.matmul(ds, kr) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q) * scale
    b, skv = q.shape[0], k.shape[2]
    dk = dk.reshape(b, hk, h // hk, skv, k.shape[3]).sum(2)
    dv = dv.reshape(b, hv, h // hv, skv, v.shape[3]).sum(2)
    grads = [dq, dk, dv] + ([sum_to(ds, bias.shape)] if a["dbias"] else [])
    if a["dsink"]:
        p_sink = torch.exp(sink - stats).masked_fill(stats.isneginf(), 0.0)
        grads.append(-(p_sink * rows).sum((0, 2), keepdim=True))
    return grads


def undefined_sdpa_backward(ins, a, outs):
    """With padding, what cuDNN writes past a sequence's length is taken as unspecified, as for the forward's
    O: dq's rows past seq_len_q, dk's and dv's past seq_len_kv."""
    len_q, len_kv = ins[7], ins[8]
    if len_q is None:
        return [None] * len(outs)
    rows_q = _positions(ins[0], 2) >= len_q.view(-1, 1, 1, 1)
    rows_k = _positions(ins[1], 2) >= len_kv.view(-1, 1, 1, 1)
    return [rows_q.expand(outs[0].shape), rows_k.expand(outs[1].shape), rows_k.expand(outs[2].shape)] + [None] * (
        len(outs) - 3
    )


def lower_sdpa_backward(ctx, ins, a):
    q, k, v, o, do, stats, bias, len_q, len_kv, drop_mask, drop_scale, drop_scale_inv, sink, attn_scale = ins
    kw = {"attn_scale": _scale(a, attn_scale), **_masks(ctx, a, bias, len_q, len_kv, sink)}
    if drop_mask is not None:
        kw["dropout"] = (drop_mask, drop_scale, drop_scale_inv)
    if a["deterministic"]:
        kw["use_deterministic_algorithm"] = True
    if a["dbias"]:  # the frontend takes dBias's descriptor from the caller; the lowering pass stamps it
        t = ctx.in_types[6]  # rank 4, as cuDNN gets it
        kw["dBias"] = ctx.g.tensor(
            name=f"{ctx.name}_dbias",
            dim=list(t.shape),
            stride=list(t.strides),
            data_type=cudnn_type(ctx.cudnn, t.dtype),
        )
    if a["dsink"]:  # as dBias: the caller's descriptor, stamped by the lowering pass
        h = ctx.in_types[0].shape[1]
        kw["dSink_token"] = ctx.g.tensor(
            name=f"{ctx.name}_dsink", dim=[1, h, 1, 1], stride=[h, 1, 1, 1], data_type=ctx.cudnn.data_type.FLOAT
        )
    res = ctx.g.sdpa_backward(q, k, v, o, do, stats, **kw, **ctx.kw)
    extra = [kw[k] for k, asked in (("dBias", a["dbias"]), ("dSink_token", a["dsink"])) if asked]
    return [res[0], res[1], res[2], *extra]  # [dQ, dK, dV, dBias, dSink_token]


def ref_rope_backward(ins, a, outs):
    """rope is a rotation per pair of dims, times output_scale: its gradient rotates dy by the opposite angles."""
    dy, freqs = ins
    return ref_rope([dy, -freqs], a, outs)


def lower_rope_backward(ctx, ins, a):
    return [ctx.g.rope_backward(ins[0], ins[1], output_scale=a["output_scale"], rope_dim=a["rope_dim"], **ctx.kw)]


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to fp8_e4m3, the dtype FP8 attention quantizes P and dS to, kept in x's dtype."""
    return x.to(torch.float8_e4m3fn).to(x.dtype)


def _grouped(g: torch.Tensor, heads: int) -> torch.Tensor:
    """A gradient over q's heads summed to `heads` (grouped-query K/V: each K/V head serves h / heads queries)."""
    b, h, s, d = g.shape
    return g.reshape(b, heads, h // heads, s, d).sum(2)


def ref_sdpa_fp8_backward(ins, a, outs):
    """The frontend's FP8 backward graph (sdpa_fp8_bwd.h's expansion), untiled: P = exp(s - stats) from the descaled
    scores, quantized as the forward quantized it; D = rowsum(do * o) * descale_do * descale_o;
    dS = P * (do v^T * descale_do * descale_v - D) * scale, quantized with scale_dp to e4m3 (descale_dp undoes it);
    dv = P8^T do, dq = dS8 k, dk = dS8^T q, each times its operands' descales, its amax taken, then times its scale."""
    q, k, v, o, do, stats = ins[:6]
    descale_q, descale_k, descale_v, descale_o, descale_do, descale_s, descale_dp = ins[6:13]
    scale_s, scale_dq, scale_dk, scale_dv, scale_dp = ins[13:]
    h = q.shape[1]
    kr, vr = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // v.shape[1], 1)
    s = torch.matmul(q, kr.transpose(-1, -2)) * (descale_q * descale_k * a["scale"])
    s = s.masked_fill(~_sdpa_keep(a, q.shape[0], s, None, None), float("-inf"))
    p = torch.exp(s - stats).masked_fill(s.isneginf(), 0.0)
    dv = torch.matmul(_e4m3(p * scale_s).transpose(-1, -2), do) * descale_s * descale_do
    rows = (do * o).sum(-1, keepdim=True) * descale_do * descale_o
    ds = p * (torch.matmul(do, vr.transpose(-1, -2)) * descale_do * descale_v - rows) * a["scale"]
    ds8 = _e4m3(ds * scale_dp) * descale_dp
    dq = torch.matmul(ds8, kr) * descale_k
    dk = _grouped(torch.matmul(ds8.transpose(-1, -2), q) * descale_q, k.shape[1])
    dv = _grouped(dv, v.shape[1])
    amax = [t.abs().amax().reshape(1, 1, 1, 1) for t in (dq, dk, dv, ds)]
    return [dq * scale_dq, dk * scale_dk, dv * scale_dv, *amax]


def lower_sdpa_fp8_backward(ctx, ins, a):
    kw = {"attn_scale": a["scale"], **_band(ctx, a, "")}
    if a["deterministic"]:
        kw["use_deterministic_algorithm"] = True
    return list(ctx.g.sdpa_fp8_backward(*ins, **kw, **ctx.kw))  # dQ, dK, dV, amax_dQ, amax_dK, amax_dV, amax_dP


IMPLS: dict[str, OpImpl] = {
    "sdpa": OpImpl(ref_sdpa, lower_sdpa, undefined_sdpa, drawn=drawn_sdpa),
    "sdpa_fp8": OpImpl(ref_sdpa_fp8, lower_sdpa_fp8),
    "sdpa_mxfp8": OpImpl(ref_sdpa_mxfp8, lower_sdpa_mxfp8),
    "rope": OpImpl(ref_rope, lower_rope),
    "rope_backward": OpImpl(ref_rope_backward, lower_rope_backward),
    "sdpa_backward": OpImpl(ref_sdpa_backward, lower_sdpa_backward, undefined_sdpa_backward),
    "sdpa_fp8_backward": OpImpl(ref_sdpa_fp8_backward, lower_sdpa_fp8_backward),
}
