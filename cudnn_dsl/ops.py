"""Backend layer: per-op torch reference and cuDNN Frontend lowering, keyed like dsl.ops.OPS.

A reference function takes the input tensors (float32 or wider, None for an absent optional),
the node's attributes and its output types, and returns the output tensors. A lowering function takes a
LowerCtx (the cuDNN graph and helpers), the input cuDNN tensors and the attributes, and returns
the output cuDNN tensors; the lowering pass then stamps each with its IR uid, dtype, dims and
strides. Attributes arrive canonical (dsl.ops.canonical): no row here fills a default.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import torch
import torch.nn.functional as F

from cudnn_dsl.target.dtypes import cudnn_type
from dsl.ops import BSHD, norm_axes
from dsl.types import dense_strides, storage_elements


@attrs.frozen
class OpImpl:
    """How one op runs: its torch reference and its cuDNN lowering."""

    ref: Callable[..., list]
    lower: Callable[..., list]
    undefined: Callable[..., list] | None = None
    """(inputs, attributes, output types) -> per output, a bool mask of the elements cuDNN leaves
    unspecified (None: all defined); the compare does not read them (sdpa's padded query rows)"""
    stats: str = "as_asked"
    """which of the results after the first cuDNN must write: "as_asked" (the outputs), "together"
    (all or none: layernorm's mean and inv_variance), "always" (batchnorm's); what no output asks for
    goes to scratch memory"""
    drawn: Callable[[dict], tuple[int, ...]] | None = None
    """(attributes) -> the results the device draws and the reference cannot compute (sdpa's seeded
    dropout mask): cuDNN always writes them (to scratch memory when no output asks), and the reference
    takes them as they were after the launch, passed to `ref` after the inputs"""


# ---- pointwise ---------------------------------------------------------------------

_UNARY_REF = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "elu": F.elu,
    "softplus": F.softplus,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "abs": torch.abs,
    "neg": torch.neg,
    "reciprocal": torch.reciprocal,
    "erf": torch.erf,
    "sin": torch.sin,
    "cos": torch.cos,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "tan": torch.tan,
    "identity": lambda x: x.clone(),
}
_BINARY_REF = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "max": torch.maximum,
    "min": torch.minimum,
    "pow": torch.pow,
    "mod": torch.fmod,
    "add_square": lambda a, b: a + b * b,
    "bias": torch.add,
    "scale": torch.mul,
}
#: language name -> cuDNN Frontend builder name, where they differ
CUDNN_NAME = {"gelu_tanh": "gelu_approx_tanh", "gelu_tanh_backward": "gelu_approx_tanh_backward"}


def _unary(op: str) -> OpImpl:
    fn = _UNARY_REF[op]
    builder = CUDNN_NAME.get(op, op)
    return OpImpl(
        ref=lambda ins, a, outs: [fn(ins[0])],
        lower=lambda ctx, ins, a: [getattr(ctx.g, builder)(ins[0], **ctx.kw)],
    )


def _binary(op: str) -> OpImpl:
    fn = _BINARY_REF[op]
    return OpImpl(
        ref=lambda ins, a, outs: [fn(ins[0], ins[1])],
        lower=lambda ctx, ins, a: [getattr(ctx.g, op)(ins[0], ins[1], **ctx.kw)],
    )


#: relu's attributes at cuDNN's own defaults (no ceiling, no slope): left out of the call
_RELU_DEFAULTS = {"negative_slope": 0.0, "lower_clip": 0.0, "upper_clip": None}


def ref_relu(ins, a, outs):
    x, lo, hi = ins[0], a["lower_clip"], a["upper_clip"]
    y = torch.where(x <= lo, lo + a["negative_slope"] * (x - lo), x)
    return [y if hi is None else torch.where(x >= hi, torch.full_like(x, hi), y)]


def lower_relu(ctx, ins, a):
    given = {k: v for k, v in a.items() if v != _RELU_DEFAULTS[k]}
    return [ctx.g.relu(ins[0], **given, **ctx.kw)]


def ref_leaky_relu(ins, a, outs):
    return [F.leaky_relu(ins[0], a["slope"])]


def lower_leaky_relu(ctx, ins, a):
    return [ctx.g.leaky_relu(ins[0], negative_slope=a["slope"], **ctx.kw)]


def ref_swish(ins, a, outs):
    return [ins[0] * torch.sigmoid(a["beta"] * ins[0])]


def lower_swish(ctx, ins, a):
    return [ctx.g.swish(ins[0], swish_beta=a["beta"], **ctx.kw)]


def ref_gen_index(ins, a, outs):
    x, axis = ins[0], a["axis"]
    shape = [1] * x.dim()
    shape[axis] = x.shape[axis]
    index = torch.arange(x.shape[axis], dtype=x.dtype, device=x.device).reshape(shape)
    return [index.expand(x.shape).clone()]


def lower_gen_index(ctx, ins, a):
    return [ctx.g.gen_index(ins[0], axis=a["axis"] + ctx.lead, **ctx.kw)]


# ---- comparisons and logic ------------------------------------------------------------------
# The reference holds every value widened (bool as 0/1 in float32); a bool result is 0/1 in the
# dtype of its first input, rounded to bool when it is an output.

_COMPARE_REF = {
    "cmp_eq": torch.eq,
    "cmp_neq": torch.ne,
    "cmp_gt": torch.gt,
    "cmp_ge": torch.ge,
    "cmp_lt": torch.lt,
    "cmp_le": torch.le,
    "logical_and": lambda a, b: torch.logical_and(a != 0, b != 0),
    "logical_or": lambda a, b: torch.logical_or(a != 0, b != 0),
}


def _as_tensors(ins) -> list:
    """The inputs as tensors: the eager baseline passes host scalars as Python numbers."""
    like = next(t for t in ins if isinstance(t, torch.Tensor))
    return [t if isinstance(t, torch.Tensor) else torch.tensor(t, dtype=like.dtype, device=like.device) for t in ins]


def _compare(op: str) -> OpImpl:
    fn = _COMPARE_REF[op]

    def ref(ins, a, outs):
        x, y = _as_tensors(ins)
        return [fn(x, y).to(x.dtype)]

    return OpImpl(
        ref=ref,
        lower=lambda ctx, ins, a: [getattr(ctx.g, op)(ins[0], ins[1], **ctx.kw)],
    )


def ref_logical_not(ins, a, outs):
    return [(ins[0] == 0).to(ins[0].dtype)]


def lower_logical_not(ctx, ins, a):
    return [ctx.g.logical_not(ins[0], **ctx.kw)]


def ref_binary_select(ins, a, outs):
    x, y, mask = _as_tensors(ins)
    return [torch.where(mask != 0, x, y)]


def lower_binary_select(ctx, ins, a):
    return [ctx.g.binary_select(*ins, **ctx.kw)]


def ref_concatenate(ins, a, outs):
    return [torch.cat(ins, a["axis"])]


def lower_concatenate(ctx, ins, a):
    # a layout op: the frontend takes no compute dtype for it
    return [ctx.g.concatenate(inputs=list(ins), axis=a["axis"] + ctx.lead, name=ctx.name)]


# ---- convolution -------------------------------------------------------------------


def _conv_args(a: dict) -> dict:
    return {"padding": list(a["padding"]), "stride": list(a["stride"]), "dilation": list(a["dilation"])}


def ref_conv_fprop(ins, a, outs):
    x, w = ins
    conv = (F.conv1d, F.conv2d, F.conv3d)[x.dim() - 3]
    return [conv(x, w, None, a["stride"], a["padding"], a["dilation"], x.shape[1] // w.shape[1])]


def _conv_backward(dy, x, w, a, which: int):
    """One gradient of a convolution (0: data, 1: weight) from aten, the shapes of the others given by x and w."""
    mask = [which == 0, which == 1, False]
    n = dy.dim() - 2
    return torch.ops.aten.convolution_backward(
        dy, x, w, None, a["stride"], a["padding"], a["dilation"], False, [0] * n, 1, mask
    )[which]


def ref_conv_dgrad(ins, a, outs):
    dy, w = ins
    return [_conv_backward(dy, dy.new_empty(outs[0].shape), w, a, 0)]


def ref_conv_wgrad(ins, a, outs):
    x, dy = ins
    return [_conv_backward(dy, x, x.new_empty(outs[0].shape), a, 1)]


def _lower_conv(builder: str):
    def lower(ctx, ins, a):
        return [getattr(ctx.g, builder)(ins[0], ins[1], **_conv_args(a), **ctx.kw)]

    return lower


# ---- matmul, reduction ------------------------------------------------------------------


def ref_matmul(ins, a, outs):
    return [torch.matmul(ins[0], ins[1])]


def lower_matmul(ctx, ins, a):
    return [ctx.g.matmul(ins[0], ins[1], **ctx.kw)]


def ref_reduction(ins, a, outs):
    x = ins[0]
    axes = list(a["axes"])
    mode = a["mode"]
    if mode in ("mul", "mul_no_zeros"):
        if mode == "mul_no_zeros":
            x = torch.where(x == 0, torch.ones_like(x), x)
        for d in axes:
            x = x.prod(d, keepdim=True)
        return [x]
    fns = {
        "sum": lambda t: t.sum(axes, keepdim=True),
        "min": lambda t: t.amin(axes, keepdim=True),
        "max": lambda t: t.amax(axes, keepdim=True),
        "amax": lambda t: t.abs().amax(axes, keepdim=True),
        "avg": lambda t: t.mean(axes, keepdim=True),
        "norm1": lambda t: t.abs().sum(axes, keepdim=True),
        "norm2": lambda t: t.square().sum(axes, keepdim=True).sqrt(),
    }
    return [fns[mode](x)]


def lower_reduction(ctx, ins, a):
    mode = getattr(ctx.cudnn.reduction_mode, "ADD" if a["mode"] == "sum" else a["mode"].upper())
    return [ctx.g.reduction(ins[0], mode=mode, **ctx.kw)]


# ---- attention ---------------------------------------------------------------------


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


def _unpack(x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The padded [B, H, S, D] that cuDNN reads from a packed (BSHD) buffer holding x's logical
    values: sequence b's rows from offsets[b]. Rows past the buffer (those of a sequence past its
    length, which the masks drop) read its last element."""
    flat = x.transpose(1, 2).reshape(-1)
    strides = dense_strides(tuple(x.shape), BSHD)
    return flat.take(_ragged_index(x, offsets, strides).clamp(0, flat.numel() - 1))


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


def _scores(q, k, bias, a, len_q, len_kv):
    """sdpa's scaled scores with its bias, ALiBi and masks (-inf where masked), as the forward computes them
    and its backward recomputes them; k has q's heads."""
    s = torch.matmul(q, k.transpose(-1, -2)) * a["scale"]
    if bias is not None:
        s = s + bias
    if a["alibi"]:
        s = s + _alibi(s)
    return s.masked_fill(~_sdpa_keep(a, q.shape[0], s, len_q, len_kv), float("-inf"))


def ref_sdpa(ins, a, outs):
    """softmax(q k^T * scale + bias + ALiBi, masked) [* dropout mask * scale] v, as the cuDNN Frontend's
    own test reference computes it. Rows with no key left (padded queries, an empty band) give O = 0
    and stats = -inf, which is what cuDNN writes for padded queries since 9.14. Ragged (packed)
    tensors are unpacked to padded ones, and O and the stats packed back (_pack)."""
    q, k, v, bias, len_q, len_kv, drop_mask, drop_scale, table_k, table_v = ins[:10]
    ragged_q, ragged_k, ragged_v, ragged_o, ragged_stats = ins[10:15]
    drawn = ins[17:]  # seeded dropout: the mask cuDNN drew (OpImpl.drawn)
    if drawn:
        drop_mask, drop_scale = drawn[0], 1.0 / (1.0 - a["dropout_probability"])
    q, k, v = (x if r is None else _unpack(x, r) for x, r in ((q, ragged_q), (k, ragged_k), (v, ragged_v)))
    h = q.shape[1]
    causal = a["right_bound"] == 0 and a["left_bound"] is None and a["diagonal_alignment"] == "top_left"
    plain = not a["stats"] and not a["alibi"] and all(t is None for t in (len_q, drop_mask, table_k))
    if plain and (a["right_bound"] is None and a["left_bound"] is None or causal and bias is None):
        # what a PyTorch user writes (and what torch eager and torch.compile run in `bench`)
        k, v = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // v.shape[1], 1)
        return [F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal, scale=a["scale"])]
    if table_k is not None:
        k, v = _unpage(k, table_k, a["max_seq_len_kv"]), _unpage(v, table_v, a["max_seq_len_kv"])
    k = k.repeat_interleave(h // k.shape[1], 1)
    v = v.repeat_interleave(h // v.shape[1], 1)
    s = _scores(q, k, bias, a, len_q, len_kv)
    stats = torch.logsumexp(s, -1, keepdim=True)
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


def _masks(ctx, a, bias, len_q, len_kv) -> dict:
    """The frontend's arguments for what sdpa and sdpa_backward both take: bias, ALiBi, padding, band."""
    kw = {}
    if bias is not None:
        kw["bias"] = bias
    if a["alibi"]:
        kw["use_alibi_mask"] = True
    if len_q is not None:
        kw.update(use_padding_mask=True, seq_len_q=len_q, seq_len_kv=len_kv)
    kw.update(_band(ctx, a, "diagonal_band_"))
    return kw


def _band(ctx, a, prefix: str) -> dict:
    """A diagonal band's bounds and alignment, under the frontend's names for them (prefix: sdpa's
    `diagonal_band_`, none for sdpa_fp8)."""
    if a["left_bound"] is None and a["right_bound"] is None:
        return {}
    kw = {"diagonal_alignment": getattr(ctx.cudnn.diagonal_alignment, a["diagonal_alignment"].upper())}
    for side in ("left", "right"):
        if a[f"{side}_bound"] is not None:
            kw[f"{prefix}{side}_bound"] = a[f"{side}_bound"]
    return kw


def lower_sdpa(ctx, ins, a):
    q, k, v, bias, len_q, len_kv, drop_mask, drop_scale, table_k, table_v = ins[:10]
    for t, off in zip((q, k, v), ins[10:13]):
        if off is not None:
            t.set_ragged_offset(off)
    kw = {"attn_scale": a["scale"], "generate_stats": a["stats"], **_masks(ctx, a, bias, len_q, len_kv)}
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


# ---- norms ----------------------------------------------------------------------------


def _norm_axes(x, scale) -> list[int]:
    return list(norm_axes(tuple(x.shape), tuple(scale.shape)))


def _standardize(x, axes, eps):
    """(x - mean) * inv_variance over `axes`, with the biased variance, as cuDNN's norms compute it."""
    mean = x.mean(axes, keepdim=True)
    inv_var = torch.rsqrt(x.var(axes, keepdim=True, correction=0) + eps)
    return (x - mean) * inv_var, mean, inv_var


def _affine(y, scale, bias):
    y = y * scale if scale is not None else y
    return y + bias if bias is not None else y


def _phase(ctx, a):
    return getattr(ctx.cudnn.norm_forward_phase, a["phase"].upper())


def _results(res, a, n: int) -> list:
    """The first n of a norm builder's results in training, else only y (the statistics are None)."""
    return [res[i] for i in range(n)] if a["phase"] == "training" else [res[0]]


def _lower_norm(builder: str, results: int):
    """layernorm, rmsnorm, instancenorm and adalayernorm: (x, scale, bias, epsilon) in a phase; in training
    `results` outputs (Y and the statistics), else Y alone."""

    def lower(ctx, ins, a):
        x, scale, bias = ins
        eps = ctx.constant(a["epsilon"], "epsilon")
        y = getattr(ctx.g, builder)(x, scale, bias, eps, norm_forward_phase=_phase(ctx, a), **ctx.kw)
        return _results(y, a, results)

    return lower


def ref_layernorm(ins, a, outs):
    x, scale, bias = ins
    axes = _norm_axes(x, scale)
    first = axes[0]
    if len(outs) == 1 and axes == list(range(first, x.dim())):  # what a PyTorch user writes: one kernel
        tail = x.shape[first:]
        return [F.layer_norm(x, tail, scale.reshape(tail), bias.reshape(tail), a["epsilon"])]
    y, mean, inv_var = _standardize(x, axes, a["epsilon"])
    return [_affine(y, scale, bias), mean, inv_var][: len(outs)]


def ref_rmsnorm(ins, a, outs):
    x, scale, bias = ins
    inv_var = torch.rsqrt(x.square().mean(_norm_axes(x, scale), keepdim=True) + a["epsilon"])
    return [_affine(x * inv_var, scale, bias), inv_var][: len(outs)]


def ref_batchnorm_inference(ins, a, outs):
    x, mean, inv_var, scale, bias = ins
    return [(x - mean) * inv_var * scale + bias]


def lower_batchnorm_inference(ctx, ins, a):
    return [ctx.g.batchnorm_inference(*ins, **ctx.kw)]


def ref_batchnorm(ins, a, outs):
    """Saved statistics with the biased variance; the running variance follows the unbiased one (Bessel's
    correction, as cuDNN and PyTorch update it): next = (1 - momentum) * running + momentum * batch."""
    x, scale, bias, running_mean, running_var = ins
    axes = [d for d in range(x.dim()) if d != 1]
    y, mean, inv_var = _standardize(x, axes, a["epsilon"])
    m = a["momentum"]
    unbiased = x.var(axes, keepdim=True, correction=1)
    return [
        _affine(y, scale, bias),
        mean,
        inv_var,
        (1 - m) * running_mean + m * mean,
        (1 - m) * running_var + m * unbiased,
    ]


def lower_batchnorm(ctx, ins, a):
    x, scale, bias, running_mean, running_var = ins
    res = ctx.g.batchnorm(
        x,
        scale,
        bias,
        running_mean,
        running_var,
        ctx.constant(a["epsilon"], "epsilon"),
        ctx.constant(a["momentum"], "momentum"),
        **ctx.kw,
    )
    return [res[i] for i in range(5)]  # [Y, mean, inv_var, next_running_mean, next_running_var]


def ref_instancenorm(ins, a, outs):
    x, scale, bias = ins
    y, mean, inv_var = _standardize(x, list(range(2, x.dim())), a["epsilon"])
    return [_affine(y, scale, bias), mean, inv_var][: len(outs)]


def ref_adalayernorm(ins, a, outs):
    x, scale, bias = ins
    y, mean, inv_var = _standardize(x, _norm_axes(x, scale), a["epsilon"])
    return [_affine(y, scale, bias), mean, inv_var][: len(outs)]


def ref_genstats(ins, a, outs):
    x = ins[0]
    axes = [d for d in range(x.dim()) if d != 1]
    return [x.sum(axes, keepdim=True), x.square().sum(axes, keepdim=True)]


def lower_genstats(ctx, ins, a):
    res = ctx.g.genstats(ins[0], **ctx.kw)
    return [res[0], res[1]]  # [SUM, SQ_SUM]


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


# ---- layout ---------------------------------------------------------------------------


def ref_transpose(ins, a, outs):
    return [ins[0].permute(*a["perm"]).contiguous()]


def lower_transpose(ctx, ins, a):
    lead = list(range(ctx.lead))
    return [ctx.g.transpose(ins[0], permutation=lead + [p + ctx.lead for p in a["perm"]], **ctx.kw)]


def ref_reshape(ins, a, outs):
    return [ins[0].reshape(a["shape"])]


def lower_reshape(ctx, ins, a):
    return [ctx.g.reshape(ins[0], name=ctx.name)]


def ref_slice(ins, a, outs):
    return [ins[0][tuple(slice(s, e) for s, e in zip(a["start"], a["end"]))]]


def lower_slice(ctx, ins, a):
    lead = [slice(0, 1)] * ctx.lead
    return [ctx.g.slice(ins[0], slices=lead + [slice(s, e) for s, e in zip(a["start"], a["end"])], **ctx.kw)]


IMPLS: dict[str, OpImpl] = {
    **{op: _unary(op) for op in _UNARY_REF},
    **{op: _binary(op) for op in _BINARY_REF},
    **{op: _compare(op) for op in _COMPARE_REF},
    "relu": OpImpl(ref_relu, lower_relu),
    "gen_index": OpImpl(ref_gen_index, lower_gen_index),
    "logical_not": OpImpl(ref_logical_not, lower_logical_not),
    "binary_select": OpImpl(ref_binary_select, lower_binary_select),
    "concatenate": OpImpl(ref_concatenate, lower_concatenate),
    "leaky_relu": OpImpl(ref_leaky_relu, lower_leaky_relu),
    "swish": OpImpl(ref_swish, lower_swish),
    "conv_fprop": OpImpl(ref_conv_fprop, _lower_conv("conv_fprop")),
    "conv_dgrad": OpImpl(ref_conv_dgrad, _lower_conv("conv_dgrad")),
    "conv_wgrad": OpImpl(ref_conv_wgrad, _lower_conv("conv_wgrad")),
    "matmul": OpImpl(ref_matmul, lower_matmul),
    "reduction": OpImpl(ref_reduction, lower_reduction),
    "sdpa": OpImpl(ref_sdpa, lower_sdpa, undefined_sdpa, drawn=drawn_sdpa),
    "sdpa_fp8": OpImpl(ref_sdpa_fp8, lower_sdpa_fp8),
    "layernorm": OpImpl(ref_layernorm, _lower_norm("layernorm", 3), stats="together"),
    "rmsnorm": OpImpl(ref_rmsnorm, _lower_norm("rmsnorm", 2)),
    "batchnorm_inference": OpImpl(ref_batchnorm_inference, lower_batchnorm_inference),
    "batchnorm": OpImpl(ref_batchnorm, lower_batchnorm, stats="always"),
    "instancenorm": OpImpl(ref_instancenorm, _lower_norm("instancenorm", 3), stats="together"),
    "adalayernorm": OpImpl(ref_adalayernorm, _lower_norm("adalayernorm", 3), stats="together"),
    "genstats": OpImpl(ref_genstats, lower_genstats),
    "rope": OpImpl(ref_rope, lower_rope),
    "transpose": OpImpl(ref_transpose, lower_transpose),
    "reshape": OpImpl(ref_reshape, lower_reshape),
    "slice": OpImpl(ref_slice, lower_slice),
}


# ---- backward ops (issue 10): the frontend's gradient ops ---------------------------------------------------
# Closed forms (the reference runs under no_grad, and `emit --format torch` traces it); the CPU tests
# hold each against torch autograd of the forward op's reference.


def _gelu_tanh_grad(x):
    k = math.sqrt(2.0 / math.pi)
    t = torch.tanh(k * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)


#: forward op -> its derivative at x, given the canonical attributes
_DERIVATIVE = {
    "relu": lambda x, a: torch.where(
        x <= a["lower_clip"],
        torch.full_like(x, a["negative_slope"]),
        torch.ones_like(x) if a["upper_clip"] is None else (x < a["upper_clip"]).to(x.dtype),
    ),
    "leaky_relu": lambda x, a: torch.where(x > 0, torch.ones_like(x), torch.full_like(x, a["slope"])),
    "gelu": lambda x, a: (
        0.5 * (1 + torch.erf(x / math.sqrt(2.0))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    ),
    "gelu_tanh": lambda x, a: _gelu_tanh_grad(x),
    "sigmoid": lambda x, a: torch.sigmoid(x) * (1 - torch.sigmoid(x)),
    "tanh": lambda x, a: 1 - torch.tanh(x) ** 2,
    "elu": lambda x, a: torch.where(x > 0, torch.ones_like(x), torch.exp(x)),
    "softplus": lambda x, a: torch.sigmoid(x),
    "swish": lambda x, a: torch.sigmoid(a["beta"] * x) * (1 + a["beta"] * x * (1 - torch.sigmoid(a["beta"] * x))),
}


def _pointwise_backward(op: str) -> OpImpl:
    """dy * f'(x); cuDNN's modes take the gradient and the forward op's input (loss, input)."""
    forward = op.removesuffix("_backward")
    derivative = _DERIVATIVE[forward]
    builder = CUDNN_NAME.get(op, op)
    extra = {
        "relu": lambda a: {k: v for k, v in a.items() if v != _RELU_DEFAULTS[k]},
        "leaky_relu": lambda a: {"negative_slope": a["slope"]},
        "swish": lambda a: {"swish_beta": a["beta"]},
    }.get(forward, lambda a: {})

    def ref(ins, a, outs):
        dy, x = _as_tensors(ins)
        return [dy * derivative(x, a)]

    def lower(ctx, ins, a):
        return [getattr(ctx.g, builder)(ins[0], ins[1], **extra(a), **ctx.kw)]

    return OpImpl(ref, lower)


def _sum_to(t: torch.Tensor, shape) -> torch.Tensor:
    """t summed over the axes where `shape` is 1 and t is not (a broadcast's gradient)."""
    axes = [i for i, (d, s) in enumerate(zip(t.shape, shape)) if s == 1 and d != 1]
    return t.sum(axes, keepdim=True) if axes else t


def _norm_grads(dy, x, scale, mean, inv_var, axes):
    """dx, dscale, dbias of y = (x - mean) * inv_var * scale + bias, with mean and inv_var the statistics
    of x over `axes` (mean None: an RMS norm): dx = inv_var * (g - mean(g) - xhat * mean(g * xhat)),
    g = dy * scale, the means over `axes`."""
    xhat = (x if mean is None else x - mean) * inv_var
    g = dy * scale
    centred = g - g.mean(axes, keepdim=True) if mean is not None else g
    dx = inv_var * (centred - xhat * (g * xhat).mean(axes, keepdim=True))
    return [dx, _sum_to(dy * xhat, scale.shape), _sum_to(dy, scale.shape)]


def _ref_norm_backward(axes_of):
    def ref(ins, a, outs):
        dy, x, scale, *stats = ins
        mean, inv_var = stats if len(stats) == 2 else (None, stats[0])
        return _norm_grads(dy, x, scale, mean, inv_var, axes_of(x, scale))[: len(outs)]

    return ref


def _lower_norm_backward(builder: str):
    def lower(ctx, ins, a):
        more = {"has_dbias": a["dbias"]} if "dbias" in a else {}
        res = getattr(ctx.g, builder)(*ins, **more, **ctx.kw)
        return [res[i] for i in range(2 + bool(a.get("dbias", True)))]  # [DX, DScale, DBias]

    return lower


def ref_sdpa_backward(ins, a, outs):
    """dq, dk, dv from P = exp(s - stats) (s the forward's masked scores, stats its log-sum-exp) as cuDNN
    recomputes it: dv = Pd^T do, dP = (do v^T) * dropout, dS = P * (dP - rowsum(do * o)), dq = dS k * scale,
    dk = dS^T q * scale; grouped K/V heads sum their queries' gradients. A row with no key has P = 0. With
    dropout, cuDNN's graph scales rowsum(do * o) by dropout_scale_inv (the frontend's sdpa_backward node), and
    so does this: dS = P * (dP - rowsum(do * o) * scale * scale_inv), the usual gradient when scale_inv is
    1 / scale."""
    q, k, v, o, do, stats, bias, len_q, len_kv, drop_mask, drop_scale, drop_scale_inv = ins
    h, hk, hv = q.shape[1], k.shape[1], v.shape[1]
    kr, vr = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hv, 1)
    s = _scores(q, kr, bias, a, len_q, len_kv)
    p = torch.exp(s - stats).masked_fill(stats.isneginf() | s.isneginf(), 0.0)
    keep = 1.0 if drop_mask is None else drop_mask * drop_scale
    rescale = 1.0 if drop_mask is None else drop_scale * drop_scale_inv
    dv = torch.matmul((p * keep).transpose(-1, -2), do)
    dp = torch.matmul(do, vr.transpose(-1, -2)) * keep
    ds = p * (dp - (do * o).sum(-1, keepdim=True) * rescale)
    dq = torch.matmul(ds, kr) * a["scale"]
    dk = torch.matmul(ds.transpose(-1, -2), q) * a["scale"]
    b, skv = q.shape[0], k.shape[2]
    dk = dk.reshape(b, hk, h // hk, skv, k.shape[3]).sum(2)
    dv = dv.reshape(b, hv, h // hv, skv, v.shape[3]).sum(2)
    return [dq, dk, dv, _sum_to(ds, bias.shape)] if a["dbias"] else [dq, dk, dv]


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
    q, k, v, o, do, stats, bias, len_q, len_kv, drop_mask, drop_scale, drop_scale_inv = ins
    kw = {"attn_scale": a["scale"], **_masks(ctx, a, bias, len_q, len_kv)}
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
    res = ctx.g.sdpa_backward(q, k, v, o, do, stats, **kw, **ctx.kw)
    return [res[0], res[1], res[2]] + ([kw["dBias"]] if a["dbias"] else [])  # [dQ, dK, dV, dBias]


def ref_rope_backward(ins, a, outs):
    """rope is a rotation per pair of dims, times output_scale: its gradient rotates dy by the opposite angles."""
    dy, freqs = ins
    return ref_rope([dy, -freqs], a, outs)


def lower_rope_backward(ctx, ins, a):
    return [ctx.g.rope_backward(ins[0], ins[1], output_scale=a["output_scale"], rope_dim=a["rope_dim"], **ctx.kw)]


def _layer_axes(x, scale) -> list[int]:
    return _norm_axes(x, scale)


def _batch_axes(x, scale) -> list[int]:
    return [d for d in range(x.dim()) if d != 1]


def _spatial_axes(x, scale) -> list[int]:
    return list(range(2, x.dim()))


BACKWARD_IMPLS: dict[str, OpImpl] = {
    **{f"{op}_backward": _pointwise_backward(f"{op}_backward") for op in _DERIVATIVE},
    "rope_backward": OpImpl(ref_rope_backward, lower_rope_backward),
    "layernorm_backward": OpImpl(_ref_norm_backward(_layer_axes), _lower_norm_backward("layernorm_backward")),
    "rmsnorm_backward": OpImpl(_ref_norm_backward(_layer_axes), _lower_norm_backward("rmsnorm_backward")),
    "batchnorm_backward": OpImpl(_ref_norm_backward(_batch_axes), _lower_norm_backward("batchnorm_backward")),
    "instancenorm_backward": OpImpl(_ref_norm_backward(_spatial_axes), _lower_norm_backward("instancenorm_backward")),
    "adalayernorm_backward": OpImpl(_ref_norm_backward(_layer_axes), _lower_norm_backward("adalayernorm_backward")),
    "sdpa_backward": OpImpl(ref_sdpa_backward, lower_sdpa_backward, undefined_sdpa_backward),
}
IMPLS.update(BACKWARD_IMPLS)
