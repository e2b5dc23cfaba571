"""One instance of an IR graph -> the cuDNN Frontend graph calls (no planning).

Every cuDNN tensor is named after its IR value, so that cuDNN's messages can be mapped back to
the .cdg line of the op they concern (build.steps does that). `emit` runs this same pass against a
recorder, so the ejected script cannot drift from what `run` builds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from cudnn_dsl.ops import IMPLS
from cudnn_dsl.target.dtypes import cudnn_type
from cudnn_dsl.target.library import Target, device_properties, load_cudnn
from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Graph, Instance, Node
from dsl.ops import OPS
from dsl.types import TensorType, storage_elements


class NotLowered(Exception):
    """A lowering refused by the recorder it runs against (an emitter), not by cuDNN: its words are said as they
    are, at the op."""


@attrs.define
class LowerCtx:
    """What a lowering function gets: the cuDNN graph, the node, and helpers."""

    cudnn: Any
    g: Any
    node: Node
    in_types: list
    compute: str
    new_constant: Callable[[float, int, int | None], Any]
    tensors: dict[str, Any] = attrs.Factory(dict)
    """the graph's cuDNN tensors lowered so far, by name (a scalar an attribute names among them)"""

    @property
    def name(self) -> str:
        return self.node.outputs[0]

    @property
    def rank(self) -> int:
        """The rank cuDNN sees (at least MIN_RANK)."""
        return max(len(self.in_types[0].shape), MIN_RANK)

    @property
    def lead(self) -> int:
        """Unit dims put in front of the first input for cuDNN: add it to an attribute's axis."""
        return lead_dims(len(self.in_types[0].shape))

    @property
    def kw(self) -> dict:
        return {"name": self.name, "compute_data_type": cudnn_type(self.cudnn, self.compute)}

    def constant(self, value: float, attr: str | None = None):
        """A pass-by-value float tensor holding `value`; `attr` names the attribute it carries, whose
        declared uid (`epsilon=1e-5 uid=7`) it takes, or the declared scalar's own tensor where the attribute
        names one (`epsilon=eps`); the registry marks such attributes `tensor`."""
        named = dict(self.node.scalars)
        if attr in named:
            return self.tensors[named[attr]]
        return self.new_constant(value, self.rank, dict(self.node.uids).get(attr))


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
    allowed: list[int] | None = None
    """indices of the plans the options' constraints leave (None: every plan); a pinned plan's alone"""
    selected: int = 0
    """index of the plan built (deviceless: the one whose kernel needed a GPU to load)"""
    skipped: dict[str, str] = attrs.Factory(dict)
    """step -> why it could not run here (deviceless planning of runtime-compiled engines)"""
    scratch: dict[str, int] = attrs.Factory(dict)
    """name -> uid of each value cuDNN must write that no output asks for (OpSig.statistics): the runtime
    binds memory of its own to it"""


def lower(
    graph: Graph,
    instance: Instance,
    *,
    handle=None,
    target: Target | None = None,
    kernel_cache=None,
    cudnn=None,
    override_shapes: bool = False,
) -> Lowered:
    """Emits the cuDNN Frontend graph calls for one instance (no planning yet).

    ``cudnn`` defaults to the real frontend; `emit` passes a recorder that writes the same
    calls out as a script. `override_shapes` builds the graph in cuDNN's override-shape mode (9.21+):
    its plan then runs other shapes given at execute time (`override_args`).
    """
    cudnn = cudnn or load_cudnn()
    # An unset type is passed as NOT_SET: left out, the pygraph would fill it (from io_data_type, else FLOAT), and
    # the frontend's graph would say a type the file does not.
    kwargs: dict[str, Any] = {
        "name": graph.name,
        "intermediate_data_type": _graph_type(cudnn, graph.intermediate),
        "compute_data_type": _graph_type(cudnn, graph.compute),
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
    if override_shapes:
        kwargs["is_override_shape_enabled"] = True
    g = cudnn.pygraph(**kwargs)
    tensors: dict[str, Any] = {}
    host: dict[int, tuple[float, str]] = {}
    scratch: dict[str, int] = {}
    next_uid = [max([v.uid for v in graph.values] + [u for n in graph.nodes for _, u in n.uids]) + 1]

    def by_value(name: str, uid: int, value: float, dtype: str, dims: list[int]):
        host[uid] = (value, dtype)
        return g.tensor(
            name=name,
            dim=dims,
            stride=[1] * len(dims),
            data_type=cudnn_type(cudnn, dtype),
            is_pass_by_value=True,
            uid=uid,
        )

    def new_constant(value: float, rank: int, uid: int | None = None):
        if uid is None:
            uid = next_uid[0]
            next_uid[0] += 1
        return by_value(f"const_uid{uid}", uid, value, "float", [1] * rank)

    left, lifted = left_to_offsets(graph, instance), lifted_ranks(graph, instance)
    for v in graph.values:
        if v.kind == "input":
            t = instance.type(v.name)
            dims, strides = cudnn_dims(t, v.name in left, lifted.get(v.name, 0))
            tensors[v.name] = g.tensor(
                name=v.name, dim=dims, stride=strides, data_type=cudnn_type(cudnn, t.dtype), uid=v.uid
            )
        elif v.kind in ("scalar", "const"):
            dims = v.dims or (1,) * max(len(instance.type(v.name).shape), MIN_RANK)
            tensors[v.name] = by_value(v.name, v.uid, v.scalar, v.dtype, list(dims))
    for index, node in enumerate(graph.nodes):
        in_types = [instance.type(i) if i else None for i in node.inputs]
        ctx = LowerCtx(cudnn, g, node, in_types, node.compute, new_constant, tensors)
        ins = [tensors[i] if i else None for i in node.inputs]
        try:
            outs = IMPLS[node.op].lower(ctx, ins, instance.attrs(index))
        except Exception as e:  # noqa: BLE001 - cuDNN's builders raise many types
            why = f"{node.op}: {e}" if isinstance(e, NotLowered) else f"cuDNN rejected {node.op}: {clean(e)}"
            raise DslError(Diagnostic("error", why, node.loc)) from None
        for name, t in zip(node.outputs, outs):
            _stamp(cudnn, t, graph.value(name), instance.type(name), name in left)
            tensors[name] = t
        impl, declared, stats = IMPLS[node.op], OPS[node.op].statistics, node.outputs[1:]
        asked = any(graph.value(n).kind == "output" for n in stats)
        written = list(stats) if declared is not None and declared.all_written(asked) else []
        if impl.drawn is not None:  # cuDNN's own random draws: the reference reads them (seeded dropout)
            written += [node.outputs[i] for i in impl.drawn(instance.attrs(index))]
        for name in written:
            if graph.value(name).kind != "output":
                tensors[name].set_output(True)
                scratch[name] = graph.value(name).uid
    return Lowered(graph, instance, g, host, scratch=scratch)


MIN_RANK = 3
"""cuDNN's engines take tensors of rank 3 and up: 9.28 plans no rank-2 relu or matmul for an H200
(tests/test_quirks.py), 9.19 planned a rank-2 relu ([64, 256]) and computed it wrong on the H200. Every tensor
reaches cuDNN with at least three dims, unit ones in front."""


def lead_dims(rank: int) -> int:
    return max(MIN_RANK - rank, 0)


def left_to_offsets(graph: Graph, instance: Instance) -> set[str]:
    """The tensors whose batch stride ragged offsets replace, declared `_` (0 in their type): those a node's
    offsets place, with batch stride 0."""
    out = set()
    for n in graph.nodes:
        for port in OPS[n.op].placed(n.inputs):
            name = n.inputs[port] if port >= 0 else n.outputs[-1 - port]
            if instance.type(name).strides[0] == 0:
                out.add(name)
    return out


def lifted_ranks(graph: Graph, instance: Instance) -> dict[str, int]:
    """The one-element inputs that pointwise ops read at a higher rank (`input s : float[1]` in `x * s`, x of rank
    4: the checker broadcasts it), each with that rank: cuDNN wants a pointwise op's operands at one rank, so the
    input reaches it at the rank of the ops that read it (its memory is the one element either way). Where its
    readers' ranks differ, or one is no pointwise op, it keeps its own, and cuDNN says what it refuses."""
    ranks: dict[str, set[int]] = {}
    for n in graph.nodes:
        pointwise = OPS[n.op].family == "pointwise"
        for i in n.inputs:
            if i is not None and graph.value(i).kind == "input":
                ranks.setdefault(i, set()).add(len(instance.type(n.outputs[0]).shape) if pointwise else -1)
    out = {}
    for name, rs in ranks.items():
        t = instance.type(name)
        if len(rs) == 1 and min(rs) > len(t.shape) and all(d == 1 for d in t.shape):
            out[name] = min(rs)
    return out


def cudnn_dims(ty: TensorType, left: bool = False, rank: int = 0) -> tuple[list[int], list[int]]:
    """A tensor's dims and strides as cuDNN gets them: unit dims in front up to MIN_RANK, or `rank` (their
    stride, the tensor's extent, makes the layout the same memory). A batch stride left to ragged offsets
    (`left`) is one batch slice's extent, S*H*D for [B, H, S, D]: cuDNN reads offset[b] in its place, and this
    is what TransformerEngine's THD graphs and the frontend's ragged tests give it."""
    lead = max(lead_dims(len(ty.shape)), rank - len(ty.shape))
    strides = list(ty.strides)
    if left:
        strides[0] = storage_elements(ty.shape[1:], ty.strides[1:])
    extent = 1 + sum((d - 1) * s for d, s in zip(ty.shape, strides))
    return [1] * lead + list(ty.shape), [extent] * lead + strides


def override_args(graph: Graph, instance: Instance) -> dict[str, list]:
    """execute()'s shape overrides that run a graph lowered in override-shape mode at this instance: the
    dims and strides cuDNN sees (as `cudnn_dims` gives them) of every input and output tensor."""
    tensors, left, lifted = (
        graph.of_kind("input", "output"),
        left_to_offsets(graph, instance),
        lifted_ranks(graph, instance),
    )
    dims = [cudnn_dims(instance.type(v.name), v.name in left, lifted.get(v.name, 0)) for v in tensors]
    return {
        "override_uids": [v.uid for v in tensors],
        "override_shapes": [d for d, _ in dims],
        "override_strides": [s for _, s in dims],
    }


def _graph_type(cudnn, dtype: str | None):
    return cudnn.data_type.NOT_SET if dtype is None else cudnn_type(cudnn, dtype)


def _stamp(cudnn, t, value, ty: TensorType, left: bool) -> None:
    t.set_name(value.name)
    t.set_uid(value.uid)
    t.set_data_type(cudnn_type(cudnn, ty.dtype))
    dims, strides = cudnn_dims(ty, left)
    t.set_dim(dims)
    t.set_stride(strides)
    if value.kind == "output":
        t.set_output(True)


def clean(e: BaseException | str, limit: int = 800) -> str:
    """An exception's words on one line, clipped at a word boundary (an ellipsis says so): what cuDNN said, fit
    for a message."""
    text = " ".join(str(e).split()) or type(e).__name__
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > 0 else limit] + " …"
