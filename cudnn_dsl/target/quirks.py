"""cuDNN's quirks: one row per workaround of a wrong result or a refusal, keyed by the version of the library planning.

A row is a `wrong_result` (cuDNN built and ran such a graph and gave outputs never written or half wrong, with
no error), a `refusal` (cuDNN had no engine for it) or a `slow_build` (cuDNN's answer does not come in time: its
build_operation_graph takes time exponential in the graph's size). A refusal cuDNN reports needs no row where
the answer comes in time: the partitioner splits a graph cuDNN declines, on every version. The refusal rows
here are for a choice made before planning, which op a derived backward emits: the partitioner splits a graph,
and cannot trade a backward op cuDNN refuses for the chain of registry ops that computes the same gradients.
A slow_build row declines the graph before build_operation_graph, and tells the partitioner how long a part
may be (`part_end`), so that no part it asks about is one cuDNN would take that long over.

A row applies on every cuDNN version it is not verified clean on, newer ones included: what a release fixed
is known only where a test showed it. The version is the library planning: the local one when planning for a
target without a GPU, the GPU's own on it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from typing import Literal

import attrs

from cudnn_dsl.target.library import BackendUnavailable, load_cudnn, version_text
from dsl.autodiff import Avoid
from dsl.diagnostics import Diagnostic
from dsl.ir import Graph, Instance, Node
from dsl.ops import OPS
from dsl.subgraph import unconnected
from dsl.types import TensorType

KNOWN_DEFECT = "cudnn-dsl refuses to build this graph"
"""how the refusal of a 'plan' row begins: the project declines the graph, cuDNN was not asked"""


def known_defect(message: str) -> bool:
    """Whether a refusal is a 'plan' row's (the project's, for a known defect of cuDNN), not cuDNN's own."""
    return message.startswith(KNOWN_DEFECT)


@attrs.frozen
class Sighting:
    """One version of cuDNN a row was checked on, and the test that shows what it did there."""

    version: int
    """as the library's backend_version() gives it: 91900 is 9.19.0"""
    where: str
    """the GPU it ran on, or the target planned for without one"""
    test: str

    def __str__(self) -> str:
        return f"{version_text(self.version)} ({self.where})"


@attrs.frozen
class Quirk:
    name: str
    kind: Literal["wrong_result", "refusal", "slow_build"]
    stage: Literal["plan", "derive"]
    """'plan': `fires(graph, inst)` gives (the op, why) or None, and a graph it fires on is declined before
    cuDNN sees it, then split like any graph cuDNN declines (`option split`); 'derive': `fires(op, x, scale,
    axes)` says whether a derived backward is to use the chain of registry ops rather than the frontend's
    backward op `op` for a norm of input x, scale `scale`, over `axes`"""
    does: str
    """the workaround, as the docs table says it"""
    evidence: str
    """what cuDNN did, and what ran right"""
    fires: Callable
    seen: tuple[Sighting, ...]
    clean: tuple[Sighting, ...] = ()
    """the versions a test showed it does not apply to"""

    def applies(self, version: int | None) -> bool:
        """Whether the row is in force on cuDNN `version` (None: no library to ask, so every row is)."""
        return all(c.version != version for c in self.clean)

    def tag(self, version: int | None) -> str:
        """How a report names the row: 'quirk unconnected_computations, not verified clean on cuDNN 9.28.1'."""
        on = "no cuDNN library loaded here" if version is None else f"cuDNN {version_text(version)}"
        return f"quirk {self.name}, not verified clean on {on}"

    def declines(self, graph: Graph, inst: Instance, version: int) -> Diagnostic | None:
        """Why cuDNN `version` would run this graph wrong, at the op (a 'plan' row); None when it does not apply.
        cuDNN is not asked: the message says the project refuses the graph (KNOWN_DEFECT), and names the row."""
        found = self.fires(graph, inst) if self.applies(version) else None
        if found is None:
            return None
        node, why = found
        slow = self.kind == "slow_build"
        does = "takes time exponential in its size to build it" if slow else "runs it wrong"
        return Diagnostic(
            "error",
            f"{KNOWN_DEFECT}: a known defect of cuDNN {version_text(version)} {does} (quirk {self.name}): "
            f"{why}; `option split = true` runs it as graphs that {'build in time' if slow else 'run right'}",
            node.loc,
        )

    def avoids(
        self, version: int | None, op: str, x: TensorType, scale: TensorType, axes: tuple[int, ...]
    ) -> str | None:
        """Why a derived backward takes the chain of registry ops rather than `op` (a 'derive' row), for its
        text; None when the row does not apply."""
        if not self.applies(version) or not self.fires(op, x, scale, axes):
            return None
        return f"not {op}: cuDNN has no engine for it here ({self.tag(version)})"


Found = tuple[Node, str] | None


def _unconnected(graph: Graph, inst: Instance) -> Found:
    separate = unconnected(graph)
    if separate is None:
        return None
    a, b = (graph.nodes[k] for k in separate)
    return b, (
        f"{b.op} (line {b.loc.line}) shares no value made in this graph with {a.op} (line {a.loc.line}), and "
        "cuDNN runs one connected computation per graph (it left one computation's outputs unwritten)"
    )


MAX_ROOTS = 8
"""the most ops a graph hands cuDNN that read no value made in it: build_operation_graph's time doubles with
each one more (deviceless for the H200, cuDNN 9.28.1: 10 such ops 1.1 s, 12 ops 3 s, 14 ops 11.5 s, 16 ops
over 100 s; a chain of 32 ops, or 13 ops each reading the one before, 3 ms)"""


def roots(graph: Graph, first: int = 0) -> Iterator[int]:
    """The nodes from `first` on that read no value made by a node from `first` on: a part starting at `first`
    holds those before its end (as a part, a value made before `first` is an input)."""
    made: set[str] = set()
    for k in range(first, len(graph.nodes)):
        n = graph.nodes[k]
        if not any(i in made for i in n.inputs if i is not None):
            yield k
        made.update(n.outputs)


def _many_roots(graph: Graph, inst: Instance) -> Found:
    past = next(itertools.islice(roots(graph), MAX_ROOTS, None), None)
    if past is None:
        return None
    n = graph.nodes[past]
    return n, (
        f"{n.op} (line {n.loc.line}) is op {MAX_ROOTS + 1} of the graph that reads no value made in it, and "
        f"cuDNN's build_operation_graph takes time exponential in the number of such ops (at most {MAX_ROOTS} "
        "a graph)"
    )


def part_end(graph: Graph, first: int, version: int | None) -> int:
    """The end past which every part of `graph` starting at node `first` is declined by a slow_build row in force
    on cuDNN `version` (a part declined, every longer one is): the partitioner asks cuDNN of no longer part."""
    if not SLOW_ROOTS.applies(version):
        return len(graph.nodes)
    return next(itertools.islice(roots(graph, first), MAX_ROOTS, None), len(graph.nodes))


def _pointwise_broadcasts(graph: Graph, inst: Instance):
    """(node, input, its shape, the node's shape) of each tensor a graph of pointwise ops alone broadcasts."""
    if not all(OPS[n.op].family == "pointwise" for n in graph.nodes):
        return
    for n in graph.nodes:
        shape = inst.type(n.outputs[0]).shape
        for i in n.inputs:
            if i is None or graph.value(i).kind in ("scalar", "const"):
                continue
            t = inst.type(i).shape
            if t != shape:
                yield n, i, t, shape


def _made_value_broadcast(graph: Graph, inst: Instance) -> Found:
    made = {o for n in graph.nodes for o in n.outputs}
    for n, i, t, shape in _pointwise_broadcasts(graph, inst):
        if i in made:
            return n, f"{n.op} broadcasts '{i}', a value made in this graph ({list(t)} to {list(shape)})"
    return None


def _two_dim_broadcast(graph: Graph, inst: Instance) -> Found:
    for n, i, t, shape in _pointwise_broadcasts(graph, inst):
        over = [d for d, (a, b) in enumerate(zip(t, shape)) if a == 1 and b > 1]
        if len(over) > 1 and len(shape) <= 3:
            return n, f"{n.op} broadcasts input '{i}' over {len(over)} dims ({list(t)} to {list(shape)})"
    return None


def _float_attention_gradients(graph: Graph, inst: Instance) -> Found:
    for n in graph.nodes:
        if n.op != "sdpa_backward":
            continue
        for grad, of in zip(n.outputs[:3], n.inputs[:3]):
            if inst.type(grad).dtype == "float" and inst.type(of).dtype != "float":
                return n, f"{n.op} writes '{grad}' as float, '{of}' being {inst.type(of).dtype}"
    return None


def _layer_norm_backward_form(op: str, x: TensorType, scale: TensorType, axes: tuple[int, ...]) -> bool:
    per_sample = len(x.shape) == 4 and 0 not in axes and all(i in axes or x.shape[i] == 1 for i in (1, 2, 3))
    return op in ("layernorm_backward", "rmsnorm_backward") and not per_sample


def _channel_norm_backward_rank(op: str, x: TensorType, scale: TensorType, axes: tuple[int, ...]) -> bool:
    return op in ("batchnorm_backward", "instancenorm_backward") and len(x.shape) != 4


def _adalayernorm_backward(op: str, x: TensorType, scale: TensorType, axes: tuple[int, ...]) -> bool:
    return op == "adalayernorm_backward"


H200 = "H200"
H200_PLANNED = "planned for the H200, no GPU"
SPLIT_RUNS_RIGHT = "tests/gpu/test_quirks_gpu.py::test_split_the_graph_runs_right"
ANSWER_HERE = "tests/test_quirks.py::test_the_library_here_answers_as_the_table_says"
NORM_FROM_STATISTICS = "tests/gpu/test_backward_gpu.py::test_norm_backward_from_the_forward_statistics"

SLOW_ROOTS = Quirk(
    "many_independent_ops",
    "slow_build",
    "plan",
    f"declines a graph of more than {MAX_ROOTS} ops that read no value made in the graph (each reads only the "
    f"graph's inputs): split into parts of at most {MAX_ROOTS} such ops each",
    "build_operation_graph of N outputs o_i = a * b took 1.1 s at N = 10, 3 s at 12, 11.5 s at 14 and over 100 s "
    "at 16; N ops summed into one output alike; a chain of 32 ops, or N ops each reading the one before, "
    "a few ms",
    _many_roots,
    (Sighting(92801, H200_PLANNED, "tests/test_partition.py::test_many_independent_ops_are_split_in_time"),),
)

QUIRKS: tuple[Quirk, ...] = (
    Quirk(
        "unconnected_computations",
        "wrong_result",
        "plan",
        "declines a graph whose ops form more than one connected computation (in a graph of pointwise ops "
        "alone, an input two ops read joins them): split, each runs as a graph of its own",
        "a conv_wgrad beside a relu_backward that shares its input: the conv_wgrad's output right, the "
        "relu_backward's never written (NaN gradients); two pointwise chains reading nothing in common: one "
        "chain's output never written. Two pointwise chains over the halves of one tensor ran right as one "
        "graph (examples/rope_in_place.cdg)",
        _unconnected,
        (Sighting(91900, H200, f"{SPLIT_RUNS_RIGHT}[unconnected]"),),
    ),
    Quirk(
        "pointwise_made_value_broadcast",
        "wrong_result",
        "plan",
        "declines a graph of pointwise ops alone where an op broadcasts a value made in the graph",
        "the broadcast value came out NaN",
        _made_value_broadcast,
        (Sighting(91900, H200, f"{SPLIT_RUNS_RIGHT}[made_then_broadcast]"),),
    ),
    Quirk(
        "pointwise_two_dim_broadcast",
        "wrong_result",
        "plan",
        "declines a graph of pointwise ops alone, of rank 3 or less, where an op broadcasts an input over two "
        "dims or more",
        "[1, 1, D], [1, S, 1] or [B, 1, 1] broadcast over [B, S, D] left about half the outputs wrong; a lone "
        "add of float [16, 512, 512] and bf16 [1, 1, 512] gave NaNs (`run --isolate`, docs/results/isolate-h200.txt). "
        "What ran right: a rank-3 input broadcast over one dim (a "
        "[1, S, D] table over a batch, examples/rope_in_place.cdg; a [B, S, 1] statistic over D), and at rank 4 "
        "a per-channel [1, C, 1, 1] over NHWC [N, C, H, W] (a conv's epilogue run alone, checked by `tune`)",
        _two_dim_broadcast,
        (Sighting(91900, H200, f"{SPLIT_RUNS_RIGHT}[two_dims]"),),
    ),
    Quirk(
        "sdpa_backward_float_gradients",
        "wrong_result",
        "plan",
        "declines a graph where sdpa_backward writes dq, dk or dv as float while q, k or v is narrower",
        "float dq, dk and dv came out wrong (a derived backward had materialized them float before a reshape: "
        "the transformer block's gradients); in q, k and v's dtypes they are right",
        _float_attention_gradients,
        (
            Sighting(
                91900,
                H200,
                "tests/gpu/test_train_example_gpu.py::test_training_on_cudnn_matches_plain_pytorch_under_torch_compile"
                "[transformer]",
            ),
        ),
    ),
    Quirk(
        "layer_norm_backward_forms",
        "refusal",
        "derive",
        "derives layernorm's and rmsnorm's backward as the chain of registry ops except per sample over "
        "[N, C, H, W] (statistics [N, 1, 1, 1]), where it is layernorm_backward or rmsnorm_backward; a norm over "
        "its input's last axes whose input gradient is its own is read per sample, as [rows, columns, 1, 1]",
        "layernorm_backward over tokens ([B, S, D], statistics [B, S, 1]): no engine (create_execution_plans); "
        "per sample over [N, C, H, W] it ran right. Planned for the H200, 9.28.1 takes the form over tokens with "
        "dx in x's dtype, and not with the float dx a derived backward writes under `intermediate float`",
        _layer_norm_backward_form,
        (Sighting(91900, H200, f"{NORM_FROM_STATISTICS}[layernorm_tokens]"),),
    ),
    Quirk(
        "channel_norm_backward_rank",
        "refusal",
        "derive",
        "derives batchnorm's and instancenorm's backward as the chain of registry ops except at rank 4, where it "
        "is batchnorm_backward or instancenorm_backward",
        "batchnorm_backward at rank 3 ([N, C, L]): no engine (create_execution_plans); instancenorm_backward at "
        "rank 3 and both ops at rank 5 planned (not run); at rank 4 both ran right on the H200 with cuDNN 9.19.0",
        _channel_norm_backward_rank,
        (Sighting(92801, H200_PLANNED, f"{ANSWER_HERE}[channel_norm_backward_rank]"),),
    ),
    Quirk(
        "adalayernorm_backward",
        "refusal",
        "derive",
        "derives adalayernorm's backward as the chain of registry ops, never adalayernorm_backward",
        "adalayernorm_backward: no engine (create_execution_plans)",
        _adalayernorm_backward,
        (Sighting(91900, H200, f"{NORM_FROM_STATISTICS}[adalayernorm]"),),
    ),
    SLOW_ROOTS,
)


def declined(graph: Graph, inst: Instance, version: int, slow_only: bool = False) -> Diagnostic | None:
    """Why cuDNN `version` would run this graph wrong or take too long to build it, located at the op: the first
    'plan' row in force that fires (a slow_build row only, with `slow_only`: the graph is built, not run); None
    when none does."""
    for q in QUIRKS:
        if q.stage == "plan" and (not slow_only or q.kind == "slow_build"):
            if (d := q.declines(graph, inst, version)) is not None:
                return d
    return None


def avoided_backward(
    version: int | None, op: str, x: TensorType, scale: TensorType, axes: tuple[int, ...]
) -> str | None:
    """Why a derived backward on cuDNN `version` takes the chain of registry ops rather than the frontend's `op`
    for a norm of input x, scale `scale`, over `axes` (the first 'derive' row in force that fires); None: `op`."""
    for q in QUIRKS:
        if q.stage == "derive" and (why := q.avoids(version, op, x, scale, axes)) is not None:
            return why
    return None


def library_version() -> int | None:
    """The version of the cuDNN loaded here, or None where none loads (a CPU machine without the library, whose
    torch op runs the reference)."""
    try:
        return load_cudnn().backend_version()
    except BackendUnavailable:
        return None


def backward_avoid(version: int | None) -> Avoid:
    """dsl.autodiff.derive's `avoid` for cuDNN `version` (the library that plans or runs the derived graphs;
    None where none is asked: every 'derive' row is then in force)."""
    return functools.partial(avoided_backward, version)


def table() -> str:
    """The rows as a markdown table (docs/cudnn-quirks.md)."""
    lines = ["| quirk | kind | seen on | verified clean | what it does |", "| --- | --- | --- | --- | --- |"]
    for q in QUIRKS:
        seen = ", ".join(str(s) for s in q.seen)
        clean = ", ".join(f"{c} `{c.test}`" for c in q.clean) or "none"
        lines.append(f"| `{q.name}` | {q.kind.replace('_', ' ')} | {seen} | {clean} | {q.does} |")
    return "\n".join(lines) + "\n"
