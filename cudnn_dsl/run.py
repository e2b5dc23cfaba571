"""CLI layer: `cudnn-dsl run` — compile, execute, compare with the reference, report."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import attrs
import torch

from cudnn_dsl import backend
from cudnn_dsl.cli import (EXIT_FAIL, EXIT_OK, Progress, UsageError, _read, _target, load_programs, plan_without_device,
                           select_instances, selected_graphs)
from cudnn_dsl.lower import first_plan_name, timings_text
from cudnn_dsl.store import atomic_write
from dsl.diagnostics import DslError
from dsl.ir import Graph, Instance, Options


def build_options(base: Options, args) -> Options:
    """The file's options with the command line's on top."""
    changes = {}
    if getattr(args, "heuristics", None):
        modes = tuple(m.strip().upper() for m in args.heuristics.split(",") if m.strip())
        bad = [m for m in modes if m not in ("A", "B", "FALLBACK")]
        if bad or not modes:
            raise UsageError(f"--heuristics takes A, B and FALLBACK, comma separated; got '{args.heuristics}'")
        changes["heuristics"] = modes
    for name in ("build_policy", "workspace_limit", "seed", "warmup", "iterations"):
        if getattr(args, name, None) is not None:
            changes[name] = getattr(args, name)
    return attrs.evolve(base, **changes)


def _tolerances(items, graph: Graph) -> dict[str, float]:
    """--atol 1e-2 (every output) and --atol out=1e-2 (one output) -> {output: tol}."""
    outputs = [v.name for v in graph.outputs]
    out: dict[str, float] = {}
    for item in items or ():
        name, sep, value = item.rpartition("=")
        try:
            tol = float(value)
        except ValueError:
            raise UsageError(f"tolerance '{item}' is not a number") from None
        if not sep:
            out.update({o: tol for o in outputs})
        elif name in outputs:
            out[name] = tol
        elif name in {v.name for v in graph.values}:
            raise UsageError(f"'{name}' is not an output of graph '{graph.name}'")
    return out


def _ranges(items, graph: Graph) -> dict[str, tuple[float, float]]:
    """--range x=-2:2 -> {"x": (-2.0, 2.0)}"""
    out = {}
    inputs = {v.name for v in graph.of_kind("input")}
    for item in items or ():
        name, _, span = item.partition("=")
        lo, sep, hi = span.partition(":")
        try:
            lo_f, hi_f = float(lo), float(hi)
        except ValueError:
            raise UsageError(f"--range takes NAME=LO:HI, got '{item}'") from None
        if not sep or lo_f > hi_f:
            raise UsageError(f"--range takes NAME=LO:HI with LO <= HI, got '{item}'")
        if name not in inputs:
            raise UsageError(f"graph '{graph.name}' has no tensor input '{name}'")
        out[name] = (lo_f, hi_f)
    return out


def _inputs(graph: Graph, inst: Instance, device, seed: int, args) -> dict[str, torch.Tensor]:
    from cudnn_dsl.tensors import BindingError, generate_inputs, load_tensor, relayout

    tensors = generate_inputs(graph, inst, device, seed, _ranges(args.range, graph))
    for item in args.input or ():
        name, sep, path = item.partition("=")
        if not sep:
            raise UsageError(f"--input takes NAME=FILE, got '{item}'")
        if name not in tensors:
            raise UsageError(f"graph '{graph.name}' has no tensor input '{name}'")
        try:
            tensors[name] = relayout(load_tensor(path), inst.type(name), device)
        except BindingError as e:
            raise BindingError(f"--input {name}: {e}") from None
    return tensors


def run_file(args) -> int:
    [(path, program)] = load_programs([args.file])
    if program is None:
        return EXIT_FAIL
    graphs = selected_graphs(program, args)
    gpu = backend.gpu_available()
    if not gpu:
        print("note: no CUDA GPU here: checking, planning for "
              f"{args.device_properties or args.target or 'h200'} without a device, and running the PyTorch reference "
              "on the CPU; the cuDNN execution is skipped", file=sys.stderr)
    status, reports = EXIT_OK, []
    for g in graphs:
        opts = build_options(g.options, args)
        atol = _tolerances(args.atol, g)
        rtol = _tolerances(args.rtol, g)
        runner = _GpuRunner(g, opts, args) if gpu else None
        for inst in select_instances(g, args.shape):
            label = g.name + (f" [{inst.label}]" if inst.binding else "")
            try:
                rep = runner.run(inst, atol, rtol, label) if gpu else _cpu_run(g, inst, opts, args, label)
            except DslError as e:
                print(e.render({path: _read(path)}), file=sys.stderr)
                status = EXIT_FAIL
                continue
            reports.append(rep)
            if not rep.get("ok", True):
                status = EXIT_FAIL
    if args.json:
        atomic_write(Path(args.json), json.dumps({"file": path, "gpu": gpu, "graphs": reports}, indent=2, default=str))
    return status


class _GpuRunner:
    def __init__(self, graph: Graph, opts: Options, args):
        from cudnn_dsl.runtime import CompiledGraph

        self.graph, self.opts, self.args = graph, opts, args
        self.cg = CompiledGraph(graph, opts, args.device, use_store=not args.no_cache, rebuild=args.rebuild)

    def run(self, inst: Instance, atol, rtol, label: str) -> dict:
        from cudnn_dsl.runtime import compare_outputs, gpu_time_us

        cg = self.cg
        progress = Progress(label)
        cg.progress = progress
        exe = cg.executable(inst)
        progress.done()
        tensors = _inputs(self.graph, inst, cg.device, self.opts.seed, self.args)
        graph_mode = self.args.cuda_graph or self.opts.cuda_graph
        if graph_mode:
            replay = cg.capture(**tensors)
            outputs, launch = replay.outputs, replay.replay
        else:
            bound = cg.bind(**tensors)
            outputs, launch = bound.outputs, bound.run
        launch()
        torch.cuda.synchronize(cg.device)
        want = cg.reference(**tensors)
        comps = compare_outputs(self.graph, inst, outputs, want, self.opts, atol, rtol)
        times = gpu_time_us(launch, self.opts.iterations, warmup=3)
        low = exe.low
        median = statistics.median(times)
        print(f"graph {label}")
        candidates = f"{low.plan_count} candidates, heuristics {', '.join(self.opts.modes())}; " if low.plan_count else ""
        print(f"  plan       {exe.plan_name}  ({candidates}from {exe.source})")
        for note in exe.notes + cg.kernel_cache_notes:
            print(f"  note       {note}")
        print("  build      " + timings_text(low.timings))
        print(f"  workspace  {exe.workspace.numel() if exe.workspace.numel() > 1 else 0} bytes")
        how = "CUDA-graph replays" if graph_mode else "executions"
        print(f"  gpu time   {median:.1f} µs per call ({how}; median of {len(times)} samples, "
              f"min {min(times):.1f}, max {max(times):.1f})")
        for c in comps:
            print(f"  compare    {c}")
        self._save(inst, outputs)
        return {
            "graph": self.graph.name, "binding": dict(inst.binding), "plan": exe.plan_name, "source": exe.source,
            "notes": exe.notes, "candidates": low.plan_count, "build_s": low.timings, "cuda_graph": graph_mode,
            "workspace_bytes": int(exe.workspace.numel()), "gpu_us_median": median, "gpu_us": times,
            "compare": [attrs.asdict(c) for c in comps], "ok": all(c.ok for c in comps),
            "device": torch.cuda.get_device_name(cg.device),
        }

    def _save(self, inst: Instance, outputs) -> None:
        if not self.args.save_outputs:
            return
        d = Path(self.args.save_outputs)
        d.mkdir(parents=True, exist_ok=True)
        suffix = "".join(f".{k}{v}" for k, v in inst.binding)
        for name, t in outputs.items():
            torch.save(t.cpu(), d / f"{self.graph.name}{suffix}.{name}.pt")


def _cpu_run(graph: Graph, inst: Instance, opts: Options, args, label: str) -> dict:
    from cudnn_dsl.reference import run_reference

    print(f"graph {label}")
    rep: dict = {"graph": graph.name, "binding": dict(inst.binding), "executed": False}
    try:
        target = _target(args)
        low = plan_without_device(graph, inst, opts, target, label)
        first = first_plan_name(low)
        print(f"  plan       for {target.name} (no device): {first}  ({low.plan_count} candidates)")
        print("  build      " + timings_text(low.timings))
        for step, why in low.skipped.items():
            print(f"  skipped    {step}: {why}")
        rep.update(plan=first, candidates=low.plan_count, build_s=low.timings, skipped=low.skipped)
    except backend.BackendUnavailable as e:
        print(f"  skipped    cuDNN planning: {e}")
        rep["skipped"] = {"plan": str(e)}
    tensors = _inputs(graph, inst, "cpu", opts.seed, args)
    outs = run_reference(graph, inst, tensors, "cpu")
    for name, t in outs.items():
        f = t.float()
        print(f"  reference  {name}: {inst.type(name)} on the CPU, mean {f.mean():.4g}, max |x| {f.abs().max():.4g}")
    print("  skipped    cuDNN execution and comparison: no CUDA GPU here")
    rep["reference"] = {n: {"mean": float(t.float().mean()), "absmax": float(t.float().abs().max())} for n, t in outs.items()}
    return rep
