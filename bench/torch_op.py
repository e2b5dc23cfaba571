"""Benchmark (not a test): the host cost per call of a compiled graph as a torch op, on the GPU.
Usage: python bench/torch_op.py --json FILE

Per graph, side by side in one process, on the same buffers (median host time of one call; every
contender's outputs are first checked against the reference):
- bound: `cg.bind(...).run()`, the launch with no per-call checks and no allocation (the floor);
- op: `torch.ops.cudnn_dsl.<name>` (torch.library define + impl + register_fake), through `TorchOp`'s
  wrapper and called directly;
- custom_op: the same kernels registered with `@torch.library.custom_op`;
- call: the checked `cg(...)`;
- compiled: `torch.compile(fullgraph=True)` of a function calling the op, default mode and
  `reduce-overhead` (a CUDA-graph replay);
- and, once, a torch.library op and a custom_op whose kernels do nothing: the dispatcher's own cost
  (the cuDNN Frontend's guidance: ~10 µs against ~36 µs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cudnn_dsl  # noqa: E402
from cudnn_dsl.run.buffers import restore, snapshot  # noqa: E402
from cudnn_dsl.run.compare import compare  # noqa: E402
from cudnn_dsl.run.timing import environment, gpu_time_us, host_time_us  # noqa: E402

TINY = """
graph tiny {
  io half
  compute float
  input x : half[1, 128, 128]
  input w : half[1, 128, 128]
  input b : half[1, 1, 128]
  output y = relu(matmul(x, w) + b)
}
"""

GRAPHS = {  # name -> (source, shape binding)
    "tiny matmul + bias + relu, half 128^3": (TINY, None),
    "serve_matmul, T=64": (str(ROOT / "examples" / "serve_matmul.cdg"), {"T": 64}),
    "in_place_update (EMA in place), float 1M": (str(ROOT / "examples" / "in_place_update.cdg"), None),
}


def custom_op_twin(op, namespace: str = "cudnn_dsl_bench", kernel=None):
    """The op's schema and kernels (its CUDA kernel, or `kernel`) registered with @torch.library.custom_op."""
    kernel = kernel or op.cuda_kernel
    twin = torch.library.custom_op(
        f"{namespace}::{op.name}", lambda *args: kernel(*args), mutates_args=op.mutated, schema=op.schema
    )
    twin.register_fake(op.fake_kernel)
    return twin


def noop_dispatch_us() -> dict:
    """Host time of a call to an op that does nothing, registered each way: what the dispatcher costs."""
    lib = torch.library.Library("cudnn_dsl_bench_noop", "FRAGMENT")
    lib.define("noop(Tensor x) -> ()")
    lib.impl("noop", lambda x: None, "CUDA")

    @torch.library.custom_op("cudnn_dsl_bench_noop::noop_custom", mutates_args=())
    def noop_custom(x: torch.Tensor) -> None:
        return None

    x = torch.zeros(1, device="cuda")
    library = torch.ops.cudnn_dsl_bench_noop.noop.default
    return {
        "library_us": host_time_us(lambda: library(x), 2000),
        "custom_op_us": host_time_us(lambda: noop_custom(x), 2000),
    }


def checked(name: str, got, want, dtype: str) -> None:
    c = compare(name, got, want, dtype)
    if not c.ok:
        raise SystemExit(f"a contender's output does not match the reference: {c}")


def one_graph(label: str, source: str, binding) -> dict:
    cg = cudnn_dsl.compile(source)
    op = cudnn_dsl.as_torch_op(cg)
    twin = custom_op_twin(op)
    ins = cg.allocate_inputs(binding)
    args = tuple(ins[n] for n in op.tensor_names)
    out_name = cg.graph.outputs[0].name
    dtype = cg.outputs[out_name].dtype

    contenders = {
        "bound": (lambda: bound.run()),
        "op": lambda: op(*args),
        "op_overload": lambda: op.overload(*args),
        "custom_op": lambda: twin(*args),
        "call": lambda: cg(**ins),
    }
    compiled = torch.compile(lambda *a: op(*a), fullgraph=True)
    reduce_overhead = torch.compile(lambda *a: op(*a), fullgraph=True, mode="reduce-overhead")
    contenders["compiled"] = lambda: compiled(*args)
    contenders["reduce_overhead"] = lambda: reduce_overhead(*args)

    before = snapshot(cg.graph, ins)
    want = cg.reference(before)[out_name]
    for key, fn in contenders.items():
        if key == "bound":
            continue
        for _ in range(2):  # the first call builds; CUDA-graph trees warm up and record, then replay
            fn()
            restore(ins, before)
        result = fn()
        out = result[out_name] if isinstance(result, dict) else result[0] if isinstance(result, tuple) else result
        into = cg.graph.outputs[0].into
        checked(f"{label}: {key}", ins[into] if into else out, want, dtype)
        restore(ins, before)
    bound = cg.bind(**ins)
    gpu = sorted(gpu_time_us(bound.run))
    row = {"graph": label, "gpu_time_us": gpu[len(gpu) // 2]}
    for key, fn in contenders.items():
        row[f"{key}_us"] = host_time_us(fn, 1000)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="where to write the results")
    a = p.parse_args()
    out = {"meta": environment(), "noop_dispatch": noop_dispatch_us(), "graphs": []}
    for label, (source, binding) in GRAPHS.items():
        out["graphs"].append(one_graph(label, source, binding))
    print(out["meta"])
    n = out["noop_dispatch"]
    print(f"a no-op op: torch.library {n['library_us']:.1f} µs, @custom_op {n['custom_op_us']:.1f} µs")
    keys = ["bound", "op", "op_overload", "custom_op", "call", "compiled", "reduce_overhead"]
    print("host time per call (µs, median of 1000):")
    print(f"  {'graph':42} {'GPU':>6} " + " ".join(f"{k:>15}" for k in keys))
    for r in out["graphs"]:
        print(f"  {r['graph']:42} {r['gpu_time_us']:6.1f} " + " ".join(f"{r[k + '_us']:15.1f}" for k in keys))
    Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
