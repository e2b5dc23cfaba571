"""Convolution ops: the torch references and cuDNN lowerings of conv_fprop, conv_dgrad and conv_wgrad."""

from __future__ import annotations

from cudnn_dsl.ops.base import OpImpl
from cudnn_dsl.target.lazy_torch import F, torch


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


def lower_conv(ctx, ins, a):
    """conv_fprop, conv_dgrad and conv_wgrad: the frontend's builder of the op's name."""
    return [getattr(ctx.g, ctx.node.op)(ins[0], ins[1], **_conv_args(a), **ctx.kw)]


IMPLS: dict[str, OpImpl] = {
    "conv_fprop": OpImpl(ref_conv_fprop, lower_conv),
    "conv_dgrad": OpImpl(ref_conv_dgrad, lower_conv),
    "conv_wgrad": OpImpl(ref_conv_wgrad, lower_conv),
}
