"""Data types, layouts and stride arithmetic of the language."""

from __future__ import annotations

import math

import attrs

from dsl.diagnostics import RuleError

#: canonical dtype -> (size in bytes, is floating point)
DTYPES: dict[str, tuple[int, bool]] = {
    "half": (2, True),
    "bf16": (2, True),
    "float": (4, True),
    "double": (8, True),
    "fp8_e4m3": (1, True),
    "fp8_e5m2": (1, True),
    "fp8_e8m0": (1, True),
    "int8": (1, False),
    "uint8": (1, False),
    "int32": (4, False),
    "int64": (8, False),
    "bool": (1, False),
}

DTYPE_ALIASES = {
    "fp16": "half",
    "float16": "half",
    "bfloat16": "bf16",
    "fp32": "float",
    "float32": "float",
    "fp64": "double",
    "float64": "double",
    "e4m3": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "e8m0": "fp8_e8m0",
}

#: layout name -> how it orders the axes of a tensor of rank r (outermost first), or None
LAYOUTS = ("row_major", "col_major", "nchw", "nhwc", "ncdhw", "ndhwc", "channels_last")

INT64_MAX = 2**63 - 1

ALIGNMENT = 16
"""bytes: cuDNN assumes every device buffer is aligned to this (misaligned SDPA operands give wrong
results on sm_90, not an error); a view's offset keeps it"""

DEFAULT_MATH = "float"
"""the dtype of intermediates, of computation, and of number literals, unless a graph says otherwise"""

UNSET = "unset"
"""`intermediate unset` / `compute unset`: the graph gives no such type, so every virtual tensor and op gives its
own (as a frontend graph that never sets them)"""

#: the values each dtype can hold (a host scalar or a literal is checked against its dtype)
DTYPE_RANGE: dict[str, tuple[float, float]] = {
    "half": (-65504.0, 65504.0),
    "bf16": (-3.3895313892515355e38, 3.3895313892515355e38),
    "float": (-3.4028234663852886e38, 3.4028234663852886e38),
    "double": (-1.7976931348623157e308, 1.7976931348623157e308),
    "fp8_e4m3": (-448.0, 448.0),
    "fp8_e5m2": (-57344.0, 57344.0),
    "fp8_e8m0": (2.0**-127, 2.0**127),
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "bool": (0, 1),
}


def canonical_dtype(name: str) -> str | None:
    if name in DTYPES:
        return name
    return DTYPE_ALIASES.get(name)


def is_float(dtype: str) -> bool:
    return DTYPES[dtype][1]


def itemsize(dtype: str) -> int:
    return DTYPES[dtype][0]


def check_value(dtype: str, value: float | int) -> None:
    """RuleError when a host value does not fit its dtype (out of range, or not an integer)."""
    lo, hi = DTYPE_RANGE[dtype]
    if not is_float(dtype) and isinstance(value, float) and not value.is_integer():
        raise RuleError(f"{value} is not an integer, and the dtype is {dtype}")
    if not lo <= value <= hi:
        raise RuleError(f"{value} is out of range for {dtype} ({lo:g} to {hi:g})")


def layout_order(layout: str, rank: int) -> tuple[int, ...]:
    """The axis order (outermost first) of a named layout; RuleError when it does not fit the rank."""
    identity = tuple(range(rank))
    if layout in ("row_major", "nchw", "ncdhw"):
        if layout == "nchw" and rank != 4 or layout == "ncdhw" and rank != 5:
            raise RuleError(
                f"layout '{layout}' needs a rank-{4 if layout == 'nchw' else 5} tensor, this one has rank {rank}"
            )
        return identity
    if layout == "col_major":
        if rank < 2:
            raise RuleError("layout 'col_major' needs a tensor of rank 2 or more")
        return identity[:-2] + (rank - 1, rank - 2)
    if layout in ("nhwc", "ndhwc", "channels_last"):
        want = {"nhwc": 4, "ndhwc": 5}.get(layout)
        if want and rank != want or rank < 3:
            raise RuleError(f"layout '{layout}' needs a rank-{want or '3+'} tensor, this one has rank {rank}")
        return (0,) + tuple(range(2, rank)) + (1,)
    raise AssertionError(layout)


def dense_strides(shape: tuple[int, ...], order: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Packed strides for ``shape`` with axes laid out in ``order`` (outermost first)."""
    order = tuple(range(len(shape))) if order is None else order
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= max(1, shape[axis])
    return tuple(strides)


def packed_row_major(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a tensor lies packed in row-major order, its size-1 dims aside (their strides address nothing):
    then any shape of as many elements, row-major, is the same memory."""
    dims = [(d, s) for d, s in zip(shape, strides) if d != 1]
    kept = tuple(d for d, _ in dims)
    return tuple(s for _, s in dims) == dense_strides(kept)


def merged_stride(shape: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The stride of ``shape``'s axes read as one axis (row-major order, unit axes ignored), or None where
    they are no evenly strided run of memory (then merging them is a copy, not a view)."""
    real = [(d, s) for d, s in zip(shape, strides) if d != 1]
    if any(outer != inner * d for (_, outer), (d, inner) in zip(real, real[1:])):
        return None
    return real[-1][1] if real else 1


LEFT_TO_OFFSETS = ("_",)
"""a batch stride left to ragged offsets (`strides [_, ...]`), as declared: each sequence of the tensor starts at
its offset in the memory of one batch slice (the token capacity), so the type's batch stride is 0"""


def left_to_offsets(strides: tuple | None) -> bool:
    """Whether declared strides leave the batch stride to ragged offsets (`_`)."""
    return bool(strides) and strides[0] == LEFT_TO_OFFSETS


def token_batch(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether [B, H, S, D] strides step the batch by one token, as the token rows do (`[512, 128, 512, 1]`, as
    flashinfer's prefill binds q over its token buffer): on a tensor ragged offsets place, the batch stride left
    to the offsets, spelled as the bound tensor has it (the type is `_`'s: batch stride 0, memory S tokens)."""
    return len(shape) == 4 and shape[0] > 1 and strides[0] == strides[2] > 0


def stride_values(strides: tuple, binding: dict[str, int]) -> tuple[int, ...]:
    """Declared strides for one binding of the symbolic dims: each a number, or a product of dims and numbers
    (`H*W*C`, held as its factors); a batch stride left to ragged offsets is 0."""
    return tuple(
        s
        if isinstance(s, int)
        else 0
        if s == LEFT_TO_OFFSETS
        else math.prod(binding[f] if isinstance(f, str) else f for f in s)
        for s in strides
    )


def stride_order(strides: tuple[int, ...]) -> tuple[int, ...]:
    """The axis order (outermost first) that ``strides`` describe; ties keep axis order."""
    return tuple(sorted(range(len(strides)), key=lambda a: (-strides[a], a)))


def storage_elements(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements a buffer must hold for this view: 1 + the largest offset."""
    if any(d == 0 for d in shape):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(shape, strides))


def overlap(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int] | None:
    """Two axes whose elements would alias in memory, or None when the view is one-to-one."""
    axes = sorted((a for a in range(len(shape)) if shape[a] > 1), key=lambda a: (strides[a], a))
    for inner, outer in zip(axes, axes[1:]):
        if strides[outer] < strides[inner] * shape[inner]:
            return inner, outer
    if axes and strides[axes[0]] == 0:
        return axes[0], axes[0]
    return None


def shares_elements(a: TensorType, a_offset: int, b: TensorType, b_offset: int) -> bool | None:
    """Whether two views of one buffer reach a common element: exact when their extents are apart, or
    when they have the same dims and one-to-one strides (packed Q, K, V; the halves of a table); None
    (unknown) otherwise."""
    if a_offset + a.storage <= b_offset or b_offset + b.storage <= a_offset:
        return False
    if a.shape != b.shape or a.strides != b.strides or overlap(a.shape, a.strides) is not None:
        return None
    axes = sorted((k for k in range(len(a.shape)) if a.shape[k] > 1), key=lambda k: -a.strides[k])

    def reach(delta: int, i: int) -> bool:
        """delta = sum of j_k * stride_k over axes[i:], with |j_k| < extent_k? The axes inside reach less
        than one stride of the axis outside them, so only the two nearest multiples need trying."""
        if i == len(axes):
            return delta == 0
        s, d = a.strides[axes[i]], a.shape[axes[i]]
        return any(abs(j) < d and reach(delta - j * s, i + 1) for j in {delta // s, -(-delta // s)})

    return reach(b_offset - a_offset, 0)


def broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy broadcasting of two equal-rank shapes, or None when they don't broadcast."""
    if len(a) != len(b):
        return None
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


def fmt_shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


@attrs.frozen
class TensorType:
    """A concrete tensor type: dtype, shape (ints) and element strides."""

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def storage(self) -> int:
        return storage_elements(self.shape, self.strides)

    @property
    def too_large(self) -> bool:
        """Whether its size in bytes, of its elements or of the memory its strides span, overflows an int64."""
        return max(self.numel, self.storage) * itemsize(self.dtype) > INT64_MAX

    def __str__(self) -> str:
        return f"{self.dtype}{fmt_shape(self.shape)}"
