"""Runtime layer: bool tensors as cuDNN keeps them in memory — bit-packed, eight elements a byte, the
element at the lowest address in the lowest bit.

Measured on the H200 with cuDNN 9.19: a comparison in a matmul epilogue writes its bool output this
way, and a bool input mask is read this way (a byte per element reads as garbage). So a bound bool
tensor is a uint8 buffer of ceil(extent / 8) bytes, and the reference and the comparison unpack it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsl.types import TensorType


def nbytes(t: TensorType) -> int:
    """The bytes cuDNN reads or writes for a bool tensor of this type."""
    return (t.storage + 7) // 8


def pack(values: torch.Tensor, t: TensorType) -> torch.Tensor:
    """Logical bools (t's shape) -> cuDNN's bytes, in t's memory order."""
    flat = torch.zeros(t.storage, dtype=torch.uint8, device=values.device)
    flat.as_strided(t.shape, t.strides).copy_(values)
    groups = F.pad(flat, (0, -t.storage % 8)).view(-1, 8)
    weights = torch.tensor([1 << b for b in range(8)], dtype=torch.uint8, device=values.device)
    return (groups * weights).sum(1, dtype=torch.uint8)


def unpack(packed: torch.Tensor, t: TensorType) -> torch.Tensor:
    """cuDNN's bytes -> logical bools of t's shape."""
    b = packed.reshape(-1)[: nbytes(t)].to(torch.uint8)
    bits = torch.stack([(b >> k) & 1 for k in range(8)], 1)  # no tensor of shifts: emit traces this device-free
    flat = bits.reshape(-1)[: t.storage].bool()
    return flat.as_strided(t.shape, t.strides)


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
