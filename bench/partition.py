"""Benchmark (not a test): graphs run in parts, bound once, against the sum of their parts each bound
and timed on its own, and against torch eager. Usage: python bench/partition.py [--json FILE]

The split graph is bound once (run.compiled.CompiledGraph.bind: intermediates allocated, each part's variant
pack built once) and timed per call; each part's own launch on the same buffers is timed alone, in the same
run, so the ratio is what running the parts as one graph adds. The plain call (`cg(...)`, which checks
the caller's buffers on every call) is shown beside it. The matmul epilogue, which cuDNN fuses whole, is
also run as the split `tune` times against it: the matmul alone, then the rest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cudnn_dsl.run.compiled import CompiledGraph  # noqa: E402
from cudnn_dsl.run.partition import ANCHOR  # noqa: E402
from cudnn_dsl.run.parts import Parts  # noqa: E402
from cudnn_dsl.run.reference import run_reference  # noqa: E402
from cudnn_dsl.run.timing import gpu_time_us  # noqa: E402
from cudnn_dsl.target.machine import environment  # noqa: E402
from dsl.diagnostics import DslError  # noqa: E402
from dsl.pipeline import program  # noqa: E402

GRAPHS = {
    "layernorm -> gelu": (
        "graph ln_gelu {\n  io bf16\n  input x : bf16[64, 4096, 1, 1] nhwc\n  input s : float[1, 4096, 1, 1] nhwc\n"
        "  input b : float[1, 4096, 1, 1] nhwc\n  output y = gelu(layernorm(x, s, b))\n}\n"
    ),
    "matmul -> reshape": (
        "graph mm_reshape {\n  io half\n  input a : half[16, 512, 1024]\n  input b : half[16, 1024, 512]\n"
        "  output y : float[16, 262144] = reshape(matmul(a, b), shape=[16, 262144])\n}\n"
    ),
}


def median_us(fn) -> float:
    return statistics.median(gpu_time_us(fn, iterations=30, warmup=3, inner=10))


def measure(label: str, text: str, anchor: bool = False) -> dict:
    g = program(text=text, file=f"{label}.cdg").graphs[0]
    cg = CompiledGraph(g, use_store=False)
    inst = g.instances[0]
    ins = cg.allocate_inputs()
    row = {"graph": label, "eager_us": None}
    if anchor:  # cuDNN fuses it whole: time that, then run it as the anchor op alone and the rest
        row["fused_whole_bound_us"] = median_us(cg.bind(ins).run)
        cg.use_partition(inst, None, first=ANCHOR)
    parts = cg.parts(inst)
    bound = cg.bind(ins)
    got = {k: v.clone() for k, v in bound.run().items()}
    want = run_reference(g, inst, ins)
    row["matches"] = all(torch.allclose(got[k].float(), want[k].float(), atol=5e-2, rtol=2e-2) for k in want)
    row["plain_call_us"] = median_us(lambda: cg(ins))
    row["bound_us"] = median_us(bound.run)
    try:  # eager torch in the tensors' own dtypes (it refuses some mixes, e.g. a bf16 norm with float weights)
        row["eager_us"] = median_us(lambda: run_reference(g, inst, ins, native=True))
    except DslError as e:
        row["eager_error"] = str(e).splitlines()[0]
    if not isinstance(parts, Parts):
        row["parts"] = ["fused whole"]
        return row
    each = [median_us(launch) for launch in bound.launches]  # each part's own bound launch, on the same buffers
    row.update(
        parts=parts.lines,
        parts_bound_us=each,
        sum_of_parts_us=sum(each),
        ratio_to_sum=row["bound_us"] / sum(each),
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    rows = [measure(label, text) for label, text in GRAPHS.items()]
    rows.append(measure("matmul epilogue", (ROOT / "examples" / "matmul_epilogue.cdg").read_text(), anchor=True))
    for r in rows:
        print(f"{r['graph']}: matches the reference: {r['matches']}")
        for line in r["parts"]:
            print(f"  {line}")
        if "sum_of_parts_us" in r:
            print(
                f"  bound in parts {r['bound_us']:.1f} µs per call; the parts bound one by one "
                f"{r['sum_of_parts_us']:.1f} µs ({' + '.join(f'{t:.1f}' for t in r['parts_bound_us'])}); "
                f"ratio {r['ratio_to_sum']:.2f}; plain call {r['plain_call_us']:.1f} µs; "
                + (f"torch eager {r['eager_us']:.1f} µs" if r["eager_us"] else f"torch eager: {r['eager_error']}")
            )
        if "fused_whole_bound_us" in r:
            print(f"  fused whole (bound) {r['fused_whole_bound_us']:.1f} µs per call")
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
