"""Benchmark (not a test): the host cost per call of a compiled graph as a torch op, layer by layer.
Usage: python bench/torch_op.py --json FILE [--device cuda|cpu] [--iterations N]

Per graph, side by side in one process, on the same buffers (median host time of one call; on the GPU every
contender's outputs are first checked against the reference):
- bound: `cg.bind(...).run()`, the launch with no per-call checks and no allocation (the floor);
- plan: the op's launch plan for these arguments called directly (what the CUDA kernel runs after its key);
- kernel: the op's CUDA kernel called directly (key, plan, outputs returned as the schema returns them);
- op: `torch.ops.cudnn_dsl.<name>` (torch.library define + impl + register_fake), through `TorchOp`'s
  wrapper, and called directly as its overload (the dispatcher);
- custom_op: the same kernels registered with `@torch.library.custom_op`;
- call: the checked `cg(...)`;
- compiled: `torch.compile(fullgraph=True)` of a function calling the op (Inductor's wrapper calls the op's
  overload), and on the GPU under `reduce-overhead` (a CUDA-graph replay);
- and, once, a torch.library op and a custom_op whose kernels do nothing: the dispatcher's own cost (the cuDNN
  Frontend's guidance: ~10 µs against ~36 µs); `op / no-op` is the op's cost in those;
- and, once, the peer of the compiled contenders: an Inductor extern kernel call of the same arity (aten.baddbmm
  of three tensors, which Inductor's wrapper calls as `extern_kernels.baddbmm`; on the GPU at the tiny graph's
  shapes, on the CPU at 2x2, so that its arithmetic is nothing beside its call), eager, compiled and on the GPU
  under `reduce-overhead`; `compiled / extern` is a graph's compiled call against it (the target: at most 1).
  The generated wrapper code is checked: the op a direct overload call, the peer an extern kernel call.
Then graphs that run in parts (ResNet block's forward, and its derived backward for the weights, as an H200
splits them): the checked call, the bound run (`cg.bind(...)`'s BoundParts) and the op (its launch plan).

`--device cpu` runs the CUDA host path on CPU tensors under bench.nocudnn: planned for an H200 by the real
cuDNN library, every backend execute a no-op — host cost without a GPU (compiled code included: Inductor's CPU
wrapper calls the op as its CUDA wrapper does). Outputs are not checked there (no kernel ran) and the
`reduce-overhead` contenders are left out (CUDA graphs); a torch part of a split graph runs on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cudnn_dsl  # noqa: E402
from bench.nocudnn import nocudnn  # noqa: E402
from cudnn_dsl.run.buffers import restore, snapshot  # noqa: E402
from cudnn_dsl.run.compare import compare  # noqa: E402
from cudnn_dsl.run.compiled import CompiledGraph  # noqa: E402
from cudnn_dsl.run.inputs import generate_inputs  # noqa: E402
from cudnn_dsl.run.timing import gpu_time_us, host_time_us  # noqa: E402
from cudnn_dsl.target.machine import environment  # noqa: E402
from cudnn_dsl.target.quirks import backward_avoid, library_version  # noqa: E402
from dsl.autodiff import derive  # noqa: E402

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
RESNET = ROOT / "examples" / "training" / "resnet_block.cdg"
KEYS = ["bound", "plan", "kernel", "op_overload", "op", "custom_op", "call", "compiled", "reduce_overhead"]


def custom_op_twin(op, namespace: str = "cudnn_dsl_bench", kernel=None):
    """The op's schema and kernels (its CUDA kernel, or `kernel`) registered with @torch.library.custom_op."""
    kernel = kernel or op.cuda_kernel
    twin = torch.library.custom_op(
        f"{namespace}::{op.name}", lambda *args: kernel(*args), mutates_args=op.mutated, schema=op.schema
    )
    twin.register_fake(op.fake_kernel)
    return twin


def noop_dispatch_us(device: str, iterations: int) -> dict:
    """Host time of a call to an op that does nothing, registered each way: what the dispatcher costs."""
    lib = torch.library.Library("cudnn_dsl_bench_noop", "FRAGMENT")
    lib.define("noop(Tensor x) -> ()")
    lib.impl("noop", lambda x: None, "CPU" if device == "cpu" else "CUDA")

    @torch.library.custom_op("cudnn_dsl_bench_noop::noop_custom", mutates_args=())
    def noop_custom(x: torch.Tensor) -> None:
        return None

    x = torch.zeros(1, device=device)
    library = torch.ops.cudnn_dsl_bench_noop.noop.default
    return {
        "library_us": host_time_us(lambda: library(x), iterations),
        "custom_op_us": host_time_us(lambda: noop_custom(x), iterations),
    }


def wrapper_calls(compiled, args, prefix: str) -> list[str]:
    """The lines of Inductor's generated wrapper that call `prefix...` (compiled afresh to read its code)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()  # the code is generated again, not read from dynamo's cache
    _, codes = run_and_get_code(compiled, *args)
    return [line.strip() for code in codes for line in code.splitlines() if prefix in line and "(" in line]


def extern_us(device: str, iterations: int) -> dict:
    """The compiled contenders' peer: a function Inductor compiles to one extern kernel call of three tensors
    (aten.baddbmm), its host time eager, compiled and (on the GPU) under reduce-overhead."""
    shape, dtype = ((1, 128, 128), torch.half) if device == "cuda" else ((1, 2, 2), torch.float)
    x, w = (torch.randn(shape, dtype=dtype, device=device) for _ in range(2))
    b = torch.randn(shape[:1] + (1,) + shape[2:], dtype=dtype, device=device)

    def f(b, x, w):
        return torch.baddbmm(b, x, w)

    compiled = torch.compile(f, fullgraph=True)
    calls = wrapper_calls(compiled, (b, x, w), "extern_kernels.")
    if not calls:
        raise SystemExit("Inductor did not compile the peer to an extern kernel call: no peer to compare with")
    contenders = {"eager": lambda: f(b, x, w), "compiled": lambda: compiled(b, x, w)}
    if device == "cuda":
        reduce_overhead = torch.compile(f, fullgraph=True, mode="reduce-overhead")
        contenders["reduce_overhead"] = lambda: reduce_overhead(b, x, w)
    out = {"call": "torch.baddbmm(b, x, w)", "shape": list(shape), "wrapper_calls": calls}
    for key, fn in contenders.items():
        for _ in range(3):  # compiles; CUDA-graph trees warm up and record
            fn()
        out[f"{key}_us"] = host_time_us(fn, iterations)
    return out


def checked(name: str, got, want, dtype: str) -> None:
    c = compare(name, got, want, dtype)
    if not c.ok:
        raise SystemExit(f"a contender's output does not match the reference: {c}")


def the_plan(op, args):
    """The op's launch plan for these arguments (None where the op has none: another version of the code)."""
    plans = getattr(op, "plans", None)
    if plans is None:
        return None
    key = tuple((t.shape, t.stride(), t.dtype, t.get_device()) for t in args)
    return plans.plans.get(key)


def one_graph(label: str, source: str, binding, gpu: bool, iterations: int) -> dict:
    cg = cudnn_dsl.compile(source)
    op = cudnn_dsl.as_torch_op(cg)
    twin = custom_op_twin(op)
    ins = cg.allocate_inputs(binding)
    args = tuple(ins[n] for n in op.tensor_names)
    out_name = cg.graph.outputs[0].name
    dtype = cg.graph.instances[0].type(out_name).dtype  # the language's dtype, which compare's tolerances are keyed by

    contenders = {
        "bound": (lambda: bound.run()),
        "kernel": lambda: op.cuda_kernel(*args),
        "op_overload": lambda: op.overload(*args),
        "op": lambda: op(*args),
        "custom_op": lambda: twin(*args),
        "call": lambda: cg(**ins),
    }
    compiled = torch.compile(lambda *a: op(*a), fullgraph=True)
    contenders["compiled"] = lambda: compiled(*args)
    if gpu:
        reduce_overhead = torch.compile(lambda *a: op(*a), fullgraph=True, mode="reduce-overhead")
        contenders["reduce_overhead"] = lambda: reduce_overhead(*args)

    before = snapshot(cg.graph, ins)
    calls = wrapper_calls(compiled, args, "torch.ops.cudnn_dsl.")
    restore(ins, before)
    want = cg.reference(before)[out_name] if gpu else None
    for key, fn in contenders.items():
        if key == "bound":
            continue
        for _ in range(2):  # the first call builds; CUDA-graph trees warm up and record, then replay
            fn()
            restore(ins, before)
        result = fn()
        if gpu:
            out = result[out_name] if isinstance(result, dict) else result[0] if isinstance(result, tuple) else result
            into = cg.graph.outputs[0].into
            checked(f"{label}: {key}", ins[into] if into else out, want, dtype)
        restore(ins, before)
    bound = cg.bind(**ins)
    plan = the_plan(op, args)
    if plan is not None:
        values = args + op.defaults
        contenders["plan"] = lambda: plan(values)
    row = {"graph": label, "wrapper_calls": calls}
    if gpu:
        times = sorted(gpu_time_us(bound.run))
        row["gpu_time_us"] = times[len(times) // 2]
    for key, fn in contenders.items():
        row[f"{key}_us"] = host_time_us(fn, iterations)
    return row


def split_graphs(iterations: int) -> list[dict]:
    """ResNet block's forward and its derived backward (weights' gradients): checked call, bound run, op."""
    cg = cudnn_dsl.compile(RESNET)
    inst = cg.graph.instances[0]
    derived = derive(cg.graph, inst, ("w1", "b1", "w2", "b2"), avoid=backward_avoid(library_version()))
    backward = CompiledGraph(derived.backward, cg.options, cg.device)
    return [
        split_row("resnet_block forward", cg, inst, iterations),
        split_row("resnet_block backward (weights)", backward, derived.backward.instances[0], iterations),
    ]


def split_row(label: str, cg, inst, iterations: int) -> dict:
    ins = generate_inputs(cg.graph, inst, cg.device or "cpu", 0)
    op = cudnn_dsl.as_torch_op(cg)
    args = tuple(ins[n] for n in op.tensor_names)
    op(*args)  # builds every part's plan
    bound = cg.bind(ins)
    parts = cg.parts(inst)
    row = {"graph": label, "parts": parts.lines if hasattr(parts, "lines") else ["one cuDNN graph"]}
    for key, fn in {"call": lambda: cg(ins), "bound": bound.run, "op": lambda: op(*args)}.items():
        row[f"{key}_us"] = host_time_us(fn, iterations)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--iterations", type=int, default=1000, help="calls timed per contender (the median is kept)")
    a = p.parse_args()
    gpu = a.device == "cuda"
    with contextlib.nullcontext() if gpu else nocudnn(target="h200"):
        out = {"device": a.device, "noop_dispatch": noop_dispatch_us(a.device, a.iterations)}
        out["extern"] = extern_us(a.device, a.iterations)
        out["graphs"] = [one_graph(label, s, b, gpu, a.iterations) for label, (s, b) in GRAPHS.items()]
        out["split"] = split_graphs(max(a.iterations // 10, 20))
        out = {"meta": environment(), **out}  # after the runs: it names the cuDNN they loaded
        if not gpu:
            out["meta"]["note"] = "CPU tensors, cuDNN's execute a no-op (bench.nocudnn): host cost only"
    print(out["meta"])
    n = out["noop_dispatch"]
    print(f"a no-op op: torch.library {n['library_us']:.1f} µs, @custom_op {n['custom_op_us']:.1f} µs")
    keys = [k for k in KEYS if f"{k}_us" in out["graphs"][0]]
    e = out["extern"]
    print(
        f"the peer, an extern kernel call ({e['call']}, {e['shape']}): "
        + ", ".join(f"{k[:-3]} {e[k]:.1f} µs" for k in e if k.endswith("_us"))
    )
    print(f"host time per call (µs, median of {a.iterations}):")
    print(f"  {'graph':42} " + " ".join(f"{k:>15}" for k in keys) + f" {'op / no-op':>11} {'compiled / extern':>18}")
    for r in out["graphs"]:
        r["op_over_noop"] = r["op_us"] / n["library_us"]
        r["compiled_over_extern"] = r["compiled_us"] / e["compiled_us"]
        if "reduce_overhead_us" in r:
            r["reduce_overhead_over_extern"] = r["reduce_overhead_us"] / e["reduce_overhead_us"]
        cells = " ".join(f"{r[k + '_us']:15.1f}" if k + "_us" in r else f"{'-':>15}" for k in keys)
        print(f"  {r['graph']:42} {cells} {r['op_over_noop']:11.1f} {r['compiled_over_extern']:18.2f}")
    print(f"Inductor's wrapper calls the peer as {e['wrapper_calls']} and the ops as:")
    for r in out["graphs"]:
        print(f"  {r['wrapper_calls']}")
    print("graphs in parts (µs per call): checked call, bound run, the op")
    for r in out["split"]:
        print(f"  {r['graph']:42} {r['call_us']:10.1f} {r['bound_us']:10.1f} {r['op_us']:10.1f}")
        for line in r["parts"]:
            print(f"    {line}")
    Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
