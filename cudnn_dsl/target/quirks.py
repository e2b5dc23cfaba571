"""Backend layer: graphs that cuDNN builds and runs wrong, declined before cuDNN sees them.

Each rule is one seen on the H200 (cuDNN 9.19), where such a graph built, ran, and gave outputs never
written or half wrong, with no error. A declined graph is split like any graph cuDNN declines (`option
split`): its parts each run right.
"""

from __future__ import annotations

from dsl.diagnostics import Diagnostic
from dsl.ir import Graph, Instance
from dsl.ops import OPS
from dsl.subgraph import unconnected


def runs_wrong(graph: Graph, inst: Instance) -> Diagnostic | None:
    """Why cuDNN would run this graph wrong, located at the op; None when no known defect applies."""
    separate = unconnected(graph)
    if separate is not None:
        a, b = (graph.nodes[k] for k in separate)
        return _declined(
            b,
            f"{b.op} (line {b.loc.line}) shares no value made in this graph with {a.op} (line {a.loc.line}), and "
            f"cuDNN runs one connected computation per graph (it left one computation's outputs unwritten)",
        )
    if all(OPS[n.op].family == "pointwise" for n in graph.nodes):
        return _pointwise_broadcast(graph, inst)
    return None


def _pointwise_broadcast(graph: Graph, inst: Instance) -> Diagnostic | None:
    """A graph of pointwise ops alone, on cuDNN 9.19: a value made in the graph and broadcast by a later op
    came out NaN; a rank-3 input broadcast over two dims ([1, 1, D], [1, S, 1] or [B, 1, 1] over [B, S, D])
    left about half the outputs wrong. What ran right: a rank-3 input broadcast over one dim (a [1, S, D]
    table over a batch, examples/rope_in_place.cdg; a [B, S, 1] statistic over D), and at rank 4 a
    per-channel [1, C, 1, 1] over NHWC [N, C, H, W] (a conv's epilogue run alone, checked by `tune`)."""
    made = {o for n in graph.nodes for o in n.outputs}
    for n in graph.nodes:
        shape = inst.type(n.outputs[0]).shape
        for i in n.inputs:
            if i is None or graph.value(i).kind in ("scalar", "const"):
                continue
            t = inst.type(i).shape
            if t == shape:
                continue
            if i in made:
                return _declined(n, f"{n.op} broadcasts '{i}', a value made in this graph ({list(t)} to {list(shape)})")
            over = [d for d, (a, b) in enumerate(zip(t, shape)) if a == 1 and b > 1]
            if len(over) > 1 and len(shape) <= 3:
                return _declined(n, f"{n.op} broadcasts input '{i}' over {len(over)} dims ({list(t)} to {list(shape)})")
    return None


def _declined(node, why: str) -> Diagnostic:
    return Diagnostic(
        "error",
        f"cuDNN builds this graph but runs it wrong: {why}; `option split = true` runs it as graphs that run right",
        node.loc,
    )
