"""Benchmark (not a test): real models at real sizes, unmodified, under every contender, with and without the
regions cudnn-dsl's pattern library replaces (cudnn_dsl.patterns.install_library).
Usage: python bench/models.py [--device cuda|cpu] [--tiny] [--models resnet50,gpt2,llama_layer]
                              [--phases inference,training] [--contenders eager,default,...] [--json FILE]

Models (examples/torch_models/, unmodified model code): torchvision's ResNet-50 channels-last (batch 64 and 256,
half), nanoGPT's GPT-2 124M (B=8, T=1024, bf16), a Llama-style decoder layer (d=4096, RMSNorm, SwiGLU, GQA; B=1,
T=4096, bf16); and, when named (`--models hf_gpt2`), HF transformers' GPT2LMHeadModel of GPT-2 124M's size (its
Conv1D and gelu_new as HF writes them), each trained as mixed precision trains (float parameters, the forward under
bf16 autocast; the library installed for autocast). `--tiny` shrinks each to a few layers and small sizes (a check
that runs on the CPU in CI time, in float, not a figure). Contenders, each in this process on the same weights and
inputs: torch eager, torch.compile in the modes default, max-autotune and reduce-overhead, and each compiled mode
with the pattern library installed ("+cudnn"; on CUDA each region's shape tuned on its first run unless --no-tune).

Per model, phase and contender: the median step time (inference: a forward under no_grad; training: forward,
loss, backward and an SGD step), images or tokens per second, the share of the model's forward FLOPs inside
cuDNN graphs (the replaced regions' FLOPs over the model's, torch's flop counter), the regions replaced and the
compute ops left to torch (the patterns' report), and the numerics: inference outputs against eager's within the
dtype's tolerance; training loss curves (`--steps`, 100 by default) against eager's, the largest difference
relative to the loss. A contender that fails is recorded with its error, and the rest go on.

On CUDA the JSON goes to docs/results/models-<gpu>.json unless --json names a file; docs/results.md's table
is generated from it (bench/results_md.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cudnn_dsl  # noqa: E402
from cudnn_dsl import patterns  # noqa: E402
from cudnn_dsl.store.files import atomic_write  # noqa: E402
from cudnn_dsl.target.dtypes import tolerance  # noqa: E402
from cudnn_dsl.target.machine import environment  # noqa: E402
from examples.torch_models.gpt2 import GPT, GPTConfig  # noqa: E402
from examples.torch_models.llama import DecoderLayer, LlamaConfig  # noqa: E402
from examples.torch_models.resnet import Bottleneck, ResNet, resnet50  # noqa: E402

MODES = {"default": "default", "max-autotune": "max-autotune", "reduce-overhead": "reduce-overhead"}
CONTENDERS = ("eager", *MODES, *(f"{m}+cudnn" for m in MODES))
_NAMES = {torch.float: "float", torch.half: "half", torch.bfloat16: "bf16"}
PHASES = ("inference", "training")


@attrs.frozen
class Case:
    """One model at one size: how to build it and its batch, the loss of a training step, and what it counts."""

    name: str
    build: Callable[[], torch.nn.Module]
    batch: Callable[[torch.Generator, str], tuple]
    """(inputs, targets) on a device"""
    loss: Callable[[object, object], torch.Tensor]
    dtype: torch.dtype
    families: tuple[str, ...]
    unit: str
    per_step: int
    """images or tokens in one step"""
    channels_last: bool = False
    config: dict = attrs.field(factory=dict)
    amp: torch.dtype | None = None
    """a training step's precision, as mixed precision trains: float parameters and inputs, the forward under
    torch.autocast to this dtype; None: trained in `dtype`"""


def _resnet_cases(tiny: bool, dtype: torch.dtype, amp, batches: tuple[int, ...]) -> list[Case]:
    sizes = ((8, 32),) if tiny else tuple((n, 224) for n in batches)

    def build():
        if tiny:  # a Bottleneck ResNet of one block per stage, narrow
            return ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, width_per_group=16)
        return resnet50()

    cases = []
    for n, hw in sizes:

        def batch(gen, device, n=n, hw=hw):
            x = torch.randn(n, 3, hw, hw, generator=gen).to(device, dtype).to(memory_format=torch.channels_last)
            return x, torch.randint(0, 10 if tiny else 1000, (n,), generator=gen).to(device)

        cases.append(
            Case(
                f"resnet50 batch {n}" if not tiny else f"resnet (tiny) batch {n}",
                build,
                batch,
                lambda out, y: F.cross_entropy(out.float(), y),
                dtype,
                ("resnet",),
                "images",
                n,
                channels_last=True,
                config={"batch": n, "image": hw, "dtype": _NAMES[dtype], "layout": "channels_last"},
                amp=amp,
            )
        )
    return cases


class _HFLogits(torch.nn.Module):
    """An HF transformers causal LM as a function of token ids to logits."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=idx, use_cache=False).logits


def _hf_gpt2(config: GPTConfig) -> torch.nn.Module:
    """HF transformers' GPT2LMHeadModel of nanoGPT's config (no dropout, SDPA attention)."""
    try:
        import transformers
    except ImportError:
        raise SystemExit("hf_gpt2 is HF transformers' GPT-2: pip install transformers") from None
    sizes = {"n_layer": config.n_layer, "n_head": config.n_head, "n_embd": config.n_embd}
    last = config.vocab_size - 1  # HF's default ids (50256) lie outside a tiny vocabulary
    hf = transformers.GPT2Config(
        **sizes, n_positions=config.block_size, vocab_size=config.vocab_size, bos_token_id=last, eos_token_id=last
    )
    hf.resid_pdrop = hf.embd_pdrop = hf.attn_pdrop = 0.0
    hf._attn_implementation = "sdpa"
    return _HFLogits(transformers.GPT2LMHeadModel(hf))


def _gpt2_case(tiny: bool, dtype: torch.dtype, amp, hf: bool = False) -> Case:
    """nanoGPT's GPT-2, or (`hf`) HF transformers' of the same size."""
    config = GPTConfig(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_embd=64) if tiny else GPTConfig()
    b, t = (2, 32) if tiny else (8, 1024)

    def batch(gen, device):
        idx = torch.randint(0, config.vocab_size, (b, t + 1), generator=gen).to(device)
        return idx[:, :-1], idx[:, 1:]

    def loss(out, targets):
        return F.cross_entropy(out.float().view(-1, out.size(-1)), targets.reshape(-1))

    return Case(
        ("hf " if hf else "") + ("gpt2 124M" if not tiny else "gpt2 (tiny)"),
        (lambda: _hf_gpt2(config)) if hf else (lambda: GPT(config)),
        batch,
        loss,
        dtype,
        ("gpt",),
        "tokens",
        b * t,
        config={"B": b, "T": t, "n_layer": config.n_layer, "n_embd": config.n_embd, "dtype": _NAMES[dtype]},
        amp=amp,
    )


def _llama_case(tiny: bool, dtype: torch.dtype, amp) -> Case:
    config = LlamaConfig(dim=64, n_heads=8, n_kv_heads=2, hidden_dim=160) if tiny else LlamaConfig()
    b, t = (2, 32) if tiny else (1, 4096)

    def batch(gen, device):
        return torch.randn(b, t, config.dim, generator=gen).to(device, dtype), None

    return Case(
        "llama layer" if not tiny else "llama layer (tiny)",
        lambda: DecoderLayer(config, max_seq_len=t),
        batch,
        lambda out, _: out.float().pow(2).mean(),
        dtype,
        ("llama",),
        "tokens",
        b * t,
        config={"B": b, "T": t, "dim": config.dim, "heads": config.n_heads, "kv_heads": config.n_kv_heads}
        | {"dtype": _NAMES[dtype]},
        amp=amp,
    )


def cases(models: list[str], tiny: bool, device: str, batches: tuple[int, ...] = (64, 256)) -> list[Case]:
    """The cases of the models named; on the CPU with --tiny in float (the CPU's half and bf16 convolutions are
    slow, and a check needs no low precision), else for inference ResNet in half and the transformers in bf16, and
    each trained with bf16 mixed precision."""
    low = torch.float if tiny and device == "cpu" else None
    amp = None if low else torch.bfloat16
    made = {
        "resnet50": lambda: _resnet_cases(tiny, low or torch.half, amp, batches),
        "gpt2": lambda: [_gpt2_case(tiny, low or torch.bfloat16, amp)],
        "hf_gpt2": lambda: [_gpt2_case(tiny, low or torch.bfloat16, amp, hf=True)],
        "llama_layer": lambda: [_llama_case(tiny, low or torch.bfloat16, amp)],
    }
    unknown = [m for m in models if m not in made]
    if unknown:
        raise SystemExit(f"no model {unknown[0]!r}; the models are {', '.join(made)}")
    return [c for m in models for c in made[m]()]


def _prepare(case: Case, base: torch.nn.Module, device: str, training: bool) -> torch.nn.Module:
    model = copy.deepcopy(base).to(device, torch.float if training and case.amp else case.dtype)
    if case.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model.train(training)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _median_ms(step: Callable[[], object], device: str, iterations: int) -> float:
    times = []
    for _ in range(iterations):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _profile(folder: Path | None, title: str, step: Callable[[], object], device: str, steps: int = 3) -> None:
    """With --profile: a few steps under torch.profiler, its table of ops by device time (CPU time on the CPU),
    then the same by the ops' input shapes (which copy, of what), and on CUDA by host time, written to
    FOLDER/<title>.txt. Where a contender's time goes, not a figure."""
    if folder is None:
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    tables = [
        prof.key_averages(group_by_input_shape=by_shape).table(sort_by=sort, row_limit=60, max_name_column_width=90)
        for by_shape in (False, True)
    ]
    name = "".join(c if c.isalnum() or c == "-" else "_" for c in title)
    text = f"{title}: {steps} steps\n{tables[0]}\n\nby input shape:\n{tables[1]}\n"
    if device == "cuda":  # where the host's time goes, beside the device's
        host = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=90)
        text += f"\nby host time:\n{host}\n"
    atomic_write(folder / f"{name}.txt", text, follow_symlinks=False)


def _forward_flops(case: Case, model: torch.nn.Module, inputs) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=_ATTENTION_FLOPS) as counter:
        model(inputs)
    return counter.get_total_flops()


def _attention_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Attention's two matmuls over every query head, key and value heads shared by groups (grouped-query attention,
    which some torch versions' own count refuses)."""
    b, heads, s_q, d = query
    return 2 * b * heads * s_q * key[-2] * (d + value[-1])


_ATTENTION_FLOPS = {
    getattr(torch.ops.aten, f"_scaled_dot_product_{kind}"): _attention_flops
    for kind in ("flash_attention", "efficient_attention", "cudnn_attention", "flash_attention_for_cpu")
}


def _report(installed) -> dict:
    if installed is None:
        return {}
    r = installed.report
    return {
        "replaced": [str(x) for x in r.replaced],
        "near_misses": [str(x) for x in r.missed],
        "left_to_torch": [str(x) for x in r.unmatched],
        "replaced_flops": sum(x.flops for x in r.replaced),
    }


def run_contender(case: Case, base, name: str, phase: str, device: str, args, reference) -> dict:
    """One contender on one model and phase: its numbers, or its error."""
    mode = name.removesuffix("+cudnn")
    cudnn = name.endswith("+cudnn")
    training = phase == "training"
    torch._dynamo.reset()
    model = _prepare(case, base, device, training)
    gen = torch.Generator().manual_seed(0)
    inputs, targets = case.batch(gen, device)
    amp = case.amp if training else None
    installed = None
    if cudnn:
        installed = patterns.install_library(
            *case.families,
            dtype=_NAMES[amp or case.dtype],
            channels_last=case.channels_last,
            device=device,
            tune=device == "cuda" and args.tune,
            autocast=amp is not None,
        )
    try:
        fn = model if mode == "eager" else torch.compile(model, mode=MODES[mode], fullgraph=False)
        if not training:
            with torch.no_grad():
                t0 = time.perf_counter()
                out = fn(inputs)
                first = time.perf_counter() - t0
                got = out[0] if isinstance(out, tuple) else out
                numerics = _compare(got, reference, case.dtype)
                ms = _median_ms(lambda: fn(inputs), device, args.iterations)
                _profile(args.profile, f"{case.name} {phase} {name}", lambda: fn(inputs), device)
            losses = None
        else:
            opt = torch.optim.SGD(model.parameters(), lr=args.lr)
            batches = [case.batch(gen, device) for _ in range(4)]
            if amp is not None:  # float inputs, as the float model takes them
                batches = [(x.float() if x.is_floating_point() else x, y) for x, y in batches]
            autocast = torch.autocast(device, dtype=amp) if amp is not None else contextlib.nullcontext()

            def step(i):
                x, y = batches[i % len(batches)]
                opt.zero_grad(set_to_none=True)
                with autocast:
                    out = fn(x)
                loss = case.loss(out[0] if isinstance(out, tuple) else out, y)
                loss.backward()
                opt.step()
                return loss

            t0 = time.perf_counter()
            losses = [step(0).item()]
            first = time.perf_counter() - t0
            losses += [step(i).item() for i in range(1, args.steps)]
            counter = iter(range(10**9))
            ms = _median_ms(lambda: step(next(counter)), device, args.iterations)
            _profile(args.profile, f"{case.name} {phase} {name}", lambda: step(next(counter)), device)
            numerics = None if reference is None else _curve_difference(losses, reference)
        result = {
            "contender": name,
            "ok": True,
            "step_ms": ms,
            "per_second": case.per_step / (ms / 1e3),
            "first_call_s": first,
            **_report(installed),
        }
        if numerics is not None:
            result["numerics"] = numerics
        if losses is not None:
            result["losses"] = losses
        return result
    except Exception as e:  # a contender that fails is a result, and the others still run
        return {"contender": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:2000], **_report(installed)}
    finally:
        if installed is not None:
            installed.uninstall()
        del model
        if device == "cuda":
            torch.cuda.empty_cache()


def _compare(got: torch.Tensor, reference, dtype) -> dict | None:
    """Inference numerics against eager's output: the largest difference and whether it is within tolerance."""
    if reference is None:
        return None
    atol, rtol = tolerance(_NAMES[dtype])
    got, want = got.float(), reference.float()
    diff = (got - want).abs()
    bound = atol + rtol * want.abs()
    # the model's own output under the dtype's tolerance, scaled by its depth: many layers compound rounding
    return {"max_abs_diff": diff.max().item(), "within_tolerance": bool((diff <= 8 * bound).all().item())}


def _curve_difference(losses: list[float], reference: list[float]) -> dict:
    """A training loss curve against eager's: the largest difference relative to eager's loss."""
    rel = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, reference))
    return {"max_relative_loss_diff": rel, "within_tolerance": rel <= 0.05}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="small models and sizes: a check, not a figure")
    p.add_argument("--models", default="resnet50,gpt2,llama_layer", help="of resnet50, gpt2, llama_layer, hf_gpt2")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--resnet-batches", default="64,256", help="ResNet-50's batch sizes (default 64,256)")
    p.add_argument("--steps", type=int, default=100, help="training steps of each loss curve (default 100)")
    p.add_argument("--iterations", type=int, default=20, help="timed steps, after the curve or a warm-up call")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--no-tune",
        dest="tune",
        action="store_false",
        help="run the heuristics' plans of the library's graphs (default on CUDA: each region's shape tuned on its "
        "first run, kept in the plan store; the first run's time includes it, as max-autotune's does)",
    )
    p.add_argument("--json", type=Path, help="where the results go (default on CUDA: docs/results/models-<gpu>.json)")
    p.add_argument("--profile", type=Path, metavar="DIR", help="also write each contender's torch.profiler table here")
    args = p.parse_args(argv)
    contenders = args.contenders.split(",")
    if "eager" not in contenders:
        contenders.insert(0, "eager")  # every comparison is against eager
    bad = [c for c in contenders if c not in CONTENDERS] + [x for x in args.phases.split(",") if x not in PHASES]
    if bad:
        p.error(f"{bad[0]!r}: the contenders are {', '.join(CONTENDERS)}; the phases {', '.join(PHASES)}")
    warnings.simplefilter("ignore", cudnn_dsl.DslWarning)
    torch.manual_seed(0)
    results = []
    path = args.json
    if path is None and args.device == "cuda":
        gpu = torch.cuda.get_device_name().split()[-1].lower()
        path = ROOT / "docs" / "results" / f"models-{gpu}.json"
    batches = tuple(int(n) for n in args.resnet_batches.split(","))
    for case in cases(args.models.split(","), args.tiny, args.device, batches):
        base = case.build()
        model = _prepare(case, base, args.device, False)
        inputs, _ = case.batch(torch.Generator().manual_seed(0), args.device)
        flops = _forward_flops(case, model, inputs)
        with torch.no_grad():
            out = model(inputs)
        eager_out = out[0] if isinstance(out, tuple) else out
        del model
        for phase in args.phases.split(","):
            entry = {"model": case.name, "phase": phase, "unit": case.unit, "per_step": case.per_step}
            amp = case.amp if phase == "training" else None
            config = case.config | (
                {"training": f"mixed precision ({_NAMES[amp]} autocast, float parameters)"} if amp else {}
            )
            entry.update(config=config, forward_flops=flops, contenders=[])
            reference = eager_out if phase == "inference" else None
            for name in contenders:
                print(f"{case.name} {phase}: {name} ...", file=sys.stderr, flush=True)
                try:
                    r = run_contender(case, base, name, phase, args.device, args, reference)
                except torch.AcceleratorError as e:  # raised while cleaning up: the device is lost for the rest
                    entry["contenders"].append({"contender": name, "ok": False, "error": f"{type(e).__name__}: {e}"})
                    _write(path, args, results + [entry])
                    raise
                if phase == "training" and name == "eager" and r["ok"]:
                    reference = r["losses"]
                if "replaced_flops" in r:
                    r["flops_in_cudnn"] = r["replaced_flops"] / flops if flops else 0.0
                entry["contenders"].append(r)
                print(_line(r), file=sys.stderr, flush=True)
                _write(path, args, results + [entry])  # after every contender: a run cut short keeps what it did
            results.append(entry)
    if path is not None:
        print(f"wrote {path}", file=sys.stderr)
    failed = [
        (e["model"], e["phase"], r["contender"])
        for e in results
        for r in e["contenders"]
        if not r["ok"] or not r.get("numerics", {}).get("within_tolerance", True)
    ]
    for f in failed:
        print(f"FAILED or out of tolerance: {' / '.join(f)}", file=sys.stderr)
    return 1 if failed else 0


def _write(path: Path | None, args, results: list) -> None:
    if path is None:
        return
    report = {
        "device": args.device,
        "tiny": args.tiny,
        "tuned": args.device == "cuda" and args.tune,
        "environment": environment(),
        "results": results,
    }
    atomic_write(path, json.dumps(report, indent=1) + "\n", follow_symlinks=False)


def _line(r: dict) -> str:
    if not r["ok"]:
        return f"  error: {r['error'].splitlines()[0]}"
    share = f", {100 * r['flops_in_cudnn']:.0f}% of FLOPs in cuDNN" if "flops_in_cudnn" in r else ""
    num = r.get("numerics") or {}
    ok = "" if num.get("within_tolerance", True) else " OUT OF TOLERANCE"
    return f"  {r['step_ms']:.2f} ms/step, {r['per_second']:.0f}/s{share}{ok}"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.exit(130)
