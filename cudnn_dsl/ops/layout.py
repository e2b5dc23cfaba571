"""Layout ops: the torch references and cuDNN lowerings of transpose, reshape, slice and concatenate."""

from __future__ import annotations

from cudnn_dsl.ops.base import OpImpl
from cudnn_dsl.target.lazy_torch import torch


def ref_concatenate(ins, a, outs):
    return [torch.cat(ins, a["axis"])]


def lower_concatenate(ctx, ins, a):
    # a layout op: the frontend takes no compute dtype for it
    return [ctx.g.concatenate(inputs=list(ins), axis=a["axis"] + ctx.lead, name=ctx.name)]


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
    "concatenate": OpImpl(ref_concatenate, lower_concatenate),
    "transpose": OpImpl(ref_transpose, lower_transpose),
    "reshape": OpImpl(ref_reshape, lower_reshape),
    "slice": OpImpl(ref_slice, lower_slice),
}
