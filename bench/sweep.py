"""What a deviceless sweep gains over planning one file after another: the same graphs × targets planned by
`cudnn-dsl support` in one process, then by `cudnn-dsl sweep` with the local executor, then swept again (the store
answers it all), each a fresh process timed from start to exit.

    python bench/sweep.py --workers 2 --json docs/results/sweep-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["conv_bias_relu", "dynamic_shapes", "matmul_epilogue", "sdpa", "layernorm", "residual_block"]
TARGETS = ["h200", "h100", "a100", "l40s", "b200"]


def timed(cmd: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0, proc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    files = [str(ROOT / "examples" / f"{e}.cdg") for e in EXAMPLES]
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "CUDNN_DSL_CACHE_DIR": os.path.join(d, "cache")}
        spec = Path(d) / "sweep.toml"
        spec.write_text(
            f'[sweep]\nname = "bench"\ngraphs = {json.dumps(files)}\nstore = "store"\n'
            f"[plan_targets]\ntargets = {json.dumps(TARGETS)}\n"
        )
        cli = [sys.executable, "-m", "cudnn_dsl"]
        one_s, one = timed([*cli, "support", *files, "--target", ",".join(TARGETS), "--json", f"{d}/s.json"], env)
        shapes = len(json.loads(Path(f"{d}/s.json").read_text())["support"])
        _, dry = timed([*cli, "sweep", str(spec), "--dry-run", "--json", f"{d}/w.json"], env)
        work = json.loads(Path(f"{d}/w.json").read_text())["work"]
        sweep_s, _ = timed([*cli, "sweep", str(spec), "--workers", str(args.workers), "--json", f"{d}/r.json"], env)
        result = json.loads(Path(f"{d}/r.json").read_text())
        again_s, _ = timed([*cli, "sweep", str(spec), "--json", f"{d}/r2.json"], env)
        again = json.loads(Path(f"{d}/r2.json").read_text())
    planned = sum(len(u["bindings"]) for u in work["units"])
    report = {
        "schema_version": 1,
        "examples": EXAMPLES,
        "targets": TARGETS,
        "workers": args.workers,
        "cores": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "shapes": shapes,
        "planned": planned,
        "deduplicated": shapes - planned,
        "support_one_process_s": round(one_s, 1),
        "sweep_s": round(sweep_s, 1),
        "sweep_outcomes": result["sweep"]["outcomes"],
        "manifest": result["sweep"]["manifest"],
        "sweep_again_s": round(again_s, 1),
        "sweep_again_outcomes": again["sweep"]["outcomes"],
        "environment": result["environment"],
    }
    print(json.dumps({k: v for k, v in report.items() if k != "environment"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
