"""Benchmark (not a test): the front end's speed on this machine's CPU.

1. `cudnn-dsl check FILE` as a process, start to exit, against `python -c pass` (the floor), with
   the bytecode cache warm as it is after a first run;
2. parse + check of each example in-process (warm: the grammar is loaded once; median of runs);
3. generated graphs of 10 to 100,000 ops (a chain of matmul/bias/pointwise statements), 1,000 / 10,000 /
   100,000 side by side with the ratio of each time to the previous one (10x the ops: near 10x when linear).
Usage: python bench/frontend.py [--json FILE]
The JSON holds "machine", "python" and "rows" ([{"ops", "parse_check_s"}] for 1,000, 10,000 and 100,000 ops),
and the other measurements under "process_ms", "examples_ms" and "generated_ms".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dsl.pipeline import program  # noqa: E402


def timed(text: str, name: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        program(text=text, file=name)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def process_ms(argv: list[str], repeat: int = 15) -> float:
    """Median wall time of a whole process, start to exit, bytecode cache written on the first run."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(argv, env=env, capture_output=True, cwd=ROOT)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def generated(n_ops: int) -> str:
    """n_ops ops: one matmul, then pointwise statements cycling through binary and unary ops."""
    lines = [
        "graph big {",
        "  io half",
        "  input a : half[8, 64, 64]",
        "  input b : half[8, 64, 64]",
        "  input c : half[1, 1, 64]",
        "  t0 = matmul(a, b)",
    ]
    ops = ["relu({p})", "{p} * 0.5", "bias({p}, c)", "gelu({p})", "{p} + c", "sigmoid({p})"]
    for i in range(1, n_ops - 1):
        lines.append(f"  t{i} = " + ops[i % len(ops)].format(p=f"t{i - 1}"))
    lines.append(f"  output y = relu(t{n_ops - 2})")
    lines.append("}")
    return "\n".join(lines) + "\n"


SIZES = (1000, 10000, 100000)
"""the sizes compared side by side (the "rows" of the JSON)"""


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPU cores, {platform.system()} {platform.machine()}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    a = p.parse_args()
    script = Path(sys.executable).with_name("cudnn-dsl")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "cudnn_dsl"]
    rows = {
        "process_ms": {
            "python -c pass": process_ms([sys.executable, "-c", "pass"]),
            "cudnn-dsl check examples/sdpa.cdg": process_ms([*cmd, "check", "examples/sdpa.cdg"]),
            "cudnn-dsl fmt --check examples/*.cdg": process_ms(
                [*cmd, "fmt", "--check", *map(str, sorted((ROOT / "examples").glob("*.cdg")))]
            ),
            "cudnn-dsl --help": process_ms([*cmd, "--help"]),
        },
        "examples_ms": {},
        "generated_ms": {},
    }
    program(text=generated(10), file="warmup.cdg")  # grammar load, imports
    for path in sorted((ROOT / "examples").glob("*.cdg")):
        rows["examples_ms"][path.name] = timed(path.read_text(), path.name, 30) * 1e3
    for n in (10, 100, *SIZES):
        repeat = 5 if n < 10000 else 3 if n < 100000 else 1  # a median where a run is cheap
        rows["generated_ms"][n] = timed(generated(n), f"gen{n}.cdg", repeat) * 1e3
    print("whole process, start to exit, median:")
    for k, v in rows["process_ms"].items():
        print(f"  {k:38} {v:7.1f} ms")
    print("parse + check, warm, median:")
    for k, v in rows["examples_ms"].items():
        print(f"  {k:26} {v:7.2f} ms")
    for n, v in rows["generated_ms"].items():
        print(f"  {n:6d} ops {'':15} {v:9.1f} ms   ({v / n * 1e3:.1f} µs per op)")
    print("generated chains side by side:")
    print(f"  {'ops':>7}  {'parse + check':>13}  {'x previous':>10}")
    prev = None
    for n in SIZES:
        s = rows["generated_ms"][n] / 1e3
        print(f"  {n:7,d}  {s:11.3f} s  {'' if prev is None else f'{s / prev:9.1f}x':>10}")
        prev = s
    if a.json:
        report = {
            "machine": machine(),
            "python": platform.python_version(),
            "rows": [{"ops": n, "parse_check_s": round(rows["generated_ms"][n] / 1e3, 4)} for n in SIZES],
            **rows,
        }
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
