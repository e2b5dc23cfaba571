"""Benchmark (not a test): the example models of examples/torch_models/, unmodified, eager and under
torch.compile(fullgraph=True) without and with their regions replaced by the graphs' ops (cudnn_dsl.patterns).
Usage: python bench/patterns.py --json FILE [--device cuda|cpu] [--iterations N]

Per model, inference (no_grad), on the same inputs: the median time of one call of each contender (on the GPU
by CUDA events around back-to-back calls, on the CPU by the wall clock), after checking that the replaced
model's output equals the eager one's and that the report names the replacement. On the CPU the op runs the
graph's reference (a check that the script works, not a figure of cuDNN).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cudnn_dsl  # noqa: E402
from cudnn_dsl import patterns  # noqa: E402
from cudnn_dsl.run.timing import gpu_time_us  # noqa: E402
from cudnn_dsl.target.dtypes import tolerance  # noqa: E402
from cudnn_dsl.target.machine import environment  # noqa: E402
from examples.torch_models.models import Attention, ConvBnRelu  # noqa: E402

EXAMPLES = ROOT / "examples" / "torch_models"


def conv_bn_relu(device: str):
    model = ConvBnRelu().eval().half().to(device, memory_format=torch.channels_last)
    x = torch.randn(8, 4, 16, 16, dtype=torch.half, device=device).to(memory_format=torch.channels_last)
    return model, x, "half"


def attention(device: str):
    return Attention().to(device), torch.randn(2, 16, 64, device=device), "float"


MODELS = {  # label -> (the graph that replaces its region, the model and its input on a device, their dtype)
    "conv -> batchnorm (eval) -> relu, half NHWC": ("conv_bn_relu_half.cdg", conv_bn_relu),
    "attention (projections as heads)": ("attention.cdg", attention),
}
CONTENDERS = ("eager", "compiled", "replaced")


def median_us(fn, device: str, iterations: int) -> float:
    if device == "cuda":
        return statistics.median(gpu_time_us(fn, iterations=iterations, warmup=3, inner=10))
    for _ in range(3):
        fn()
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def one_model(label: str, file: str, make, device: str, iterations: int) -> dict:
    torch.manual_seed(0)
    model, x, dtype = make(device)
    row = {"model": label, "graph": file}
    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        compiled(x)
        row["eager_us"] = median_us(lambda: model(x), device, iterations)
        row["compiled_us"] = median_us(lambda: compiled(x), device, iterations)
        torch._dynamo.reset()
        with patterns.install(EXAMPLES / file, device=device) as installed:
            replaced = torch.compile(model, fullgraph=True)
            got = replaced(x)
        if len(installed.report.replaced) != 1:
            raise SystemExit(f"{label}: not replaced as expected:\n{installed.report}")
        atol, rtol = tolerance(dtype)
        torch.testing.assert_close(got, model(x), atol=atol, rtol=rtol)
        row["replaced_us"] = median_us(lambda: replaced(x), device, iterations)
        row["report"] = str(installed.report)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--iterations", type=int, default=200, help="samples timed per contender (the median is kept)")
    a = p.parse_args()
    warnings.simplefilter("ignore", cudnn_dsl.DslWarning)
    models = [one_model(label, f, make, a.device, a.iterations) for label, (f, make) in MODELS.items()]
    out = {"meta": environment(), "device": a.device, "iterations": a.iterations, "models": models}  # after the
    # runs: the environment names the libraries they loaded
    if a.device == "cpu":
        out["meta"]["note"] = "CPU tensors: the replaced region runs the graph's reference, not cuDNN"
    print(out["meta"])
    print(f"time per call (µs, median of {a.iterations}), inference:")
    print(f"  {'model':46} " + " ".join(f"{c:>10}" for c in CONTENDERS) + f" {'compiled / replaced':>20}")
    for r in out["models"]:
        r["speedup"] = r["compiled_us"] / r["replaced_us"]
        cells = " ".join(f"{r[c + '_us']:10.1f}" for c in CONTENDERS)
        print(f"  {r['model']:46} {cells} {r['speedup']:20.2f}")
    Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
