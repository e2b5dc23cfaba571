"""Backend layer: IR graph instance -> cuDNN Frontend graph -> execution plans.

The build walks validate -> build_operation_graph -> create_execution_plans -> check_support ->
build_plans, timing each step. Whatever cuDNN raises is reported at the .cdg location of the op
it concerns (cuDNN nodes are named after their IR results), with cuDNN's own words kept.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

import attrs

from cudnn_dsl.backend import Target, device_properties, load_cudnn
from cudnn_dsl.dtypes import cudnn_type
from cudnn_dsl.ops import BACKENDS
from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Graph, Instance, Node
from dsl.types import TensorType

STEPS = ("validate", "build_operation_graph", "create_execution_plans", "check_support", "build_plans")


@attrs.define
class LowerCtx:
    """What a lowering function gets: the cuDNN graph, the node, and helpers."""

    cudnn: Any
    g: Any
    node: Node
    in_types: list
    compute: str
    new_constant: Callable[[float, int], Any]

    @property
    def name(self) -> str:
        return self.node.outputs[0]

    @property
    def rank(self) -> int:
        return len(self.in_types[0].shape)

    @property
    def float_type(self):
        return cudnn_type(self.cudnn, "float")

    @property
    def kw(self) -> dict:
        return {"name": self.name, "compute_data_type": cudnn_type(self.cudnn, self.compute)}

    def constant(self, value: float):
        return self.new_constant(value, self.rank)


@attrs.define
class Lowered:
    """A cuDNN graph built from one instance of an IR graph, before or after planning."""

    graph: Graph
    instance: Instance
    g: Any
    host_values: dict[int, tuple[float, str]]
    """uid -> (value, dtype) of every pass-by-value tensor, user scalars included"""
    timings: dict[str, float] = attrs.Factory(dict)
    plan_count: int = 0
    skipped: dict[str, str] = attrs.Factory(dict)
    """step -> why it could not run here (deviceless planning of runtime-compiled engines)"""


def lower(graph: Graph, instance: Instance, *, handle=None, target: Target | None = None,
          kernel_cache=None, cudnn=None) -> Lowered:
    """Emits the cuDNN Frontend graph calls for one instance (no planning yet).

    ``cudnn`` defaults to the real frontend; `emit` passes a recorder that writes the same
    calls out as a script.
    """
    cudnn = cudnn or load_cudnn()
    kwargs: dict[str, Any] = {
        "name": graph.name,
        "intermediate_data_type": cudnn_type(cudnn, graph.intermediate),
        "compute_data_type": cudnn_type(cudnn, graph.compute),
    }
    if graph.io:
        kwargs["io_data_type"] = cudnn_type(cudnn, graph.io)
    if handle is not None:
        kwargs["handle"] = handle
    if target is not None:
        kwargs["device_property"] = device_properties(target)
        kwargs["sm_version"] = target.sm_version
    if kernel_cache is not None:
        kwargs["kernel_cache"] = kernel_cache
        kwargs["is_dynamic_shape_enabled"] = True
    g = cudnn.pygraph(**kwargs)
    tensors: dict[str, Any] = {}
    host: dict[int, tuple[float, str]] = {}
    next_uid = [max(v.uid for v in graph.values) + 1]

    def by_value(name: str, uid: int, value: float, dtype: str, rank: int):
        host[uid] = (value, dtype)
        return g.tensor(name=name, dim=[1] * rank, stride=[1] * rank, data_type=cudnn_type(cudnn, dtype),
                        is_pass_by_value=True, uid=uid)

    def new_constant(value: float, rank: int):
        uid = next_uid[0]
        next_uid[0] += 1
        return by_value(f"const_uid{uid}", uid, value, "float", rank)

    for v in graph.values:
        if v.kind == "input":
            t = instance.type(v.name)
            tensors[v.name] = g.tensor(name=v.name, dim=list(t.shape), stride=list(t.strides),
                                       data_type=cudnn_type(cudnn, t.dtype), uid=v.uid)
        elif v.kind in ("scalar", "const"):
            rank = len(instance.type(v.name).shape)
            tensors[v.name] = by_value(v.name, v.uid, v.scalar, v.dtype, rank)
    for node in graph.nodes:
        in_types = [instance.type(i) if i else None for i in node.inputs]
        ctx = LowerCtx(cudnn, g, node, in_types, node.compute, new_constant)
        ins = [tensors[i] if i else None for i in node.inputs]
        try:
            outs = BACKENDS[node.op].lower(ctx, ins, node.attr)
        except Exception as e:  # noqa: BLE001 - cuDNN's builders raise many types
            raise DslError(Diagnostic("error", f"cuDNN rejected {node.op}: {_clean(e)}", node.loc)) from None
        for name, t in zip(node.outputs, outs):
            _stamp(cudnn, t, graph.value(name), instance.type(name))
            tensors[name] = t
    return Lowered(graph, instance, g, host)


def _stamp(cudnn, t, value, ty: TensorType) -> None:
    t.set_name(value.name)
    t.set_uid(value.uid)
    t.set_data_type(cudnn_type(cudnn, ty.dtype))
    t.set_dim(list(ty.shape))
    t.set_stride(list(ty.strides))
    if value.kind == "output":
        t.set_output(True)


def heur_modes(cudnn, names) -> list:
    return [getattr(cudnn.heur_mode, n) for n in names]


def plan(low: Lowered, heuristics=("A", "FALLBACK"), policy: str = "heuristics_choice",
         workspace_limit: int | None = None, target_name: str = "this GPU", progress=None,
         deviceless: bool = False, steps=STEPS) -> Lowered:
    """Runs the five build steps, timing each; raises DslError located at the culprit op.

    Deviceless, build_plans of a runtime-compiled engine compiles but cannot load the kernel
    without a GPU driver; that step is then recorded as skipped, with the reason.
    """
    cudnn = load_cudnn()
    g = low.g
    actions = {
        "validate": g.validate,
        "build_operation_graph": g.build_operation_graph,
        "create_execution_plans": lambda: g.create_execution_plans(heur_modes(cudnn, heuristics)),
        "check_support": lambda: _check_support(g, workspace_limit),
        "build_plans": lambda: g.build_plans(
            cudnn.build_plan_policy.ALL if policy == "all" else cudnn.build_plan_policy.HEURISTICS_CHOICE),
    }
    if deviceless:  # the first plan tells whether kernels load here; compiling every one would not
        actions["build_plans"] = lambda: g.build_plan_at_index(0)
    for step in steps:
        if progress:
            progress(step)
        t0 = time.perf_counter()
        try:
            actions[step]()
        except Exception as e:  # noqa: BLE001 - cuDNN raises RuntimeError, its own errors, ValueError
            if deviceless and step == "build_plans" and "CUDA_DRIVER" in str(e):
                low.skipped[step] = "the chosen engine compiles its kernel at run time, and loading it needs a GPU"
                continue
            raise DslError(_diagnose(low, step, e, heuristics, target_name)) from None
        low.timings[step] = time.perf_counter() - t0
        if step == "create_execution_plans":
            low.plan_count = g.get_execution_plan_count()
    return low


def timings_text(timings: dict[str, float]) -> str:
    """'validate 0.3 ms · build_operation_graph 1.1 ms · ...'"""
    return " · ".join(f"{k} {v * 1e3:.1f} ms" for k, v in timings.items())


def first_plan_name(low: Lowered) -> str:
    return low.g.get_plan_name_at_index(0) if low.plan_count else "-"


def _check_support(g, workspace_limit):
    if workspace_limit is not None:
        g.deselect_workspace_greater_than(workspace_limit)
    g.check_support()


def _clean(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    return re.sub(r"\s+", " ", text)[:800]


_KIND_WORDS = {
    "reduction": ("reduction",),
    "matmul": ("matmul",),
    "conv": ("conv_fprop", "conv_dgrad", "conv_wgrad"),
    "transpose": ("transpose",),
    "slice": ("slice",),
    "reshape": ("reshape",),
    "norm": ("layernorm", "rmsnorm", "batchnorm_inference"),
    "sdpa": ("sdpa",),
}


def _diagnose(low: Lowered, step: str, e: Exception, heuristics, target_name: str) -> Diagnostic:
    msg = _clean(e)
    graph = low.graph
    culprit = None
    for node in graph.nodes:  # the node whose result name appears in cuDNN's message
        if any(re.search(rf"(?<![\w]){re.escape(o)}(?![\w])", msg) for o in node.outputs):
            culprit = node
    if culprit is None:  # else the only node of the kind cuDNN's message names
        for word, ops in _KIND_WORDS.items():
            kind = [n for n in graph.nodes if n.op in ops]
            if word in msg.lower() and len(kind) == 1:
                culprit = kind[0]
                break
    loc = culprit.loc if culprit else graph.loc
    where = f"{culprit.op} " if culprit else ""
    notes = []
    if step in ("create_execution_plans", "check_support", "build_plans"):
        types = sorted({low.instance.type(v.name).dtype for v in graph.values if v.kind in ("input", "output")})
        ops = ", ".join(dict.fromkeys(n.op for n in graph.nodes))
        notes.append((
            f"no cuDNN engine for {target_name} supports this graph (ops: {ops}; io dtypes: {', '.join(types)}; "
            f"heuristics {', '.join(heuristics)}). Try: NHWC layouts for conv tensors, half/bf16 inputs with float "
            f"compute, channel counts that are multiples of 8, 'option heuristics = [A, B, FALLBACK]', or splitting "
            f"the graph where an op cannot fuse with its neighbours", None))
    if low.instance.binding:
        notes.append((f"with {low.instance.label}", None))
    return Diagnostic("error", f"cuDNN {step} failed for {where}graph '{graph.name}': {msg}", loc, tuple(notes))
