"""Seeded input draws and cuDNN's bool packing.

`run` calls these functions, and `emit --format cudnn` copies their source into the scripts it
prints (emit.portable_source), so a script draws the inputs `run` draws for the same seed, bit for
bit, and binds bool tensors as cuDNN reads them. Keep this module self-contained: it imports only
the standard library and torch (lazy_torch's, imported on first use: a script imports its own), and every
name it defines is one the scripts get.
"""

import hashlib
import math

from cudnn_dsl.target.lazy_torch import torch

CHUNK = 1 << 22
"""elements drawn from one stream: big inputs are drawn in chunks (on every core, in `run`), each from its
own seed, so the values do not depend on the number of cores"""


def stream_seed(seed, name, start):
    """The seed of the stream that draws input `name`'s elements from index `start` on."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}:{start}".encode()).digest()[:8], "little")


def draw(dist, args, n, gen, start=0):
    """n values of a distribution (dsl/inits.py names them), on the CPU (float, int64 or bool); `start`: the
    index of the first (arange counts from it)."""
    a = args
    if dist == "uniform":
        return torch.rand(n, generator=gen) * (a[1] - a[0]) + a[0]
    if dist == "randn":
        return torch.randn(n, generator=gen) * a[1] + a[0]
    if dist == "randint":
        ints = torch.randint(int(a[0]), int(a[1]) + 1, (n,), generator=gen)
        return ints if len(a) == 2 else ints.double() * a[2]
    if dist == "permutation":  # every chunk draws the one order (draw_values seeds them alike)
        order = torch.randperm(int(a[1] - a[0]) + 1, generator=gen)
        return order[torch.arange(start, start + n) % order.numel()] + int(a[0])
    if dist == "bernoulli":
        return torch.rand(n, generator=gen) < a[0]
    if dist == "sparse":
        return (torch.rand(n, generator=gen) * 2 - 1).masked_fill_(torch.rand(n, generator=gen) < a[0], 0)
    if dist == "full":
        return torch.full((n,), a[0], dtype=torch.float64)
    if dist in ("zeros", "ones"):
        return torch.full((n,), float(dist == "ones"), dtype=torch.float64)
    if dist == "arange":
        return torch.arange(start, start + n, dtype=torch.float64) * a[1] + a[0]
    raise ValueError(f"unknown distribution {dist!r}")


def draw_values(dist, args, shape, dtype, seed, name, clamp=None, chunks=map):
    """The values of one generated input, row-major on the CPU in torch dtype `dtype`, from streams of its
    own (seeded by `seed` and its name: drawing one input differently leaves the others as they were). An
    integer input (`clamp`: its dtype's least and greatest value) takes the values rounded and clamped; a
    bool input, whether they are non-zero. `chunks` maps a function over the chunks' starts (a pool's map)."""
    n = math.prod(shape)
    out = torch.empty(n, dtype=dtype)

    def chunk(start):
        stream = stream_seed(seed, name, 0 if dist == "permutation" else start)
        v = draw(dist, args, min(CHUNK, n - start), torch.Generator().manual_seed(stream), start)
        if dtype == torch.bool:
            v = v != 0
        elif clamp is not None and v.is_floating_point():
            v = v.round().clamp(*clamp)
        out[start : start + v.numel()] = v

    list(chunks(chunk, range(0, n, CHUNK)))
    return out.reshape(shape)


def ragged_span(shape, strides):
    """(a, b): a sequence of L rows of a batch-outermost [B, H, S, D] tensor of these strides spans
    L * a + b elements."""
    return strides[2], 1 - strides[2] + sum((shape[i] - 1) * strides[i] for i in (1, 3))


def packed_offsets(lengths, shape, strides):
    """Ragged offsets [B+1] that pack sequences of these lengths back to back in a buffer of this shape and
    strides: what `run` draws for offsets no init= names (random offsets would reach outside the buffers)."""
    row, rest = ragged_span(shape, strides)
    spans = lengths.flatten().long() * row + rest
    return torch.cat((spans.new_zeros(1), spans.cumsum(0)))


def pack_bool(values, shape, strides, storage):
    """Logical bools of `shape` -> cuDNN's bytes: eight elements a byte, in memory order (`strides` over
    `storage` elements), the element at the lowest address in the lowest bit."""
    flat = torch.zeros(storage, dtype=torch.uint8, device=values.device)
    flat.as_strided(shape, strides).copy_(values)
    groups = torch.nn.functional.pad(flat, (0, -storage % 8)).view(-1, 8)
    weights = torch.tensor([1 << b for b in range(8)], dtype=torch.uint8, device=values.device)
    return (groups * weights).sum(1, dtype=torch.uint8)


def unpack_bool(packed, shape, strides, storage):
    """cuDNN's bytes -> logical bools of `shape`."""
    b = packed.reshape(-1)[: (storage + 7) // 8].to(torch.uint8)
    bits = torch.stack([(b >> k) & 1 for k in range(8)], 1)  # no tensor of shifts: emit traces this device-free
    flat = bits.reshape(-1)[:storage].bool()
    return flat.as_strided(shape, strides)
