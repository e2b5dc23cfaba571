"""Matmul: the torch reference and cuDNN lowering of the batched matrix product."""

from __future__ import annotations

from cudnn_dsl.ops.base import OpImpl
from cudnn_dsl.target.lazy_torch import torch


def ref_matmul(ins, a, outs):
    return [torch.matmul(ins[0], ins[1])]


def lower_matmul(ctx, ins, a):
    return [ctx.g.matmul(ins[0], ins[1], **ctx.kw)]


IMPLS = {"matmul": OpImpl(ref_matmul, lower_matmul)}
