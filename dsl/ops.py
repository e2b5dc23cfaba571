"""Semantic layer: the op registry of the language — signatures, attributes, shape and dtype rules.

One entry per op. The checker reads it; so do the backend tables in ``cudnn_dsl/ops.py``
(torch reference and cuDNN lowering), which hold exactly the same keys (a test proves it).
Attributes reach the back end canonical: every default filled, every list at its full length,
every enum in its declared spelling (``canonical``), so no back-end row ever fills a default.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from dsl.diagnostics import RuleError
from dsl.types import TensorType, broadcast, dense_strides, fmt_shape, is_float, stride_order
from dsl.values import DERIVED, REQUIRED, Attr


@attrs.frozen
class Out:
    """One inferred result of an op: shape, stride order, and a dtype when the op fixes it."""

    shape: tuple[int, ...]
    order: tuple[int, ...]
    dtype: str | None = None
    """set when the op fixes its result's dtype (sdpa's stats are float)"""


@attrs.frozen
class Ctx:
    """What a shape rule sees: the input types (None for absent optionals) and the canonical attributes."""

    op: str
    inputs: tuple[TensorType | None, ...]
    attrs: dict


@attrs.frozen
class Family:
    """What ops of one kind share: the word cuDNN's messages use for them, and advice for when
    cuDNN declines a graph holding one."""

    words: tuple[str, ...]
    advice: str


FAMILIES = {
    "pointwise": Family(
        ("pointwise",),
        "pointwise ops fuse as the epilogue of a matmul, conv or norm; a chain of "
        "pointwise ops alone may need a graph of its own",
    ),
    "conv": Family(
        ("conv", "convolution"),
        "NHWC layouts for conv tensors, half/bf16 data with float compute, and channel counts that are multiples of 8",
    ),
    "matmul": Family(("matmul",), "half/bf16 data with float compute, and inner dims that are multiples of 8"),
    "reduction": Family(
        ("reduction",), "a reduction fuses after a matmul or conv over its output; alone it may need a graph of its own"
    ),
    "attention": Family(
        ("sdpa", "attention", "alibi", "causal", "diagonal_band", "padding mask", "seq_len", "dropout", "hidden_dim"),
        "half/bf16 q, k, v with head dims that are multiples of 8 (at most 256)",
    ),
    "norm": Family(
        ("norm", "layernorm", "rmsnorm", "batchnorm", "instancenorm", "adalayernorm", "genstats"),
        "norms fuse with a pointwise epilogue on some engines only; a norm alone is the safest graph",
    ),
    "layout": Family(
        ("reshape", "transpose", "slice", "concat"), "layout ops need a newer cuDNN, or a graph of their own"
    ),
}


@attrs.frozen
class OpSig:
    name: str
    family: str
    inputs: tuple[str, ...]
    infer: Callable[[Ctx], list[Out]]
    optional: tuple[str, ...] = ()
    attrs: tuple[Attr, ...] = ()
    outputs: tuple[str, ...] = ("out",)
    doc: str = ""
    positive: tuple[int, ...] = ()
    """inputs whose domain is positive (generated test data avoids 0 and negatives there)"""
    flops: Callable[[Ctx, list], int] | None = None
    """floating-point operations for these input and output types (default: one per output element)"""
    results: Callable[[dict], int] | None = None
    """how many of `outputs` a call returns, given its attributes (default: one)"""
    derive: Callable[[Ctx], dict] | None = None
    """fills the attributes whose default is DERIVED, from the input types"""
    lint: Callable[[tuple], list[tuple[int, str]]] | None = None
    """warnings about the declared inputs, as (input index, message); the checker locates them"""
    keeps_dtype: bool = False
    """cuDNN wants the result in the input's dtype (its layout ops do)"""
    result_dtype: str | None = None
    """the result's dtype unless the file declares another (comparisons give bool)"""
    compute: str | None = None
    """this op's compute dtype unless the call says `compute=` (logic ops compute in bool)"""
    variadic: bool = False
    """the last input repeats: a call takes len(inputs) or more (concatenate)"""
    ragged: tuple[tuple[int, int, int], ...] = ()
    """ragged offsets, as (offset input, the tensor it places: an input index, or -1 - k for output k,
    the lengths input): sequence b of that tensor starts at element offset[b], in place of b times
    its batch stride; generated offsets pack the sequences back to back (sdpa's THD layout)"""

    folded: tuple[str, ...] = ()
    """attributes that only spell others: `derive` folds them in and the IR drops them"""
    domains: Callable[[Ctx], dict[int, tuple[int, int]]] | None = None
    """integer inputs' valid values [lo, hi], by input index, from the input types and canonical
    attributes (sdpa's sequence lengths are in [1, S], its page tables index K/V's blocks);
    generated test data stays inside"""

    @property
    def ports(self) -> str:
        """How messages and docs list the inputs: `x, w, [bias]`, or `x, x, ...` when the last repeats."""
        more = (self.inputs[-1], "...") if self.variadic else ()
        return ", ".join(self.inputs + more + tuple(f"[{p}]" for p in self.optional))

    def count_results(self, attrs_: dict) -> int:
        return self.results(attrs_) if self.results is not None else 1

    def count_flops(self, ctx: Ctx, outs: list[TensorType]) -> int:
        if self.flops is not None:
            return self.flops(ctx, outs)
        return sum(math.prod(o.shape) for o in outs)

    def attr(self, name: str) -> Attr | None:
        for a in self.attrs + COMMON_ATTRS:
            if a.name == name:
                return a
        return None

    @property
    def all_attrs(self) -> tuple[Attr, ...]:
        return self.attrs + COMMON_ATTRS


COMMON_ATTRS = (
    Attr("compute", "dtype", None, doc="compute data type of this op (default: the graph's)", optional=True),
)

REDUCTION_MODES = ("sum", "mul", "min", "max", "amax", "avg", "norm1", "norm2", "mul_no_zeros")


def canonical(sig: OpSig, given: dict, inputs: tuple[TensorType | None, ...]) -> dict:
    """The full attribute set of one application: given values, defaults, spatial lists expanded to
    the spatial rank, derived values computed. RuleError(at=name) when a given value does not fit."""
    out: dict[str, Any] = {}
    for a in sig.attrs:
        v = given.get(a.name, a.default)
        if a.kind == "spatial":
            n = len(inputs[0].shape) - 2
            if isinstance(v, int):
                v = (v,) * n
            elif len(v) != n:
                raise RuleError(f"{sig.name}: '{a.name}' has {len(v)} values, the input has {n} spatial dims", a.name)
        out[a.name] = v
    if sig.derive is not None:
        out.update(sig.derive(Ctx(sig.name, inputs, out)))
    for name in sig.folded:
        del out[name]
    assert not any(v is DERIVED or v is REQUIRED for v in out.values()), out
    return out


# ---- shape rules -------------------------------------------------------------------


def _row_major(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


def _same_kind(ctx: Ctx, *idx: int) -> None:
    """Floats and integers do not mix; a bool mixes with either, as 0 and 1 (cuDNN's bitmask samples
    multiply a gradient by a bool mask)."""
    ts = [(i, ctx.inputs[i]) for i in idx if ctx.inputs[i] is not None and ctx.inputs[i].dtype != "bool"]
    for i, t in ts[1:]:
        if is_float(t.dtype) != is_float(ts[0][1].dtype):
            raise RuleError(
                f"{ctx.op}: dtype conflict: input {ts[0][0] + 1} is {ts[0][1].dtype}, input {i + 1} is {t.dtype}",
                i,
            )


def infer_unary(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    return [Out(x.shape, stride_order(x.strides))]


def infer_binary(ctx: Ctx) -> list[Out]:
    a, b = ctx.inputs[0], ctx.inputs[1]
    _same_kind(ctx, 0, 1)
    if len(a.shape) != len(b.shape):
        raise RuleError(
            f"{ctx.op}: inputs have ranks {len(a.shape)} and {len(b.shape)} ({fmt_shape(a.shape)} and "
            f"{fmt_shape(b.shape)}); cuDNN pointwise ops need equal ranks, with 1 where an axis broadcasts",
            1,
        )
    shape = broadcast(a.shape, b.shape)
    if shape is None:
        raise RuleError(f"{ctx.op}: shapes {fmt_shape(a.shape)} and {fmt_shape(b.shape)} do not broadcast", 1)
    full = a if a.shape == shape else b if b.shape == shape else a
    return [Out(shape, stride_order(full.strides))]


def infer_bias(ctx: Ctx) -> list[Out]:
    """bias/scale: the second input broadcasts onto the first, whose shape is kept."""
    x, b = ctx.inputs[0], ctx.inputs[1]
    out = infer_binary(ctx)
    if out[0].shape != x.shape:
        raise RuleError(
            f"{ctx.op}: {fmt_shape(b.shape)} must broadcast onto the input {fmt_shape(x.shape)} without growing it",
            1,
        )
    return out


def _broadcast_all(ctx: Ctx) -> list[Out]:
    """Every input broadcast to one shape (equal ranks); the result takes the full input's layout."""
    ts = [t for t in ctx.inputs if t is not None]
    shape = ts[0].shape
    for i, t in enumerate(ts[1:], 1):
        if len(t.shape) != len(shape):
            raise RuleError(
                f"{ctx.op}: input {i + 1} has rank {len(t.shape)}, input 1 has rank {len(shape)}; cuDNN pointwise "
                f"ops need equal ranks, with 1 where an axis broadcasts",
                i,
            )
        shape = broadcast(shape, t.shape)
        if shape is None:
            raise RuleError(
                f"{ctx.op}: shapes {', '.join(fmt_shape(t.shape) for t in ts[: i + 1])} do not broadcast", i
            )
    full = next((t for t in ts if t.shape == shape), ts[0])
    return [Out(shape, stride_order(full.strides))]


def _bool_inputs(ctx: Ctx, *idx: int) -> None:
    for i in idx:
        if ctx.inputs[i].dtype != "bool":
            raise RuleError(
                f"{ctx.op}: input {i + 1} is {ctx.inputs[i].dtype}; it must be bool (a comparison gives one: "
                f"cmp_neq(x, 0))",
                i,
            )


def infer_compare(ctx: Ctx) -> list[Out]:
    """Comparisons compare in the compute dtype, so integers and floats mix (an int32 gen_index
    against a float literal); deviceless planning with cuDNN 9.28 accepts it."""
    return _broadcast_all(ctx)


def infer_logic(ctx: Ctx) -> list[Out]:
    """logical_and/or/not: bool in, bool out."""
    _bool_inputs(ctx, *range(len(ctx.inputs)))
    return _broadcast_all(ctx)


def infer_select(ctx: Ctx) -> list[Out]:
    """binary_select(a, b, mask): a where mask, else b."""
    _same_kind(ctx, 0, 1)
    _bool_inputs(ctx, 2)
    return _broadcast_all(ctx)


def infer_gen_index(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    if ctx.attrs["axis"] >= len(x.shape):
        raise RuleError(f"{ctx.op}: axis {ctx.attrs['axis']} is out of range for rank {len(x.shape)}", "axis")
    return [Out(x.shape, stride_order(x.strides))]


def infer_concatenate(ctx: Ctx) -> list[Out]:
    ts = ctx.inputs
    axis = ctx.attrs["axis"]
    x = ts[0]
    if axis >= len(x.shape):
        raise RuleError(f"{ctx.op}: axis {axis} is out of range for rank {len(x.shape)}", "axis")
    for i, t in enumerate(ts[1:], 1):
        if t.dtype != x.dtype:
            raise RuleError(f"{ctx.op}: dtype conflict: input 1 is {x.dtype}, input {i + 1} is {t.dtype}", i)
        if len(t.shape) != len(x.shape) or any(a != b for k, (a, b) in enumerate(zip(t.shape, x.shape)) if k != axis):
            raise RuleError(
                f"{ctx.op}: input {i + 1} {fmt_shape(t.shape)} differs from input 1 {fmt_shape(x.shape)} "
                f"off axis {axis}",
                i,
            )
    shape = tuple(sum(t.shape[axis] for t in ts) if k == axis else d for k, d in enumerate(x.shape))
    return [Out(shape, stride_order(x.strides))]


def _conv_params(ctx: Ctx):
    return ctx.attrs["padding"], ctx.attrs["stride"], ctx.attrs["dilation"]


def _conv_rank(ctx: Ctx, t: TensorType, i: int, what: str) -> None:
    if len(t.shape) not in (3, 4, 5):
        raise RuleError(f"{ctx.op}: {what} must have rank 3, 4 or 5 (N, C, spatial...), got {fmt_shape(t.shape)}", i)


def infer_conv_fprop(ctx: Ctx) -> list[Out]:
    x, w = ctx.inputs
    _conv_rank(ctx, x, 0, "image")
    if len(w.shape) != len(x.shape):
        raise RuleError(f"{ctx.op}: weight {fmt_shape(w.shape)} and image {fmt_shape(x.shape)} differ in rank", 1)
    if x.dtype != w.dtype:
        raise RuleError(f"{ctx.op}: dtype conflict: image is {x.dtype}, weight is {w.dtype}", 1)
    c, wc, k = x.shape[1], w.shape[1], w.shape[0]
    if wc == 0 or c % wc:
        raise RuleError(
            f"{ctx.op}: image has {c} channels, weight expects {wc} (channels must be a multiple of the "
            f"weight's for a grouped convolution)",
            1,
        )
    groups = c // wc
    if k % groups:
        raise RuleError(f"{ctx.op}: {k} output channels do not divide into {groups} groups", 1)
    pad, stride, dil = _conv_params(ctx)
    spatial = []
    for i, (h, r) in enumerate(zip(x.shape[2:], w.shape[2:])):
        o = (h + 2 * pad[i] - dil[i] * (r - 1) - 1) // stride[i] + 1
        if o < 1:
            raise RuleError(f"{ctx.op}: filter {r} (dilation {dil[i]}) is larger than the padded input {h}", 1)
        spatial.append(o)
    return [Out((x.shape[0], k, *spatial), stride_order(x.strides))]


def infer_conv_dgrad(ctx: Ctx) -> list[Out]:
    dy, w = ctx.inputs
    _conv_rank(ctx, dy, 0, "gradient")
    if len(w.shape) != len(dy.shape):
        raise RuleError(f"{ctx.op}: filter {fmt_shape(w.shape)} and gradient {fmt_shape(dy.shape)} differ in rank", 1)
    if dy.shape[1] != w.shape[0]:
        raise RuleError(f"{ctx.op}: gradient has {dy.shape[1]} channels, filter has {w.shape[0]} outputs", 1)
    pad, stride, dil = _conv_params(ctx)
    extra = ctx.attrs["output_padding"]
    for i, e in enumerate(extra):
        if e >= stride[i]:
            raise RuleError(
                f"{ctx.op}: output_padding {list(extra)} must be below the stride {list(stride)} on each axis "
                f"(any more and the forward convolution would not give this gradient's size)",
                "output_padding",
            )
    spatial = [
        (o - 1) * stride[i] - 2 * pad[i] + dil[i] * (r - 1) + 1 + extra[i]
        for i, (o, r) in enumerate(zip(dy.shape[2:], w.shape[2:]))
    ]
    if any(s < 1 for s in spatial):
        raise RuleError(f"{ctx.op}: no input size gives gradient {fmt_shape(dy.shape)}", 0)
    return [Out((dy.shape[0], w.shape[1], *spatial), stride_order(dy.strides))]


def _wgrad_filter(x: TensorType, dy: TensorType, pad, stride, dil) -> tuple[int, ...]:
    """The filter size that maps x to dy (the largest, when stride leaves a choice)."""
    return tuple(
        (h + 2 * p - (o - 1) * s - 1) // d + 1 for h, o, p, s, d in zip(x.shape[2:], dy.shape[2:], pad, stride, dil)
    )


def derive_conv_wgrad(ctx: Ctx) -> dict:
    x, dy = ctx.inputs
    if ctx.attrs["filter"] is not DERIVED:
        return {}
    if len(x.shape) != len(dy.shape):
        return {"filter": (1,) * (len(x.shape) - 2)}  # the shape rule reports the rank mismatch
    return {"filter": _wgrad_filter(x, dy, *_conv_params(ctx))}


def infer_conv_wgrad(ctx: Ctx) -> list[Out]:
    x, dy = ctx.inputs
    _conv_rank(ctx, x, 0, "image")
    if len(x.shape) != len(dy.shape) or x.shape[0] != dy.shape[0]:
        raise RuleError(f"{ctx.op}: image {fmt_shape(x.shape)} and gradient {fmt_shape(dy.shape)} do not match", 1)
    pad, stride, dil = _conv_params(ctx)
    filt = ctx.attrs["filter"]
    if len(filt) != len(x.shape) - 2:
        raise RuleError(
            f"{ctx.op}: 'filter' has {len(filt)} values, the image has {len(x.shape) - 2} spatial dims", "filter"
        )
    fits = all(
        r >= 1 and (h + 2 * p - d * (r - 1) - 1) // s + 1 == o
        for r, h, o, p, s, d in zip(filt, x.shape[2:], dy.shape[2:], pad, stride, dil)
    )
    if not fits:
        raise RuleError(
            f"{ctx.op}: a filter of {list(filt)} does not map image {fmt_shape(x.shape)} to gradient "
            f"{fmt_shape(dy.shape)} with this padding, stride and dilation",
            "filter",
        )
    return [Out((dy.shape[1], x.shape[1], *filt), stride_order(x.strides))]


def infer_matmul(ctx: Ctx) -> list[Out]:
    a, b = ctx.inputs
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise RuleError(f"{ctx.op}: inputs need rank >= 2, got {fmt_shape(a.shape)} and {fmt_shape(b.shape)}", 0)
    if len(a.shape) != len(b.shape):
        raise RuleError(
            f"{ctx.op}: inputs have ranks {len(a.shape)} and {len(b.shape)}; use 1 for broadcast batch dims", 1
        )
    if a.dtype != b.dtype:
        raise RuleError(f"{ctx.op}: dtype conflict: A is {a.dtype}, B is {b.dtype}", 1)
    if a.shape[-1] != b.shape[-2]:
        raise RuleError(
            f"{ctx.op}: inner dimensions differ: A {fmt_shape(a.shape)} has K={a.shape[-1]}, "
            f"B {fmt_shape(b.shape)} has K={b.shape[-2]}",
            1,
        )
    batch = broadcast(a.shape[:-2], b.shape[:-2])
    if batch is None:
        raise RuleError(
            f"{ctx.op}: batch dims {fmt_shape(a.shape[:-2])} and {fmt_shape(b.shape[:-2])} do not broadcast", 1
        )
    shape = (*batch, a.shape[-2], b.shape[-1])
    return [Out(shape, _row_major(len(shape)))]


def derive_reduction(ctx: Ctx) -> dict:
    rank = len(ctx.inputs[0].shape)
    axes = ctx.attrs["axes"]
    if axes is DERIVED:
        return {"axes": tuple(range(rank))}
    if any(not -rank <= a < rank for a in axes):
        raise RuleError(f"{ctx.op}: axes {list(axes)} out of range for rank {rank}", "axes")
    return {"axes": tuple(sorted({a % rank for a in axes}))}


def infer_reduction(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    axes = ctx.attrs["axes"]
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return [Out(shape, stride_order(x.strides))]


SDPA_ALIGNMENTS = ("top_left", "bottom_right")


def _given(v) -> bool:
    return v is not None and v is not DERIVED


def _derive_band(ctx: Ctx) -> dict:
    """The scale, and the mask in its one IR form: a diagonal band (left and right bounds, None for
    unbounded) with its alignment. `causal`, `causal_bottom_right` and `sliding_window_length` are
    the frontend's older spellings of the band; they fold in here and the IR drops them."""
    a = ctx.attrs
    out = {} if a["scale"] is not DERIVED else {"scale": 1.0 / math.sqrt(ctx.inputs[0].shape[-1])}
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
    if left is None and right is None:
        align = "top_left"  # no band: the alignment means nothing
    elif not _given(align):
        align = "top_left"
    return out | {"left_bound": left, "right_bound": right, "diagonal_alignment": align}


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
    seeded = _sdpa_seeded(ctx)
    _sdpa_ragged(ctx)
    o_order = BSHD if ctx.inputs[13] is not None else stride_order(q.strides)
    outs = [Out((*scores[:3], v.shape[3]), o_order)]
    if ctx.attrs["stats"]:
        outs.append(Out((*scores[:3], 1), BSHD if ctx.inputs[14] is not None else _row_major(4), "float"))
    if seeded:
        outs.append(Out(scores, _row_major(4), "float"))
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
    """Ragged offsets (THD): each int32/int64 [B+1, 1, 1, 1], with the padding lengths (they say where
    a sequence ends), on a q, k or v packed as BSHD; ragged_stats with stats=true, no paged k/v."""
    names, base, b = OPS[ctx.op].optional, len(OPS[ctx.op].inputs), ctx.inputs[0].shape[0]
    for i in range(10, 15):
        t = ctx.inputs[i]
        if t is None:
            continue
        name = names[i - base]
        if t.dtype not in ("int32", "int64") or t.shape != (b + 1, 1, 1, 1):
            raise RuleError(
                f"{ctx.op}: {name} must be int32 or int64[{b + 1}, 1, 1, 1], each sequence's first element "
                f"and one past the last; got {t.dtype}{fmt_shape(t.shape)}",
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
            if any(d > 1 and s != w for d, s, w in zip(x.shape, x.strides, want)):
                raise RuleError(
                    f"{ctx.op}: {name} packs {'qkv'[i - 10]} as BSHD (THD): its strides must be "
                    f"{list(want)}, got {list(x.strides)}",
                    i,
                )


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
    for i in range(3, 9):
        t = ctx.inputs[i]
        if t.shape != (1, 1, 1, 1) or t.dtype != "float":
            name = OPS[ctx.op].inputs[i]
            raise RuleError(f"{ctx.op}: {name} must be float[1, 1, 1, 1], got {t.dtype}{fmt_shape(t.shape)}", i)
    b, h, s, _ = q.shape
    outs = [Out((b, h, s, v.shape[3]), stride_order(q.strides)), Out((1, 1, 1, 1), _row_major(4), "float")]
    if ctx.attrs["stats"]:
        outs.append(Out((b, h, s, 1), _row_major(4), "float"))
    return outs


def _norm_rank(ctx: Ctx, least: int) -> TensorType:
    x = ctx.inputs[0]
    if len(x.shape) < least:
        raise RuleError(f"{ctx.op}: input needs rank >= {least}, got {fmt_shape(x.shape)}", 0)
    return x


def _with_stats(ctx: Ctx, x: TensorType, stats: tuple[int, ...]) -> list[Out]:
    """y, then (in training) each statistic the op returns: float, in x's stride order, as cuDNN infers them."""
    outs = [Out(x.shape, stride_order(x.strides))]
    if ctx.attrs.get("phase", "training") == "training":
        outs += [Out(stats, stride_order(x.strides), "float")] * (len(OPS[ctx.op].outputs) - 1)
    return outs


def norm_axes(x: tuple[int, ...], scale: tuple[int, ...]) -> tuple[int, ...]:
    """The axes a layer norm normalizes: those after the first where scale is not 1 (cuDNN's rule for the
    statistics' dims). x [N, C, H, W] with scale [1, C, H, W]: all but the first; x [B, S, D], [1, 1, D]: D."""
    return tuple(i for i in range(1, len(x)) if scale[i] != 1)


def _scale_bias_axes(ctx: Ctx, x: TensorType, per_sample: bool) -> tuple[int, ...]:
    """Checks scale (input 1) and bias (input 2, same shape) against x; returns the normalized axes."""
    names = OPS[ctx.op].inputs + OPS[ctx.op].optional
    scale = ctx.inputs[1]
    for i, t in enumerate(ctx.inputs[1:], 1):
        if t is None:
            continue
        if len(t.shape) != len(x.shape) or any(s not in (1, d) for s, d in zip(t.shape, x.shape)):
            raise RuleError(
                f"{ctx.op}: {names[i]} {fmt_shape(t.shape)} must broadcast onto the input {fmt_shape(x.shape)}", i
            )
    if not per_sample and scale.shape[0] != 1:
        raise RuleError(
            f"{ctx.op}: scale {fmt_shape(scale.shape)} must be 1 on the batch axis (one scale for every sample; "
            f"adalayernorm takes one per sample)",
            1,
        )
    bias = ctx.inputs[2]
    if bias is not None and bias.shape != scale.shape:
        raise RuleError(f"{ctx.op}: bias {fmt_shape(bias.shape)} differs from scale {fmt_shape(scale.shape)}", 2)
    axes = norm_axes(x.shape, scale.shape)
    if not axes:
        raise RuleError(
            f"{ctx.op}: scale {fmt_shape(scale.shape)} is 1 on every axis after the first; the axes it spans "
            f"are the ones normalized",
            1,
        )
    return axes


def infer_norm(ctx: Ctx) -> list[Out]:
    """layernorm, rmsnorm: over the axes scale spans ([1, C, H, W]: all but the first; [1, 1, D]: the last);
    statistics are x with 1 on those axes."""
    x = _norm_rank(ctx, 2)
    axes = _scale_bias_axes(ctx, x, per_sample=False)
    return _with_stats(ctx, x, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))


def _per_channel(ctx: Ctx, x: TensorType, first: int) -> tuple[int, ...]:
    want = tuple(d if i == 1 else 1 for i, d in enumerate(x.shape))
    for i, t in enumerate(ctx.inputs[first:], first):
        if t is not None and t.shape != want:
            raise RuleError(
                f"{ctx.op}: {OPS[ctx.op].inputs[i]} must be {fmt_shape(want)} (one value per channel), "
                f"got {fmt_shape(t.shape)}",
                i,
            )
    return want


def infer_batchnorm(ctx: Ctx) -> list[Out]:
    x = _norm_rank(ctx, 2)
    _per_channel(ctx, x, 1)
    return [Out(x.shape, stride_order(x.strides))]


def infer_batchnorm_training(ctx: Ctx) -> list[Out]:
    """y, then saved mean, saved inv_variance, next running mean and variance: float, per channel."""
    x = _norm_rank(ctx, 2)
    if math.prod(x.shape) // x.shape[1] < 2:
        raise RuleError(f"{ctx.op}: {fmt_shape(x.shape)} holds one value per channel; the unbiased variance needs 2", 0)
    return _with_stats(ctx, x, _per_channel(ctx, x, 1))


def infer_instancenorm(ctx: Ctx) -> list[Out]:
    """Over the spatial axes of each image and channel; scale and bias per channel; statistics [N, C, 1, ...]."""
    x = _norm_rank(ctx, 3)
    _per_channel(ctx, x, 1)
    return _with_stats(ctx, x, x.shape[:2] + (1,) * (len(x.shape) - 2))


def infer_adalayernorm(ctx: Ctx) -> list[Out]:
    """Scale and bias vary per sample: [N, 1, ..., D] against x [N, S, ..., D]; statistics are x with 1 on the
    normalized axes (those after the first where scale is not 1)."""
    x = _norm_rank(ctx, 2)
    axes = _scale_bias_axes(ctx, x, per_sample=True)
    return _with_stats(ctx, x, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))


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


def flops_norm(per_element: int) -> Callable[[Ctx, list], int]:
    """An estimate: `per_element` operations per element of x (statistics, normalization, scale, shift)."""
    return lambda ctx, outs: per_element * math.prod(ctx.inputs[0].shape)


def infer_genstats(ctx: Ctx) -> list[Out]:
    """Per-channel sum and sum of squares, [1, C, 1, ...] float."""
    x = _norm_rank(ctx, 2)
    shape = tuple(d if i == 1 else 1 for i, d in enumerate(x.shape))
    return [Out(shape, stride_order(x.strides), "float")] * 2


def infer_transpose(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    perm = ctx.attrs["perm"]
    if sorted(perm) != list(range(len(x.shape))):
        raise RuleError(f"{ctx.op}: perm {list(perm)} is not a permutation of the {len(x.shape)} axes", "perm")
    shape = tuple(x.shape[p] for p in perm)
    return [Out(shape, _row_major(len(shape)))]


def infer_reshape(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    shape = tuple(ctx.attrs["shape"])
    if any(d < 1 for d in shape) or math.prod(shape) != math.prod(x.shape):
        raise RuleError(
            f"{ctx.op}: cannot reshape {fmt_shape(x.shape)} ({math.prod(x.shape)} elements) to {fmt_shape(shape)}",
            "shape",
        )
    return [Out(shape, _row_major(len(shape)))]


def infer_slice(ctx: Ctx) -> list[Out]:
    x = ctx.inputs[0]
    start, end = ctx.attrs["start"], ctx.attrs["end"]
    rank = len(x.shape)
    if len(start) != rank or len(end) != rank:
        raise RuleError(f"{ctx.op}: start and end need {rank} values each", "start")
    for i, (s, e) in enumerate(zip(start, end)):
        if not 0 <= s < e <= x.shape[i]:
            raise RuleError(f"{ctx.op}: axis {i}: [{s}, {e}) is not inside [0, {x.shape[i]})", "end")
    return [Out(tuple(e - s for s, e in zip(start, end)), stride_order(x.strides))]


def lint_channels_last(inputs: tuple) -> list[tuple[int, str]]:
    """cuDNN's tensor-core convolution engines want channels-last tensors. `inputs` holds, per
    input declared in the file, (name, rank, layout or None, explicit strides?); None otherwise."""
    out = []
    for i, d in enumerate(inputs):
        if d is None:
            continue
        name, rank, layout, strided = d
        if not strided and rank in (4, 5) and layout not in ("nhwc", "ndhwc", "channels_last"):
            want = "nhwc" if rank == 4 else "ndhwc"
            out.append(
                (i, f"convolution input '{name}' is not channels-last; cuDNN's tensor-core engines want '{want}'")
            )
    return out


# ---- arithmetic counts (for TFLOP/s in tune and bench) ------------------------------------


def flops_conv(ctx: Ctx, outs) -> int:
    """2 * (elements of the forward output) * (C/groups * filter volume), for fprop, dgrad and wgrad."""
    y = {"conv_fprop": outs[0], "conv_dgrad": ctx.inputs[0], "conv_wgrad": ctx.inputs[1]}[ctx.op]
    w = {"conv_fprop": ctx.inputs[1], "conv_dgrad": ctx.inputs[1], "conv_wgrad": outs[0]}[ctx.op]
    return 2 * math.prod(y.shape) * math.prod(w.shape[1:])


def flops_matmul(ctx: Ctx, outs) -> int:
    return 2 * math.prod(outs[0].shape) * ctx.inputs[0].shape[-1]


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


# ---- the registry ----------------------------------------------------------------


_POSITIVE = {
    "log": (0,),
    "sqrt": (0,),
    "rsqrt": (0,),
    "reciprocal": (0,),
    "div": (1,),
    "pow": (0,),
    "mod": (1,),
}


def _pointwise_unary(name: str, doc: str, *attrs_: Attr) -> OpSig:
    return OpSig(name, "pointwise", ("x",), infer_unary, attrs=attrs_, doc=doc, positive=_POSITIVE.get(name, ()))


def _pointwise_binary(name: str, doc: str) -> OpSig:
    return OpSig(name, "pointwise", ("a", "b"), infer_binary, doc=doc, positive=_POSITIVE.get(name, ()))


def _compare(name: str, doc: str) -> OpSig:
    return OpSig(name, "pointwise", ("a", "b"), infer_compare, doc=doc, result_dtype="bool")


def _logic(name: str, inputs: tuple[str, ...], doc: str) -> OpSig:
    # cuDNN's own samples compute logic ops in bool (compute_data_type=BOOLEAN)
    return OpSig(name, "pointwise", inputs, infer_logic, doc=doc, result_dtype="bool", compute="bool")


_UNARY = {
    "gelu": "x * Phi(x) (erf form)",
    "gelu_tanh": "GELU, tanh approximation",
    "sigmoid": "1 / (1 + exp(-x))",
    "tanh": "tanh(x)",
    "elu": "x if x > 0 else exp(x) - 1",
    "softplus": "log(1 + exp(x))",
    "exp": "e^x",
    "log": "natural logarithm",
    "sqrt": "square root",
    "rsqrt": "1 / sqrt(x)",
    "abs": "absolute value",
    "neg": "-x",
    "reciprocal": "1 / x",
    "erf": "the error function",
    "sin": "sine",
    "cos": "cosine",
    "floor": "round down",
    "ceil": "round up",
    "tan": "tangent",
    "identity": "x (a copy, e.g. to change dtype)",
}
_BINARY = {
    "add": "a + b (infix +)",
    "sub": "a - b (infix -)",
    "mul": "a * b (infix *)",
    "div": "a / b (infix /)",
    "max": "elementwise maximum",
    "min": "elementwise minimum",
    "pow": "a ** b",
    "mod": "remainder of a / b with the sign of a (C's fmod)",
    "add_square": "a + b * b",
}
_COMPARE = {
    "cmp_eq": "a == b",
    "cmp_neq": "a != b",
    "cmp_gt": "a > b",
    "cmp_ge": "a >= b",
    "cmp_lt": "a < b",
    "cmp_le": "a <= b",
}

_SPATIAL_ATTRS = (
    Attr("padding", "spatial", 0, doc="zero padding per spatial dim", lo=0),
    Attr("stride", "spatial", 1, doc="stride per spatial dim", lo=1),
    Attr("dilation", "spatial", 1, doc="dilation per spatial dim", lo=1),
)

_EPSILON = Attr("epsilon", "float", 1e-5, lo=0, hi=None, doc="added to the variance", tensor=True)
_PHASE = Attr(
    "phase", "enum", "inference", ("inference", "training"), doc="training also returns the statistics (float)"
)


def _training_results(n: int) -> Callable[[dict], int]:
    """A norm returns y alone in inference, y and its statistics in training (the given attributes)."""
    return lambda a: n if a.get("phase") == "training" else 1


_BAND_ATTRS = (
    Attr("scale", "float", DERIVED, doc="softmax scale, attn_scale (default 1/sqrt(D))", hi=None),
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

OPS: dict[str, OpSig] = {
    "relu": _pointwise_unary(
        "relu",
        "x, clipped to [lower_clip, upper_clip]; below lower_clip, lower_clip + negative_slope * (x - lower_clip)",
        Attr("negative_slope", "float", 0.0, lo=None, hi=None, doc="slope below lower_clip (leaky)"),
        Attr("lower_clip", "float", 0.0, lo=None, hi=None, doc="where the slope starts"),
        Attr("upper_clip", "float", None, lo=None, hi=None, optional=True, doc="the ceiling (default: none)"),
    ),
    **{n: _pointwise_unary(n, d) for n, d in _UNARY.items()},
    "gen_index": OpSig(
        "gen_index",
        "pointwise",
        ("x",),
        infer_gen_index,
        attrs=(Attr("axis", "int", REQUIRED, lo=0, doc="the axis whose index each element gets"),),
        result_dtype="int32",
        doc="each element's index along `axis` (x gives only the shape)",
    ),
    "leaky_relu": _pointwise_unary(
        "leaky_relu", "x if x > 0 else slope * x", Attr("slope", "float", 0.01, hi=None, doc="slope for x < 0")
    ),
    "swish": _pointwise_unary(
        "swish", "x * sigmoid(beta * x)", Attr("beta", "float", 1.0, hi=None, doc="the sigmoid's scale")
    ),
    **{n: _pointwise_binary(n, d) for n, d in _BINARY.items()},
    "bias": OpSig("bias", "pointwise", ("x", "bias"), infer_bias, doc="x + bias, bias broadcast onto x"),
    "scale": OpSig("scale", "pointwise", ("x", "scale"), infer_bias, doc="x * scale, scale broadcast onto x"),
    # ---- comparisons and logic: results are bool unless declared otherwise ----
    **{n: _compare(n, d) for n, d in _COMPARE.items()},
    "logical_and": _logic("logical_and", ("a", "b"), "a and b (bool inputs)"),
    "logical_or": _logic("logical_or", ("a", "b"), "a or b (bool inputs)"),
    "logical_not": _logic("logical_not", ("x",), "not x (a bool input)"),
    "binary_select": OpSig(
        "binary_select", "pointwise", ("a", "b", "mask"), infer_select, doc="a where mask (bool) is true, else b"
    ),
    "concatenate": OpSig(
        "concatenate",
        "layout",
        ("x",),
        infer_concatenate,
        attrs=(Attr("axis", "int", REQUIRED, lo=0, doc="the axis the inputs are joined along"),),
        variadic=True,
        keeps_dtype=True,
        doc="the inputs joined along `axis` (equal dtypes; equal dims off the axis)",
    ),
    "conv_fprop": OpSig(
        "conv_fprop",
        "conv",
        ("image", "weight"),
        infer_conv_fprop,
        attrs=_SPATIAL_ATTRS,
        flops=flops_conv,
        lint=lint_channels_last,
        doc="convolution forward: image [N,C,H,W] * weight [K,C/groups,R,S] -> [N,K,P,Q]",
    ),
    "conv_dgrad": OpSig(
        "conv_dgrad",
        "conv",
        ("grad", "weight"),
        infer_conv_dgrad,
        attrs=_SPATIAL_ATTRS
        + (
            Attr(
                "output_padding",
                "spatial",
                0,
                doc="rows/columns added at the end of dx: with stride > 1 several input sizes give one dy",
                lo=0,
            ),
        ),
        flops=flops_conv,
        lint=lint_channels_last,
        doc="convolution data gradient: dy [N,K,P,Q], weight [K,C,R,S] -> dx [N,C,H,W]",
    ),
    "conv_wgrad": OpSig(
        "conv_wgrad",
        "conv",
        ("image", "grad"),
        infer_conv_wgrad,
        flops=flops_conv,
        derive=derive_conv_wgrad,
        lint=lint_channels_last,
        attrs=_SPATIAL_ATTRS
        + (Attr("filter", "ints", DERIVED, doc="filter spatial size (inferred from the shapes when omitted)", lo=1),),
        doc="convolution weight gradient: x [N,C,H,W], dy [N,K,P,Q] -> dw [K,C,R,S]",
    ),
    "matmul": OpSig(
        "matmul",
        "matmul",
        ("a", "b"),
        infer_matmul,
        flops=flops_matmul,
        doc="batched [..., M, K] @ [..., K, N] -> [..., M, N]",
    ),
    "reduction": OpSig(
        "reduction",
        "reduction",
        ("x",),
        infer_reduction,
        derive=derive_reduction,
        attrs=(
            Attr("mode", "enum", REQUIRED, REDUCTION_MODES, doc="how to combine elements"),
            Attr(
                "axes", "ints", DERIVED, doc="axes reduced to 1 (default: all); negative counts from the end", lo=None
            ),
        ),
        doc="reduce axes to size 1, keeping the rank",
    ),
    "sdpa": OpSig(
        "sdpa",
        "attention",
        ("q", "k", "v"),
        infer_sdpa,
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
        ),
        ragged=((10, 0, 4), (11, 1, 5), (12, 2, 5), (13, -1, 4), (14, -2, 4)),
        flops=flops_sdpa,
        derive=derive_sdpa,
        folded=("causal", "causal_bottom_right", "sliding_window_length"),
        domains=domains_sdpa,
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
        # the given attributes: stats defaults to false; seeded dropout adds the mask cuDNN drew
        results=lambda a: 1 + bool(a.get("stats")) + (a.get("dropout_probability") is not None),
        doc="scaled dot-product attention: softmax(q k^T * scale + bias + masks) v. seq_len_q/seq_len_kv "
        "(int32 [B,1,1,1], both or neither) mask padding; dropout_mask and dropout_scale ([1,1,1,1] float) "
        "multiply the probabilities, or dropout_seed and dropout_offset (int64 [1,1,1,1]) with "
        "dropout_probability draw the mask on the GPU; page_table_k/page_table_v (int32 [B,1,pages,1]) make k and v "
        "caches of blocks [N,H,block,D]; ragged_q/k/v/o/stats (int32 or int64 [B+1,1,1,1], with the lengths) "
        "place each sequence of a packed (THD) tensor",
    ),
    "sdpa_fp8": OpSig(
        "sdpa_fp8",
        "attention",
        ("q", "k", "v", "descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"),
        infer_sdpa_fp8,
        flops=flops_sdpa,
        derive=_derive_band,
        folded=("causal", "causal_bottom_right", "sliding_window_length"),
        positive=(3, 4, 5, 6, 7, 8),
        attrs=(
            *_BAND_ATTRS,
            Attr("stats", "bool", False, doc="also return the softmax stats [B,H,S,1] float, third (generate_stats)"),
        ),
        outputs=("o", "amax_o", "stats"),
        results=lambda a: 3 if a.get("stats") else 2,
        doc="FP8 attention: q, k, v fp8_e4m3 with their float [1,1,1,1] descales; the probabilities quantized "
        "with scale_s (descale_s undoes it), O scaled by scale_o; amax_o = max |O| before scale_o",
    ),
    "layernorm": OpSig(
        "layernorm",
        "norm",
        ("x", "scale", "bias"),
        infer_norm,
        attrs=(_EPSILON, _PHASE),
        outputs=("y", "mean", "inv_variance"),
        results=_training_results(3),
        flops=flops_norm(7),
        doc="layer norm over the axes scale spans (scale, bias [1, C, H, W]: all but the first; [1, 1, D]: the "
        "last); in training also mean and inv_variance (x with 1 on those axes) float",
    ),
    "rmsnorm": OpSig(
        "rmsnorm",
        "norm",
        ("x", "scale"),
        infer_norm,
        optional=("bias",),
        attrs=(_EPSILON, _PHASE),
        outputs=("y", "inv_variance"),
        results=_training_results(2),
        flops=flops_norm(5),
        doc="RMS norm over the axes scale spans, as layernorm; in training also inv_variance (x with 1 on those "
        "axes) float",
    ),
    "batchnorm_inference": OpSig(
        "batchnorm_inference",
        "norm",
        ("x", "mean", "inv_variance", "scale", "bias"),
        infer_batchnorm,
        doc="(x - mean) * inv_variance * scale + bias, per channel (axis 1)",
        positive=(2,),
    ),
    "batchnorm": OpSig(
        "batchnorm",
        "norm",
        ("x", "scale", "bias", "running_mean", "running_var"),
        infer_batchnorm_training,
        attrs=(
            _EPSILON,
            Attr(
                "momentum", "float", 0.1, lo=0, hi=1, doc="weight of this batch in the running statistics", tensor=True
            ),
        ),
        outputs=("y", "mean", "inv_variance", "next_running_mean", "next_running_var"),
        results=lambda a: 5,
        flops=flops_norm(7),
        positive=(4,),
        doc="batch norm (training) over all axes but the channel (1); scale, bias and running stats are "
        "[1, C, 1, ...]; also the saved mean and inv_variance and the next running mean and (unbiased) variance, "
        "float",
    ),
    "instancenorm": OpSig(
        "instancenorm",
        "norm",
        ("x", "scale", "bias"),
        infer_instancenorm,
        attrs=(_EPSILON, _PHASE),
        outputs=("y", "mean", "inv_variance"),
        results=_training_results(3),
        flops=flops_norm(7),
        doc="instance norm over the spatial axes of each sample and channel; scale and bias are [1, C, 1, ...]; "
        "in training also mean and inv_variance [N, C, 1, ...] float",
    ),
    "adalayernorm": OpSig(
        "adalayernorm",
        "norm",
        ("x", "scale"),
        infer_adalayernorm,
        optional=("bias",),
        attrs=(_EPSILON, _PHASE),
        outputs=("y", "mean", "inv_variance"),
        results=_training_results(3),
        flops=flops_norm(7),
        doc="adaptive layer norm: scale and bias per sample ([N, 1, D] for x [N, S, D]), over the axes after the "
        "first where scale is not 1; in training also mean and inv_variance (x with 1 there) float",
    ),
    "genstats": OpSig(
        "genstats",
        "norm",
        ("x",),
        infer_genstats,
        outputs=("sum", "sq_sum"),
        results=lambda a: 2,
        flops=flops_norm(3),
        doc="per-channel sum and sum of squares [1, C, 1, ...] float (the statistics of a later batch norm)",
    ),
    "rope": OpSig(
        "rope",
        "attention",
        ("x", "freqs"),
        infer_rope,
        derive=derive_rope,
        attrs=(
            Attr("rope_dim", "int", DERIVED, lo=0, doc="the trailing dims rotated (default, or 0: all of D)"),
            Attr("output_scale", "float", 1.0, hi=None, doc="multiplies the whole output"),
        ),
        flops=flops_norm(4),
        doc="rotary embedding, halves rotated by the angles freqs[s, 0, 0, :rope_dim/2]; x [B, H, S, D], "
        "freqs [S, 1, 1, F]; the first D - rope_dim dims pass through (scaled)",
    ),
    "transpose": OpSig(
        "transpose",
        "layout",
        ("x",),
        infer_transpose,
        attrs=(Attr("perm", "ints", REQUIRED, doc="the new order of the axes", lo=0),),
        doc="permute the axes",
        keeps_dtype=True,
    ),
    "reshape": OpSig(
        "reshape",
        "layout",
        ("x",),
        infer_reshape,
        attrs=(Attr("shape", "ints", REQUIRED, doc="the new dims", lo=1),),
        doc="same elements, new shape",
        keeps_dtype=True,
    ),
    "slice": OpSig(
        "slice",
        "layout",
        ("x",),
        infer_slice,
        attrs=(
            Attr("start", "ints", REQUIRED, doc="first index per axis", lo=0),
            Attr("end", "ints", REQUIRED, doc="one past the last index per axis", lo=0),
        ),
        doc="the box [start, end) per axis",
        keeps_dtype=True,
    ),
}

# ---- backward ops (issue 10): the frontend's gradient ops, for derived backward graphs ----------------------
# Every op here takes the loss gradient dy of a forward op and what that op saved (its input, its
# statistics); none of them is differentiated itself.


def infer_pointwise_backward(ctx: Ctx) -> list[Out]:
    """dy and the forward input x broadcast as a binary op's inputs do; dx takes their shape."""
    return infer_binary(ctx)


def _same_shape(ctx: Ctx, i: int, want: tuple[int, ...], what: str) -> None:
    t = ctx.inputs[i]
    if t is not None and t.shape != want:
        name = (OPS[ctx.op].inputs + OPS[ctx.op].optional)[i]
        raise RuleError(f"{ctx.op}: {name} {fmt_shape(t.shape)} must be {fmt_shape(want)} ({what})", i)


def _float_stats(ctx: Ctx, *idx: int) -> None:
    for i in idx:
        t = ctx.inputs[i]
        if t.dtype != "float":
            raise RuleError(f"{ctx.op}: {OPS[ctx.op].inputs[i]} is {t.dtype}; saved statistics are float", i)


def _norm_backward(
    ctx: Ctx, axes_of: Callable[[TensorType, TensorType], tuple[int, ...]], scale_rule: str
) -> list[Out]:
    """dy, x, scale, then the saved statistics: dy is x's shape, scale follows the forward norm's rule
    (`scale_rule` says it), the statistics are x with 1 on the normalized axes (`axes_of(x, scale)`).
    Results: dx like x, dscale and dbias like scale."""
    x, scale = ctx.inputs[1], ctx.inputs[2]
    least = 3 if ctx.op == "instancenorm_backward" else 2
    if len(x.shape) < least:
        raise RuleError(f"{ctx.op}: input needs rank >= {least}, got {fmt_shape(x.shape)}", 1)
    _same_kind(ctx, 0, 1)
    _same_shape(ctx, 0, x.shape, "the gradient of y, which is x's shape")
    if len(scale.shape) != len(x.shape) or any(s not in (1, d) for s, d in zip(scale.shape, x.shape)):
        raise RuleError(
            f"{ctx.op}: scale {fmt_shape(scale.shape)} must broadcast onto the input {fmt_shape(x.shape)}", 2
        )
    axes = axes_of(x, scale)
    if not axes:
        raise RuleError(f"{ctx.op}: scale {fmt_shape(scale.shape)} must be {scale_rule}", 2)
    stats = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    for i in range(3, len(ctx.inputs)):
        _same_shape(ctx, i, stats, "x with 1 on the normalized axes, as the forward norm saved it")
    _float_stats(ctx, *range(3, len(ctx.inputs)))
    grads = [Out(scale.shape, stride_order(scale.strides))] * (len(OPS[ctx.op].outputs) - 1)
    return [Out(x.shape, stride_order(x.strides)), *grads][: OPS[ctx.op].count_results(ctx.attrs)]


def _layer_axes(x: TensorType, scale: TensorType) -> tuple[int, ...]:
    return norm_axes(x.shape, scale.shape) if scale.shape[0] == 1 else ()


def _ada_axes(x: TensorType, scale: TensorType) -> tuple[int, ...]:
    return norm_axes(x.shape, scale.shape) if scale.shape[0] == x.shape[0] else ()


def _channel_axes(spatial_only: bool) -> Callable[[TensorType, TensorType], tuple[int, ...]]:
    """batchnorm: every axis but the channel; instancenorm: the spatial axes. scale is [1, C, 1, ...]."""

    def axes(x: TensorType, scale: TensorType) -> tuple[int, ...]:
        if scale.shape != tuple(d if i == 1 else 1 for i, d in enumerate(x.shape)):
            return ()
        return tuple(range(2, len(x.shape))) if spatial_only else tuple(i for i in range(len(x.shape)) if i != 1)

    return axes


def infer_layernorm_backward(ctx: Ctx) -> list[Out]:
    return _norm_backward(ctx, _layer_axes, "1 on the batch axis and not 1 on some axis after it")


def infer_adalayernorm_backward(ctx: Ctx) -> list[Out]:
    return _norm_backward(ctx, _ada_axes, "one scale per sample ([N, 1, D] for x [N, S, D])")


def infer_batchnorm_backward(ctx: Ctx) -> list[Out]:
    return _norm_backward(ctx, _channel_axes(False), "[1, C, 1, ...] (one value per channel)")


def infer_instancenorm_backward(ctx: Ctx) -> list[Out]:
    return _norm_backward(ctx, _channel_axes(True), "[1, C, 1, ...] (one value per channel)")


def infer_sdpa_backward(ctx: Ctx) -> list[Out]:
    """q, k, v as sdpa takes them; o and do [B, H, S_q, D_v]; stats [B, H, S_q, 1] float; the optional
    inputs as sdpa's. Results: dq, dk, dv like q, k, v, in their dtypes (on the H200, cuDNN 9.19 wrote float
    dq, dk and dv wrong: a derived backward whose gradients went on to a reshape materialized them float)."""
    q, k, v = _sdpa_qkv(ctx)
    b, h, s, _ = q.shape
    o_shape = (b, h, s, v.shape[3])
    for i in (3, 4):
        _sdpa_rank4(ctx, i, ("o", "do")[i - 3])
        _same_shape(ctx, i, o_shape, "attention's output: [B, H, S_q, D_v]")
        if ctx.inputs[i].dtype != q.dtype:
            raise RuleError(f"{ctx.op}: dtype conflict: q {q.dtype}, {('o', 'do')[i - 3]} {ctx.inputs[i].dtype}", i)
    _same_shape(ctx, 5, (b, h, s, 1), "the forward's softmax stats: [B, H, S_q, 1]")
    if ctx.inputs[5].dtype != "float":
        raise RuleError(f"{ctx.op}: stats is {ctx.inputs[5].dtype}; the forward's softmax stats are float", 5)
    scores = (b, h, s, k.shape[2])
    _sdpa_optional(ctx, 6, scores, "[B or 1, H or 1, S_q or 1, S_kv or 1]", None)
    _sdpa_pair(ctx, 7, 8)
    for i in (7, 8):
        _same_shape(ctx, i, (b, 1, 1, 1), "one length per batch")
        if ctx.inputs[i] is not None and ctx.inputs[i].dtype != "int32":
            raise RuleError(f"{ctx.op}: {OPS[ctx.op].optional[i - 6]} must be int32, got {ctx.inputs[i].dtype}", i)
    _sdpa_pair(ctx, 9, 10)
    _sdpa_pair(ctx, 9, 11)
    _sdpa_optional(ctx, 9, scores, "[B or 1, H or 1, S_q or 1, S_kv or 1]", None)
    _sdpa_optional(ctx, 10, (1, 1, 1, 1), "[1, 1, 1, 1]", ("float",))
    _sdpa_optional(ctx, 11, (1, 1, 1, 1), "[1, 1, 1, 1]", ("float",))
    outs = [Out(t.shape, stride_order(t.strides), t.dtype) for t in (q, k, v)]
    if ctx.attrs["dbias"]:
        bias = ctx.inputs[6]
        if bias is None:
            raise RuleError(f"{ctx.op}: dbias is the gradient of the bias: give the forward's bias (bias=...)", "dbias")
        outs.append(Out(bias.shape, stride_order(bias.strides)))
    return outs


def domains_sdpa_backward(ctx: Ctx) -> dict[int, tuple[int, int]]:
    return {7: (1, ctx.inputs[0].shape[2]), 8: (1, ctx.inputs[1].shape[2])}


def flops_sdpa_backward(ctx: Ctx, outs) -> int:
    """Two and a half times the forward's: P recomputed, then dV, dP, dQ and dK, one matmul each."""
    return 5 * flops_sdpa(ctx, outs) // 2


def _pointwise_backward(name: str, of: str, *attrs_: Attr) -> OpSig:
    return OpSig(
        name,
        "pointwise",
        ("dy", "x"),
        infer_pointwise_backward,
        attrs=attrs_,
        doc=f"dy * {of}'(x): the gradient of `{of}` at its input x, given the gradient dy of its result",
    )


_NORM_BWD_OUTPUTS = ("dx", "dscale", "dbias")

BACKWARD_OPS: dict[str, OpSig] = {
    "relu_backward": _pointwise_backward("relu_backward", "relu", *OPS["relu"].attrs),
    "leaky_relu_backward": _pointwise_backward("leaky_relu_backward", "leaky_relu", *OPS["leaky_relu"].attrs),
    **{
        f"{n}_backward": _pointwise_backward(f"{n}_backward", n)
        for n in ("gelu", "gelu_tanh", "sigmoid", "tanh", "elu", "softplus")
    },
    "swish_backward": _pointwise_backward("swish_backward", "swish", *OPS["swish"].attrs),
    "rope_backward": OpSig(
        "rope_backward",
        "attention",
        ("dy", "freqs"),
        infer_rope,
        derive=derive_rope,
        attrs=OPS["rope"].attrs,
        flops=flops_norm(4),
        doc="the gradient of rope(x, freqs) from dy: dy rotated back by the same angles (times output_scale)",
    ),
    "layernorm_backward": OpSig(
        "layernorm_backward",
        "norm",
        ("dy", "x", "scale", "mean", "inv_variance"),
        infer_layernorm_backward,
        outputs=_NORM_BWD_OUTPUTS,
        results=lambda a: 3,
        flops=flops_norm(9),
        doc="the gradients of layernorm(x, scale, bias) from dy and its saved mean and inv_variance: dx like x, "
        "dscale and dbias like scale",
    ),
    "rmsnorm_backward": OpSig(
        "rmsnorm_backward",
        "norm",
        ("dy", "x", "scale", "inv_variance"),
        infer_layernorm_backward,
        attrs=(Attr("dbias", "bool", False, doc="also return dbias, for an rmsnorm with a bias (has_dbias)"),),
        outputs=_NORM_BWD_OUTPUTS,
        results=lambda a: 3 if a.get("dbias") else 2,
        flops=flops_norm(7),
        doc="the gradients of rmsnorm(x, scale[, bias]) from dy and its saved inv_variance: dx like x, dscale "
        "(and dbias) like scale",
    ),
    "batchnorm_backward": OpSig(
        "batchnorm_backward",
        "norm",
        ("dy", "x", "scale", "mean", "inv_variance"),
        infer_batchnorm_backward,
        outputs=_NORM_BWD_OUTPUTS,
        results=lambda a: 3,
        flops=flops_norm(9),
        doc="the gradients of batchnorm (training) from dy and its saved mean and inv_variance [1, C, 1, ...]: "
        "dx like x, dscale and dbias per channel",
    ),
    "instancenorm_backward": OpSig(
        "instancenorm_backward",
        "norm",
        ("dy", "x", "scale", "mean", "inv_variance"),
        infer_instancenorm_backward,
        outputs=_NORM_BWD_OUTPUTS,
        results=lambda a: 3,
        flops=flops_norm(9),
        doc="the gradients of instancenorm from dy and its saved mean and inv_variance [N, C, 1, ...]: dx like "
        "x, dscale and dbias per channel",
    ),
    "adalayernorm_backward": OpSig(
        "adalayernorm_backward",
        "norm",
        ("dy", "x", "scale", "mean", "inv_variance"),
        infer_adalayernorm_backward,
        outputs=_NORM_BWD_OUTPUTS,
        results=lambda a: 3,
        flops=flops_norm(9),
        doc="the gradients of adalayernorm from dy and its saved mean and inv_variance: dx like x, dscale and "
        "dbias per sample, like scale",
    ),
    "sdpa_backward": OpSig(
        "sdpa_backward",
        "attention",
        ("q", "k", "v", "o", "do", "stats"),
        infer_sdpa_backward,
        optional=("bias", "seq_len_q", "seq_len_kv", "dropout_mask", "dropout_scale", "dropout_scale_inv"),
        flops=flops_sdpa_backward,
        derive=_derive_band,
        folded=("causal", "causal_bottom_right", "sliding_window_length"),
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
        ),
        outputs=("dq", "dk", "dv", "dbias"),
        results=lambda a: 4 if a.get("dbias") else 3,
        doc="the gradients of sdpa(q, k, v, ...) from do, its output o and its softmax stats (sdpa's `stats=true`), "
        "with the forward's scale, masks, bias and dropout (the frontend's backward also takes dropout_scale_inv, "
        "1 / dropout_scale): dq, dk, dv like q, k, v",
    ),
}
OPS.update(BACKWARD_OPS)

#: infix operators -> pointwise op
INFIX = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
