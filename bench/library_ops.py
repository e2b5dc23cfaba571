"""Benchmark (not a test): the pattern library's regions at the sizes real models run them, as the ops a compiled
model calls — the inference op, the training path's augmented forward and its backward (torch_op.training.GradOps)
— beside the same region written in torch, on the same inputs.
Usage: python bench/library_ops.py [--device cuda|cpu] [--regions NAMES] [--iterations N] [--json FILE]

Per region (REGIONS: GPT-2 124M's MLP and LayerNorm at B=8, T=1024 as bf16 autocast runs them, a Llama layer's
SwiGLU MLP and RMSNorm at d=4096, T=4096), side by side in one process:
- on CUDA, each op's GPU time (CUDA events around back-to-back calls: its kernels, host gaps hidden) and host
  time (the median of single calls, not synchronized: what the call costs the CPU), and the same of the torch
  twin's forward and of autograd's backward through it, and the inference op's output's largest difference from
  the twin's (max_abs_diff). Where a region's host time exceeds its GPU time, a step that calls it is host-bound
  there.
- on the CPU, the ops' CUDA host path under bench.nocudnn (planned for an H200 by the real cuDNN library, every
  launch a no-op): host time only, and the parts each op launches; the twin is left out (torch's CPU arithmetic
  at these sizes is no peer of a GPU's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cudnn_dsl  # noqa: E402
from bench.nocudnn import nocudnn  # noqa: E402
from cudnn_dsl.patterns import library  # noqa: E402
from cudnn_dsl.run.timing import gpu_time_us, host_time_us  # noqa: E402
from cudnn_dsl.store.files import atomic_write  # noqa: E402
from cudnn_dsl.target.machine import environment  # noqa: E402
from cudnn_dsl.torch_op.training import grad_ops  # noqa: E402


def _weight(w: torch.Tensor) -> torch.Tensor:
    """A graph's col_major [1, D, F] matmul operand as the nn.Linear weight [F, D] it views."""
    return w[0].mT


@attrs.frozen
class Region:
    name: str
    graph: str
    binding: dict
    twin: Callable[[dict], torch.Tensor]
    """the region as a model writes it in torch, on the graph's inputs by name"""


REGIONS = (
    Region(
        "gpt2 mlp (c_fc + GELU)",
        "linear_gelu_tanh_bf16",
        {"B": 8, "T": 1024, "D": 768, "F": 3072},
        lambda t: F.gelu(F.linear(t["x"], _weight(t["w"]), t["b"].reshape(-1)), approximate="tanh"),
    ),
    Region(
        "gpt2 layernorm",
        "layernorm_float",
        {"B": 8, "T": 1024, "D": 768},
        lambda t: F.layer_norm(t["x"], t["x"].shape[-1:], t["scale"].reshape(-1), t["bias"].reshape(-1)),
    ),
    Region(
        "llama swiglu",
        "swiglu_bf16",
        {"B": 1, "T": 4096, "D": 4096, "F": 14336},
        lambda t: F.silu(F.linear(t["x"], _weight(t["w1"]))) * F.linear(t["x"], _weight(t["w3"])),
    ),
    Region(
        "llama rmsnorm",
        "rmsnorm_float",
        {"B": 1, "T": 4096, "D": 4096},
        lambda t: F.rms_norm(t["x"], t["x"].shape[-1:], t["scale"].reshape(-1), library.NORM_EPS),
    ),
)


def _source() -> str:
    families = tuple(library.FAMILIES)
    return library.source(families, "bf16", autocast=True) + library.source(families, "float")


def measure(region: Region, text: str, gpu: bool, iterations: int, stub=None) -> dict:
    cg = cudnn_dsl.compile(text=text, graph=region.graph, device="cuda" if gpu else None)
    op = cudnn_dsl.as_torch_op(cg)
    inputs = cg.allocate_inputs(region.binding)
    args = tuple(inputs[n] for n in op.tensor_names)
    grads_of = grad_ops(op, tuple(op.tensor_names))
    augmented = getattr(torch.ops.cudnn_dsl, grads_of.name).default
    binding = grads_of.binding(op.named(args))
    shape = grads_of.bound(binding)
    outs = shape.forward(args)
    kept = shape.saved(args, outs)
    grads = [torch.randn_like(outs[k]) for k in shape.outputs]
    dims = [int(binding[s]) for s in grads_of.symbols]
    ops = {
        "op": lambda: op(*args),
        "augmented forward": lambda: augmented(*args),
        "backward": lambda: grads_of.backward_op(kept, grads, dims),
    }
    row: dict = {"region": region.name, "graph": region.graph, "binding": region.binding}
    for key, fn in ops.items():
        fn()  # the first call of a shape plans it
        if stub is not None:
            before = stub.launches
            fn()
            row[f"{key} launches"] = stub.launches - before
        row[f"{key} host_us"] = host_time_us(fn, iterations)
        if gpu:
            row[f"{key} gpu_us"] = statistics.median(gpu_time_us(fn))
    if gpu:
        with torch.no_grad():
            want = region.twin(inputs)
        got = op(*args)
        row["max_abs_diff"] = (got.float() - want.float()).abs().max().item()
        row.update(_twin(region, inputs, iterations))
    return row


def _twin(region: Region, inputs: dict, iterations: int) -> dict:
    """The torch twin's forward (without autograd) and autograd's backward through it: host and GPU time."""
    wanting = {k: v.detach().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    y = region.twin(wanting)
    g = torch.randn_like(y)
    leaves = [v for v in wanting.values() if v.requires_grad]

    def forward():
        with torch.no_grad():
            region.twin(inputs)

    def backward():
        torch.autograd.grad(y, leaves, g, retain_graph=True)

    row = {}
    for key, fn in (("torch forward", forward), ("torch backward", backward)):
        row[f"{key} host_us"] = host_time_us(fn, iterations)
        row[f"{key} gpu_us"] = statistics.median(gpu_time_us(fn))
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--regions", help=f"comma-separated, of: {', '.join(r.graph for r in REGIONS)} (default: all)")
    p.add_argument("--iterations", type=int, default=100, help="calls per host-time median (default 100)")
    p.add_argument("--json", type=Path, help="write the rows here")
    a = p.parse_args(argv)
    gpu = a.device == "cuda"
    wanted = a.regions.split(",") if a.regions else [r.graph for r in REGIONS]
    unknown = sorted(set(wanted) - {r.graph for r in REGIONS})
    if unknown:
        p.error(f"no region {unknown[0]!r}; the regions are {', '.join(r.graph for r in REGIONS)}")
    text = _source()
    rows = []
    with contextlib.nullcontext() if gpu else nocudnn(target="h200") as stub:
        for region in (r for r in REGIONS if r.graph in wanted):
            print(f"{region.name} ({region.graph}, {region.binding}) ...", file=sys.stderr, flush=True)
            row = measure(region, text, gpu, a.iterations, stub)
            rows.append(row)
            print(
                "  " + "; ".join(f"{k} {v:.1f}" for k, v in row.items() if k.endswith("_us") or k.endswith("diff")),
                flush=True,
            )
    report = {
        "device": "the GPU" if gpu else "the CPU, cuDNN's launches no-ops (bench.nocudnn): host cost only",
        "environment": environment(),
        "rows": rows,
    }
    if a.json:
        atomic_write(a.json, json.dumps(report, indent=2) + "\n", follow_symlinks=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
