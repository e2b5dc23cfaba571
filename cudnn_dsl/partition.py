"""Backend layer: when cuDNN declines a graph, the fewest graphs it accepts, in order, and the ops
no cuDNN engine runs (left to their torch reference on the GPU, when the options allow).

The search is greedy from the first node: the longest run of nodes cuDNN accepts becomes one part.
Acceptance is a question put to cuDNN itself (deviceless planning for a target, or a build on the
GPU), so CI sees the partition an H200 would get.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Graph, Instance
from dsl.subgraph import subgraph

Accepts = Callable[[Graph], "str | None"]
"""a part -> None when cuDNN accepts it, else cuDNN's reason"""


@attrs.frozen
class Part:
    first: int
    end: int
    graph: Graph | None
    """the part as a graph of its own; None for an op left to torch"""
    why: str = ""
    """for an op left to torch: why cuDNN declined it alone"""


@attrs.frozen
class Partition:
    parts: tuple[Part, ...]
    declined: str
    """cuDNN's reason for declining the whole graph"""

    @property
    def how(self) -> str:
        """'splits into 3 parts', or 'runs as 1 part' (one op left to torch)."""
        n = len(self.parts)
        return f"splits into {n} parts" if n > 1 else "runs as 1 part"

    @property
    def fallbacks(self) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if p.graph is None)

    def lines(self, graph: Graph) -> list[str]:
        """One line per part: which ops, and where they run."""
        out = []
        for k, p in enumerate(self.parts, 1):
            ops = ", ".join(f"{graph.nodes[i].op} (line {graph.nodes[i].loc.line})" for i in range(p.first, p.end))
            made = [o for o in (p.graph.outputs if p.graph else ()) if graph.value(o.name).kind != "output"]
            keep = f"; materializes {', '.join(v.name for v in made)}" if made else ""
            where = "cuDNN graph" if p.graph is not None else f"torch fallback (cuDNN runs it on no engine: {p.why})"
            out.append(f"part {k}: {ops} — {where}{keep}")
        return out


def find_partition(graph: Graph, inst: Instance, accepts: Accepts, declined: str, fallback: bool) -> Partition:
    """Splits one shape of a graph that cuDNN declined as a whole (`declined` says why). Raises a
    DslError at the op when an op runs on no engine and `fallback` is off."""
    n, parts, i = len(graph.nodes), [], 0
    while i < n:
        why = declined
        for j in range(n if i else n - 1, i, -1):  # the whole graph is known to be declined
            sub = subgraph(graph, inst, i, j, f"{graph.name}_part{len(parts) + 1}")
            why = accepts(sub)
            if why is None:
                parts.append(Part(i, j, sub))
                i = j
                break
        else:
            node = graph.nodes[i]
            if not fallback:
                raise DslError(
                    Diagnostic(
                        "error",
                        f"no cuDNN engine runs {node.op} here, even alone ({why}), and fallback to torch is off",
                        node.loc,
                    )
                )
            parts.append(Part(i, i + 1, None, why))
            i += 1
    return Partition(tuple(parts), declined)


def short(message: str) -> str:
    """cuDNN's reason without the backend's engine-by-engine dump."""
    return message.split(" (the backend declined")[0][:240]


def plan_for_target(graph: Graph, inst: Instance, options, target, progress=None, pin=None):
    """(plans, None) when the target's cuDNN takes the graph whole, else (None, the partition); the
    refusal itself (a DslError) when splitting is off or a plan is pinned (a pin names a whole-graph plan)."""
    from cudnn_dsl.build import NotAllowed, plan_deviceless

    try:
        return plan_deviceless(graph, inst, options, target, progress, pin), None
    except DslError as e:
        if not options.split or pin is not None or isinstance(e, NotAllowed):
            raise
        declined = short(e.diagnostics[0].message)
    return None, find_partition(graph, inst, deviceless_accepts(options, target), declined, options.fallback)


def deviceless_accepts(options, target) -> Accepts:
    """Acceptance by the real cuDNN library, planning for `target` without a device."""
    from cudnn_dsl.build import plan_deviceless

    def accepts(part: Graph) -> str | None:
        try:
            plan_deviceless(part, part.instances[0], options, target)
        except DslError as e:
            return short(e.diagnostics[0].message)
        return None

    return accepts
