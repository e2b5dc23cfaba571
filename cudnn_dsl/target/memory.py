"""How the language's tensors lie in device memory: buffers at their declared strides, bool tensors
packed, pass-by-value scalars as the one-element CPU tensors cuDNN reads."""

from __future__ import annotations

import functools
from collections.abc import Callable

from cudnn_dsl.target import bits
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.lazy_torch import torch
from dsl.types import TensorType


def empty(t: TensorType, device) -> torch.Tensor:
    """A buffer cuDNN can read or write as t: in its layout, or for a bool tensor, its packed bytes."""
    return allocator(t, device)()


def allocator(t: TensorType, device) -> Callable[[], torch.Tensor]:
    """A new `empty(t, device)` per call, with the arguments worked out once."""
    if t.dtype == "bool":
        return functools.partial(torch.zeros, bits.nbytes(t), dtype=torch.uint8, device=device)
    return functools.partial(torch.empty_strided, t.shape, t.strides, dtype=torch_dtype(t.dtype), device=device)


def owned(t: TensorType) -> tuple[slice, ...]:
    """The index of t's elements that have memory of their own: with a batch stride left to ragged offsets (0)
    every batch is batch 0's memory, which a copy writes once (torch refuses to write one element twice)."""
    return (slice(0, 1),) if t.shape and t.shape[0] > 1 and t.strides[0] == 0 else ()


def as_type(memory: torch.Tensor, t: TensorType) -> torch.Tensor:
    """A buffer's memory read as t, which must lie in it element for element (a reshape of a packed tensor):
    t's shape and strides from the buffer's first element; a bool tensor's packed bytes, as they are."""
    if t.dtype == "bool":
        return memory
    return memory.as_strided(t.shape, t.strides, memory.storage_offset())


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are one: the same first element, shape, dtype and strides (those of size-1 dims
    address nothing)."""
    strides = [(s, t) for s, t, d in zip(a.stride(), b.stride(), a.shape) if d != 1]
    same = a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype
    return same and all(s == t for s, t in strides)


def stored(values: torch.Tensor, t: TensorType) -> torch.Tensor:
    """Values of t's shape as cuDNN's memory holds them (packed, for bool), on their device."""
    return bits.pack(values, t) if t.dtype == "bool" and values.dtype == torch.bool else values


def host_scalar(value, dtype: str) -> torch.Tensor:
    """The one-element CPU tensor cuDNN reads a pass-by-value scalar from."""
    return torch.full((1,), float(value), dtype=torch_dtype(dtype))
