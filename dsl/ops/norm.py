"""Norms: signatures, shape rules, flop counts and VJP rules of layernorm, rmsnorm, batchnorm, instancenorm,
adalayernorm, batchnorm_inference and genstats, and of their backward ops."""

from __future__ import annotations

import math
from collections.abc import Callable

from dsl.diagnostics import RuleError
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
    same_kind,
    same_shape,
    x_of,
)
from dsl.types import TensorType, dense_strides, fmt_shape, stride_order
from dsl.values import Attr

FAMILY = Family(
    "norm",
    ("norm", "layernorm", "rmsnorm", "batchnorm", "instancenorm", "adalayernorm", "genstats"),
    "norms fuse with a pointwise epilogue on some engines only; a norm alone is the safest graph",
)


# ---- shape rules -------------------------------------------------------------------


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


def infer_genstats(ctx: Ctx) -> list[Out]:
    """Per-channel sum and sum of squares, [1, C, 1, ...] float."""
    x = _norm_rank(ctx, 2)
    shape = tuple(d if i == 1 else 1 for i, d in enumerate(x.shape))
    return [Out(shape, stride_order(x.strides), "float")] * 2


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
    same_kind(ctx, 0, 1)
    same_shape(ctx, OPS[ctx.op], 0, x.shape, "the gradient of y, which is x's shape")
    if len(scale.shape) != len(x.shape) or any(s not in (1, d) for s, d in zip(scale.shape, x.shape)):
        raise RuleError(
            f"{ctx.op}: scale {fmt_shape(scale.shape)} must broadcast onto the input {fmt_shape(x.shape)}", 2
        )
    axes = axes_of(x, scale)
    if not axes:
        raise RuleError(f"{ctx.op}: scale {fmt_shape(scale.shape)} must be {scale_rule}", 2)
    stats = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    for i in range(3, len(ctx.inputs)):
        same_shape(ctx, OPS[ctx.op], i, stats, "x with 1 on the normalized axes, as the forward norm saved it")
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


# ---- the rows ----------------------------------------------------------------------

_EPSILON = Attr("epsilon", "float", 1e-5, lo=0, hi=None, doc="added to the variance", tensor=True)
_PHASE = Attr(
    "phase", "enum", "inference", ("inference", "training"), doc="training also returns the statistics (float)"
)
_TRAINING = ("phase", "training")
_TOGETHER = Statistics(_TRAINING, "together")
"""mean and inv_variance in training, which cuDNN writes both or neither"""

OPS = by_name(
    FAMILY.op(
        "layernorm",
        ("x", "scale", "bias"),
        infer_norm,
        attrs=(_EPSILON, _PHASE),
        outputs=("y", "mean", "inv_variance"),
        statistics=_TOGETHER,
        flops=flops_per_element(7),
        doc="layer norm over the axes scale spans (scale, bias [1, C, H, W]: all but the first; [1, 1, D]: the "
        "last); in training also mean and inv_variance (x with 1 on those axes) float",
    ),
    FAMILY.op(
        "rmsnorm",
        ("x", "scale"),
        infer_norm,
        optional=("bias",),
        attrs=(_EPSILON, _PHASE),
        outputs=("y", "inv_variance"),
        statistics=Statistics(_TRAINING),
        flops=flops_per_element(5),
        doc="RMS norm over the axes scale spans, as layernorm; in training also inv_variance (x with 1 on those "
        "axes) float",
    ),
    FAMILY.op(
        "batchnorm_inference",
        ("x", "mean", "inv_variance", "scale", "bias"),
        infer_batchnorm,
        doc="(x - mean) * inv_variance * scale + bias, per channel (axis 1)",
        positive=(2,),
        alone="fold it into a per-channel scale s = inv_variance * scale and shift t = bias - mean * s, computed "
        "once: `bias(scale(y, s), t)` fuses into a convolution's or matmul's epilogue (examples/residual_block.cdg)",
    ),
    FAMILY.op(
        "batchnorm",
        ("x", "scale", "bias", "running_mean", "running_var"),
        infer_batchnorm_training,
        attrs=(
            _EPSILON,
            Attr(
                "momentum", "float", 0.1, lo=0, hi=1, doc="weight of this batch in the running statistics", tensor=True
            ),
        ),
        outputs=("y", "mean", "inv_variance", "next_running_mean", "next_running_var"),
        statistics=Statistics(written="always"),
        flops=flops_per_element(7),
        positive=(4,),
        doc="batch norm (training) over all axes but the channel (1); scale, bias and running stats are "
        "[1, C, 1, ...]; also the saved mean and inv_variance and the next running mean and (unbiased) variance, "
        "float",
    ),
    FAMILY.op(
        "instancenorm",
        ("x", "scale", "bias"),
        infer_instancenorm,
        attrs=(_EPSILON, _PHASE),
        outputs=("y", "mean", "inv_variance"),
        statistics=_TOGETHER,
        flops=flops_per_element(7),
        doc="instance norm over the spatial axes of each sample and channel; scale and bias are [1, C, 1, ...]; "
        "in training also mean and inv_variance [N, C, 1, ...] float",
    ),
    FAMILY.op(
        "adalayernorm",
        ("x", "scale"),
        infer_adalayernorm,
        optional=("bias",),
        attrs=(_EPSILON, _PHASE),
        outputs=("y", "mean", "inv_variance"),
        statistics=_TOGETHER,
        flops=flops_per_element(7),
        doc="adaptive layer norm: scale and bias per sample ([N, 1, D] for x [N, S, D]), over the axes after the "
        "first where scale is not 1; in training also mean and inv_variance (x with 1 there) float",
    ),
    FAMILY.op(
        "genstats",
        ("x",),
        infer_genstats,
        outputs=("sum", "sq_sum"),
        results=lambda a: 2,
        flops=flops_per_element(3),
        doc="per-channel sum and sum of squares [1, C, 1, ...] float (the statistics of a later batch norm)",
    ),
)

_NORM_BWD_OUTPUTS = ("dx", "dscale", "dbias")

BACKWARD_OPS = by_name(
    FAMILY.op(
        "layernorm_backward",
        ("dy", "x", "scale", "mean", "inv_variance"),
        infer_layernorm_backward,
        prologue=(2,),  # the scale: a zero-centred gamma's + 1 fuses before it
        outputs=_NORM_BWD_OUTPUTS,
        results=lambda a: 3,
        flops=flops_per_element(9),
        doc="the gradients of layernorm(x, scale, bias) from dy and its saved mean and inv_variance: dx like x, "
        "dscale and dbias like scale",
    ),
    FAMILY.op(
        "rmsnorm_backward",
        ("dy", "x", "scale", "inv_variance"),
        infer_layernorm_backward,
        attrs=(Attr("dbias", "bool", False, doc="also return dbias, for an rmsnorm with a bias (has_dbias)"),),
        prologue=(2,),  # the scale: a zero-centred gamma's + 1 fuses before it
        outputs=_NORM_BWD_OUTPUTS,
        results=lambda a: 3 if a.get("dbias") else 2,
        flops=flops_per_element(7),
        doc="the gradients of rmsnorm(x, scale[, bias]) from dy and its saved inv_variance: dx like x, dscale "
        "(and dbias) like scale",
    ),
    FAMILY.op(
        "batchnorm_backward",
        ("dy", "x", "scale", "mean", "inv_variance"),
        infer_batchnorm_backward,
        outputs=_NORM_BWD_OUTPUTS,
        results=lambda a: 3,
        flops=flops_per_element(9),
        doc="the gradients of batchnorm (training) from dy and its saved mean and inv_variance [1, C, 1, ...]: "
        "dx like x, dscale and dbias per channel",
    ),
    FAMILY.op(
        "instancenorm_backward",
        ("dy", "x", "scale", "mean", "inv_variance"),
        infer_instancenorm_backward,
        outputs=_NORM_BWD_OUTPUTS,
        results=lambda a: 3,
        flops=flops_per_element(9),
        doc="the gradients of instancenorm from dy and its saved mean and inv_variance [N, C, 1, ...]: dx like "
        "x, dscale and dbias per channel",
    ),
    FAMILY.op(
        "adalayernorm_backward",
        ("dy", "x", "scale", "mean", "inv_variance"),
        infer_adalayernorm_backward,
        outputs=_NORM_BWD_OUTPUTS,
        results=lambda a: 3,
        flops=flops_per_element(9),
        doc="the gradients of adalayernorm from dy and its saved mean and inv_variance: dx like x, dscale and "
        "dbias per sample, like scale",
    ),
)
"""the frontend's backward ops of the norms: the loss gradient dy, x, scale and the forward's saved statistics"""
OPS |= BACKWARD_OPS


# ---- VJP rules ---------------------------------------------------------------------


def _norm(
    centered: bool,
    over: Callable = lambda x, scale: norm_axes(x.shape, scale.shape),
    dedicated: str | None = None,
) -> Rule:
    """A norm (centered: layer, instance, batch; else RMS) from its statistics (the forward computes them
    in training phase). The frontend's `dedicated` backward op where the cuDNN that runs it takes the form
    (`Emit.avoid`, from the quirks table) and every gradient it returns is wanted (an unread result of a fused
    op is not left dangling);
    else the chain: xhat = (x - mean) * inv_variance, g = dy * scale, and over the normalized axes
    (`over`, N elements) dx = inv_variance * (g - sum(g) / N - xhat * sum(g * xhat) / N); dscale =
    dy * xhat, dbias = dy, summed over the axes scale broadcasts on."""

    def rule(e, n):
        x, scale = n.ins[0], n.ins[1]
        axes = over(x, scale)
        n_stats = 2 if centered else 1
        bias = len(n.inputs) > 2 and n.inputs[2] is not None
        wanted = all(n.need[: 3 if bias else 2]) and (bias or not centered)
        given = {"dbias": bias} if dedicated == "rmsnorm_backward" else {}
        if dedicated and wanted and e.avoid(dedicated, x, scale, axes) is None:
            dy = e.cast(n.dy, x.dtype)
            grads = e.call(dedicated, dy, e.fwd(n.inputs[0]), e.fwd(n.inputs[1]), *e.stats(n, n_stats), **given)
            return (*grads, *(None,) * (len(n.inputs) - len(grads)))
        rows = _as_rows(x, scale, axes)
        # per sample where dx is the input's gradient alone: cuDNN writes it in x's dtype, not a float intermediate
        if dedicated and wanted and rows and e.read_once(n.inputs[0]) and e.avoid(dedicated, *rows, (1,)) is None:
            x4, scale4 = (t.shape for t in rows)
            stats4 = (x4[0], 1, 1, 1)
            dy = e.rows(e.cast(n.dy, x.dtype), x4)
            read = [e.fwd_rows(n.inputs[0], x4), e.fwd_rows(n.inputs[1], scale4)]
            read += [e.fwd_rows(s, stats4) for s in e.stat_names(n, n_stats)]
            grads = e.call(dedicated, dy, *read, **given)
            shapes = (x.shape, scale.shape, scale.shape)
            return (*(e.reshape(g, s) for g, s in zip(grads, shapes)), *(None,) * (len(n.inputs) - len(grads)))
        stats = e.stats(n, n_stats)
        count = math.prod(x.shape[a] for a in axes)
        xs = e.fwd(n.inputs[0])
        xhat = e.call("mul", e.call("sub", xs, stats[0]) if centered else xs, stats[-1])
        dx = None
        if n.need[0]:
            g = e.call("mul", n.dy, e.fwd(n.inputs[1]))
            mean = lambda t: e.call("mul", e.call("reduction", t, mode="sum", axes=axes), 1 / count)  # noqa: E731
            t = e.call("sub", g, e.call("mul", xhat, mean(e.call("mul", g, xhat))))
            dx = e.call("mul", e.call("sub", t, mean(g)) if centered else t, stats[-1])
        dscale = e.call("mul", n.dy, xhat) if n.need[1] else None
        dbias = n.dy if bias and n.need[2] else None
        return (dx, dscale, dbias) + (None,) * (len(n.inputs) - 3)

    return rule


def _as_rows(x: TensorType, scale: TensorType, axes: tuple[int, ...]) -> tuple[TensorType, TensorType] | None:
    """x and scale as a norm's backward op takes them per sample, where the normalized axes are x's last ones and
    scale is one for all samples: [rows, columns, 1, 1] and [1, columns, 1, 1], the leading axes merged into the rows
    and the normalized ones into the columns (x [B, S, D] over D: [B*S, D, 1, 1]); else None."""
    if not axes or axes != tuple(range(axes[0], len(x.shape))) or any(d != 1 for d in scale.shape[: axes[0]]):
        return None  # another form, or a scale per sample (adalayernorm's)
    rows, cols = math.prod(x.shape[: axes[0]]), math.prod(x.shape[axes[0] :])
    x4, scale4 = (rows, cols, 1, 1), (1, cols, 1, 1)
    return TensorType(x.dtype, x4, dense_strides(x4)), TensorType(scale.dtype, scale4, dense_strides(scale4))


def _batchnorm_inference(e, n):
    """y = (x - mean) * inv_variance * scale + bias, all but x per channel."""
    x, mean, inv, scale = (e.fwd(i) for i in n.inputs[:4])
    centered = e.call("sub", x, mean)
    dxhat = e.call("mul", n.dy, scale)
    return (
        e.call("mul", dxhat, inv) if n.need[0] else None,
        e.call("neg", e.call("mul", dxhat, inv)) if n.need[1] else None,
        e.call("mul", dxhat, centered) if n.need[2] else None,
        e.call("mul", n.dy, e.call("mul", centered, inv)) if n.need[3] else None,
        n.dy if n.need[4] else None,
    )


def _batchnorm_inference_pointwise(e, op, args, attrs):
    """batchnorm_inference recomputed as its pointwise form, which fuses with the pointwise ops reading it."""
    x, mean, inv, scale, bias = args
    return e.call("add", e.call("mul", e.call("mul", e.call("sub", x, mean), inv), scale), bias)


def _genstats(e, n):
    """sum = Σ x and sq_sum = Σ x² over every axis but the channels: dx = dsum + 2 x dsq_sum, each term where a
    gradient flows (the caller broadcasts a lone dsum to x's shape)."""
    dsum, dsq = n.dys
    squares = e.call("mul", e.call("mul", x_of(e, n), dsq), 2.0) if dsq is not None else None
    if squares is not None and dsum is not None:
        return (e.call("add", squares, dsum),)
    return (squares if squares is not None else dsum,)


VJPS: dict[str, Rule] = {
    "genstats": _genstats,
    "layernorm": _norm(centered=True, dedicated="layernorm_backward"),
    "rmsnorm": _norm(centered=False, dedicated="rmsnorm_backward"),
    "adalayernorm": _norm(centered=True, dedicated="adalayernorm_backward"),
    "instancenorm": _norm(
        centered=True, over=lambda x, scale: tuple(range(2, len(x.shape))), dedicated="instancenorm_backward"
    ),
    "batchnorm": _norm(
        centered=True, over=lambda x, scale: (0, *range(2, len(x.shape))), dedicated="batchnorm_backward"
    ),
    "batchnorm_inference": _batchnorm_inference,
}
RECOMPUTE: dict[str, Recompute] = {"batchnorm_inference": _batchnorm_inference_pointwise}
NO_VJP = {
    **{op: SECOND_ORDER for op in BACKWARD_OPS},
}
