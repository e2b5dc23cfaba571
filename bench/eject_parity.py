"""Benchmark (not a test): a compiled graph vs. its ejected standalone cuDNN script, same buffers.

For each example, in one process: the graph compiled by cudnn-dsl (the heuristics' plan, as the
script builds) and the script that `cudnn-dsl emit --format cudnn` prints are built, run on the
same input buffers, checked to give the same outputs, then timed in interleaved rounds. GPU time
is taken from CUDA-graph replays of 10 launches, so it is the device's time alone whatever the
host is doing; the host time per call is given for the Python API call (binding checks, output
allocation), a launch with the variant pack prepared, and the script's own execute.

A graph cuDNN declines whole on this GPU (an EXAMPLE may be a path to any .cdg file) is compared
as it runs: cudnn-dsl's parts against the script ejected for the same partition, on the inputs the
script draws (`run`'s), each timed with CUDA events around whole calls (every part; a torch
fallback part cannot be captured in a CUDA graph). The heuristics' plan per part on both sides.
Usage: python bench/eject_parity.py [--json FILE] [EXAMPLE...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cudnn_dsl  # noqa: E402
from cudnn_dsl.run.launch import Launch  # noqa: E402
from cudnn_dsl.run.parts import Parts  # noqa: E402
from cudnn_dsl.run.timing import gpu_time_us, host_time_us, replay_time_us  # noqa: E402
from cudnn_dsl.target.machine import environment  # noqa: E402
from cudnn_dsl.tune.bench import import_script, load_ejected  # noqa: E402


def _path(example: str) -> str:
    return example if example.endswith(".cdg") else str(ROOT / "examples" / f"{example}.cdg")


def bench(example: str, rounds: int, iters: int) -> dict:
    cg = cudnn_dsl.compile(_path(example), split=True)
    cg.planner.use_store = False  # the heuristics' plan, as the script builds: the same plan on both sides
    inst = cg.graph.instances[0]
    parts = cg.parts(inst)
    if isinstance(parts, Parts):
        return bench_split(example, cg, inst, parts, rounds, iters)
    exe = cg.executable(inst)
    tensors = cg.allocate_inputs()
    ours = cg.bind_outputs(inst, tensors)
    launch = Launch(exe)
    buffers = launch.layout.named(tensors, ours)

    script = load_ejected(cg.graph, inst, tensors, ours)
    theirs, run_script = script.outputs, script.run

    def run_ours():
        launch.on(buffers)

    run_ours()
    run_script()
    torch.cuda.synchronize()
    same = {n: bool(torch.equal(ours[n], theirs[n])) for n in ours}

    ours_t, script_t = [], []
    for _ in range(rounds):  # interleaved, so drift shows as spread in both
        ours_t.append(statistics.median(replay_time_us(run_ours, exe.handle, cg.device, iters, 2)))
        script_t.append(statistics.median(replay_time_us(run_script, script.handle, cg.device, iters, 2)))
    api = host_time_us(lambda: cg(**tensors))
    launch_us = host_time_us(run_ours)
    script_host = host_time_us(run_script)
    row = {
        "example": example,
        "plan": exe.plan_name,
        "script_plan": script.g.get_plan_name_at_index(0),
        "identical_outputs": same,
        "gpu_us_cudnn_dsl": statistics.median(ours_t),
        "gpu_us_script": statistics.median(script_t),
        "gpu_us_spread_cudnn_dsl": [min(ours_t), max(ours_t)],
        "gpu_us_spread_script": [min(script_t), max(script_t)],
        "host_us_api_call": api,
        "host_us_launch": launch_us,
        "host_us_script": script_host,
    }
    row["gpu_ratio"] = row["gpu_us_cudnn_dsl"] / row["gpu_us_script"]
    return row


def bench_split(example: str, cg, inst, parts, rounds: int, iters: int) -> dict:
    """A graph run in parts: cudnn-dsl's parts against the script ejected for the same partition."""
    import cudnn

    from cudnn_dsl.interop.emit import emit_cudnn

    mod = import_script(emit_cudnn(cg.graph, inst, cg.options, parts.partition), cg.graph.name)
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    graphs = mod.build(handle)
    buffers = mod.make_buffers()
    tensors = {n: buffers[n].clone() for n in mod.INPUTS}  # the script's inputs (run's), in memory of ours
    size = max([1] + [g.get_workspace_size() for g in graphs if g is not None])
    workspace = torch.empty(size, dtype=torch.uint8, device="cuda")
    scalars = mod.host_scalars()
    outputs = cg.bind_outputs(inst, tensors)

    def run_ours():
        cg(tensors, outputs)

    def run_script():
        mod.execute(graphs, handle, buffers, workspace, scalars)

    run_ours()
    run_script()
    torch.cuda.synchronize()
    same = {n: bool(torch.equal(outputs[n], buffers[n])) for n in mod.OUTPUTS}
    ours_t, script_t = [], []
    for _ in range(rounds):  # interleaved, so drift shows as spread in both
        ours_t.append(statistics.median(gpu_time_us(run_ours, iters, 2, inner=1)))
        script_t.append(statistics.median(gpu_time_us(run_script, iters, 2, inner=1)))
    row = {
        "example": example,
        "plan": f"{len(parts.partition.parts)} parts",
        "script_plan": f"{len(graphs)} parts",
        "parts": parts.lines,
        "identical_outputs": same,
        "gpu_us_cudnn_dsl": statistics.median(ours_t),
        "gpu_us_script": statistics.median(script_t),
        "gpu_us_spread_cudnn_dsl": [min(ours_t), max(ours_t)],
        "gpu_us_spread_script": [min(script_t), max(script_t)],
        "host_us_api_call": host_time_us(run_ours),
        "host_us_launch": float("nan"),  # a split graph is called, not launched from a prepared pack
        "host_us_script": host_time_us(run_script),
    }
    row["gpu_ratio"] = row["gpu_us_cudnn_dsl"] / row["gpu_us_script"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("examples", nargs="*", default=["conv_bias_relu", "matmul_epilogue"])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--json")
    a = p.parse_args()
    rows = [bench(e, a.rounds, a.iters) for e in a.examples]
    meta = environment()
    print(f"{meta}")
    print(
        f"{'example':18} {'cudnn-dsl µs':>13} {'script µs':>10} {'ratio':>6} {'api host µs':>12} "
        f"{'launch µs':>12} {'script host µs':>15} same"
    )
    for r in rows:
        print(
            f"{r['example']:18} {r['gpu_us_cudnn_dsl']:13.1f} {r['gpu_us_script']:10.1f} {r['gpu_ratio']:6.3f} "
            f"{r['host_us_api_call']:12.1f} {r['host_us_launch']:12.1f} {r['host_us_script']:15.1f} "
            f"{all(r['identical_outputs'].values())}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
