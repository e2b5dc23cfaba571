"""Runtime layer: a compiled graph bound to torch buffers by UID, executed on the GPU."""

from __future__ import annotations

import time
from typing import Any

import attrs
import torch

from cudnn_dsl.backend import Target, load_cudnn
from cudnn_dsl.dtypes import TORCH
from cudnn_dsl.lower import Lowered, lower, plan
from cudnn_dsl.reference import run_reference
from cudnn_dsl.tensors import BindingError, Comparison, check_binding, compare, empty, generate_inputs
from dsl.ir import Graph, Instance, Options
from dsl.types import fmt_shape


@attrs.define
class Executable:
    """One planned instance: the cuDNN graph, its workspace, and its host scalars."""

    low: Lowered
    handle: Any
    device: torch.device
    workspace: torch.Tensor
    host: dict[int, torch.Tensor]
    """uid -> CPU tensor of each pass-by-value scalar (cuDNN reads it at launch)"""

    @property
    def plan_name(self) -> str:
        return self.low.g.get_plan_name_at_index(self.low.g._plan_index)

    def pack(self, tensors: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> dict[int, Any]:
        graph = self.low.graph
        pack = dict(self.host)
        for v in graph.inputs:
            if v.name in tensors:
                if v.kind == "scalar":
                    pack[v.uid] = _host_scalar(tensors[v.name], self.low.instance.type(v.name).dtype)
                else:
                    pack[v.uid] = tensors[v.name]
        for v in graph.outputs:
            pack[v.uid] = outputs[v.name]
        return pack

    def launch(self, pack: dict[int, Any]) -> None:
        cudnn = load_cudnn()
        cudnn.set_stream(self.handle, torch.cuda.current_stream(self.device).cuda_stream)
        self.low.g.execute(pack, self.workspace, handle=self.handle)


def _host_scalar(value, dtype: str) -> torch.Tensor:
    return torch.full((1,), float(value), dtype=TORCH[dtype])


class CompiledGraph:
    """A checked graph, compiled for the local GPU on first use of each shape.

    Call it with torch tensors by name: ``y = cg(x=x, w=w, b=b)["out"]``. Scalars may be
    given (a number) or left to their declared value.
    """

    def __init__(self, graph: Graph, options: Options | None = None, device: int | str | None = None,
                 progress=None):
        self.graph = graph
        self.options = options or graph.options
        self.device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
        self.progress = progress
        self._exes: dict[tuple, Executable] = {}
        self._handle = None

    # ---- specs ------------------------------------------------------------------

    @property
    def inputs(self) -> dict[str, Any]:
        """name -> TensorType of each input (of the first shape, for a dynamic graph)."""
        inst = self.graph.instances[0]
        return {v.name: inst.type(v.name) for v in self.graph.inputs}

    @property
    def outputs(self) -> dict[str, Any]:
        inst = self.graph.instances[0]
        return {v.name: inst.type(v.name) for v in self.graph.outputs}

    def instance_for(self, tensors: dict[str, Any]) -> Instance:
        """The declared shape that the given inputs match; a clear error when none does."""
        if len(self.graph.instances) == 1:
            return self.graph.instances[0]
        for inst in self.graph.instances:
            if all(tuple(tensors[v.name].shape) == inst.type(v.name).shape
                   for v in self.graph.of_kind("input") if isinstance(tensors.get(v.name), torch.Tensor)):
                return inst
        given = ", ".join(f"{k} {fmt_shape(tuple(t.shape))}" for k, t in tensors.items() if isinstance(t, torch.Tensor))
        declared = "; ".join(s.name + " in {" + ", ".join(map(str, s.values)) + "}" for s in self.graph.symbols)
        raise BindingError(f"graph '{self.graph.name}': inputs ({given}) match none of the declared shapes ({declared})")

    def allocate_inputs(self, binding: dict[str, int] | None = None, seed: int | None = None) -> dict[str, torch.Tensor]:
        inst = self.graph.instance(binding)
        return generate_inputs(self.graph, inst, self.device, self.options.seed if seed is None else seed)

    # ---- compile and run ------------------------------------------------------------

    def executable(self, inst: Instance) -> Executable:
        key = inst.binding
        exe = self._exes.get(key)
        if exe is None:
            exe = self._compile(inst)
            self._exes[key] = exe
        return exe

    def _compile(self, inst: Instance) -> Executable:
        cudnn = load_cudnn()
        if self._handle is None:
            with torch.cuda.device(self.device):
                self._handle = cudnn.create_handle()
        o = self.options
        low = plan(lower(self.graph, inst, handle=self._handle), o.heuristics, o.build_policy, o.workspace_limit,
                   torch.cuda.get_device_name(self.device), self.progress)
        size = low.g.get_workspace_size()
        ws = torch.empty(max(size, 1), dtype=torch.uint8, device=self.device)
        host = {uid: _host_scalar(v, dt) for uid, (v, dt) in low.host_values.items()}
        return Executable(low, self._handle, self.device, ws, host)

    def __call__(self, out: dict[str, torch.Tensor] | None = None, **tensors) -> dict[str, torch.Tensor]:
        inst = self.instance_for(tensors)
        exe = self.executable(inst)
        outputs = self._bind(inst, tensors, out)
        exe.launch(exe.pack(tensors, outputs))
        return outputs

    def _bind(self, inst: Instance, tensors: dict, out: dict | None) -> dict[str, torch.Tensor]:
        names = {v.name for v in self.graph.inputs}
        unknown = set(tensors) - names
        if unknown:
            raise BindingError(f"graph '{self.graph.name}' has no input {', '.join(sorted(unknown))} "
                               f"(inputs: {', '.join(sorted(names))})")
        for v in self.graph.of_kind("input"):
            if v.name not in tensors:
                raise BindingError(f"graph '{self.graph.name}': input '{v.name}' is not bound")
            check_binding(v.name, tensors[v.name], inst.type(v.name), self.device)
        outputs = {}
        for v in self.graph.outputs:
            t = inst.type(v.name)
            if out is not None and v.name in out:
                check_binding(v.name, out[v.name], t, self.device)
                outputs[v.name] = out[v.name]
            else:
                outputs[v.name] = empty(t, self.device)
        return outputs

    def reference(self, **tensors) -> dict[str, torch.Tensor]:
        return run_reference(self.graph, self.instance_for(tensors), tensors, self.device)

    def check(self, atol: dict | float | None = None, rtol: dict | float | None = None, **tensors) -> list[Comparison]:
        """Runs the graph and its reference on the same inputs and compares every output."""
        got = self(**tensors)
        want = self.reference(**tensors)
        return compare_outputs(self.graph, self.instance_for(tensors), got, want, self.options, atol, rtol)


def compare_outputs(graph: Graph, inst: Instance, got, want, options: Options, atol=None, rtol=None) -> list[Comparison]:
    def pick(v, name, default):
        """v: one tolerance for every output, or {output: tolerance}; None: the file's or the dtype's."""
        if isinstance(v, dict):
            return v.get(name, default)
        return default if v is None else v

    return [compare(v.name, got[v.name], want[v.name], inst.type(v.name).dtype,
                    pick(atol, v.name, options.atol), pick(rtol, v.name, options.rtol)) for v in graph.outputs]


def gpu_time_us(fn, iterations: int = 20, warmup: int = 3) -> list[float]:
    """Per-call GPU time of fn() in microseconds, one CUDA-event pair per call."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]


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
