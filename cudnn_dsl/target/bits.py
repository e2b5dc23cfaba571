"""Bool tensors as cuDNN keeps them in memory — bit-packed, eight elements a byte, the
element at the lowest address in the lowest bit.

Measured on the H200 with cuDNN 9.19: a comparison in a matmul epilogue writes its bool output this
way, and a bool input mask is read this way (a byte per element reads as garbage). So a bound bool
tensor is a uint8 buffer of ceil(extent / 8) bytes, and the reference and the comparison unpack it.
"""

from __future__ import annotations

from cudnn_dsl.target.lazy_torch import torch
from cudnn_dsl.target.portable import pack_bool, unpack_bool
from dsl.types import TensorType


def nbytes(t: TensorType) -> int:
    """The bytes cuDNN reads or writes for a bool tensor of this type."""
    return (t.storage + 7) // 8


def pack(values: torch.Tensor, t: TensorType) -> torch.Tensor:
    """Logical bools (t's shape) -> cuDNN's bytes, in t's memory order."""
    return pack_bool(values, t.shape, t.strides, t.storage)


def unpack(packed: torch.Tensor, t: TensorType) -> torch.Tensor:
    """cuDNN's bytes -> logical bools of t's shape."""
    return unpack_bool(packed, t.shape, t.strides, t.storage)


def logical(value: torch.Tensor, t: TensorType) -> torch.Tensor:
    """A tensor of type t as values: a bool tensor bound as cuDNN's bytes is unpacked; others as they are."""
    if t.dtype == "bool" and value.dtype == torch.uint8:
        return unpack(value, t)
    return value


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """A row-major bool mask as the bytes a graph binds for a bool tensor of that shape."""
    return pack(mask, TensorType("bool", tuple(mask.shape), tuple(mask.contiguous().stride())))


def unpack_bits(packed: torch.Tensor, shape) -> torch.Tensor:
    """The bytes of a row-major bool tensor (a graph's bool output) as a torch.bool tensor of `shape`."""
    shape = tuple(shape)
    return unpack(packed, TensorType("bool", shape, tuple(torch.empty(shape, device="meta").stride())))
