"""GPU time per call (CUDA events, CUDA-graph replays) and host time per call.

Figures are measured, never asserted: these feed `run`, `tune`, `bench` and the benchmark scripts.
"""

from __future__ import annotations

import time

import torch

from cudnn_dsl.target.library import load_cudnn


def replay_time_us(fn, handle, device, iterations: int, warmup: int, inner: int = 10) -> list[float]:
    """GPU time per call of fn() without host gaps: `inner` calls captured in a CUDA graph, then
    one sample per replay. Falls back to event timing when the launch cannot be captured."""
    cudnn = load_cudnn()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            cudnn.set_stream(handle, torch.cuda.current_stream(device).cuda_stream)
            for _ in range(inner):
                fn()
    except Exception:  # noqa: BLE001 - capture refused: time launches directly
        return gpu_time_us(fn, iterations, 0, inner)
    finally:
        cudnn.set_stream(handle, torch.cuda.current_stream(device).cuda_stream)
    return [t / inner for t in gpu_time_us(graph.replay, iterations, warmup=1, inner=1)]


def gpu_time_us(fn, iterations: int = 20, warmup: int = 3, inner: int = 10, before=None) -> list[float]:
    """GPU time per call of fn() in microseconds: one sample per CUDA-event pair around `inner`
    back-to-back calls, so the device queue stays full and host overhead is not counted. `before`,
    when given, runs ahead of each sample, outside its events."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    for s, e in zip(starts, ends):
        if before is not None:
            before()
        s.record()
        for _ in range(inner):
            fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 / inner for s, e in zip(starts, ends)]


def l2_flush_buffer(device=None) -> torch.Tensor:
    """A buffer twice the GPU's L2: writing it evicts whatever a timed call left there."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size or 64 << 20
    return torch.empty(2 * l2, dtype=torch.uint8, device=device or "cuda")


def cold_time_us(fn, flush: torch.Tensor, iterations: int = 20, warmup: int = 2) -> list[float]:
    """GPU time of single calls of fn() with a cold L2: each call follows a write of `flush`. The
    write keeps the device busy while fn() is launched, so its host cost is not counted either."""
    return gpu_time_us(fn, iterations, warmup, inner=1, before=flush.zero_)


def host_time_us(fn, iterations: int = 200) -> float:
    """Median host time of one call of fn() in microseconds (the GPU is synchronized at the end)."""
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2]
