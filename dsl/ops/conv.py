"""Convolution and pooling ops: signatures, shape rules, flop counts, the channels-last lint and VJP rules of
conv_fprop and its gradients conv_dgrad and conv_wgrad, and of resample (average and max pooling)."""

from __future__ import annotations

import math

from dsl.diagnostics import RuleError
from dsl.ops.base import SECOND_ORDER, Ctx, Family, OpSig, Out, Recompute, Rule, by_name
from dsl.types import TensorType, fmt_shape, stride_order
from dsl.values import DERIVED, REQUIRED, Attr

FAMILY = Family(
    "conv",
    ("conv", "convolution"),
    "NHWC layouts for conv tensors, half/bf16 data with float compute, and channel counts that are multiples of 8",
)


# ---- shape rules -------------------------------------------------------------------


def _conv_params(ctx: Ctx):
    """(padding at the start, padding at the end, stride, dilation), per spatial dim."""
    a = ctx.attrs
    return a["pre_padding"], a["post_padding"], a["stride"], a["dilation"]


def derive_padding(ctx: Ctx) -> dict:
    """The padding in its one IR form, both sides: `padding` pads both alike (the frontend's set_padding), and
    `pre_padding` / `post_padding` each override a side; the IR drops `padding`."""
    a = ctx.attrs
    sides = {"pre_padding": a["pre_padding"], "post_padding": a["post_padding"]}
    given = [name for name, v in sides.items() if v is not None]
    if given and any(a["padding"]):
        raise RuleError(
            f"{ctx.op}: give 'padding' (both sides alike) or '{given[0]}' and its other side, not both", given[0]
        )
    return {name: a["padding"] if v is None else v for name, v in sides.items()}


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
    pre, post, stride, dil = _conv_params(ctx)
    spatial = []
    for i, (h, r) in enumerate(zip(x.shape[2:], w.shape[2:])):
        o = (h + pre[i] + post[i] - dil[i] * (r - 1) - 1) // stride[i] + 1
        if o < 1:
            raise RuleError(f"{ctx.op}: filter {r} (dilation {dil[i]}) is larger than the padded input {h}", 1)
        spatial.append(o)
    return [Out((x.shape[0], k, *spatial), stride_order(x.strides))]


def infer_resample(ctx: Ctx) -> list[Out]:
    """Pooling: a window slides over the padded spatial dims with a stride; channels and batch are kept. Padding
    may be as wide as the window or wider (a window then may hold padding alone)."""
    (x,) = ctx.inputs
    if len(x.shape) not in (4, 5):
        raise RuleError(f"{ctx.op}: the input must have rank 4 or 5 (N, C, spatial...), got {fmt_shape(x.shape)}", 0)
    a, n = ctx.attrs, len(x.shape) - 2
    for name in ("window", "stride", "pre_padding", "post_padding"):
        if len(a[name]) != n:
            raise RuleError(f"{ctx.op}: '{name}' has {len(a[name])} values, the input has {n} spatial dims", name)
    spatial = []
    for i, h in enumerate(x.shape[2:]):
        padded = h + a["pre_padding"][i] + a["post_padding"][i]
        if padded < a["window"][i]:
            raise RuleError(f"{ctx.op}: window {a['window'][i]} is larger than the padded input {padded}", "window")
        spatial.append((padded - a["window"][i]) // a["stride"][i] + 1)
    return [Out((*x.shape[:2], *spatial), stride_order(x.strides))]


def note_groups(ctx: Ctx, given: dict) -> list[tuple[int | str, str]]:
    """A grouped convolution is read off the channels (the language has no `groups=`): a mistyped channel count
    would make one in silence."""
    x, w = ctx.inputs
    groups = x.shape[1] // w.shape[1]
    if groups == 1:
        return []
    return [
        (
            1,
            f"{ctx.op}: a grouped convolution, {groups} groups: the image has {x.shape[1]} channels and the weight "
            f"{w.shape[1]} per group ([K, C/groups, ...]); a weight of {x.shape[1]} channels is ungrouped",
        )
    ]


def infer_conv_dgrad(ctx: Ctx) -> list[Out]:
    dy, w = ctx.inputs
    _conv_rank(ctx, dy, 0, "gradient")
    if len(w.shape) != len(dy.shape):
        raise RuleError(f"{ctx.op}: filter {fmt_shape(w.shape)} and gradient {fmt_shape(dy.shape)} differ in rank", 1)
    if dy.shape[1] != w.shape[0]:
        raise RuleError(f"{ctx.op}: gradient has {dy.shape[1]} channels, filter has {w.shape[0]} outputs", 1)
    pre, post, stride, dil = _conv_params(ctx)
    extra = ctx.attrs["output_padding"]
    for i, e in enumerate(extra):
        if e >= stride[i]:
            raise RuleError(
                f"{ctx.op}: output_padding {list(extra)} must be below the stride {list(stride)} on each axis "
                f"(any more and the forward convolution would not give this gradient's size)",
                "output_padding",
            )
    spatial = [
        (o - 1) * stride[i] - pre[i] - post[i] + dil[i] * (r - 1) + 1 + extra[i]
        for i, (o, r) in enumerate(zip(dy.shape[2:], w.shape[2:]))
    ]
    if any(s < 1 for s in spatial):
        raise RuleError(f"{ctx.op}: no input size gives gradient {fmt_shape(dy.shape)}", 0)
    return [Out((dy.shape[0], w.shape[1], *spatial), stride_order(dy.strides))]


def _wgrad_filter(x: TensorType, dy: TensorType, pre, post, stride, dil) -> tuple[int, ...]:
    """The filter size that maps x to dy (the largest, when stride leaves a choice)."""
    return tuple(
        (h + a + b - (o - 1) * s - 1) // d + 1
        for h, o, a, b, s, d in zip(x.shape[2:], dy.shape[2:], pre, post, stride, dil)
    )


def derive_conv_wgrad(ctx: Ctx) -> dict:
    x, dy = ctx.inputs
    padding = derive_padding(ctx)
    if ctx.attrs["filter"] is not DERIVED:
        return padding
    if len(x.shape) != len(dy.shape):
        return padding | {"filter": (1,) * (len(x.shape) - 2)}  # the shape rule reports the rank mismatch
    return padding | {"filter": _wgrad_filter(x, dy, *_conv_params(Ctx(ctx.op, ctx.inputs, ctx.attrs | padding)))}


def infer_conv_wgrad(ctx: Ctx) -> list[Out]:
    x, dy = ctx.inputs
    _conv_rank(ctx, x, 0, "image")
    if len(x.shape) != len(dy.shape) or x.shape[0] != dy.shape[0]:
        raise RuleError(f"{ctx.op}: image {fmt_shape(x.shape)} and gradient {fmt_shape(dy.shape)} do not match", 1)
    pre, post, stride, dil = _conv_params(ctx)
    filt = ctx.attrs["filter"]
    if len(filt) != len(x.shape) - 2:
        raise RuleError(
            f"{ctx.op}: 'filter' has {len(filt)} values, the image has {len(x.shape) - 2} spatial dims", "filter"
        )
    fits = all(
        r >= 1 and (h + a + b - d * (r - 1) - 1) // s + 1 == o
        for r, h, o, a, b, s, d in zip(filt, x.shape[2:], dy.shape[2:], pre, post, stride, dil)
    )
    if not fits:
        raise RuleError(
            f"{ctx.op}: a filter of {list(filt)} does not map image {fmt_shape(x.shape)} to gradient "
            f"{fmt_shape(dy.shape)} with this padding, stride and dilation",
            "filter",
        )
    return [Out((dy.shape[1], x.shape[1], *filt), stride_order(x.strides))]


def lint_channels_last(inputs: tuple) -> list[tuple[int, str]]:
    """cuDNN's tensor-core convolution engines want channels-last tensors. `inputs` holds, per
    input declared in the file, (name, rank, layout or None, explicit strides or None); None otherwise.
    Strides are channels-last where the channels' is the smallest."""
    out = []
    for i, d in enumerate(inputs):
        if d is None:
            continue
        name, rank, layout, strides = d
        if strides is not None:
            channels_last = strides[1] == min(strides)
        else:
            channels_last = layout in ("nhwc", "ndhwc", "channels_last")
        if rank in (4, 5) and not channels_last:
            want = "nhwc" if rank == 4 else "ndhwc"
            out.append(
                (i, f"convolution input '{name}' is not channels-last; cuDNN's tensor-core engines want '{want}'")
            )
    return out


def flops_conv(ctx: Ctx, outs) -> int:
    """2 * (elements of the forward output) * (C/groups * filter volume), for fprop, dgrad and wgrad."""
    y = {"conv_fprop": outs[0], "conv_dgrad": ctx.inputs[0], "conv_wgrad": ctx.inputs[1]}[ctx.op]
    w = {"conv_fprop": ctx.inputs[1], "conv_dgrad": ctx.inputs[1], "conv_wgrad": outs[0]}[ctx.op]
    return 2 * math.prod(y.shape) * math.prod(w.shape[1:])


# ---- the rows ----------------------------------------------------------------------

_SPATIAL_ATTRS = (
    Attr("padding", "spatial", 0, doc="zero padding per spatial dim, at both ends alike", lo=0),
    Attr(
        "pre_padding",
        "spatial",
        None,
        doc="zero padding per spatial dim at the start (default: padding)",
        lo=0,
        optional=True,
    ),
    Attr(
        "post_padding",
        "spatial",
        None,
        doc="zero padding per spatial dim at the end (default: padding)",
        lo=0,
        optional=True,
    ),
    Attr("stride", "spatial", 1, doc="stride per spatial dim", lo=1),
    Attr("dilation", "spatial", 1, doc="dilation per spatial dim", lo=1),
)
_FOLDED = ("padding",)
"""padding on both sides alike, which derive_padding folds into pre_padding and post_padding"""

OPS = by_name(
    FAMILY.op(
        "conv_fprop",
        ("image", "weight"),
        infer_conv_fprop,
        attrs=_SPATIAL_ATTRS,
        derive=derive_padding,
        folded=_FOLDED,
        flops=flops_conv,
        lint=lint_channels_last,
        notes=note_groups,
        doc="convolution forward: image [N,C,H,W] * weight [K,C/groups,R,S] -> [N,K,P,Q]",
    ),
    FAMILY.op(
        "conv_dgrad",
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
        derive=derive_padding,
        folded=_FOLDED,
        flops=flops_conv,
        lint=lint_channels_last,
        doc="convolution data gradient: dy [N,K,P,Q], weight [K,C,R,S] -> dx [N,C,H,W]",
    ),
    FAMILY.op(
        "conv_wgrad",
        ("image", "grad"),
        infer_conv_wgrad,
        flops=flops_conv,
        derive=derive_conv_wgrad,
        folded=_FOLDED,
        lint=lint_channels_last,
        attrs=_SPATIAL_ATTRS
        + (Attr("filter", "ints", DERIVED, doc="filter spatial size (inferred from the shapes when omitted)", lo=1),),
        doc="convolution weight gradient: x [N,C,H,W], dy [N,K,P,Q] -> dw [K,C,R,S]",
    ),
    FAMILY.op(
        "resample",
        ("x",),
        infer_resample,
        attrs=(
            Attr("mode", "enum", REQUIRED, ("avg", "max"), doc="average or maximum of each window"),
            Attr("window", "spatial", REQUIRED, doc="window size per spatial dim", lo=1),
            Attr("stride", "spatial", 1, doc="stride per spatial dim", lo=1),
            *_SPATIAL_ATTRS[:3],
            Attr(
                "include_padding",
                "bool",
                True,
                doc="avg: the padding counts in each window's divisor (AVGPOOL_INCLUDE_PADDING; false: "
                "AVGPOOL_EXCLUDE_PADDING, the elements of the input only)",
            ),
        ),
        derive=derive_padding,
        folded=_FOLDED,
        lint=lint_channels_last,
        doc="pooling (the frontend's resample): x [N,C,H,W] -> [N,C,P,Q], each element the average or maximum "
        "of a window of the padded input",
    ),
)
BACKWARD_OPS: dict[str, OpSig] = {}


# ---- VJP rules ---------------------------------------------------------------------


def _conv_fprop(e, n):
    x, w = n.ins
    if x.shape[1] != w.shape[1]:
        raise RuleError(
            f"conv_fprop: a grouped convolution ({x.shape[1] // w.shape[1]} groups) has no derived backward"
        )
    pre, post, stride, dil = (n.attrs[a] for a in ("pre_padding", "post_padding", "stride", "dilation"))
    geometry = {"stride": stride, "dilation": dil, "pre_padding": pre, "post_padding": post}
    dx = dw = None
    if n.need[0]:
        size = [
            (o - 1) * s - a - b + d * (r - 1) + 1
            for o, r, a, b, s, d in zip(n.outs[0].shape[2:], w.shape[2:], pre, post, stride, dil)
        ]
        extra = [h - s for h, s in zip(x.shape[2:], size)]
        dy = e.cast(n.dy, w.dtype)
        dx = e.call("conv_dgrad", dy, e.fwd(n.inputs[1]), **geometry, output_padding=extra)
    if n.need[1]:
        dy = e.cast(n.dy, x.dtype)
        dw = e.call("conv_wgrad", e.fwd(n.inputs[0]), dy, **geometry, filter=w.shape[2:])
    return dx, dw


VJPS: dict[str, Rule] = {"conv_fprop": _conv_fprop}
RECOMPUTE: dict[str, Recompute] = {}
NO_VJP = {
    "conv_dgrad": SECOND_ORDER,
    "conv_wgrad": SECOND_ORDER,
    "resample": "the frontend's pooling backward is not spelled yet",
}
