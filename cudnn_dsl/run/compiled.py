"""A compiled graph: checks what the caller binds, runs each shape as its parts, captures CUDA graphs.

Building plans is build's (a CompiledGraph holds a Planner), packing buffers by UID and launching is
run.launch's; this module checks what the caller binds, finds the parts each shape runs as (run.parts: one
cuDNN graph, or several), captures CUDA graphs, and runs the reference.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from cudnn_dsl.build.constraints import NotAllowed
from cudnn_dsl.build.lower import Lowered
from cudnn_dsl.build.pipeline import compile_shape
from cudnn_dsl.build.planner import Executable, Planner
from cudnn_dsl.run.buffers import BindingError, check_binding, check_inputs, outputs_of, snapshot, view
from cudnn_dsl.run.compare import Comparison, compare_outputs
from cudnn_dsl.run.indices import check_indices
from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.launch import Bound, arguments, number
from cudnn_dsl.run.launch_plan import LaunchPlan, LaunchPlans
from cudnn_dsl.run.partition import short, tuned_why
from cudnn_dsl.run.parts import BoundParts, Parts, Whole, in_parts
from cudnn_dsl.run.reference import drawn_values, run_reference
from cudnn_dsl.store.files import StoreProblem
from cudnn_dsl.store.plans import PartitionChoice, PlanStore
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.library import DEFAULT_TARGET, BackendUnavailable, Target
from dsl.diagnostics import DslError, RuleError
from dsl.ir import Graph, Instance, NotFound
from dsl.options import Options
from dsl.types import LAYOUTS, dense_strides, fmt_shape, layout_order


@attrs.define
class Replay:
    """An execution captured into a CUDA graph; `replay()` relaunches it with one call."""

    cuda_graph: Any
    bound: Bound | BoundParts

    @property
    def outputs(self) -> dict[str, torch.Tensor]:
        return self.bound.outputs

    def replay(self) -> dict[str, torch.Tensor]:
        self.cuda_graph.replay()
        return self.bound.outputs


NO_GPU = (
    "no CUDA GPU is visible here; cg.reference(...) runs the PyTorch reference on the CPU, and "
    "cg.plan(target='h200') asks cuDNN for plans without a device"
)


def capture(bound: Bound | BoundParts, device, repeat: int = 1) -> Replay:
    """Captures `repeat` runs of a bound graph into one CUDA graph (the handles follow the capture stream)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm up off the default stream, as capture wants
        bound.set_stream(side.cuda_stream)
        bound.run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            bound.set_stream(torch.cuda.current_stream(device).cuda_stream)
            for _ in range(repeat):
                bound.run()
    finally:
        bound.set_stream(torch.cuda.current_stream(device).cuda_stream)
    return Replay(graph, bound)


def _device(device: int | str | None) -> tuple[torch.device | None, str]:
    """(the CUDA device, with its index; or None and why there is none)."""
    if device is not None and not isinstance(device, int) and torch.device(device).type == "cpu":
        return None, "device='cpu' was asked for"
    if not torch.cuda.is_available():
        if device is not None:
            raise BackendUnavailable(f"device {device!r}: {NO_GPU}")
        return None, NO_GPU
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    if d.type != "cuda":
        raise ValueError(f"cudnn-dsl runs graphs on CUDA devices, not {d}")
    return (d if d.index is not None else torch.device("cuda", torch.cuda.current_device())), ""


def layout_name(shape: tuple[int, ...], strides: tuple[int, ...]) -> str:
    """The named layout these strides are at this shape (a rank's own name first: nchw before row_major), else
    the strides themselves; a dim of size 1 addresses nothing, so its stride is free."""
    rank = len(shape)
    names = {4: ("nchw", "nhwc"), 5: ("ncdhw", "ndhwc")}.get(rank, ()) + ("row_major", "col_major", "channels_last")
    for name in (n for n in names if n in LAYOUTS):
        try:
            want = dense_strides(shape, layout_order(name, rank))
        except RuleError:
            continue
        if all(d <= 1 or s == w for d, s, w in zip(shape, strides, want)):
            return name
    return f"strides {list(strides)}"


@attrs.frozen
class Spec:
    """An input or output of a graph as a torch caller binds it (cg.inputs, cg.outputs): its torch dtype (a bool
    tensor binds as its bit-packed uint8 bytes), its declared dims (a symbolic one by name), the first shape's
    sizes and strides, and the layout they are."""

    name: str
    kind: str
    dtype: Any
    dims: tuple[int | str, ...]
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    layout: str
    value: float | int | None = None
    """a scalar's declared value"""
    into: str | None = None
    """the input an output is written over"""

    def __repr__(self) -> str:
        if self.kind == "scalar":
            return f"scalar {self.name}: {self.dtype} = {self.value}"
        where = f" in {self.into}" if self.into else ""
        return f"{self.kind} {self.name}{where}: {self.dtype}{fmt_shape(self.dims)} {self.layout}"


def _dims(graph: Graph, name: str) -> tuple[int | str, ...]:
    """A value's dims over the typed shapes: an input's as declared; an output's as the first shape has them, a
    symbol's name where a dim equals that symbol in every typed shape."""
    declared = dict(graph.input_dims)
    if name in declared:
        return tuple(declared[name])
    bindings = [dict(i.binding) for i in graph.instances]
    shapes = [i.type(name).shape for i in graph.instances]
    out = []
    for axis, size in enumerate(shapes[0]):
        sizes = [s[axis] for s in shapes]
        same = [k for k in bindings[0] if len(set(sizes)) > 1 and all(b[k] == n for b, n in zip(bindings, sizes))]
        out.append(same[0] if same else size)
    return tuple(out)


def specs(graph: Graph, values) -> dict[str, Spec]:
    """name -> Spec of each of these values of the graph (of the first shape, for a dynamic graph)."""
    inst = graph.instances[0]
    out = {}
    for v in values:
        t = inst.type(v.name)
        packed = t.dtype == "bool"
        out[v.name] = Spec(
            v.name,
            v.kind,
            torch.uint8 if packed and v.kind != "scalar" else torch_dtype(t.dtype),
            () if v.kind == "scalar" else _dims(graph, v.name),
            t.shape,
            t.strides,
            "bit-packed bool" if packed else layout_name(t.shape, t.strides),
            getattr(v, "scalar", None),
            getattr(v, "into", None),
        )
    return out


def _named(tensors: dict | None, named: dict) -> dict:
    if tensors is not None and named:
        raise TypeError("give the tensors as one dict or as keywords, not both")
    return dict(tensors if tensors is not None else named)


class CompiledGraph:
    """A checked graph, compiled for the local GPU on first use of each shape.

    Call it with torch tensors by name, as keywords or as one dict (the dict form also takes
    names such as `out`): ``y = cg(x=x, w=w, b=b)["out"]``. Scalars may be given (a number) or
    left to their declared value. Without a GPU, the reference and deviceless planning still work.
    """

    def __init__(
        self,
        graph: Graph,
        options: Options | None = None,
        device: int | str | None = None,
        progress=None,
        use_store: bool = True,
        rebuild: bool = False,
        store: PlanStore | None = None,
    ):
        self.graph = graph
        self.options = options or graph.options
        self.device, self.no_gpu = _device(device)
        self.planner = (
            Planner(graph, self.options, self.device, store, use_store, rebuild, progress)
            if self.device is not None
            else None
        )
        self._parts: dict[tuple, Whole | Parts] = {}
        self.why: dict[tuple, str] = {}
        """binding -> why it runs whole or in these parts, where tune chose ('tuned: whole, 20.1 µs vs ...')"""
        self.notes: list[str] = []
        """what the runtime said on the way (a stored partition that could not be used)"""
        if self.planner is not None and self.options.require_store_hit:
            self.planner.require_tuned(graph.instances)

    # ---- specs ------------------------------------------------------------------

    @property
    def inputs(self) -> dict[str, Spec]:
        """name -> Spec of each input, in the graph's order: a torch dtype, dims and layout (of the first shape,
        for a dynamic graph), worked out when asked (planning reads the graph, never these)."""
        return specs(self.graph, self.graph.inputs)

    @property
    def outputs(self) -> dict[str, Spec]:
        """name -> Spec of each output, as `inputs`."""
        return specs(self.graph, self.graph.outputs)

    def __repr__(self) -> str:
        where = str(self.device) if self.device is not None else "no GPU: the reference, and planning deviceless"
        lines = [f"CompiledGraph '{self.graph.name}' ({self.graph.loc}) on {where}"]
        lines += [f"  {s!r}" for s in (*self.inputs.values(), *self.outputs.values())]
        lines += [f"  dim {s.name} in {s.text}" for s in self.graph.symbols]
        return "\n".join(lines)

    def instance_for(self, tensors: dict[str, Any]) -> Instance:
        """The declared shape that the given inputs match; a clear error when none does."""
        if len(self.graph.instances) == 1 and self.graph.typer is None:
            return self.graph.instances[0]
        if self.graph.typer is not None:  # a range: read the dims off the inputs, type that shape
            shapes = {k: tuple(t.shape) for k, t in tensors.items() if isinstance(t, torch.Tensor)}
            try:
                return self.graph.instance(self.graph.binding_of(shapes))
            except NotFound as e:
                raise BindingError(str(e)) from None
        for inst in self.graph.instances:
            if all(
                tuple(tensors[v.name].shape) == inst.type(v.name).shape
                for v in self.graph.device_inputs
                if isinstance(tensors.get(v.name), torch.Tensor)
            ):
                return inst
        given = ", ".join(f"{k} {fmt_shape(tuple(t.shape))}" for k, t in tensors.items() if isinstance(t, torch.Tensor))
        raise BindingError(
            f"graph '{self.graph.name}': inputs ({given}) match none of the declared shapes "
            f"({self.graph.declared_shapes})"
        )

    def allocate_inputs(
        self, binding: dict[str, int] | None = None, seed: int | None = None
    ) -> dict[str, torch.Tensor]:
        """Seeded inputs of one shape, on the GPU (on the CPU when there is none)."""
        inst = self.graph.instance(binding)
        return generate_inputs(self.graph, inst, self.device or "cpu", self.options.seed if seed is None else seed)

    # ---- compile and run ------------------------------------------------------------

    def _planner(self) -> Planner:
        if self.planner is None:
            raise BackendUnavailable(f"graph '{self.graph.name}' cannot run: {self.no_gpu}")
        return self.planner

    def executable(self, inst: Instance) -> Executable:
        return compile_shape(self.graph, inst, self.options, stop="executable", planner=self._planner())

    def plan(self, target: str | Target = DEFAULT_TARGET, binding: dict[str, int] | None = None) -> Lowered:
        """Asks cuDNN for a target GPU's plans without a device (needs no GPU)."""
        target = Target.named(target) if isinstance(target, str) else target
        return compile_shape(self.graph, self.graph.instance(binding), self.options, target)

    def bind_outputs(self, inst: Instance, tensors: dict, out: dict | None = None) -> dict[str, torch.Tensor]:
        """Checks every input (and given output) buffer, and the index inputs' values; returns the outputs,
        allocated where not given (an output in place is its input's memory)."""
        device = self._planner().device
        check_inputs(self.graph, inst, tensors, device)
        check_indices(self.graph, inst, tensors)
        out = out or {}
        for v in self.graph.outputs:
            if v.name in out:
                if v.into is not None:
                    raise BindingError(f"output '{v.name}' is written in place of '{v.into}'; bind '{v.into}'", v.loc)
                check_binding(v.name, out[v.name], inst.type(v.name), device, v.loc)
        unknown = set(out) - {v.name for v in self.graph.outputs}
        if unknown:
            raise BindingError(f"graph '{self.graph.name}' has no output {', '.join(sorted(unknown))}")
        return outputs_of(self.graph, inst, tensors, device, out)

    def bind(self, tensors: dict | None = None, out: dict | None = None, /, **named) -> Bound | BoundParts:
        """Checks the buffers once and returns a Bound whose run() launches with no checks (a BoundParts,
        for a graph run in parts: every part bound once, launched back to back)."""
        tensors = _named(tensors, named)
        inst = self.instance_for(tensors)
        outputs = self.bind_outputs(inst, tensors, out)  # before the build: a typo costs no compile
        return self.parts(inst).bind(tensors, outputs)

    def launch_plan(self, tensors: dict) -> LaunchPlan:
        """The launches of the shape these arguments (by name, checked in full here) are, bound on them, for
        calls again and again with only their alignment checked (run.launch_plan: what the torch op and the
        training paths run)."""
        inst = self.instance_for(tensors)
        outputs = self.bind_outputs(inst, tensors)  # before the build: a typo costs no compile
        names, device = arguments(self.graph)[0], self._planner().device

        def check(values) -> None:
            check_inputs(self.graph, inst, dict(zip(names, values)), device)

        return self.parts(inst).launch_plan(tensors, outputs, check)

    def capture(self, tensors: dict | None = None, out: dict | None = None, /, **named) -> Replay:
        """Captures one execution (every part, for a graph run in parts) into a CUDA graph."""
        return capture(self.bind(_named(tensors, named), out), self.device)

    def parts(self, inst: Instance) -> Whole | Parts:
        """The parts this shape runs as, found and built on first use: the partition `tune` kept for it (in the
        plan store), else the whole graph (one part), else the fewest parts when cuDNN declines it whole
        (`option split`). Raises cuDNN's refusal when splitting is off or a plan is pinned (`--plan` names a
        plan of the whole graph)."""
        if inst.binding not in self._parts:
            choice = self._tuned(inst)
            if choice is not None:
                self.why[inst.binding] = tuned_why(self.graph, choice)
            if choice is not None and choice.cuts:
                try:
                    return self.use_partition(inst, choice.cuts, self.why[inst.binding])
                except DslError as e:  # a part that no longer builds (cuDNN's own refusal): found afresh
                    self.notes.append(f"the partition tune kept does not build here ({e.diagnostics[0].message})")
                    del self.why[inst.binding]
            try:
                self.executable(inst)
                self._parts[inst.binding] = Whole(self, inst)
            except DslError as e:
                if not self.options.split or self._planner().plan_spec is not None or isinstance(e, NotAllowed):
                    raise
                self.why.pop(inst.binding, None)  # a stored 'whole' that no longer builds: not why it runs in parts
                self.use_partition(inst, None, declined=short(e.diagnostics[0].message))
        return self._parts[inst.binding]

    def use_partition(
        self, inst: Instance, cuts: tuple[int, ...] | None, chosen: str = "", declined: str = "", first=None
    ) -> Whole | Parts:
        """Runs this shape as the parts starting at `cuts` from now on: () the whole graph, None the fewest
        parts cuDNN accepts (it `declined` the whole; or the first part ends at `first`); `chosen` says why."""
        if cuts == ():
            self.executable(inst)
            self._parts[inst.binding] = Whole(self, inst)
        else:
            self._parts[inst.binding] = in_parts(
                self.graph, inst, self.options, declined, self._part, cuts, chosen, first
            )
        return self._parts[inst.binding]

    def forget_partition(self, inst: Instance) -> None:
        """Drops this shape's parts: its next run finds them afresh (tune's stored choice, else whole, else the
        fewest parts)."""
        self._parts.pop(inst.binding, None)
        self.why.pop(inst.binding, None)

    def _tuned(self, inst: Instance) -> PartitionChoice | None:
        """The partition tune kept for this shape (in the plan store); None when it timed none, or the store,
        or splitting, is off, or a plan is pinned."""
        p = self._planner()
        if not p.use_store or p.rebuild or p.plan_spec is not None or not self.options.split:
            return None
        try:
            choice = p.store.get_partition(p.key(inst))
        except StoreProblem as e:
            self.notes.append(f"plan store: {e}; partition not reused")
            return None
        return choice if choice is None or all(c < len(self.graph.nodes) for c in choice.cuts) else None

    def _part(self, part: Graph) -> CompiledGraph:
        p = self._planner()
        options = attrs.evolve(self.options, require_store_hit=False)  # the whole graph's plan is what was required
        return CompiledGraph(part, options, self.device, p.progress, p.use_store, p.rebuild, p.store)

    def __call__(self, tensors: dict | None = None, out: dict | None = None, /, **named) -> dict[str, torch.Tensor]:
        tensors = _named(tensors, named)
        inst = self.instance_for(tensors)
        outputs = self.bind_outputs(inst, tensors, out)
        self.parts(inst).run(tensors, outputs)  # unchecked: the buffers were checked above
        return outputs

    def drawn(self, inst: Instance, outputs: dict) -> dict[str, torch.Tensor]:
        """What the last launch of this shape drew on the device and the reference reads (seeded dropout's
        mask, reference.drawn_values): from `outputs` when the graph outputs it, else from the scratch
        memory of the executable (of each part, for a graph run in parts)."""
        names = drawn_values(self.graph, inst)
        found = {n: outputs[n] for n in names if n in outputs}
        if len(found) == len(names):
            return found
        for exe in self._parts.get(inst.binding, Whole(self, inst)).executables():
            found.update((n, exe.host[u]) for n, u in exe.low.scratch.items() if n in names and n not in found)
        return found

    def reference(self, tensors: dict | None = None, drawn: dict | None = None, /, **named) -> dict[str, torch.Tensor]:
        """The PyTorch reference on the inputs' own device (checked like a binding: names, shapes, dtypes, the
        index inputs' values); `drawn`: what a launch drew on the device (`drawn`), for the graphs whose
        reference needs it."""
        tensors = _named(tensors, named)
        inst = self.instance_for(tensors)
        check_inputs(self.graph, inst, tensors, None)
        check_indices(self.graph, inst, tensors)
        devices = {t.device for t in tensors.values() if isinstance(t, torch.Tensor)}
        if len(devices) > 1:
            raise BindingError(
                f"graph '{self.graph.name}': inputs are on several devices ({sorted(map(str, devices))})"
            )
        return run_reference(self.graph, inst, tensors, devices.pop() if devices else "cpu", drawn=drawn)

    def check(
        self,
        tensors: dict | None = None,
        atol: dict | float | None = None,
        rtol: dict | float | None = None,
        /,
        **named,
    ) -> list[Comparison]:
        """Runs the graph and its reference on the same inputs and compares every output."""
        tensors = _named(tensors, named)
        before = snapshot(self.graph, tensors)  # what an in-place output overwrites, as the reference reads it
        got = self(tensors)
        want = self.reference(before, self.drawn(self.instance_for(tensors), got))
        return compare_outputs(self.graph, self.instance_for(tensors), got, want, self.options, atol, rtol)


class Calls:
    """A compiled graph called by name again and again, as a training step calls its forward and backward
    graphs: what the checked call returns (every output by name; one in place, its input's memory), through
    launch plans (run.launch_plan), so that only the first call of each kind of arguments is checked in full.
    A later call's names beyond the graph's are not looked at."""

    def __init__(self, cg: CompiledGraph):
        self.cg = cg
        self.names, self.scalars = arguments(cg.graph)
        self.fresh = [v.name for v in cg.graph.outputs if v.into is None]
        every = self.names + tuple(v.name for v in self.scalars)
        self.plans = LaunchPlans(len(self.names), lambda values: cg.launch_plan(dict(zip(every, values))))

    def __call__(self, tensors: dict) -> dict[str, torch.Tensor]:
        g = self.cg.graph
        try:
            bound = tuple(tensors[n] for n in self.names)
        except KeyError:  # the checked call says what is missing
            return self.cg(tensors)
        values = bound + tuple(number(tensors.get(v.name, v.scalar)) for v in self.scalars)
        outs = dict(zip(self.fresh, self.plans(values)))
        if g.in_place:
            inst = self.cg.instance_for(tensors)
            outs.update((v.name, view(g.value(v.into), inst, tensors)) for v in g.in_place)
        return {v.name: outs[v.name] for v in g.outputs}
