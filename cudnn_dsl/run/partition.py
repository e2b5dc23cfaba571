"""When cuDNN declines a graph, the fewest graphs it accepts, in order, and the ops
no cuDNN engine runs (left to their torch reference on the GPU, when the options allow).

The search is greedy from the first node: the longest run of nodes cuDNN accepts becomes one part.
Acceptance is a question put to cuDNN itself (deviceless planning for a target, or a build on the
GPU), so CI sees the partition an H200 would get.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from cudnn_dsl.store.plans import PartitionChoice
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
    """cuDNN's reason for declining the whole graph ('' when it takes it whole, and the split was chosen)"""
    chosen: str = ""
    """why this split was chosen over another ('tuned: split after matmul, 18.1 µs vs 24.3 µs whole')"""

    @property
    def cuts(self) -> tuple[int, ...]:
        """The node indices where a part starts, the first part's aside (what the plan store keeps)."""
        return tuple(p.first for p in self.parts[1:])

    @property
    def reason(self) -> str:
        return self.chosen or f"cuDNN declines it whole ({self.declined})"

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
            where = "cuDNN graph" if p.graph is not None else f"torch fallback (not cuDNN, even alone: {p.why})"
            out.append(f"part {k}: {ops} — {where}{keep}")
        return out


def find_partition(
    graph: Graph, inst: Instance, accepts: Accepts, declined: str, fallback: bool, first: int | None = None
) -> Partition:
    """Splits one shape of a graph that cuDNN declined as a whole (`declined` says why), or, given `first`, whose
    first part ends there (the anchor op alone: 1) and the rest is split alike. Raises a DslError at the op
    when an op runs on no engine and `fallback` is off."""
    n, parts, i = len(graph.nodes), [], 0
    while i < n:
        why = declined
        ends = [first] if i == 0 and first else range(n if i else n - 1, i, -1)  # the whole is known declined
        for j in ends:
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


def split_at(
    graph: Graph, inst: Instance, cuts: tuple[int, ...], accepts: Accepts, fallback: bool, declined: str = "", chosen=""
) -> Partition:
    """The partition whose parts start at `cuts` (node indices, increasing, inside the graph): chosen by
    tune or forced. A part cuDNN declines is a DslError at its first op, unless it is one op and
    `fallback` leaves it to torch."""
    if list(cuts) != sorted(set(cuts)) or not all(0 < c < len(graph.nodes) for c in cuts):
        raise ValueError(f"cut points {list(cuts)} are not increasing node indices in 1..{len(graph.nodes) - 1}")
    bounds, parts = (0, *cuts, len(graph.nodes)), []
    for k, (i, j) in enumerate(zip(bounds, bounds[1:]), 1):
        sub = subgraph(graph, inst, i, j, f"{graph.name}_part{k}")
        why = accepts(sub)
        if why is None:
            parts.append(Part(i, j, sub))
        elif j == i + 1 and fallback:
            parts.append(Part(i, j, None, why))
        else:
            node = graph.nodes[i]
            raise DslError(
                Diagnostic("error", f"cuDNN declines part {k} ({node.op} onwards) of this split: {why}", node.loc)
            )
    return Partition(tuple(parts), declined, chosen)


ANCHOR = 1
"""tune's alternative to the whole graph: its anchor op (the first node, a matmul or conv) alone, the rest
(the epilogue) as one graph, or the fewest graphs cuDNN accepts"""


def deviceless_alternatives(graph: Graph, inst: Instance, options, target) -> list[tuple[str, str]]:
    """(label, how cuDNN for `target` takes it) of each partition tune would time: planned, nothing built."""
    accepts = deviceless_accepts(options, target)
    why = accepts(graph)
    rows, cut_lists = [("whole", "one cuDNN graph" if why is None else f"declined: {why}")], []
    ways = ([None] if why is not None else []) + ([ANCHOR] if len(graph.nodes) > 1 else [])
    ways = ways if options.split else []  # tune times no other partition
    for first in ways:
        try:
            cut_lists.append(find_partition(graph, inst, accepts, why or "", options.fallback, first))
        except DslError as e:
            rows.append(
                ("anchor op alone" if first else "fewest parts", f"not runnable: {short(e.diagnostics[0].message)}")
            )
    for p in {p.cuts: p for p in cut_lists}.values():
        n, torch_ = len(p.parts), len(p.fallbacks)
        how = f"{n - torch_} cuDNN graphs" + (f", {torch_} op(s) left to torch" if torch_ else "")
        rows.append((cut_label(graph, p.cuts) if p.cuts else "its op left to torch", how))
    return rows


def cut_label(graph: Graph, cuts: tuple[int, ...]) -> str:
    """'whole', or 'split after matmul (line 5)'."""
    if not cuts:
        return "whole"
    return "split after " + ", after ".join(
        f"{graph.nodes[c - 1].op} (line {graph.nodes[c - 1].loc.line})" for c in cuts
    )


def tuned_why(graph: Graph, choice: PartitionChoice) -> str:
    """'tuned: split after matmul (line 5), 18.1 µs vs 24.3 µs whole': the kept partition against the others."""
    kept = choice.times_us.get(choice.name(choice.cuts))
    others = [
        f"{t:.1f} µs {cut_label(graph, choice.cuts_of(k))}"
        for k, t in choice.times_us.items()
        if k != choice.name(choice.cuts) and all(c < len(graph.nodes) for c in choice.cuts_of(k))
    ]
    time = f", {kept:.1f} µs" if kept is not None else ""
    return f"tuned: {cut_label(graph, choice.cuts)}{time}" + (f" vs {', '.join(others)}" if others else "")


def short(message: str) -> str:
    """cuDNN's reason without the backend's engine-by-engine dump."""
    return message.split(" (the backend declined")[0][:240]


def plan_for_target(graph: Graph, inst: Instance, options, target, progress=None, pin=None):
    """(plans, None) when the target's cuDNN takes the graph whole, else (None, the partition); the
    refusal itself (a DslError) when splitting is off or a plan is pinned (a pin names a whole-graph plan)."""
    from cudnn_dsl.build.constraints import NotAllowed
    from cudnn_dsl.build.pipeline import compile_shape

    try:
        return compile_shape(graph, inst, options, target, progress=progress, pin=pin), None
    except DslError as e:
        if not options.split or pin is not None or isinstance(e, NotAllowed):
            raise
        declined = short(e.diagnostics[0].message)
    return None, find_partition(graph, inst, deviceless_accepts(options, target), declined, options.fallback)


def deviceless_accepts(options, target) -> Accepts:
    """Acceptance by the real cuDNN library, planning for `target` without a device."""
    from cudnn_dsl.build.pipeline import compile_shape

    def accepts(part: Graph) -> str | None:
        try:
            compile_shape(part, part.instances[0], options, target)
        except DslError as e:
            return short(e.diagnostics[0].message)
        return None

    return accepts
