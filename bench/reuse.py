"""Benchmark (not a test): what reuse saves, on the GPU. Usage: python bench/reuse.py [--json FILE]

1. warm start from the plan store vs. a cold build, same graph, one process;
2. the autotuned plan vs. the heuristics' first plan, for each example;
3. build time per dynamic shape, with and without the shared kernel cache;
4. host time per call: the plain API call, a pre-bound launch, a CUDA-graph replay, and the
   cuDNN Frontend's own pygraph.execute for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cudnn_dsl.run.compiled import CompiledGraph  # noqa: E402
from cudnn_dsl.run.timing import host_time_us  # noqa: E402
from cudnn_dsl.store.plans import PlanStore  # noqa: E402
from cudnn_dsl.target.machine import environment  # noqa: E402
from cudnn_dsl.tune.heuristics import tune  # noqa: E402
from dsl.pipeline import program  # noqa: E402


def graph(file: str):
    return program(ROOT / "examples" / f"{file}.cdg").graphs[0]


def warm_vs_cold(store: PlanStore, names) -> list[dict]:
    rows = []
    for name in names:
        g = graph(name)
        inst = g.instances[0]
        t0 = time.perf_counter()
        CompiledGraph(g, store=store, rebuild=True).executable(inst)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        exe = CompiledGraph(g, store=store).executable(inst)
        warm = time.perf_counter() - t0
        rows.append(
            {
                "graph": name,
                "cold_ms": cold * 1e3,
                "warm_ms": warm * 1e3,
                "speedup": cold / warm,
                "warm_source": exe.source,
            }
        )
    return rows


def tuned_vs_first(store: PlanStore, names) -> list[dict]:
    rows = []
    for name in names:
        g = graph(name)
        cg = CompiledGraph(g, store=store)
        r = tune(cg, g.instances[0])
        first = next((c for c in r.candidates if c.index == 0 and c.times_us), None)
        rows.append(
            {
                "graph": name,
                "plans": len(r.candidates),
                "timed": len(r.ranked),
                "winner": r.winner.name if r.winner else None,
                "winner_us": r.winner.median_us if r.winner else None,
                "first_choice": first.name if first else None,
                "first_us": first.median_us if first else None,
                "gain": (first.median_us / r.winner.median_us) if first and r.winner else None,
            }
        )
    return rows


def dynamic_builds() -> list[dict]:
    rows = []
    for file in ("dynamic_shapes", "dynamic_matmul"):
        for use_cache in (True, False):
            g = graph(file)
            cg = CompiledGraph(g, use_store=False)
            cg.planner.use_kernel_cache = use_cache  # off: each shape from scratch, as without dynamic-shape mode
            for inst in g.instances:
                t0 = time.perf_counter()
                cg.executable(inst)
                rows.append(
                    {
                        "graph": g.name,
                        "kernel_cache": use_cache,
                        "shape": inst.label,
                        "build_ms": (time.perf_counter() - t0) * 1e3,
                    }
                )
    return rows


def host_per_call(names) -> list[dict]:
    import cudnn

    rows = []
    for name in names:
        g = graph(name)
        cg = CompiledGraph(g, use_store=False)
        ins = cg.allocate_inputs()
        bound = cg.bind(**ins)
        replay = cg.capture(**ins)
        exe = bound.exe
        pack = bound.keep
        cudnn.set_stream(exe.handle, torch.cuda.current_stream().cuda_stream)
        rows.append(
            {
                "graph": name,
                "plain_call_us": host_time_us(lambda cg=cg, ins=ins: cg(**ins)),
                "frontend_execute_us": host_time_us(
                    lambda exe=exe, pack=pack: exe.low.g.execute(pack, exe.workspace, handle=exe.handle)
                ),
                "prebound_us": host_time_us(bound.run),
                "cuda_graph_replay_us": host_time_us(replay.replay),
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    a = p.parse_args()
    store = PlanStore(Path(tempfile.mkdtemp()) / "plans")
    names = ["conv_bias_relu", "matmul_epilogue", "plan_serialization"]
    out = {
        "meta": environment(),
        "warm_vs_cold": warm_vs_cold(store, names),
        "tuned_vs_first": tuned_vs_first(store, names + ["sdpa"]),
        "dynamic_builds": dynamic_builds(),
        "host_per_call": host_per_call(["conv_bias_relu", "matmul_epilogue"]),
    }
    print(out["meta"])
    print("warm start vs cold build (one process):")
    for r in out["warm_vs_cold"]:
        print(
            f"  {r['graph']:20} cold {r['cold_ms']:8.1f} ms  warm {r['warm_ms']:7.1f} ms  {r['speedup']:6.1f}x  "
            f"({r['warm_source']})"
        )
    print("autotuned vs heuristics' first plan:")
    for r in out["tuned_vs_first"]:
        print(
            f"  {r['graph']:20} {r['timed']}/{r['plans']} timed; first {r['first_choice']} {r['first_us']:.1f} µs; "
            f"winner {r['winner']} {r['winner_us']:.1f} µs; {r['gain']:.2f}x"
        )
    print("build time per dynamic shape:")
    for r in out["dynamic_builds"]:
        print(
            f"  {r['graph']:16} kernel cache {'on ' if r['kernel_cache'] else 'off'} {r['shape']:6} "
            f"{r['build_ms']:8.1f} ms"
        )
    print("host time per call (µs, median):")
    for r in out["host_per_call"]:
        print(
            f"  {r['graph']:20} plain {r['plain_call_us']:6.1f}  frontend execute {r['frontend_execute_us']:6.1f}  "
            f"pre-bound {r['prebound_us']:6.1f}  CUDA-graph replay {r['cuda_graph_replay_us']:6.1f}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
