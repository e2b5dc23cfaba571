"""Backend layer: making, loading, checking and comparing the torch buffers bound to a graph."""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

from cudnn_dsl.dtypes import FROM_TORCH, TORCH, tolerance
from dsl.ir import Graph, Instance
from dsl.ops import OPS
from dsl.types import TensorType, fmt_shape, itemsize


class BindingError(Exception):
    """A tensor bound to a graph does not match what the graph needs."""


def empty(t: TensorType, device) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.strides, dtype=TORCH[t.dtype], device=device)


def _positive_inputs(graph: Graph) -> set[str]:
    out = set()
    for n in graph.nodes:
        for i in OPS[n.op].positive:
            if i < len(n.inputs) and n.inputs[i]:
                out.add(n.inputs[i])
    return out


def generate_inputs(graph: Graph, instance: Instance, device, seed: int = 0,
                    ranges: dict[str, tuple[float, float]] | None = None) -> dict[str, torch.Tensor]:
    """Seeded inputs in their declared layout: floats in [-1, 1] ([0.5, 1.5] where an op wants
    positive values), integers in [-8, 8], booleans at random; `ranges` overrides by name."""
    ranges = ranges or {}
    positive = _positive_inputs(graph)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for v in graph.of_kind("input"):
        t = instance.type(v.name)
        lo, hi = ranges.get(v.name, (0.5, 1.5) if v.name in positive else (-1.0, 1.0))
        buf = empty(t, device)
        if t.dtype == "bool":
            src = torch.rand(t.shape, generator=gen, device=device) < 0.5
        elif t.dtype in ("int8", "uint8", "int32", "int64"):
            lo_i, hi_i = (int(lo * 8), int(hi * 8)) if v.name not in ranges else (int(lo), int(hi))
            src = torch.randint(max(lo_i, 0) if t.dtype == "uint8" else lo_i, hi_i + 1, t.shape, generator=gen, device=device)
        else:
            src = torch.rand(t.shape, generator=gen, device=device) * (hi - lo) + lo
        buf.copy_(src)
        out[v.name] = buf
    return out


def load_tensor(path: str | Path) -> torch.Tensor:
    """A tensor from .pt, .npy or .safetensors (a file of one tensor)."""
    path = Path(path)
    if not path.is_file():
        raise BindingError(f"{path}: no such file")
    if path.suffix == ".pt":
        t = torch.load(path, map_location="cpu", weights_only=True)
    elif path.suffix == ".npy":
        import numpy as np

        t = torch.from_numpy(np.load(path, allow_pickle=False))
    elif path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise BindingError(f"{path}: reading .safetensors needs the safetensors package") from None

        tensors = load_file(str(path))
        if len(tensors) != 1:
            raise BindingError(f"{path}: holds {len(tensors)} tensors; give a file of one")
        t = next(iter(tensors.values()))
    else:
        raise BindingError(f"{path}: unknown tensor file type (use .pt, .npy or .safetensors)")
    if not isinstance(t, torch.Tensor):
        raise BindingError(f"{path}: does not hold a tensor")
    return t


def relayout(t: torch.Tensor, want: TensorType, device) -> torch.Tensor:
    """A loaded tensor moved to the device in the graph's layout and dtype (shape must match)."""
    if tuple(t.shape) != want.shape:
        raise BindingError(f"expected shape {fmt_shape(want.shape)}, the file holds {fmt_shape(tuple(t.shape))}")
    buf = empty(want, device)
    buf.copy_(t.to(device=device, dtype=TORCH[want.dtype]))
    return buf


def check_binding(name: str, t, want: TensorType, device: torch.device) -> None:
    """Everything cuDNN will assume about a buffer, checked before it sees the pointer."""
    if not isinstance(t, torch.Tensor):
        raise BindingError(f"'{name}': expected a torch.Tensor, got {type(t).__name__}")
    problems = []
    if tuple(t.shape) != want.shape:
        problems.append(f"shape {fmt_shape(want.shape)}, given {fmt_shape(tuple(t.shape))}")
    if t.dtype != TORCH[want.dtype]:
        problems.append(f"dtype {want.dtype}, given {FROM_TORCH.get(t.dtype, t.dtype)}")
    if t.device != device:
        problems.append(f"device {device}, given {t.device}")
    if not problems:
        strides = tuple(t.stride())
        if any(s != w and d > 1 for s, w, d in zip(strides, want.strides, want.shape)):
            problems.append(f"strides {list(want.strides)}, given {list(strides)}")
        need = want.storage * itemsize(want.dtype)
        have = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
        if have < need:
            problems.append(f"a buffer of {need} bytes, given {have}")
    if problems:
        raise BindingError(f"'{name}': expected " + "; ".join(problems))


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

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def __str__(self) -> str:
        verdict = "ok" if self.ok else f"MISMATCH in {self.mismatches} of {self.numel}"
        return (f"{self.name}: {verdict} (max abs err {self.max_abs:.3g}, max rel err {self.max_rel:.3g}; "
                f"atol {self.atol:g}, rtol {self.rtol:g})")


def compare(name: str, got: torch.Tensor, want: torch.Tensor, dtype: str,
            atol: float | None = None, rtol: float | None = None, floor_dtype: str | None = None) -> Comparison:
    """Counts elements off by more than atol + rtol * |want|. Defaults come from the output's dtype,
    and from ``floor_dtype`` (the least precise input) when that is looser."""
    d_atol, d_rtol = tolerance(dtype)
    if floor_dtype is not None:
        d_atol, d_rtol = max(d_atol, tolerance(floor_dtype)[0]), max(d_rtol, tolerance(floor_dtype)[1])
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    g = got.to(torch.float64).cpu() if got.device != want.device else got.to(torch.float64)
    w = want.to(device=g.device, dtype=torch.float64)
    diff = (g - w).abs()
    bad = (diff > atol + rtol * w.abs()) | (g.isnan() ^ w.isnan()) | (g.isinf() & (g != w))
    finite = diff[diff.isfinite()]
    significant = diff.isfinite() & (w.abs() > atol)  # relative error where it means something
    rel = (diff / w.abs().clamp_min(1e-12))[significant]
    return Comparison(name, dtype, atol, rtol, float(finite.max()) if finite.numel() else 0.0,
                      float(rel.max()) if rel.numel() else 0.0, int(bad.sum()), g.numel())
