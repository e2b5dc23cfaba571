"""Outputs against the reference: per-dtype tolerances, cuDNN's unspecified elements skipped, the worst
element named; how precise an output can be given what its ops read."""

from __future__ import annotations

import attrs

from cudnn_dsl.target import bits
from cudnn_dsl.target.dtypes import tolerance
from cudnn_dsl.target.lazy_torch import torch
from dsl.ir import Graph, Instance
from dsl.options import Options
from dsl.types import is_float, itemsize


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
    shapes: tuple | None = None
    """(got, want) where the shapes differ: no element compared, every one counted off"""

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def __str__(self) -> str:
        if self.shapes is not None:
            got, want = (list(s) for s in self.shapes)
            return f"{self.name}: MISMATCH of shape: {got} where the reference is {want}"
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
    if got.shape != want.shape:
        n = max(got.numel(), want.numel())
        return Comparison(name, dtype, atol, rtol, 0.0, 0.0, n, n, shapes=(tuple(got.shape), tuple(want.shape)))
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
