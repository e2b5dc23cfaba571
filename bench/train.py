"""Benchmark (not a test): a small transformer block and a small ResNet-style block, written in .cdg
(examples/training/), trained through the graph's torch op, side by side with the same model in plain
PyTorch from the same initial weights.
Usage: python bench/train.py [--steps N] [--device cuda|cpu] [--json FILE] [--model NAME] [--no-compile]
[--no-autotune]

Per model, in one process:
- training: `--steps` SGD steps (momentum 0.9) on a fixed synthetic regression task (a few fixed batches,
  targets from a teacher of the same architecture with other weights), for the cudnn-dsl model (the
  graph's torch op under `torch.compile(fullgraph=True)` where it traces, else eager) and the plain
  PyTorch model; the loss curves' largest relative difference;
- step time of forward + backward (the optimizer step left out): cudnn-dsl eager and under
  torch.compile, plain PyTorch eager and torch.compile (`max-autotune` on the GPU, the default mode on
  the CPU). On CUDA, the time between CUDA events around each step (host gaps between its kernels
  included: a step of a small model is launch-bound); on the CPU, wall time.

Both models keep float32 master weights and cast them to the graph's dtypes in their forward, so the
only difference between them is the function the block calls. On CUDA tensors the cudnn-dsl model runs
cuDNN (the graph and its derived backward, split where cuDNN declines them whole); **on CPU tensors the
torch op's kernel is the graph's PyTorch reference, not cuDNN**: a CPU run checks the derived backward
and the plumbing, and the report says so (`"cudnn": false`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cudnn_dsl  # noqa: E402
from cudnn_dsl.run.timing import environment, gpu_time_us  # noqa: E402
from cudnn_dsl.target.dtypes import torch_dtype  # noqa: E402

EXAMPLES = ROOT / "examples" / "training"


def transformer_torch(x, gamma, beta, wq, wk, wv, bq, bk, bv, wo, bo):
    """examples/training/transformer_block.cdg as a PyTorch user writes it (its first output, y)."""
    h = F.layer_norm(x.float(), (x.shape[-1],), gamma.reshape(-1), beta.reshape(-1), eps=1e-5).to(x.dtype)
    q, k, v = h @ wq + bq, h @ wk + bk, h @ wv + bv
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(q.shape[-1]))
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
        self.op = cudnn_dsl.as_torch_op(self.cg)
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
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def step_time_us(setup: Setup, model, iterations: int) -> float:
    """Median time of one forward + backward (gradients set to None first), GPU time on CUDA."""
    params = list(model.parameters())

    def step():
        for p in params:
            p.grad = None
        setup.loss(model, 0).backward()

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


def compiled(model: Block, plain: bool, mode: str = "default"):
    """torch.compile of a twin: `mode` for plain PyTorch, fullgraph for cudnn-dsl."""
    return torch.compile(model, mode=mode if plain else None, fullgraph=not plain)


def run_model(
    name: str,
    device: str,
    steps: int,
    lr: float,
    iterations: int,
    compile_: bool,
    batch=None,
    autotune: bool = True,
    **options,
) -> dict:
    """One model's report: its loss curves and step times (options: cudnn_dsl.compile's). Plain PyTorch's
    torch.compile contender uses `max-autotune` on the GPU when `autotune` (minutes of Triton autotuning)."""
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
    dsl_model, how = setup.dsl(), "eager"
    if compile_:
        try:
            candidate = compiled(setup.dsl(), plain=False)
            setup.loss(candidate, 0).backward()  # traces forward and backward, or raises
            dsl_model, how = candidate, "torch.compile(fullgraph=True)"
        except Exception as e:  # noqa: BLE001 - a model that does not trace trains eager, and the report says why
            report["dsl_compile_error"] = f"{type(e).__name__}: {e}"[:500]
            dsl_model = setup.dsl()
    report["dsl_trained"] = how
    report["losses_dsl"] = train(setup, dsl_model, steps, lr)
    report["losses_torch"] = train(setup, setup.plain(), steps, lr)
    report["max_relative_difference"] = max_relative_difference(report["losses_dsl"], report["losses_torch"])
    times = {
        "cudnn-dsl eager": lambda: setup.dsl(),
        "torch eager": lambda: setup.plain(),
    }
    if compile_:
        times["cudnn-dsl torch.compile(fullgraph=True)"] = lambda: compiled(setup.dsl(), plain=False)
        mode = "max-autotune" if autotune and setup.device.type == "cuda" else "default"
        times[f"torch.compile({mode})"] = lambda: compiled(setup.plain(), plain=True, mode=mode)
    report["step_time_us"] = {}
    for label, make in times.items():
        try:
            report["step_time_us"][label] = step_time_us(setup, make(), iterations)
        except Exception as e:  # noqa: BLE001 - one contender failing leaves the others' figures
            report["step_time_us"][label] = f"failed: {type(e).__name__}: {e}"[:500]
    return report


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
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out (training and timing)")
    p.add_argument(
        "--no-autotune", action="store_true", help="plain PyTorch's torch.compile in its default mode, not max-autotune"
    )
    p.add_argument("--json", help="write the report here")
    a = p.parse_args(argv)
    iterations = a.iterations or (20 if a.device.startswith("cuda") else 3)
    result = {"environment": environment(), "models": {}}
    for name in a.model or sorted(SPECS):
        r = run_model(name, a.device, a.steps, a.lr, iterations, not a.no_compile, a.batch, not a.no_autotune)
        result["models"][name] = r
        print(f"{name} ({r['graph']}, batch {r['batch']}, {r['device']}, {'cuDNN' if r['cudnn'] else r['note']})")
        print(
            f"  trained {a.steps} steps, cudnn-dsl {r['dsl_trained']}: loss {r['losses_dsl'][0]:.5g} -> "
            f"{r['losses_dsl'][-1]:.5g} (torch {r['losses_torch'][-1]:.5g}); loss curves' max relative "
            f"difference {r['max_relative_difference']:.3g}"
        )
        if "dsl_compile_error" in r:
            print(f"  cudnn-dsl under torch.compile failed: {r['dsl_compile_error']}")
        for label, t in r["step_time_us"].items():
            print(f"  {label:42s} {t:.1f} µs" if isinstance(t, float) else f"  {label:42s} {t}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
