"""Bench layer: `cudnn-dsl bench` — the compiled graph against hand-written cuDNN, torch eager and
torch.compile, in one process, on the same input buffers, checked before timed.

GPU time comes from CUDA events around back-to-back calls (the device queue kept full), taken in
interleaved rounds so a noisy machine shows as spread rather than as a wrong winner. Host time is
the median wall time of one call. Ratios are computed within the run.
"""

from __future__ import annotations

import importlib.util
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch

from cudnn_dsl.backend import load_cudnn
from cudnn_dsl.emit import emit_cudnn
from cudnn_dsl.reference import run_reference
from cudnn_dsl.runtime import CompiledGraph
from cudnn_dsl.tensors import compare, defined_only, loosest_input_dtype
from cudnn_dsl.timing import gpu_time_us, host_time_us
from cudnn_dsl.tune import work
from dsl.ir import Graph, Instance, shape_label

BASELINES = ("cudnn", "torch", "compile")
LABELS = {"cudnn-dsl": "cudnn-dsl", "cudnn": "hand-written cuDNN", "torch": "torch eager", "compile": "torch.compile"}


@attrs.define
class Contender:
    name: str
    fn: Callable[[], dict]
    outputs: dict | None = None
    samples: list[float] = attrs.Factory(list)
    host_us: float = 0.0
    error: str = ""
    check: str = ""


@attrs.define
class Ejected:
    """The standalone script `emit --target cudnn` prints, imported, built, and bound to buffers."""

    g: Any
    handle: Any
    outputs: dict
    run: Callable[[], dict]


def load_ejected(graph: Graph, inst: Instance, tensors: dict, like: dict) -> Ejected:
    """Builds the ejected script on its own handle; it reads `tensors` and writes fresh outputs."""
    cudnn = load_cudnn()
    with tempfile.TemporaryDirectory(prefix="cudnn-dsl-bench-") as tmp:  # imported, the file is not needed
        path = Path(tmp) / f"{graph.name}_ejected.py"
        path.write_text(emit_cudnn(graph, inst))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    g = mod.build(handle)
    outs = {n: torch.empty_like(t) for n, t in like.items()}
    buffers = {**{k: v for k, v in tensors.items() if k in mod.INPUTS}, **outs}
    ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device="cuda")
    scalars = mod.host_scalars()

    def run():
        mod.execute(g, handle, buffers, ws, scalars)
        return outs

    return Ejected(g, handle, outs, run)


def peak_tflops_bf16() -> float:
    """The dense bf16 rate this GPU reaches on an 8192^3 matmul of random data (our ceiling)."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = statistics.median(gpu_time_us(lambda: a @ b, iterations=5, warmup=2, inner=3))
    return 2 * n**3 / (t * 1e-6) / 1e12


def bench_graph(graph: Graph, inst: Instance, against=BASELINES, rounds: int = 7, iters: int = 20) -> dict:
    cg = CompiledGraph(graph)
    tensors = cg.allocate_inputs(dict(inst.binding))
    bound = cg.bind(**tensors)
    contenders = [Contender("cudnn-dsl", bound.run)]
    if "cudnn" in against:
        contenders.append(
            _guard("cudnn", lambda: Contender("cudnn", load_ejected(graph, inst, tensors, bound.outputs).run))
        )
    eager = lambda: run_reference(graph, inst, tensors, native=True)  # noqa: E731
    if "torch" in against:
        contenders.append(Contender("torch", eager))
    if "compile" in against:
        contenders.append(Contender("compile", torch.compile(eager)))
    for c in contenders:  # first call: compiles what compiles, and gives outputs to check
        try:
            c.outputs = {k: v.clone() for k, v in c.fn().items()}
        except Exception as e:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
            c.error = c.error or " ".join(str(e).split())[:200]
    torch.cuda.synchronize()
    want = run_reference(graph, inst, tensors)
    for c in contenders:
        if c.outputs is None:
            continue
        floor = loosest_input_dtype(graph, inst)
        comps = [compare(n, *defined_only(n, c.outputs[n], want), inst.type(n).dtype, floor_dtype=floor) for n in want]
        c.check = "ok" if all(x.ok for x in comps) else "; ".join(str(x) for x in comps if not x.ok)
    live = [c for c in contenders if c.outputs is not None]
    for _ in range(rounds):
        for c in live:
            c.samples.append(statistics.median(gpu_time_us(c.fn, iterations=iters, warmup=2, inner=5)))
    for c in live:
        c.host_us = host_time_us(c.fn, iterations=100)
    flops, moved = work(graph, inst)
    ours = statistics.median(contenders[0].samples)
    rows = []
    for c in contenders:
        row = {"name": c.name, "label": LABELS[c.name], "check": c.check, "error": c.error}
        if c.samples:
            med = statistics.median(c.samples)
            row.update(
                gpu_us_median=med,
                gpu_us_min=min(c.samples),
                gpu_us_max=max(c.samples),
                host_us=c.host_us,
                tflops=flops / (med * 1e-6) / 1e12,
                gbps=moved / (med * 1e-6) / 1e9,
                speedup_of_cudnn_dsl=med / ours,
            )
        rows.append(row)
    return {
        "graph": graph.name,
        "binding": dict(inst.binding),
        "flops": flops,
        "bytes": moved,
        "rows": rows,
        "plan": bound.exe.plan_name,
        "plan_source": bound.exe.source,
    }


def _guard(name: str, make: Callable[[], Contender]) -> Contender:
    try:
        return make()
    except Exception as e:  # noqa: BLE001
        return Contender(name, lambda: {}, error=" ".join(str(e).split())[:200])


def table(result: dict, peak: float | None) -> str:
    label = result["graph"] + (f" [{shape_label(result['binding'].items())}]" if result["binding"] else "")
    lines = [
        f"graph {label}: {result['flops'] / 1e9:.2f} GFLOP, {result['bytes'] / 1e6:.1f} MB moved at least; "
        f"cudnn-dsl plan {result['plan']} (from {result['plan_source']})",
        f"  {'':20} {'GPU µs':>9} {'spread':>15} {'host µs':>8} {'TFLOP/s':>8} {'GB/s':>7} "
        f"{'% peak':>6} {'vs cudnn-dsl':>12}  check",
    ]
    for r in result["rows"]:
        if "gpu_us_median" not in r:
            lines.append(f"  {r['label']:20} failed: {r['error']}")
            continue
        pk = f"{100 * r['tflops'] / peak:5.1f}%" if peak else "-"
        lines.append(
            f"  {r['label']:20} {r['gpu_us_median']:9.1f} {r['gpu_us_min']:7.1f}-{r['gpu_us_max']:<7.1f} "
            f"{r['host_us']:8.1f} {r['tflops']:8.1f} {r['gbps']:7.0f} {pk:>6} "
            f"{r['speedup_of_cudnn_dsl']:11.2f}x  {r['check'] or r['error']}"
        )
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    import matplotlib  # the CLI checks that it is installed before any work

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.6), squeeze=False)
    for ax, res in zip(axes[0], results):
        rows = [r for r in res["rows"] if "gpu_us_median" in r]
        ax.bar(
            [r["label"] for r in rows],
            [r["gpu_us_median"] for r in rows],
            yerr=[
                [r["gpu_us_median"] - r["gpu_us_min"] for r in rows],
                [r["gpu_us_max"] - r["gpu_us_median"] for r in rows],
            ],
            color=["#76b900" if r["name"] == "cudnn-dsl" else "#888888" for r in rows],
        )
        ax.set_title(res["graph"])
        ax.set_ylabel("GPU µs per call (median, min-max)")
        ax.tick_params(axis="x", rotation=30, labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
