"""Benchmark (not a test): graphs cuDNN declines whole, run in parts, against the sum of their
parts timed one by one, and against torch eager. Usage: python bench/partition.py [--json FILE]

Each part is called through the same API (a compiled graph per cuDNN part, the torch reference for
a fallback op), on the same buffers, so the difference is what running them as one graph adds.
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

from cudnn_dsl.reference import run_reference  # noqa: E402
from cudnn_dsl.runtime import CompiledGraph  # noqa: E402
from cudnn_dsl.timing import environment, gpu_time_us  # noqa: E402
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


def measure(label: str, text: str) -> dict:
    g = program(text=text, file=f"{label}.cdg").graphs[0]
    cg = CompiledGraph(g)
    inst = g.instances[0]
    ins = cg.allocate_inputs()
    got = cg(ins)
    staged = cg.staged(inst)
    want = run_reference(g, inst, ins)
    ok = all(torch.allclose(got[k].float(), want[k].float(), atol=5e-2, rtol=2e-2) for k in want)
    whole = median_us(lambda: cg(ins))
    row = {"graph": label, "matches": ok, "whole_us": whole, "eager_us": None}
    try:  # eager torch in the tensors' own dtypes (it refuses some mixes, e.g. a bf16 norm with float weights)
        row["eager_us"] = median_us(lambda: run_reference(g, inst, ins, native=True))
    except DslError as e:
        row["eager_error"] = str(e).splitlines()[0]
    if staged is None:
        row["parts"] = ["fused whole"]
        return row
    env = dict(ins)  # each part on its own, fed (and writing into) what the earlier parts made
    parts = []
    for k in range(len(staged.compiled)):
        staged.run_part(k, env)
        parts.append(median_us(lambda k=k: staged.run_part(k, env)))
    row.update(parts=staged.lines, parts_us=parts, sum_of_parts_us=sum(parts), ratio_to_sum=whole / sum(parts))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    rows = [measure(label, text) for label, text in GRAPHS.items()]
    for r in rows:
        print(f"{r['graph']}: matches the reference: {r['matches']}")
        for line in r["parts"]:
            print(f"  {line}")
        if "sum_of_parts_us" in r:
            print(
                f"  in parts {r['whole_us']:.1f} µs per call; the parts one by one {r['sum_of_parts_us']:.1f} µs "
                f"({' + '.join(f'{t:.1f}' for t in r['parts_us'])}); ratio {r['ratio_to_sum']:.2f}; "
                + (f"torch eager {r['eager_us']:.1f} µs" if r["eager_us"] else f"torch eager: {r['eager_error']}")
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
