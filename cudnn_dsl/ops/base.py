"""What every op family's back end shares: the row (OpImpl) of an op's torch reference and cuDNN lowering.

A reference function takes the input tensors (float32 or wider, None for an absent optional; OpImpl.narrow takes
half and bf16 ones as stored), the node's attributes and its output types, and returns the output tensors. A
lowering function takes a LowerCtx (the cuDNN graph and helpers), the input cuDNN tensors and the attributes, and
returns the output cuDNN tensors; the lowering pass then stamps each with its IR uid, dtype, dims and strides.
Attributes arrive canonical (dsl.ops.canonical): no row fills a default.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from cudnn_dsl.target.lazy_torch import torch


@attrs.frozen
class OpImpl:
    """How one op runs: its torch reference and its cuDNN lowering."""

    ref: Callable[..., list]
    lower: Callable[..., list]
    undefined: Callable[..., list] | None = None
    """(inputs, attributes, output types) -> per output, a bool mask of the elements cuDNN leaves
    unspecified (None: all defined); the compare does not read them (sdpa's padded query rows)"""
    drawn: Callable[[dict], tuple[int, ...]] | None = None
    """(attributes) -> the results the device draws and the reference cannot compute (sdpa's seeded
    dropout mask): cuDNN always writes them (to scratch memory when no output asks), and the reference
    takes them as they were after the launch, passed to `ref` after the inputs"""
    narrow: Callable[..., list] | None = None
    """`ref` for half and bf16 inputs as stored, read in float32 as it computes: what a torch fallback of the op
    in a graph run in parts runs (run.parts), with no float copy of its inputs (a reduction's sum accumulates in
    float32)"""


def sum_to(t: torch.Tensor, shape) -> torch.Tensor:
    """t summed over the axes where `shape` is 1 and t is not (a broadcast's gradient)."""
    axes = [i for i, (d, s) in enumerate(zip(t.shape, shape)) if s == 1 and d != 1]
    return t.sum(axes, keepdim=True) if axes else t
