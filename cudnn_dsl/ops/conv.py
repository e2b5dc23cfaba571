"""Convolution and pooling ops: the torch references and cuDNN lowerings of conv_fprop, conv_dgrad and conv_wgrad,
and of resample (average and max pooling)."""

from __future__ import annotations

from cudnn_dsl.ops.base import OpImpl
from cudnn_dsl.target.lazy_torch import F, torch


def _conv_args(a: dict) -> dict:
    """The frontend's keywords: `padding` where both sides are alike, as a hand-written script has them."""
    padding = _symmetric(a)
    sides = {"padding": padding} if padding is not None else {k: list(a[k]) for k in ("pre_padding", "post_padding")}
    return {**sides, "stride": list(a["stride"]), "dilation": list(a["dilation"])}


def _symmetric(a: dict) -> list[int] | None:
    """The padding torch's convolutions and the frontend's `padding` take (both sides alike), or None where the
    sides differ."""
    return list(a["pre_padding"]) if a["pre_padding"] == a["post_padding"] else None


def _pad(x, a: dict):
    """x with its spatial dims zero-padded, `pre_padding` before and `post_padding` after (F.pad lists the last
    dim first)."""
    return F.pad(x, [p for pair in zip(reversed(a["pre_padding"]), reversed(a["post_padding"])) for p in pair])


def ref_conv_fprop(ins, a, outs):
    x, w = ins
    conv = (F.conv1d, F.conv2d, F.conv3d)[x.dim() - 3]
    groups = x.shape[1] // w.shape[1]
    padding = _symmetric(a)
    if padding is None:
        x, padding = _pad(x, a), 0
    return [conv(x, w, None, a["stride"], padding, a["dilation"], groups)]


def _conv_backward(dy, x, w, a, which: int):
    """One gradient of a convolution (0: data, 1: weight) from aten, the shapes of the others given by x and w.
    Padding whose sides differ is a convolution of the padded image without padding: its data gradient, cropped
    back to the image, is the image's."""
    mask = [which == 0, which == 1, False]
    n = dy.dim() - 2
    padding = _symmetric(a)
    image = x if padding is not None else _pad(x, a)
    grad = torch.ops.aten.convolution_backward(
        dy, image, w, None, a["stride"], padding or [0] * n, a["dilation"], False, [0] * n, 1, mask
    )[which]
    if which == 1 or padding is not None:
        return grad
    return grad[(slice(None), slice(None), *(slice(p, p + h) for p, h in zip(a["pre_padding"], x.shape[2:])))]


def ref_conv_dgrad(ins, a, outs):
    dy, w = ins
    return [_conv_backward(dy, dy.new_empty(outs[0].shape), w, a, 0)]


def ref_conv_wgrad(ins, a, outs):
    x, dy = ins
    return [_conv_backward(dy, x, x.new_empty(outs[0].shape), a, 1)]


def lower_conv(ctx, ins, a):
    """conv_fprop, conv_dgrad and conv_wgrad: the frontend's builder of the op's name."""
    return [getattr(ctx.g, ctx.node.op)(ins[0], ins[1], **_conv_args(a), **ctx.kw)]


def ref_resample(ins, a, outs):
    """Pooling of the explicitly padded input (torch's own padding stops at half the window; this takes any):
    -inf pads a max, zeros an average, whose divisor is the window (padding included) or the input's elements
    in it (padding excluded: a window of padding alone is 0 / 0)."""
    (x,) = ins
    spatial = x.dim() - 2
    pad = [p for pair in zip(reversed(a["pre_padding"]), reversed(a["post_padding"])) for p in pair]
    window, stride = list(a["window"]), list(a["stride"])
    if a["mode"] == "max":
        return [(F.max_pool2d, F.max_pool3d)[spatial - 2](F.pad(x, pad, value=float("-inf")), window, stride)]
    pool = (F.avg_pool2d, F.avg_pool3d)[spatial - 2]
    mean = pool(F.pad(x, pad), window, stride)
    if a["include_padding"]:
        return [mean]
    inside = pool(F.pad(torch.ones_like(x[:1, :1]), pad), window, stride)  # the share of each window in the input
    return [mean / inside]


MISSING_BUILDER = (
    "the cuDNN Frontend's Python API has no resample builder (1.32: its C++ graph has a Resample node, its "
    "pygraph does not), so no cuDNN graph here holds it"
)


def lower_resample(ctx, ins, a):
    """The frontend's resample: refused where its Python API lacks the builder (the partitioner then leaves the op
    to its torch reference, with `fallback`)."""
    raise RuntimeError(MISSING_BUILDER)


IMPLS: dict[str, OpImpl] = {
    "conv_fprop": OpImpl(ref_conv_fprop, lower_conv),
    "conv_dgrad": OpImpl(ref_conv_dgrad, lower_conv),
    "conv_wgrad": OpImpl(ref_conv_wgrad, lower_conv),
    "resample": OpImpl(ref_resample, lower_resample),
}
