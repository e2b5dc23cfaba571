"""The torch buffers bound to a graph: checked against what it declares, views placed on their buffers,
snapshots of what an in-place output overwrites."""

from __future__ import annotations

import math

from cudnn_dsl.target import bits
from cudnn_dsl.target.dtypes import from_torch, torch_dtype
from cudnn_dsl.target.lazy_torch import torch
from cudnn_dsl.target.memory import empty, owned, stored
from dsl.diagnostics import Loc, RuleError
from dsl.ir import Graph, Instance
from dsl.types import ALIGNMENT, TensorType, check_value, fmt_shape, itemsize


class BindingError(Exception):
    """A tensor bound to a graph does not match what the graph needs; `loc` is where the graph
    declares the value, when the message concerns one."""

    def __init__(self, message: str, loc: Loc | None = None):
        super().__init__(message)
        self.loc = loc


def window(v, inst: Instance) -> tuple:
    """A view input's (shape, strides, element offset) in its buffer."""
    t = inst.type(v.name)
    return t.shape, t.strides, v.view[1]


def on(buffer: torch.Tensor, window: tuple) -> torch.Tensor:
    """A view's window on its bound buffer (the address cuDNN gets is the buffer's plus offset * itemsize)."""
    shape, strides, offset = window
    return buffer.as_strided(shape, strides, buffer.storage_offset() + offset)


def view(v, inst: Instance, tensors: dict) -> torch.Tensor:
    """The tensor of input `v`: as bound, or for a view, its window on the bound buffer."""
    return tensors[v.name] if v.view is None else on(tensors[v.view[0]], window(v, inst))


def with_views(graph: Graph, inst: Instance, tensors: dict) -> dict:
    """The bound tensors, plus every view input on its buffer."""
    return {**tensors, **{v.name: view(v, inst, tensors) for v in graph.views}}


def outputs_of(graph: Graph, inst: Instance, tensors: dict, device, out: dict | None = None) -> dict:
    """The outputs of one launch by name: an output in place is its input's memory (a view: its window on the
    buffer), one given in `out` that buffer, the others allocated on `device`."""
    out = out or {}
    return {
        v.name: view(graph.value(v.into), inst, tensors)
        if v.into is not None
        else out[v.name]
        if v.name in out
        else empty(inst.type(v.name), device)
        for v in graph.outputs
    }


def written(graph: Graph) -> set[str]:
    """The bound names whose memory an in-place output overwrites (an input, or a view's buffer)."""
    return {v.view[0] if v.view else v.name for v in map(graph.value, (o.into for o in graph.in_place))}


def snapshot(graph: Graph, tensors: dict) -> dict:
    """The bound tensors with a copy of each one an in-place output overwrites: the reference's inputs,
    taken before a launch changes them."""
    keep = written(graph)
    return {k: t.clone() if k in keep and isinstance(t, torch.Tensor) else t for k, t in tensors.items()}


def restore(tensors: dict, before: dict) -> None:
    """Puts a snapshot's copies back into the bound tensors (before another launch that must be checked)."""
    for k, t in before.items():
        if t is not tensors[k]:
            tensors[k].copy_(t)


def converted(t: torch.Tensor, want: TensorType, cast: bool = False) -> torch.Tensor:
    """A loaded tensor in the graph's dtype (its shape must match). A dtype change that would lose
    information is refused unless `cast`. A bool tensor's packed bytes (as a dump holds them) pass as they are."""
    if want.dtype == "bool" and t.dtype == torch.uint8:
        return _bool_bytes(t, want)
    if tuple(t.shape) != want.shape:
        raise BindingError(f"expected shape {fmt_shape(want.shape)}, the file holds {fmt_shape(tuple(t.shape))}")
    if owned(want):
        first = t[:1].expand_as(t)
        differ = ~((t == first) | (t != t) & (first != first)).flatten(1).all(1)  # NaN is itself here
        if differ.any():
            raise BindingError(
                f"the tensor's batch stride is left to ragged offsets: every batch is one token buffer, but the "
                f"file's batch {int(differ.nonzero()[0])} differs from batch 0 (memory of B * S rows declares its "
                "batch stride, `strides [S*H*D, ...]`)"
            )
    target = torch_dtype(want.dtype)
    out = t.to(target)
    if t.dtype != target and not cast:
        back, nan = out.to(t.dtype), t.isnan() if t.is_floating_point() else None
        exact = (
            torch.equal(back, t) if nan is None else torch.equal(back.isnan(), nan) and torch.equal(back[~nan], t[~nan])
        )
        if not exact:
            raise BindingError(
                f"the file holds {from_torch(t.dtype) or t.dtype} values that {want.dtype} cannot "
                f"hold exactly; convert them yourself, or pass --cast-inputs"
            )
    return out


def _bool_bytes(t: torch.Tensor, want: TensorType) -> torch.Tensor:
    """uint8 data for a bool tensor of n elements, read by its size: n bytes in want's shape are one element
    each (0 or 1); ceil(extent / 8) bytes (any shape) are cuDNN's packed bytes, passed as they are. The two
    sizes coincide only for one element: its byte is one value when it is 0 or 1, else packed."""
    n, packed = want.numel, bits.nbytes(want)
    one = tuple(t.shape) == want.shape and bool((t <= 1).all())
    if t.numel() == n and (n != packed or one):
        if tuple(t.shape) != want.shape:
            raise BindingError(
                f"expected shape {fmt_shape(want.shape)} for one byte per element, the file holds "
                f"{fmt_shape(tuple(t.shape))}"
            )
        if not one:
            raise BindingError("a bool tensor given one byte per element takes 0 (false) and 1 (true) only")
        return t.bool()
    if t.numel() == packed:
        return t
    raise BindingError(
        f"a bool tensor of {n} elements takes {n} uint8 bytes (one per element, 0 or 1, shape "
        f"{fmt_shape(want.shape)}) or {packed} (packed eight a byte, as cuDNN reads it); the file holds {t.numel()}"
    )


def relayout(t: torch.Tensor, want: TensorType, device) -> torch.Tensor:
    """A tensor of the right shape and dtype copied to the device in the graph's layout (packed, for bool)."""
    buf, index = empty(want, device), owned(want)
    buf[index].copy_(stored(t.to(device), want)[index])
    return buf


def stride_problem(shape, strides, declared) -> str | None:
    """What is wrong with a tensor's strides against the declared ones, or None: a dim of size 1 (or 0) addresses
    nothing, so its stride is free. The sizes and strides may be symbolic (a traced tensor's)."""
    if all(d <= 1 or s == w for d, s, w in zip(shape, strides, declared)):
        return None
    return f"strides {list(declared)}, given {list(strides)}"


def bound_strides(want: TensorType, given) -> tuple[int, ...]:
    """The strides a bound tensor of type `want` may have: its own, or, where its batch stride is left to ragged
    offsets (0), a batch stride of one token as well (flashinfer's binding of a token buffer, dsl.types.token_batch):
    cuDNN reads each batch at its offset either way, in the memory of S tokens from the tensor's start."""
    s = want.strides
    if len(s) == 4 and s[0] == 0 and want.shape[0] > 1 and given[0] == s[2]:
        return (s[2], *s[1:])
    return s


def check_binding(name: str, t, want: TensorType, device: torch.device | None, loc: Loc | None = None) -> None:
    """Everything cuDNN will assume about a buffer, checked before it sees the pointer. With no
    device (the reference), only what the math needs: type, shape and dtype."""
    if not isinstance(t, torch.Tensor):
        raise BindingError(f"'{name}': expected a torch.Tensor, got {type(t).__name__}", loc)
    if want.dtype == "bool" and not (device is None and t.dtype == torch.bool):
        _check_packed(name, t, want, device, loc)
        return
    problems = []
    if tuple(t.shape) != want.shape:
        problems.append(f"shape {fmt_shape(want.shape)}, given {fmt_shape(tuple(t.shape))}")
    if t.dtype != torch_dtype(want.dtype):
        problems.append(f"dtype {want.dtype}, given {from_torch(t.dtype) or t.dtype}")
    if device is not None and t.device != device:
        problems.append(f"device {device}, given {t.device}")
    if not problems and device is not None:
        misplaced = stride_problem(want.shape, t.stride(), bound_strides(want, t.stride()))
        if misplaced:
            problems.append(misplaced)
        need = want.storage * itemsize(want.dtype)
        have = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
        if have < need:
            problems.append(f"a buffer of {need} bytes, given {have}")
        if t.data_ptr() % ALIGNMENT:
            problems.append(f"an address aligned to {ALIGNMENT} bytes, given one {t.data_ptr() % ALIGNMENT} past it")
    if problems:
        raise BindingError(f"'{name}': expected " + "; ".join(problems), loc)


def _check_packed(name: str, t: torch.Tensor, want: TensorType, device, loc: Loc | None) -> None:
    """A bool tensor as cuDNN keeps it: uint8 bytes, eight elements each (cudnn_dsl.pack_bits)."""
    need = bits.nbytes(want)
    problems = []
    if t.dtype != torch.uint8:
        problems.append(
            f"a bool tensor bit-packed as cuDNN keeps it: {need} uint8 bytes, eight elements a byte "
            f"(cudnn_dsl.pack_bits(mask) makes them), given {from_torch(t.dtype) or t.dtype}"
        )
    elif t.numel() != need or not t.is_contiguous():  # a byte per element is the likely mistake: never read as bits
        hint = (
            " (a byte per element? cudnn_dsl.pack_bits(mask) packs them)" if t.numel() == math.prod(want.shape) else ""
        )
        problems.append(f"{need} contiguous bytes of packed bools, given {t.numel()}{hint}")
    if device is not None and t.device != device:
        problems.append(f"device {device}, given {t.device}")
    if device is not None and not problems and t.data_ptr() % ALIGNMENT:
        problems.append(f"an address aligned to {ALIGNMENT} bytes, given one {t.data_ptr() % ALIGNMENT} past it")
    if problems:
        raise BindingError(f"'{name}': expected " + "; ".join(problems), loc)


def check_inputs(graph: Graph, inst: Instance, tensors: dict, device: torch.device | None) -> None:
    """Names, then each bound tensor (check_binding), then each scalar given by value."""
    names = {v.name for v in graph.inputs}
    unknown = set(tensors) - names
    for name in sorted(unknown & {v.name for v in graph.views}):
        v = graph.value(name)
        raise BindingError(f"'{name}' is a view of buffer '{v.view[0]}'; bind '{v.view[0]}'", v.loc)
    if unknown:
        raise BindingError(
            f"graph '{graph.name}' has no input {', '.join(sorted(unknown))} (inputs: {', '.join(sorted(names))})"
        )
    for v in graph.device_inputs:
        if v.name not in tensors:
            raise BindingError(f"graph '{graph.name}': {v.kind} '{v.name}' is not bound", v.loc)
        check_binding(v.name, tensors[v.name], inst.type(v.name), device, v.loc)
    for v in graph.views:  # the checker proved each in bounds and aligned; this is the pointer cuDNN gets
        check_binding(v.name, view(v, inst, tensors), inst.type(v.name), device, v.loc)
    for v in graph.of_kind("scalar"):
        if v.name in tensors:
            scalar_value(v.name, tensors[v.name], inst.type(v.name).dtype, v.loc)


def scalar_value(name: str, value, dtype: str, loc: Loc | None = None) -> float | int:
    """A scalar given by value (a number, or a one-element tensor), checked against its dtype."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise BindingError(f"scalar '{name}': expected one value, given a tensor of {value.numel()}", loc)
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BindingError(f"scalar '{name}': expected a finite number, given {value!r}", loc)
    try:
        check_value(dtype, value)
    except RuleError as e:
        raise BindingError(f"scalar '{name}': {e}", loc) from None
    return value
