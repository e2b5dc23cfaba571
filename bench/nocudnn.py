"""Benchmark instrument (not a test, never used by one): the CUDA host path of compiled graphs and torch ops,
run on CPU tensors with cuDNN's execute and torch's CUDA calls replaced by no-ops — host cost without a GPU.

    from bench.nocudnn import nocudnn

    with nocudnn(target="h200") as stub:
        cg = cudnn_dsl.compile("examples/training/resnet_block.cdg")  # planned deviceless for an H200
        op = cudnn_dsl.as_torch_op(cg)
        y = op(x, w1, b1, w2, b2)       # CPU tensors: the op's CUDA kernel, every launch a no-op
        stub.launches                   # the backend executes that did nothing

Inside the block:
- `cudnn_dsl.compile(...)` graphs (and the derived graphs and parts they make) get the CPU as their device and
  a planner that plans each shape with the real cuDNN library for `target` (deviceless, as `check --target`):
  the real lowering, UIDs, partition, variant pack order and host tensors. Where the chosen plan builds
  without a GPU its workspace is the plan's own; a runtime-compiled engine's kernel cannot load without
  one, so its workspace is a 1-byte stand-in. The plan store is not used.
- The frontend's backend executes (every form: raw pointers, ordered, uid map) do nothing but count; the
  ordered form still reads the buffers as the frontend does. Everything above them — the frontend's own
  Python, cudnn_dsl's checks, binding and allocation — runs for real.
- torch's CUDA stream and device calls answer as for one device (stream 0); `torch.cuda.synchronize` is a
  no-op. torch runs on one thread: the torch parts of a split graph run on the CPU, and a parallel CPU kernel
  on a shared machine waits whole milliseconds for a thread that another process holds.
- The CPU kernel of every `cudnn_dsl` op registered inside is its CUDA kernel, so that `op(...)` on CPU
  tensors takes the dispatcher to the CUDA host path. Those ops stay so after the block (an op cannot be
  unregistered): use the instrument in a benchmark process of its own.

Outputs hold whatever the allocator left there (no kernel ran): time with it, never check results with it.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cudnn_dsl.build.pipeline import compile_shape  # noqa: E402
from cudnn_dsl.build.planner import Executable, Planner, host_tensors  # noqa: E402
from cudnn_dsl.build.steps import selected_index  # noqa: E402
from cudnn_dsl.run import compiled  # noqa: E402
from cudnn_dsl.target.library import Target, load_cudnn  # noqa: E402
from cudnn_dsl.torch_op.library import NAMESPACE  # noqa: E402

_BACKEND_EXECUTES = (
    "_execute_with_raw_ptrs",
    "_execute_ordered_pack",
    "_execute_plan_at_index",
    "_execute",
)
"""the frontend backend graph's launches that the instrument makes no-ops (the ordered form is separate: it
reads the buffers first)"""


class Stub:
    """What the instrument stood in for during the block."""

    def __init__(self, target: Target):
        self.target = target
        self.launches = 0
        """backend executes that did nothing"""


def _deviceless_planner(stub: Stub):
    class DevicelessPlanner(Planner):
        """A Planner on the CPU that plans with the real cuDNN library for the stub's target, storing nothing."""

        def __init__(self, graph, options, device, store=None, use_store=True, rebuild=False, progress=None):
            super().__init__(graph, options, device, store, False, False, progress)
            self.stand_in = load_cudnn().Handle(None, 0, 0)  # a Handle with no backend handle: set_stream records

        @property
        def handle(self):
            return self.stand_in

        @property
        def device_name(self) -> str:
            return stub.target.name

        def stage(self, inst, stop, dynamic=None, **planning):
            return compile_shape(self.graph, inst, self.options, stub.target, stop=stop, **planning)

        def executable_of(self, low, source, notes, workspace=None):
            g = low.g
            if workspace is None:
                workspace = g.get_workspace_size() if g._is_built else 0
            # the frontend's execute builds a plan it thinks unbuilt; this one is, as far as the launch goes
            g._is_built, g._plan_index = True, low.selected
            ws = torch.empty(max(workspace, 1), dtype=torch.uint8, device=self.device)
            name = g.get_plan_name_at_index(selected_index(g)) if low.plan_count else ""
            source = f"{source}, deviceless for {stub.target.name} (bench.nocudnn)"
            return Executable(low, self.handle, self.device, ws, host_tensors(low, self.device), name, source, notes)

    return DevicelessPlanner


class _NoStream:
    cuda_stream = 0


def _cpu_device(device):
    """compiled._device's stand-in: every graph on the CPU, as if it were the GPU."""
    return torch.device("cpu"), ""


@contextlib.contextmanager
def nocudnn(target: str = "h200"):
    """Within the block, compiled graphs and torch ops run their CUDA host path on CPU tensors with cuDNN's
    execute a no-op (see the module's docstring); yields a Stub that counts the launches."""
    stub = Stub(Target.named(target))
    cudnn = load_cudnn()
    backend = cudnn._compiled_module.backend_graph
    patches: list[tuple[object, str, object]] = []

    def patch(owner, name, value):
        patches.append((owner, name, getattr(owner, name, _ABSENT)))
        setattr(owner, name, value)

    def no_launch(*args, **kwargs):
        stub.launches += 1

    def ordered(self, schema, buffers, uids, bindings, workspace, o_uids, o_shapes, o_strides, handle, index):
        schema.read(buffers, uids, bindings, workspace, o_uids, o_shapes, o_strides)  # the frontend's own read
        stub.launches += 1

    impl = torch.library.Library.impl

    def routed_impl(self, op_name, fn, dispatch_key="", **kwargs):
        """On the cudnn_dsl namespace, the CUDA kernel also serves CPU tensors (and the CPU kernel is dropped)."""
        if self.ns != NAMESPACE or dispatch_key not in ("CPU", "CUDA"):
            return impl(self, op_name, fn, dispatch_key, **kwargs)
        if dispatch_key == "CUDA":
            impl(self, op_name, fn, "CUDA", **kwargs)
            impl(self, op_name, fn, "CPU", **kwargs)
        return None

    for name in _BACKEND_EXECUTES:
        patch(backend, name, no_launch)
    patch(backend, "_execute_ordered", ordered)
    patch(compiled, "_device", _cpu_device)
    patch(compiled, "Planner", _deviceless_planner(stub))
    patch(torch.library.Library, "impl", routed_impl)
    patch(torch.cuda, "current_stream", lambda device=None: _NoStream)
    patch(torch.cuda, "current_device", lambda: None)  # a CPU tensor's device.index
    patch(torch.cuda, "device", _NoDevice)
    patch(torch.cuda, "synchronize", lambda device=None: None)
    patch(torch._C, "_cuda_getCurrentRawStream", lambda index: 0)
    patch(torch._C, "_cuda_getDevice", lambda: -1)  # a CPU tensor's get_device()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield stub
    finally:
        torch.set_num_threads(threads)
        for owner, name, old in reversed(patches):
            if old is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, old)


_ABSENT = object()


class _NoDevice(contextlib.nullcontext):
    """torch.cuda.device's stand-in: there is one device, always current."""

    def __init__(self, device=None):
        super().__init__()
