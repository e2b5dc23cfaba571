"""Backend layer: making, loading, checking and comparing the torch buffers bound to a graph."""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import torch

from cudnn_dsl.target import bits, portable
from cudnn_dsl.target.dtypes import from_torch, tolerance, torch_dtype
from cudnn_dsl.target.memory import empty, stored
from dsl.diagnostics import Loc, RuleError
from dsl.inits import Init, make
from dsl.inits import default as default_init
from dsl.ir import Graph, Instance
from dsl.ops import OPS, Ctx
from dsl.options import Options
from dsl.types import ALIGNMENT, DTYPE_RANGE, TensorType, check_value, fmt_shape, is_float, itemsize


class BindingError(Exception):
    """A tensor bound to a graph does not match what the graph needs; `loc` is where the graph
    declares the value, when the message concerns one."""

    def __init__(self, message: str, loc: Loc | None = None):
        super().__init__(message)
        self.loc = loc


def _positive_inputs(graph: Graph) -> set[str]:
    """Bound names whose data an op wants positive (a view's buffer, for a view)."""
    out = set()
    for n in graph.nodes:
        for i in OPS[n.op].positive:
            if i < len(n.inputs) and n.inputs[i]:
                v = graph.value(n.inputs[i])
                out.add(v.view[0] if v.view else v.name)
    return out


def view(v, inst: Instance, tensors: dict) -> torch.Tensor:
    """The tensor of input `v`: as bound, or for a view, its window on the bound buffer (the address
    cuDNN gets is the buffer's plus offset * itemsize)."""
    if v.view is None:
        return tensors[v.name]
    buf, offset = v.view
    t, base = inst.type(v.name), tensors[buf]
    return base.as_strided(t.shape, t.strides, base.storage_offset() + offset)


def with_views(graph: Graph, inst: Instance, tensors: dict) -> dict:
    """The bound tensors, plus every view input on its buffer."""
    return {**tensors, **{v.name: view(v, inst, tensors) for v in graph.views}}


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


def _domains(graph: Graph, instance: Instance) -> dict[str, tuple[int, int]]:
    """Integer inputs whose op allows only some values (sdpa's sequence lengths), by name."""
    out = {}
    for index, n in enumerate(graph.nodes):
        sig = OPS[n.op]
        if sig.domains is None:
            continue
        types = tuple(instance.type(i) if i else None for i in n.inputs)
        for i, bounds in sig.domains(Ctx(n.op, types, instance.attrs(index))).items():
            if n.inputs[i]:
                out[n.inputs[i]] = bounds
    return out


def input_inits(graph: Graph, instance: Instance, inits: dict[str, Init] | None = None) -> dict[str, Init]:
    """How each input is drawn: `inits` (run --init), else the file's `init=`, else the default of its
    dtype (positive values where an op of the registry wants them)."""
    inits, positive, domains = inits or {}, _positive_inputs(graph), _domains(graph, instance)
    return {  # a buffer is drawn once for all its views
        v.name: inits.get(v.name)
        or getattr(v, "init", None)
        or (make("randint", domains[v.name]) if v.name in domains else None)
        or default_init(instance.type(v.name).dtype, v.name in positive)
        for v in graph.device_inputs
    }


def draw_input(init: Init, t: TensorType, seed: int, name: str) -> torch.Tensor:
    """The values of one input, row-major on the CPU in its dtype (portable.draw_values: the ejected scripts
    draw them with the same code); big inputs are drawn on every core."""
    clamp = None if is_float(t.dtype) or t.dtype == "bool" else DTYPE_RANGE[t.dtype]
    args = (init.dist, init.args, t.shape, torch_dtype(t.dtype), seed, name, clamp)
    if t.numel > portable.CHUNK:
        with ThreadPoolExecutor(min(-(-t.numel // portable.CHUNK), os.cpu_count() or 1)) as pool:  # torch drops the GIL
            return portable.draw_values(*args, chunks=pool.map)
    return portable.draw_values(*args)


def _ragged(graph: Graph, instance: Instance) -> dict[str, tuple[TensorType, str]]:
    """Ragged offset inputs by name (OpSig.ragged): the type of the tensor each places, and its lengths.
    One offset input may place several tensors whose sequences it packs alike (q and o of equal rows)."""
    out: dict[str, tuple[TensorType, str]] = {}
    for n in graph.nodes:
        for off, port, lengths in OPS[n.op].ragged:
            if off < len(n.inputs) and n.inputs[off] and n.inputs[lengths]:
                name, placed = n.inputs[off], n.inputs[port] if port >= 0 else n.outputs[-1 - port]
                t = instance.type(placed)
                if name in out and _spans(out[name][0]) != _spans(t):
                    raise BindingError(
                        f"ragged offsets '{name}' place tensors whose sequences take different room "
                        f"({fmt_shape(out[name][0].shape)} and {fmt_shape(t.shape)}): give each its own offsets",
                        graph.value(name).loc,
                    )
                out[name] = (t, n.inputs[lengths])
    return out


def _spans(t: TensorType) -> tuple[int, int]:
    return portable.ragged_span(t.shape, t.strides)


def packed_offsets(t: TensorType, lengths: torch.Tensor) -> torch.Tensor:
    """Offsets [B+1] that pack sequences of these lengths back to back in a buffer of type t."""
    return portable.packed_offsets(lengths, t.shape, t.strides)


def packed_ragged(graph: Graph, instance: Instance, inits: dict[str, Init] | None = None) -> dict[str, tuple]:
    """The ragged offset inputs whose generated values pack their sequences (no init names them): name ->
    (the type of the tensor they place, the name of its lengths). The ejected scripts draw them alike."""
    drawn = input_inits(graph, instance, inits)
    return {
        name: (placed, lengths)
        for name, (placed, lengths) in _ragged(graph, instance).items()
        if not (inits or {}).get(name) and getattr(graph.value(name), "init", None) is None and name in drawn
    }


def generate_inputs(
    graph: Graph,
    instance: Instance,
    device,
    seed: int = 0,
    inits: dict[str, Init] | None = None,
    given: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Seeded inputs in their declared layout, each drawn as `input_inits` says. Drawn on the CPU, so
    a seed gives the same inputs on every device. Ragged offsets no init names pack their sequences
    (packed_offsets of the lengths: generated, or `given`, the tensors taken in place of drawn ones)."""
    out = {}
    for name, init in input_inits(graph, instance, inits).items():
        t = instance.type(name)
        buf = empty(t, device)
        buf.copy_(stored(draw_input(init, t, seed, name), t))
        out[name] = buf
    given = given or {}
    out.update(given)
    for name, (placed, lengths) in packed_ragged(graph, instance, inits).items():
        if name not in given:
            out[name].copy_(packed_offsets(placed, out[lengths].cpu()).view(out[name].shape))
    return out


def load_tensor(path: str | Path) -> torch.Tensor:
    """A tensor from .pt, .npy or .safetensors (a file of one dense tensor); no pickled code runs."""
    path = Path(path)
    if not path.is_file():
        raise BindingError(f"{path}: no such file")
    try:
        if path.suffix == ".pt":
            t = torch.load(path, map_location="cpu", weights_only=True)
        elif path.suffix == ".npy":
            import numpy as np

            t = torch.from_numpy(np.load(path, allow_pickle=False))
        elif path.suffix == ".safetensors":
            from safetensors.torch import load_file

            tensors = load_file(str(path))
            if len(tensors) != 1:
                raise BindingError(f"{path}: holds {len(tensors)} tensors; give a file of one")
            t = next(iter(tensors.values()))
        else:
            raise BindingError(f"{path}: unknown tensor file type (use .pt, .npy or .safetensors)")
    except BindingError:
        raise
    except ImportError:
        raise BindingError(f"{path}: reading {path.suffix} files needs a package that is not installed") from None
    except Exception as e:  # noqa: BLE001 - unpickling refusals, truncated zips, bad headers: all say "not a tensor file"
        raise BindingError(f"{path}: not a readable tensor file ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(t, torch.Tensor):
        raise BindingError(f"{path}: holds a {type(t).__name__}, not a tensor")
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        raise BindingError(
            f"{path}: holds a {t.layout if t.layout != torch.strided else t.device.type} tensor; give a dense one"
        )
    if t.is_complex():
        raise BindingError(f"{path}: holds a complex tensor; cuDNN graphs take real data")
    return t


def converted(t: torch.Tensor, want: TensorType, cast: bool = False) -> torch.Tensor:
    """A loaded tensor in the graph's dtype (its shape must match). A dtype change that would lose
    information is refused unless `cast`. A bool tensor's packed bytes (as a dump holds them) pass as they are."""
    if want.dtype == "bool" and t.dtype == torch.uint8:
        return _bool_bytes(t, want)
    if tuple(t.shape) != want.shape:
        raise BindingError(f"expected shape {fmt_shape(want.shape)}, the file holds {fmt_shape(tuple(t.shape))}")
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
    buf = empty(want, device)
    buf.copy_(stored(t.to(device), want))
    return buf


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
        strides = tuple(t.stride())
        if any(s != w and d > 1 for s, w, d in zip(strides, want.strides, want.shape)):
            problems.append(f"strides {list(want.strides)}, given {list(strides)}")
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


@attrs.frozen
class Comparison:
    name: str
    dtype: str
    atol: float
    rtol: float
    max_abs: float
    max_rel: float
    mismatches: int
    numel: int
    mean_abs: float = 0.0
    worst: tuple | None = None
    """(index, got, want) of the element furthest past its tolerance, when any is"""

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def __str__(self) -> str:
        if self.ok:
            verdict = "ok"
        else:
            index, got, want = self.worst
            verdict = (
                f"MISMATCH in {self.mismatches} of {self.numel} ({100 * self.mismatches / self.numel:.3g}%); "
                f"worst at {list(index)}: {got:.6g}, want {want:.6g}"
            )
        return (
            f"{self.name}: {verdict} (max abs err {self.max_abs:.3g}, mean {self.mean_abs:.3g}, max rel err "
            f"{self.max_rel:.3g}; atol {self.atol:g}, rtol {self.rtol:g})"
        )


def compare(
    name: str,
    got: torch.Tensor,
    want: torch.Tensor,
    dtype: str,
    atol: float | None = None,
    rtol: float | None = None,
    floor_dtype: str | None = None,
) -> Comparison:
    """Counts elements off by more than atol + rtol * |want|. Defaults come from the output's dtype,
    and from ``floor_dtype`` (the least precise input) when that is looser; a bool output is exact."""
    d_atol, d_rtol = tolerance(dtype)
    if floor_dtype is not None and dtype != "bool":
        d_atol, d_rtol = max(d_atol, tolerance(floor_dtype)[0]), max(d_rtol, tolerance(floor_dtype)[1])
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    g = got.to(torch.float64).cpu() if got.device != want.device else got.to(torch.float64)
    w = want.to(device=g.device, dtype=torch.float64)
    diff = (g - w).abs()
    bad = (diff > atol + rtol * w.abs()) | (g.isnan() ^ w.isnan()) | ((g.isinf() | w.isinf()) & (g != w))
    finite = diff[diff.isfinite()]
    significant = diff.isfinite() & (w.abs() > atol)  # relative error where it means something
    rel = (diff / w.abs().clamp_min(1e-12))[significant]
    n_bad = int(bad.sum())
    worst = None
    if n_bad:
        excess = torch.where(bad, (diff - atol - rtol * w.abs()).nan_to_num(float("inf")), -1.0)
        flat = int(excess.argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), g.shape))
        worst = (index, float(g[index]), float(w[index]))
    return Comparison(
        name,
        dtype,
        atol,
        rtol,
        float(finite.max()) if finite.numel() else 0.0,
        float(rel.max()) if rel.numel() else 0.0,
        n_bad,
        g.numel(),
        float(finite.mean()) if finite.numel() else 0.0,
        worst,
    )


def defined_only(name: str, got: torch.Tensor, want) -> tuple[torch.Tensor, torch.Tensor]:
    """One output and its reference, zero on both sides where the reference (reference.Outputs)
    marks the op's result unspecified."""
    mask = getattr(want, "undefined", {}).get(name)
    if mask is None:
        return got, want[name]
    return got.masked_fill(mask.to(got.device), 0), want[name].masked_fill(mask.to(want[name].device), 0)


def compare_outputs(
    graph: Graph, inst: Instance, got, want, options: Options, atol=None, rtol=None, skip=frozenset()
) -> list[Comparison]:
    """Every output but those in `skip` against the reference, and but for the elements the reference marks
    undefined (reference.Outputs). atol/rtol: one tolerance for all, or {output: tolerance}; None: the
    options', else the dtype's."""

    def pick(v, name, default):
        if isinstance(v, dict):
            return v.get(name, default)
        return default if v is None else v

    floor = loosest_read_dtype(graph, inst)
    return [
        compare(
            v.name,
            *defined_only(v.name, bits.logical(got[v.name], inst.type(v.name)), want),
            inst.type(v.name).dtype,
            pick(atol, v.name, options.atol),
            pick(rtol, v.name, options.rtol),
            floor,
        )
        for v in graph.outputs
        if v.name not in skip
    ]


def rounded_values(graph: Graph, instance: Instance) -> frozenset[str]:
    """The computed values that cuDNN rounds to their dtype before another op reads them: every one.

    Measured on the H200 (tests/gpu/test_precision_gpu.py): an output read by a later op is read as
    written (the frontend's add + layernorm sample), a virtual operand of a matmul is fed in its dtype,
    and even a virtual half between two pointwise ops of one fused epilogue is rounded to half. A
    virtual tensor of the default intermediate dtype (float) is computed in float, so rounding it changes
    nothing. Only floating-point values narrower than double are named (in a double graph float32 is
    narrow); integers and booleans are exact."""
    return frozenset(
        o
        for n in graph.nodes
        for o in n.outputs
        if is_float(instance.type(o).dtype) and itemsize(instance.type(o).dtype) < 8
    )


def loosest_read_dtype(graph: Graph, inst: Instance) -> str | None:
    """An output is never checked tighter than the least precise tensor an op reads allows: an input, or
    a value rounded where it is computed (rounded_values). An AMAX in float of bf16 data is
    only as exact as bf16, and so is anything computed from a bf16 matmul result: one ulp of difference
    in the sum's order rounds it the other way."""
    read = {i for n in graph.nodes for i in n.inputs if i}
    names = [v.name for v in graph.of_kind("input")] + sorted(read & rounded_values(graph, inst))
    dtypes = [inst.type(n).dtype for n in names]
    return max(dtypes, key=lambda d: tolerance(d)[0], default=None)


def reference_bytes(graph: Graph, inst: Instance) -> int:
    """About what the reference holds at once: every value, widened to float32 or wider."""
    return sum(t.numel * max(4, itemsize(t.dtype)) for _, t in inst.types)
