"""`run --isolate` — each op of a graph run alone on the GPU, to find the first that diverges.

Each node becomes a graph of its own (dsl.subgraph.one_op_graphs): its tensor inputs are device inputs of the dtypes,
shapes and strides they have in the whole graph (an intermediate keeps its intermediate dtype), its scalars and
constants stay what they were, and its results are outputs. Each is fed the whole graph's reference values of its
inputs, rounded to their declared dtypes, and goes through the normal compile, run and compare path: cuDNN
against the reference of that op on those very inputs.
"""

from __future__ import annotations

import attrs

from dsl.ir import Graph, Instance, Node
from dsl.subgraph import one_op_graphs


@attrs.frozen
class Alone:
    """One op's graph, and what running it alone said."""

    node: Node
    graph: Graph
    status: str = ""
    """ok, mismatch, declined (cuDNN has no plan for the op alone), or failed"""
    detail: str = ""


def isolate(graph: Graph, inst: Instance, tensors: dict, options, device, drawn: dict | None = None) -> list[Alone]:
    """Runs every op alone on `device`, on the whole graph's reference values of its inputs (`drawn`: what
    the whole graph's launch drew, for its reference; an op alone draws it again from the same inputs)."""
    from cudnn_dsl.run.buffers import relayout
    from cudnn_dsl.run.compiled import CompiledGraph
    from cudnn_dsl.run.reference import run_reference
    from dsl.diagnostics import DslError

    values = run_reference(graph, inst, tensors, device, every=True, drawn=drawn)
    results = []
    for node, g in one_op_graphs(graph, inst):
        alone = g.instances[0]
        feed = {v.name: relayout(values[v.name], alone.type(v.name), device) for v in g.of_kind("input")}
        feed.update((v.name, tensors[v.name]) for v in g.of_kind("scalar") if v.name in tensors)
        try:
            comps = CompiledGraph(g, options, device, use_store=False).check(feed)
        except DslError as e:  # cuDNN has no plan for this op alone: said, not a failure of the op
            results.append(Alone(node, g, "declined", e.diagnostics[0].message[:200]))
            continue
        except Exception as e:  # noqa: BLE001 - a binding or launch failure of one op; the others still run
            results.append(Alone(node, g, "failed", f"{type(e).__name__}: {e}"))
            continue
        ok = all(c.ok for c in comps)
        results.append(Alone(node, g, "ok" if ok else "mismatch", "; ".join(str(c) for c in comps)))
    return results


def report(results: list[Alone]) -> list[str]:
    """One line per op, then which op diverges first (or that none does)."""
    lines = []
    for r in results:
        what = {"declined": "cuDNN-declined-alone"}.get(r.status, r.status)
        lines.append(
            f"{r.node.loc.line}:{r.node.loc.col} {', '.join(r.node.outputs)} = {r.node.op}: {what}  {r.detail}"
        )
    bad = next((r for r in results if r.status == "mismatch"), None)
    if bad is not None:
        lines.append(f"first op that diverges: {', '.join(bad.node.outputs)} = {bad.node.op} at {bad.node.loc}")
    else:
        checked = sum(r.status == "ok" for r in results)
        lines.append(f"no op diverges alone ({checked} of {len(results)} checked; the rest cuDNN would not run alone)")
    return lines
