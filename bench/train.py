"""Benchmark (not a test): what a training step costs through a graph's torch op. A small transformer block and
a small ResNet-style block, written in .cdg (examples/training/), trained through the graph's torch op side by side
with the same model in plain PyTorch from the same initial weights.
Usage: python bench/train.py [--steps N] [--device cuda|cpu] [--json FILE] [--model NAME] [--target GPU]
[--no-compile] [--no-autotune]

Per model, in one process:
- training: `--steps` SGD steps (momentum 0.9) on a fixed synthetic regression task (a few fixed batches,
  targets from a teacher of the same architecture with other weights), for the cudnn-dsl model (the graph's
  torch op under `torch.compile(fullgraph=True)` where it traces, else eager) and the plain PyTorch model; the
  loss curves' largest relative difference;
- per step: the cuDNN graphs (distinct, as the plan store keys them) and launches, and the torch fallbacks, of
  the parts the op's derived forward and backward run as (on CUDA the parts that ran; on the CPU those
  deviceless planning for `--target` gives), and the torch (aten) ops one real step issues, counted with a
  TorchDispatchMode: kernels, views and allocations, for both twins (on CUDA inside the op's kernels too: the
  casts, copies and fallbacks around cuDNN's launches);
- step time of forward + backward (the optimizer step left out), contender by contender (CONTENDERS):
  cudnn-dsl eager, under torch.compile, under `reduce-overhead` and captured whole in one CUDA graph, beside
  plain PyTorch eager, `torch.compile` in its default and `max-autotune` modes, under `reduce-overhead` and
  captured. On CUDA, the GPU time between CUDA events around each step (host gaps between its kernels
  included: a step of a small model is launch-bound); on the CPU, wall time, and the contenders that need
  CUDA graphs or tune GPU kernels are listed as skipped, with why.
- on CUDA, where an eager step's host time goes: forward and backward per twin, and the cudnn-dsl step's
  ops by host time (torch.profiler).

Both models keep float32 master weights and cast them to the graph's dtypes in their forward, so the only
difference between them is the function the block calls. On CUDA tensors the cudnn-dsl model runs cuDNN (the
graph and its derived backward, split where cuDNN declines them whole); **on CPU tensors the torch op's kernel
is the graph's PyTorch reference, not cuDNN**: a CPU run checks the derived backward and the plumbing, and the
report says so (`"cudnn": false`).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import pstats
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cudnn_dsl  # noqa: E402
from cudnn_dsl.run import launch  # noqa: E402
from cudnn_dsl.run.partition import Counts, Partition, plan_for_target  # noqa: E402
from cudnn_dsl.run.parts import Parts  # noqa: E402
from cudnn_dsl.run.timing import gpu_time_us  # noqa: E402
from cudnn_dsl.target.dtypes import torch_dtype  # noqa: E402
from cudnn_dsl.target.library import Target  # noqa: E402
from cudnn_dsl.target.machine import environment  # noqa: E402
from cudnn_dsl.torch_op.training import grad_ops  # noqa: E402

EXAMPLES = ROOT / "examples" / "training"


def transformer_torch(x, gamma, beta, wq, wk, wv, bq, bk, bv, wo, bo):
    """examples/training/transformer_block.cdg as a PyTorch user writes it (its first output, y)."""
    h = F.layer_norm(x.float(), (x.shape[-1],), gamma.reshape(-1), beta.reshape(-1), eps=1e-5).to(x.dtype)
    # one head, [B, 1, S, Dh] as the graph reads them: torch's fused attention kernels take 4-d inputs only
    q, k, v = ((h @ w + b).unsqueeze(1) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(q.shape[-1])).squeeze(1)
    return x + (o @ wo + bo)


def resnet_torch(x, w1, b1, w2, b2):
    """examples/training/resnet_block.cdg as a PyTorch user writes it."""
    h = F.relu(F.conv2d(x, w1, padding=1) + b1)
    return F.relu(F.conv2d(h, w2, padding=1) + b2 + x)


class Spec:
    """A model of the example: its graph file, the symbolic batch dim (None: the file's one size), its
    plain PyTorch function, and its data input (the other inputs are weights). The loss reads output y."""

    def __init__(self, file: str, dim: str | None, plain, data: str, channels_last: bool = False):
        self.file, self.dim, self.plain, self.data, self.channels_last = (
            EXAMPLES / file,
            dim,
            plain,
            data,
            channels_last,
        )


SPECS = {
    "transformer": Spec("transformer_block.cdg", None, transformer_torch, "x"),
    "resnet": Spec("resnet_block.cdg", "N", resnet_torch, "x", channels_last=True),
}


class Block(torch.nn.Module):
    """float32 master weights, cast to the graph's dtypes (and layouts) in forward; `call` is the graph's
    torch op or the plain PyTorch function, by name."""

    def __init__(self, call, weights: dict, types: dict, data: str, pick: int | None):
        super().__init__()
        self.call, self.types, self.data, self.pick = call, types, data, pick
        self.w = torch.nn.ParameterDict({k: torch.nn.Parameter(v.clone()) for k, v in weights.items()})

    def forward(self, x):
        args = {k: p.to(self.types[k]) for k, p in self.w.items()}  # keeps channels_last
        out = self.call(**{self.data: x}, **args)
        return out if self.pick is None else out[self.pick]


class Setup:
    """One model's two twins, its data and its targets, on one device, at one batch size."""

    def __init__(self, name: str, device: str, batch: int | None = None, batches: int = 4, seed: int = 0, **options):
        spec = SPECS[name]
        self.name, self.spec, self.device = name, spec, torch.device(device)
        self.cg = cudnn_dsl.compile(spec.file, device=device if self.device.type == "cuda" else None, **options)
        graph = self.cg.graph
        if spec.dim is None:  # a graph written at one size
            inst = graph.instances[0]
            self.batch = inst.type(spec.data).shape[0]
            if batch not in (None, self.batch):
                raise SystemExit(f"{name}: {spec.file.name} is written at batch {self.batch}")
        else:
            sizes = sorted(dict(i.binding)[spec.dim] for i in graph.instances)
            self.batch = batch if batch is not None else (sizes[-1] if self.device.type == "cuda" else sizes[0])
            if self.batch not in sizes:
                raise SystemExit(f"{name}: --batch must be one of {sizes} (the graph's dim {spec.dim})")
            inst = graph.instance({spec.dim: self.batch})
        self.binding = dict(inst.binding)
        self.op = cudnn_dsl.as_torch_op(self.cg)
        self.wrt = tuple(n for n in self.op.tensor_names if n != spec.data)
        """the inputs a step derives gradients for: every weight (the data wants none)"""
        gen = torch.Generator().manual_seed(seed)
        self.types, weights, teacher = {}, {}, {}
        for v in self.cg.graph.device_inputs:
            t = inst.type(v.name)
            self.types[v.name] = torch_dtype(t.dtype)
            if v.name == spec.data:
                continue
            for store in (weights, teacher):
                store[v.name] = self._draw(v.name, t.shape, gen)
        self.weights = weights
        teacher_model = self.model(spec.plain, teacher)
        self.inputs = [self._as_data(torch.randn(inst.type(spec.data).shape, generator=gen)) for _ in range(batches)]
        with torch.no_grad():
            self.targets = [teacher_model(x).float() for x in self.inputs]

    def _draw(self, name: str, shape, gen) -> torch.Tensor:
        """Initial weights: norm scales 1, biases small, matrices and filters scaled by their fan-in."""
        if name == "gamma":
            return torch.ones(shape)
        if name.startswith("b"):
            return torch.randn(shape, generator=gen) * 0.02
        fan_in = math.prod(shape[1:]) if len(shape) == 4 and self.spec.channels_last else shape[-2]
        return torch.randn(shape, generator=gen) / math.sqrt(fan_in)

    def _as_data(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.device, self.types[self.spec.data])
        return t.contiguous(memory_format=torch.channels_last) if self.spec.channels_last else t

    def model(self, call, weights: dict | None = None) -> Block:
        """A twin from the initial weights (or `weights`): call is the op (cudnn-dsl) or the plain function."""
        w = {k: v.to(self.device) for k, v in (weights or self.weights).items()}
        if self.spec.channels_last:
            w = {k: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in w.items()}
        several = call is not self.spec.plain and len(self.op.fresh) > 1  # the op's outputs: y, then statistics
        return Block(call, w, self.types, self.spec.data, self.op.fresh.index("y") if several else None).to(self.device)

    def dsl(self) -> Block:
        return self.model(self.op)

    def plain(self) -> Block:
        return self.model(self.spec.plain)

    def loss(self, model, k: int) -> torch.Tensor:
        return F.mse_loss(model(self.inputs[k % len(self.inputs)]).float(), self.targets[k % len(self.inputs)])


def train(setup: Setup, model: Block, steps: int, lr: float) -> list[float]:
    """The losses of `steps` SGD steps (the same data in the same order for every model)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for k in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = setup.loss(model, k)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def max_relative_difference(a: list[float], b: list[float]) -> float:
    """The largest relative difference of two loss curves; infinite where either is not finite."""
    if not all(math.isfinite(x) for x in (*a, *b)):
        return math.inf
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


# ---- what one step runs: cuDNN's parts, and the torch ops ------------------------------------------------


def partition_run(setup: Setup, derived, target: Target) -> Partition | None:
    """The parts one of the op's derived graphs (its TorchOp) runs as (None: whole): on CUDA those its kernel
    ran (after a step), on the CPU those the real cuDNN library plans for `target` without a device."""
    graph = derived.graph
    inst = graph.instances[0]
    if setup.device.type == "cuda":
        device = setup.device if setup.device.index is not None else torch.device("cuda", torch.cuda.current_device())
        ran = derived.compiled[device].parts(inst)
        return ran.partition if isinstance(ran, Parts) else None
    return plan_for_target(graph, inst, derived.options, target)[1]


def part_counts(setup: Setup, target: Target) -> dict:
    """cuDNN graphs and launches, views and torch fallbacks, of the augmented forward and the backward of one
    step."""
    _, fwd, bwd = grad_ops(setup.op, setup.wrt).shape(setup.binding)
    report: dict = {
        "parts_from": (
            f"the parts that ran on {torch.cuda.get_device_name(setup.device)}"
            if setup.device.type == "cuda"
            else f"deviceless planning for {target.name}"
        )
    }
    totals = Counter()
    for half, derived in (("forward", fwd), ("backward", bwd)):
        graph = derived.graph
        partition = partition_run(setup, derived, target)
        if partition is None:
            c, lines = Counts(1, 1, 0, 0), [" + ".join(n.op for n in graph.nodes)]
            torch_ops = Counter()
        else:
            c = partition.counts
            lines = [" + ".join(graph.nodes[i].op for i in range(p.first, p.end)) for p in partition.parts]
            torch_ops = Counter(graph.nodes[p.first].op for p in partition.fallbacks)
        totals.update(cudnn_graphs=c.graphs, cudnn_launches=c.launches, views=c.views, torch_fallbacks=c.fallbacks)
        report[half] = {
            "cudnn_graphs": c.graphs,
            "cudnn_launches": c.launches,
            "views": c.views,
            "torch_fallbacks": dict(torch_ops),
            "parts": lines,
        }
    report.update(totals)
    return report


ALLOCATIONS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}
"""aten ops that allocate and launch nothing"""


class AtenCount(TorchDispatchMode):
    """The aten ops issued while it is on, by name, and how many were kernels, views (metadata alone) and
    allocations; each call of a graph op counted apart. `kernels` maps a graph op's name to its Python kernel,
    run with the mode on, so that the ops it issues count too; a composite op is counted as what it decomposes
    into (inside a kernel, below autograd, the mode sees `to` and `reshape` themselves)."""

    def __init__(self, kernels: dict[str, Callable]):
        super().__init__()
        self.kernels = kernels
        self.ops: Counter = Counter()
        self.graph_ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "cudnn_dsl":
            self.graph_ops[func.name()] += 1
            kernel = self.kernels.get(func.name())
            if kernel is not None:
                with self:
                    return kernel(*args, **kwargs)
            return func(*args, **kwargs)
        with self:
            decomposed = func.decompose(*args, **kwargs)
        if decomposed is not NotImplemented:
            return decomposed
        self.ops[func] += 1
        return func(*args, **kwargs)

    def summary(self) -> dict:
        kinds = Counter()
        for func, n in self.ops.items():
            packet = func.overloadpacket.__name__
            kinds["allocations" if packet in ALLOCATIONS else "views" if func.is_view else "kernels"] += n
        by_op = sorted((func.name(), n) for func, n in self.ops.items())
        return {
            **{k: kinds[k] for k in ("kernels", "views", "allocations")},
            "graph_op_calls": sum(self.graph_ops.values()),
            "by_op": dict(by_op),
        }


def torch_ops(setup: Setup) -> dict:
    """The torch ops one real eager step (forward + backward) issues, per twin. On CUDA the graph ops' own kernels
    are entered; on the CPU they run the graph's reference, so what they issue there is left out."""
    entered = setup.device.type == "cuda"
    g = grad_ops(setup.op, setup.wrt)
    kernels = {
        f"cudnn_dsl::{g.name}": lambda *a: g.forward_kernel("cuda_kernel", a),
        f"cudnn_dsl::{g.backward_name}": lambda *a: g.backward_kernel("cuda_kernel", a),
    }
    out = {}
    for twin, model in (("cudnn-dsl", setup.dsl()), ("torch", setup.plain())):
        step = eager_step(setup, model)
        step()  # the first call of a shape builds or loads its plans
        with AtenCount(kernels if entered else {}) as count:
            step()
        out[twin] = count.summary()
    out["cudnn-dsl"]["graph_ops_entered"] = entered
    return out


# ---- the contenders of the step time -------------------------------------------------------------------


def eager_step(setup: Setup, model) -> Callable[[], torch.Tensor]:
    """One forward + backward on the first batch, gradients set to None first; returns the loss."""
    params = list(model.parameters())

    def step():
        for p in params:
            p.grad = None
        loss = setup.loss(model, 0)
        loss.backward()
        return loss

    return step


def captured(step: Callable[[], torch.Tensor], warmup: int = 3) -> Callable[[], None]:
    """The replay of `step` captured whole in one CUDA graph, after a warm-up on a side stream (where every
    shape's plans are built and every launch worked out, none of which may happen inside a capture). The step
    reads static tensors (the first batch, its target, the weights), as a replayed one must."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()  # its loss dropped: no reference keeps the captured autograd graph alive
    return graph.replay


def marked(step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """A step of a `reduce-overhead` model: each begins a new step of torch's CUDA-graph trees."""

    def run():
        torch.compiler.cudagraph_mark_step_begin()
        return step()

    return run


@attrs.frozen
class Contender:
    """One way of running the step: which twin (the graph's op, or plain PyTorch), and how."""

    label: str
    dsl: bool
    how: str
    """eager, a torch.compile mode (default, max-autotune, reduce-overhead), or captured (torch.cuda.graph)"""

    def step(self, setup: Setup) -> Callable:
        model = setup.dsl() if self.dsl else setup.plain()
        if self.how == "eager":
            return eager_step(setup, model)
        if self.how == "captured":
            return captured(eager_step(setup, model))
        mode = None if self.how == "default" else self.how
        torch.compiler.reset()  # each contender compiles afresh: dynamo's cache of Block.forward holds 8 at most
        compiled = torch.compile(model, mode=mode, fullgraph=self.dsl)  # the op traces whole; torch may break
        return marked(eager_step(setup, compiled)) if self.how == "reduce-overhead" else eager_step(setup, compiled)


CONTENDERS = (
    Contender("cudnn-dsl eager", True, "eager"),
    Contender("cudnn-dsl torch.compile(fullgraph=True)", True, "default"),
    Contender("cudnn-dsl torch.compile(reduce-overhead)", True, "reduce-overhead"),
    Contender("cudnn-dsl captured (torch.cuda.graph)", True, "captured"),
    Contender("torch eager", False, "eager"),
    Contender("torch.compile(default)", False, "default"),
    Contender("torch.compile(max-autotune)", False, "max-autotune"),
    Contender("torch.compile(reduce-overhead)", False, "reduce-overhead"),
    Contender("torch captured (torch.cuda.graph)", False, "captured"),
)


def skipped(c: Contender, device: torch.device, compile_: bool, autotune: bool) -> str:
    """Why a contender is left out of this run ('' when it runs)."""
    if c.how == "eager":
        return ""
    if not compile_ and c.how != "captured":
        return "--no-compile"
    if device.type != "cuda" and c.how in ("captured", "reduce-overhead"):
        return "CUDA-graph capture needs a CUDA device"
    if device.type != "cuda" and c.how == "max-autotune":
        return "max-autotune tunes GPU kernels (on the CPU the default mode stands for torch.compile)"
    if not autotune and c.how == "max-autotune":
        return "--no-autotune"
    return ""


def step_time_us(setup: Setup, step: Callable, iterations: int) -> float:
    """Median time of one step: GPU time on CUDA (events around each step, host gaps included), else wall time."""
    if setup.device.type == "cuda":
        times = gpu_time_us(step, iterations=iterations, warmup=3, inner=1)
    else:
        step()
        times = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e6)
    return sorted(times)[len(times) // 2]


def host_cost(name: str, batch, iterations: int, target: str) -> dict:
    """The host's part of an eager cudnn-dsl step, measured on the CPU with cuDNN's execute a no-op
    (bench/nocudnn.py: the op's CUDA host path on CPU tensors, its graphs planned for `target`): µs per step
    (the weights' casts and the loss run for real on the CPU), µs of the graph op's own forward and backward
    (op_path), and the cuDNN launches it made. The instrument's
    ops stay routed after it: run it in a process of its own (main does, with --host-cost)."""
    from bench.nocudnn import nocudnn

    with nocudnn(target=target) as stub:
        setup = Setup(name, "cpu", batch)
        step = eager_step(setup, setup.dsl())
        step()  # the first call of a shape binds its launch plans
        before = stub.launches
        step()
        launches = stub.launches - before
        return {
            "host_us": step_time_us(setup, step, iterations),
            "op_path_us": step_time_us(setup, op_path(setup), iterations),
            "cudnn_launches": launches,
            "target": target,
        }


def op_path(setup: Setup) -> Callable[[], None]:
    """The graph op's own part of an eager step: its forward on inputs that want gradients (the weights already
    cast) and its backward from a fixed gradient of y, nothing of torch's around it."""
    op, model = setup.op, setup.dsl()
    weights = {k: p.detach().to(setup.types[k]).requires_grad_() for k, p in model.w.items()}
    args = {setup.spec.data: setup.inputs[0], **weights}
    pick = model.pick
    y = op(**args)
    grad = torch.ones_like(y if pick is None else y[pick])

    def run():
        for w in weights.values():
            w.grad = None
        out = op(**args)
        torch.autograd.backward(out if pick is None else out[pick], grad)

    run()
    return run


def host_time(setup: Setup, iterations: int = 50, top: int = 10) -> dict:
    """Where an eager step's host time goes on CUDA, measured, per twin: the host's wall time of the forward (the
    loss included) and of the backward, the GPU synchronized between steps so that no launch waits for a full
    queue; the ops taking the most host time in a step (torch.profiler, CPU only: self µs and calls per step;
    a graph op's own kernel is apart from the aten ops it issues); and for cudnn-dsl, the part of it inside
    cuDNN's launches (cudnn_execute)."""
    out = {}
    for twin, model in (("cudnn-dsl", setup.dsl()), ("torch", setup.plain())):
        params = list(model.parameters())
        forward, backward = [], []
        for k in range(iterations + 3):
            for p in params:
                p.grad = None
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = setup.loss(model, 0)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            if k >= 3:
                forward.append((t1 - t0) * 1e6)
                backward.append((t2 - t1) * 1e6)
        step, steps = eager_step(setup, model), 5
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
        rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        out[twin] = {
            "forward_us": sorted(forward)[len(forward) // 2],
            "backward_us": sorted(backward)[len(backward) // 2],
            "profiled_us": sum(e.self_cpu_time_total for e in rows) / steps,
            "top_self_us": {e.key: [e.self_cpu_time_total / steps, e.count / steps] for e in rows[:top]},
        }
        if twin == "cudnn-dsl":
            out[twin]["cudnn_execute"] = cudnn_execute(step, iterations)
    return out


def cudnn_execute(step: Callable, steps: int) -> dict:
    """The host time of a step spent inside cuDNN's launches (the backend execute of every part, the function
    cudnn_dsl.run.launch names `execute`), under cProfile, the GPU synchronized between steps: µs and launches
    per step."""
    prof = cProfile.Profile()
    for _ in range(steps):
        torch.cuda.synchronize()
        prof.enable()
        step()
        prof.disable()
    launches = [
        (row[1], row[3])  # calls, cumulative seconds
        for (file, _, fn), row in pstats.Stats(prof).stats.items()
        if fn == "execute" and Path(file) == Path(launch.__file__)
    ]
    return {"us": sum(t for _, t in launches) / steps * 1e6, "launches": sum(n for n, _ in launches) / steps}


def host_cost_apart(name: str, batch, iterations: int, target: str) -> dict:
    """host_cost in a process of its own; its failure, as text."""
    cmd = [sys.executable, __file__, "--host-cost", "--model", name, "--iterations", str(iterations)]
    cmd += ["--target", target] + (["--batch", str(batch)] if batch else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        why = done.stderr.strip().splitlines()[-1][:500] if done.stderr.strip() else "no output"
        return {"failed": why, "target": target}
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_contenders(setup: Setup, iterations: int, compile_: bool, autotune: bool) -> tuple[dict, dict]:
    """({label: median µs, or why it failed}, {label: why it was skipped})."""
    times, left_out = {}, {}
    for c in CONTENDERS:
        why = skipped(c, setup.device, compile_, autotune)
        if why:
            left_out[c.label] = why
            continue
        try:
            times[c.label] = step_time_us(setup, c.step(setup), iterations)
        except Exception as e:  # noqa: BLE001 - one contender failing leaves the others' figures
            times[c.label] = f"failed: {type(e).__name__}: {e}"[:500]
    return times, left_out


# ---- one model's report ----------------------------------------------------------------------------------


def trained(setup: Setup, steps: int, lr: float, compile_: bool, report: dict) -> None:
    """The two twins trained from the same weights: the loss curves, into `report`."""
    dsl_model, how = setup.dsl(), "eager"
    if compile_:
        torch.compiler.reset()
        try:
            candidate = torch.compile(setup.dsl(), fullgraph=True)
            setup.loss(candidate, 0).backward()  # traces forward and backward, or raises
            dsl_model, how = candidate, "torch.compile(fullgraph=True)"
        except Exception as e:  # noqa: BLE001 - a model that does not trace trains eager, and the report says why
            report["dsl_compile_error"] = f"{type(e).__name__}: {e}"[:500]
            dsl_model = setup.dsl()
    report["dsl_trained"] = how
    report["losses_dsl"] = train(setup, dsl_model, steps, lr)
    report["losses_torch"] = train(setup, setup.plain(), steps, lr)
    report["max_relative_difference"] = max_relative_difference(report["losses_dsl"], report["losses_torch"])


def run_model(
    name: str,
    device: str,
    steps: int,
    lr: float,
    iterations: int,
    compile_: bool,
    batch=None,
    autotune: bool = True,
    target: str = "h200",
    **options,
) -> dict:
    """One model's report: its loss curves, what a step runs and each contender's step time (options:
    cudnn_dsl.compile's). Plain PyTorch's `max-autotune`
    contender runs on the GPU when `autotune` (minutes of Triton autotuning)."""
    setup = Setup(name, device, batch, **options)
    report: dict = {
        "graph": str(setup.spec.file.relative_to(ROOT)),
        "batch": setup.batch,
        "device": str(setup.device),
        "cudnn": setup.device.type == "cuda",
        "steps": steps,
        "lr": lr,
    }
    if setup.device.type != "cuda":
        report["note"] = (
            "CPU: the cudnn-dsl contender ran the graph's PyTorch reference and derived backward, not cuDNN"
        )
    trained(setup, steps, lr, compile_, report)
    ops = torch_ops(setup)  # first: on CUDA the parts are those its steps ran
    report["per_step"] = {**part_counts(setup, Target.named(target)), "torch_ops": ops}
    report["step_time_us"], report["skipped"] = time_contenders(setup, iterations, compile_, autotune)
    if setup.device.type == "cuda":
        report["host_time"] = host_time(setup)
    return report


# ---- the table ---------------------------------------------------------------------------------------------


def per_step_lines(r: dict) -> list[str]:
    s = r["per_step"]
    fallbacks = Counter(s["forward"]["torch_fallbacks"]) + Counter(s["backward"]["torch_fallbacks"])
    ops = s["torch_ops"]
    inside = "" if ops["cudnn-dsl"]["graph_ops_entered"] else " (the graph ops' own not counted: the reference)"
    return [
        f"  per step ({s['parts_from']}): {s['cudnn_launches']} cuDNN launches "
        f"(forward {s['forward']['cudnn_launches']}, backward {s['backward']['cudnn_launches']}) of "
        f"{s['cudnn_graphs']} distinct graphs; {s['views']} views; {s['torch_fallbacks']} torch fallbacks"
        + (f" ({', '.join(f'{op} x{n}' for op, n in sorted(fallbacks.items()))})" if fallbacks else ""),
        *(
            f"  torch ops per step, {twin}: {o['kernels']} kernels, {o['views']} views, {o['allocations']} "
            f"allocations" + (inside if twin == "cudnn-dsl" else "")
            for twin, o in ops.items()
        ),
    ]


def print_report(name: str, r: dict, steps: int) -> None:
    print(f"{name} ({r['graph']}, batch {r['batch']}, {r['device']}, {'cuDNN' if r['cudnn'] else r['note']})")
    print(
        f"  trained {steps} steps, cudnn-dsl {r['dsl_trained']}: loss {r['losses_dsl'][0]:.5g} -> "
        f"{r['losses_dsl'][-1]:.5g} (torch {r['losses_torch'][-1]:.5g}); loss curves' max relative "
        f"difference {r['max_relative_difference']:.3g}"
    )
    if "dsl_compile_error" in r:
        print(f"  cudnn-dsl under torch.compile failed: {r['dsl_compile_error']}")
    for line in per_step_lines(r):
        print(line)
    base = r["step_time_us"].get("torch eager")
    print(f"  {'step (forward + backward)':46s} {'µs':>10s}  x torch eager")
    for label, t in r["step_time_us"].items():
        if isinstance(t, float):
            print(
                f"  {label:46s} {t:10.1f}  {t / base:.2f}x" if isinstance(base, float) else f"  {label:46s} {t:10.1f}"
            )
        else:
            print(f"  {label:46s} {t}")
    for label, why in r["skipped"].items():
        print(f"  {label:46s} skipped: {why}")
    t = r.get("host_time")
    for twin, h in (t or {}).items():
        print(
            f"  host time of an eager step, {twin}: forward {h['forward_us']:.1f} µs, backward {h['backward_us']:.1f} "
            f"µs; by op (self µs and calls per step, profiled: {h['profiled_us']:.0f} µs in all):"
        )
        for key, (us, calls) in h["top_self_us"].items():
            print(f"    {us:8.1f} µs {calls:5.1f}x  {key}")
        if "cudnn_execute" in h:
            e = h["cudnn_execute"]
            print(f"    of which inside cuDNN's launches: {e['us']:.1f} µs in {e['launches']:g} launches (cProfile)")
    h = r.get("host_cost")
    if h:
        print(
            f"  host's part of a cudnn-dsl eager step, cuDNN mocked ({h['target']}'s parts): failed: {h['failed']}"
            if "failed" in h
            else f"  host's part of a cudnn-dsl eager step, cuDNN's execute a no-op ({h['target']}'s parts): "
            f"{h['host_us']:.1f} µs, of which the graph op's forward and backward {h['op_path_us']:.1f} µs; "
            f"{h['cudnn_launches']} cuDNN launches"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", choices=sorted(SPECS), action="append", help="default: every model")
    p.add_argument(
        "--batch", type=int, help="one of the graph's batch sizes (default: its largest on CUDA, else smallest)"
    )
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--iterations", type=int, help="timed steps per contender (default 20 on CUDA, 3 on the CPU)")
    p.add_argument("--target", default="h200", help="the GPU whose parts a CPU run counts (deviceless planning)")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out (training and timing)")
    p.add_argument("--no-autotune", action="store_true", help="leave plain PyTorch's max-autotune contender out")
    p.add_argument(
        "--no-host-cost",
        action="store_true",
        help="on the CPU, leave out the host's part of a step measured with cuDNN's execute a no-op "
        "(bench/nocudnn.py); on CUDA the host's part is measured on the device (forward, backward, by op)",
    )
    p.add_argument("--host-cost", action="store_true", help=argparse.SUPPRESS)  # host_cost_apart's own process
    p.add_argument("--json", help="write the report here")
    a = p.parse_args(argv)
    iterations = a.iterations or (20 if a.device.startswith("cuda") else 3)
    if a.host_cost:
        print(json.dumps(host_cost(a.model[0], a.batch, iterations, a.target)))
        return 0
    result = {"models": {}}
    for name in a.model or sorted(SPECS):
        r = run_model(name, a.device, a.steps, a.lr, iterations, not a.no_compile, a.batch, not a.no_autotune, a.target)
        if not a.no_host_cost and not a.device.startswith("cuda"):  # on CUDA, host_time measures it for real
            r["host_cost"] = host_cost_apart(name, a.batch, max(iterations, 50), a.target)
        result["models"][name] = r
        print_report(name, r, a.steps)
    result = {"environment": environment(), **result}  # after the runs: it names the libraries they loaded
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
