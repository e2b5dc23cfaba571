"""`cudnn-dsl bench` — the compiled graph against hand-written cuDNN, torch eager and
torch.compile, in one process, on the same input buffers, checked before timed.

GPU time comes from CUDA events around back-to-back calls (the device queue kept full), taken in
interleaved rounds so a noisy machine shows as spread rather than as a wrong winner; with `cold_l2`,
from events around single calls, each after a write that evicts the L2 (inputs that fit in the L2
flatter every contender when warm). Host time is the median wall time of one call. Ratios are
computed within the run.
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

from cudnn_dsl.interop.emit import emit_cudnn
from cudnn_dsl.run.buffers import restore, snapshot, with_views
from cudnn_dsl.run.compare import compare, defined_only, loosest_read_dtype
from cudnn_dsl.run.compiled import CompiledGraph
from cudnn_dsl.run.reference import run_reference
from cudnn_dsl.run.timing import cold_time_us, gpu_time_us, host_time_us, l2_flush_buffer
from cudnn_dsl.target.bits import logical
from cudnn_dsl.target.library import load_cudnn
from cudnn_dsl.target.memory import empty
from cudnn_dsl.tune.contenders import BASELINES, COMPILE_MODES, LABELS
from cudnn_dsl.tune.heuristics import work
from cudnn_dsl.tune.plots import Panel, draw
from dsl.ir import Graph, Instance, shape_label
from dsl.options import Options


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


def import_script(script: str, name: str):
    """An ejected script (emit's text, not the user's) imported as a module from a file, as a user runs it."""
    with tempfile.TemporaryDirectory(prefix="cudnn-dsl-eject-") as tmp:  # imported, the file is not needed
        path = Path(tmp) / f"{name}_ejected.py"
        path.write_text(script)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


def load_ejected(graph: Graph, inst: Instance, tensors: dict, like: dict, options: Options | None = None) -> Ejected:
    """Builds the ejected script on its own handle; it reads `tensors` and writes fresh outputs."""
    cudnn = load_cudnn()
    mod = import_script(emit_cudnn(graph, inst, options), graph.name)
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    g = mod.build(handle)
    outs = {n: torch.empty_like(t) for n, t in like.items()}
    buffers = {**with_views(graph, inst, {k: v for k, v in tensors.items() if k in mod.INPUTS}), **outs}
    for name in set(mod.UIDS) - set(buffers):  # scratch statistics (written, read by no one): memory of their own
        buffers[name] = empty(inst.type(name), "cuda")
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


def _compiled(fn: Callable[[], dict], mode: str) -> Callable[[], dict]:
    """torch.compile of the eager reference in one of its modes. The CUDA-graph modes reuse their output
    buffers from call to call, which is what the step marker tells them is allowed."""
    compiled = torch.compile(fn, mode=mode)
    if mode == "default":
        return compiled

    def call():
        torch.compiler.cudagraph_mark_step_begin()
        return compiled()

    return call


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between the closest ranks."""
    xs = sorted(samples)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def bench_graph(
    graph: Graph,
    inst: Instance,
    against=BASELINES,
    rounds: int = 7,
    iters: int = 20,
    options: Options | None = None,
    cold_l2: bool = False,
) -> dict:
    cg = CompiledGraph(graph, options)
    tensors = cg.allocate_inputs(dict(inst.binding))
    bound = cg.bind(**tensors)
    contenders = [Contender("cudnn-dsl", bound.run)]
    if "cudnn" in against:
        contenders.append(
            _guard(
                "cudnn", lambda: Contender("cudnn", load_ejected(graph, inst, tensors, bound.outputs, cg.options).run)
            )
        )
    eager = lambda: run_reference(graph, inst, tensors, native=True)  # noqa: E731
    if "torch" in against:
        contenders.append(Contender("torch", eager))
    # every graph's contenders compile the same reference function: after 8 compilations of it dynamo
    # runs it eager (seen: the third graph's reduce-overhead at the eager time), so each graph starts afresh
    torch.compiler.reset()
    for name, mode in COMPILE_MODES.items():
        if name in against:
            contenders.append(Contender(name, _compiled(eager, mode)))
    before = snapshot(graph, tensors)  # outputs in place overwrite their inputs: each first call starts afresh
    for c in contenders:  # first call: compiles what compiles, and gives outputs to check
        restore(tensors, before)
        try:
            c.outputs = {k: v.clone() for k, v in c.fn().items()}
        except Exception as e:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
            c.error = c.error or " ".join(str(e).split())[:200]
    torch.cuda.synchronize()
    want = run_reference(graph, inst, before, drawn=cg.drawn(inst, bound.outputs))  # seeded dropout: cuDNN's mask
    for c in contenders:
        if c.outputs is None:
            continue
        floor = loosest_read_dtype(graph, inst)
        comps = [
            compare(
                n, *defined_only(n, logical(c.outputs[n], inst.type(n)), want), inst.type(n).dtype, floor_dtype=floor
            )
            for n in want
        ]
        c.check = "ok" if all(x.ok for x in comps) else "; ".join(str(x) for x in comps if not x.ok)
    live = [c for c in contenders if c.outputs is not None]
    flush = l2_flush_buffer() if cold_l2 else None
    for _ in range(rounds):
        for c in live:
            if flush is not None:
                c.samples += cold_time_us(c.fn, flush, iterations=iters, warmup=2)
            else:
                c.samples += gpu_time_us(c.fn, iterations=iters, warmup=2, inner=5)
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
                gpu_us_p90=percentile(c.samples, 90),
                gpu_us_p99=percentile(c.samples, 99),
                gpu_us_min=min(c.samples),
                gpu_us_max=max(c.samples),
                samples=len(c.samples),
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
        "plan": bound.plan_name,
        "plan_source": bound.source,
        "l2": "cold" if cold_l2 else "warm",
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
        f"cudnn-dsl plan {result['plan']} (from {result['plan_source']}); {result['l2']} L2",
        f"  {'':20} {'GPU µs p50':>10} {'p90':>7} {'p99':>7} {'host µs':>8} {'TFLOP/s':>8} {'GB/s':>7} "
        f"{'% peak':>6} {'vs cudnn-dsl':>12}  check",
    ]
    for r in result["rows"]:
        if "gpu_us_median" not in r:
            lines.append(f"  {r['label']:20} failed: {r['error']}")
            continue
        pk = f"{100 * r['tflops'] / peak:5.1f}%" if peak else "-"
        lines.append(
            f"  {r['label']:20} {r['gpu_us_median']:10.1f} {r['gpu_us_p90']:7.1f} {r['gpu_us_p99']:7.1f} "
            f"{r['host_us']:8.1f} {r['tflops']:8.1f} {r['gbps']:7.0f} {pk:>6} "
            f"{r['speedup_of_cudnn_dsl']:11.2f}x  {r['check'] or r['error']}"
        )
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    """Each graph's contenders side by side: GPU µs per call, p50 with min to p90, cudnn-dsl in green."""
    panels = []
    for res in results:
        rows = [r for r in res["rows"] if "gpu_us_median" in r]
        panels.append(
            Panel(
                res["graph"],
                [r["label"] for r in rows],
                [r["gpu_us_median"] for r in rows],
                [r["gpu_us_median"] - r["gpu_us_min"] for r in rows],
                [r["gpu_us_p90"] - r["gpu_us_median"] for r in rows],
                "GPU µs per call (p50, min-p90)",
                colors=["#76b900" if r["name"] == "cudnn-dsl" else "#888888" for r in rows],
            )
        )
    draw(panels, path, side_by_side=True, size=(4.5, 3.6))
