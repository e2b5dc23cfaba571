"""Benchmark (not a test): parse + check time of the front end, on this machine's CPU.

Per example (warm: the grammar is loaded once, then the median of repeated runs), and for
generated graphs of 10 to 10,000 ops (a chain of matmul/bias/pointwise statements). Usage:
python bench/frontend.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dsl.check import check  # noqa: E402
from dsl.parser import parse  # noqa: E402


def timed(text: str, name: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        check(parse(text, name))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def generated(n_ops: int) -> str:
    """n_ops ops: one matmul, then pointwise statements cycling through binary and unary ops."""
    lines = ["graph big {", "  io half", "  input a : half[8, 64, 64]", "  input b : half[8, 64, 64]",
             "  input c : half[1, 1, 64]", "  t0 = matmul(a, b)"]
    ops = ["relu({p})", "{p} * 0.5", "bias({p}, c)", "gelu({p})", "{p} + c", "sigmoid({p})"]
    for i in range(1, n_ops - 1):
        lines.append(f"  t{i} = " + ops[i % len(ops)].format(p=f"t{i - 1}"))
    lines.append(f"  output y = relu(t{n_ops - 2})")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    a = p.parse_args()
    check(parse(generated(10), "warmup.cdg"))  # grammar load, imports
    rows = {"examples_ms": {}, "generated_ms": {}}
    for path in sorted((ROOT / "examples").glob("*.cdg")):
        rows["examples_ms"][path.name] = timed(path.read_text(), path.name, 30) * 1e3
    for n in (10, 100, 1000, 10000):
        rows["generated_ms"][n] = timed(generated(n), f"gen{n}.cdg", 5 if n < 10000 else 3) * 1e3
    print("parse + check, warm, median:")
    for k, v in rows["examples_ms"].items():
        print(f"  {k:26} {v:7.2f} ms")
    for n, v in rows["generated_ms"].items():
        print(f"  {n:6d} ops {'':15} {v:9.1f} ms   ({v / n * 1e3:.1f} µs per op)")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
