"""Benchmark (not a test): how long partitioning takes, by graph size. Usage:
python bench/partition_time.py [--sizes 16,64,256] [--json FILE]

Three families of graphs of n ops, each planned the way `run` and `check --target` plan it (the whole graph
asked first, then the partition search): n outputs `o_i = a * b` (n ops that read only the inputs, the graph
cuDNN took time exponential in n to build), n outputs `o_i = a * i` (as many, every part a distinct graph),
and a chain of n ops, n / 2 products of the inputs summed one after the other. Without a GPU the real cuDNN
library plans for an H200 (deviceless, as `check --target h200`) and the JSON goes to
docs/results/partition-time-cpu.json; on a GPU each part is built on it (`run`'s path, no plan store) and
the JSON goes to docs/results/partition-time-h200.json. Each row gives the seconds, the parts, and the
questions put to cuDNN (compile_shape calls: the whole graph and each distinct part asked about).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cudnn_dsl.build.pipeline as back_half  # noqa: E402
from cudnn_dsl.run.partition import PROBES  # noqa: E402
from cudnn_dsl.target.machine import environment  # noqa: E402
from cudnn_dsl.target.quirks import MAX_ROOTS  # noqa: E402
from dsl.pipeline import program  # noqa: E402

HEAD = "graph g {\n  input a : float[8, 64]\n  input b : float[8, 64]\n"


def same_outputs(n: int) -> str:
    return HEAD + "".join(f"  output o{i} = a * b\n" for i in range(n)) + "}\n"


def distinct_outputs(n: int) -> str:
    return HEAD + "".join(f"  output o{i} = a * {i + 1}\n" for i in range(n)) + "}\n"


def summed_chain(n: int) -> str:
    """n ops: n / 2 products, each added to the running sum (the output is the last sum)."""
    body = "".join(f"  p{i} = a * b\n  s{i} = s{i - 1} + p{i}\n" for i in range(1, n // 2))
    return HEAD + f"  s0 = a * b\n{body}  output y = s{n // 2 - 1} * b\n}}\n"


FAMILIES = {
    "n outputs a * b": same_outputs,
    "n outputs a * i": distinct_outputs,
    "a chain of n ops, n / 2 products summed": summed_chain,
}


class Counted:
    """compile_shape, counting its calls (the questions put to cuDNN): an instrument, the real function runs."""

    def __init__(self):
        self.real, self.calls = back_half.compile_shape, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


def plan(g, inst, on_gpu: bool):
    """(parts, distinct cuDNN graphs) of one shape, planned as run plans it."""
    if on_gpu:
        from cudnn_dsl.run.compiled import CompiledGraph
        from cudnn_dsl.run.parts import Parts

        parts = CompiledGraph(g, use_store=False).parts(inst)
        if not isinstance(parts, Parts):
            return 1, 1
        c = parts.partition.counts
        return len(parts.partition.parts), c.graphs
    from cudnn_dsl.run.partition import plan_for_target
    from cudnn_dsl.target.library import Target

    low, partition = plan_for_target(g, inst, g.options, Target.named("h200"))
    return (1, 1) if partition is None else (len(partition.parts), partition.counts.graphs)


def measure(family: str, n: int, on_gpu: bool) -> dict:
    import cudnn_dsl.build.planner as planner
    import cudnn_dsl.run.compiled as compiled

    g = program(text=FAMILIES[family](n), file=f"{n}.cdg").graphs[0]
    counted, callers = Counted(), (back_half, planner, compiled)  # each module that holds the name
    for m in callers:
        m.compile_shape = counted
    try:
        t0 = time.perf_counter()
        parts, graphs = plan(g, g.instances[0], on_gpu)
        seconds = time.perf_counter() - t0
    finally:
        for m in callers:
            m.compile_shape = counted.real
    return {
        "family": family,
        "ops": len(g.nodes),
        "seconds": round(seconds, 3),
        "parts": parts,
        "distinct_graphs": graphs,
        "questions": counted.calls,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,64,256", help="graph sizes, in ops (default 16,64,256)")
    ap.add_argument("--json", metavar="FILE", help="default: docs/results/partition-time-{cpu,h200}.json")
    args = ap.parse_args()
    from cudnn_dsl.target.lazy_torch import torch

    on_gpu = torch.cuda.is_available()
    rows = []
    for family in FAMILIES:
        for n in (int(s) for s in args.sizes.split(",")):
            r = measure(family, n, on_gpu)
            print(
                f"{family}, n = {n}: {r['seconds']:.2f} s, {r['parts']} parts ({r['distinct_graphs']} distinct), "
                f"{r['questions']} questions to cuDNN",
                flush=True,
            )
            rows.append(r)
    out = Path(args.json or ROOT / "docs" / "results" / f"partition-time-{'h200' if on_gpu else 'cpu'}.json")
    report = {
        "where": "on the GPU" if on_gpu else "deviceless, planning for an H200",
        "probes": PROBES,
        "max_roots": MAX_ROOTS,
        "cores": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "rows": rows,
        "environment": environment(),
    }
    out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
