"""Reduction: the torch reference and cuDNN lowering of the reduction of axes to size 1."""

from __future__ import annotations

from cudnn_dsl.ops.base import OpImpl
from cudnn_dsl.target.lazy_torch import torch


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


def narrow_reduction(ins, a, outs):
    """ref_reduction of a half or bf16 input as stored: a sum or mean accumulated in float32 as it reads (no float
    copy of the input); any other mode on a float32 copy."""
    x = ins[0]
    low = x.dtype in (torch.float16, torch.bfloat16)
    if low and a["mode"] in ("sum", "avg"):
        return [getattr(x, "sum" if a["mode"] == "sum" else "mean")(list(a["axes"]), keepdim=True, dtype=torch.float32)]
    return ref_reduction([x.float() if low else x], a, outs)


def lower_reduction(ctx, ins, a):
    mode = getattr(ctx.cudnn.reduction_mode, "ADD" if a["mode"] == "sum" else a["mode"].upper())
    return [ctx.g.reduction(ins[0], mode=mode, **ctx.kw)]


IMPLS = {"reduction": OpImpl(ref_reduction, lower_reduction, narrow=narrow_reduction)}
