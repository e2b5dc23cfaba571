"""When cuDNN declines a graph, the fewest graphs it accepts, in order, and the ops
no cuDNN engine runs (left to their torch reference on the GPU, when the options allow).

The search is greedy from the first node: the longest run of nodes cuDNN accepts becomes one part.
Acceptance is a question put to cuDNN itself (deviceless planning for a target, or a build on the
GPU), so CI sees the partition an H200 would get. The questions are bounded: a part is no longer than
the quirks table lets cuDNN build in time (quirks.part_end), and from each node at most PROBES ends
are asked (every end of a short run, the longest ones then halving lengths of a long one), so a graph
of n nodes costs at most PROBES * n builds of at most n nodes. Two kinds of part need no kernel of
their own: a reshape of a packed value is a view of its operand's memory, and a cast that would run
alone is written by the part before it, in the cast's dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from cudnn_dsl.store.keys import graph_digest
from cudnn_dsl.store.plans import PartitionChoice
from cudnn_dsl.target.quirks import known_defect, library_version, part_end
from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Graph, Instance
from dsl.ops import OPS
from dsl.subgraph import CAST, cast_folded, subgraph
from dsl.types import packed_row_major

Accepts = Callable[[Graph], "str | None"]
"""a part -> None when cuDNN accepts it, else cuDNN's reason"""

CUDNN, VIEW, TORCH = "cuDNN graph", "view", "torch fallback"
"""what a part is: a graph cuDNN runs; a reshape whose result is its operand's memory (no launch); an op no
cuDNN engine runs, left to its torch reference"""


@attrs.frozen
class Part:
    first: int
    end: int
    """the part's nodes are the graph's [first, end): a cast folded into its producer is among them"""
    kind: str
    """CUDNN, VIEW or TORCH"""
    graph: Graph | None = None
    """a cuDNN part as a graph of its own"""
    why: str = ""
    """for an op left to torch: why cuDNN declined it alone (and, for a reshape, why it is no view)"""

    def ops(self, graph: Graph) -> str:
        """'conv_fprop (line 14), relu (line 14)': its nodes of `graph`."""
        return ", ".join(f"{graph.nodes[i].op} (line {graph.nodes[i].loc.line})" for i in range(self.first, self.end))


@attrs.frozen
class Counts:
    """What one shape run as parts launches."""

    launches: int
    """cuDNN launches: one per cuDNN part"""
    graphs: int
    """distinct cuDNN graphs built for them (build_key): equal parts share one"""
    views: int
    fallbacks: int

    @property
    def text(self) -> str:
        """'6 cuDNN launches (5 distinct graphs), 4 views, no torch fallback'."""
        views = f"{self.views} view{_s(self.views)}" if self.views else "no view"
        torch_ = f"{self.fallbacks} torch fallback{_s(self.fallbacks)}" if self.fallbacks else "no torch fallback"
        launches = f"{self.launches} cuDNN launch{'es' if self.launches != 1 else ''}"
        return f"{launches} ({self.graphs} distinct graph{_s(self.graphs)}), {views}, {torch_}"


def declined_whole(declined: str, what: str = "it", target: str = "") -> str:
    """'cuDNN for NVIDIA H200 declines graph g whole (why)'; where the project's table of cuDNN's defects
    (target.quirks) declined it, cuDNN was not asked: 'graph g is not built whole (why)'."""
    if known_defect(declined):
        return f"{what} is not built whole ({declined})"
    return f"cuDNN{f' for {target}' if target else ''} declines {what} whole ({declined})"


def _s(n: int) -> str:
    return "" if n == 1 else "s"


@attrs.frozen
class Partition:
    parts: tuple[Part, ...]
    declined: str
    """why the whole graph is declined, by cuDNN or by the project's table of its defects ('' when cuDNN takes
    it whole, and the split was chosen)"""
    chosen: str = ""
    """why this split was chosen over another ('tuned: split after matmul, 18.1 µs vs 24.3 µs whole')"""

    @property
    def cuts(self) -> tuple[int, ...]:
        """The node indices where a part starts, the first part's aside (what the plan store keeps)."""
        return tuple(p.first for p in self.parts[1:])

    @property
    def reason(self) -> str:
        return self.chosen or declined_whole(self.declined)

    @property
    def how(self) -> str:
        """'splits into 3 parts', or 'runs as 1 part' (one op left to torch)."""
        n = len(self.parts)
        return f"splits into {n} parts" if n > 1 else "runs as 1 part"

    def of_kind(self, kind: str) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if p.kind == kind)

    def views_placed(self, graph: Graph, held: set[str]) -> dict[str, str]:
        """operand -> result of each view whose operand, an intermediate, is made in its result's memory: walking the
        views backwards, where the result is `held` (has memory given: an output) or placed so (a chain of views,
        through each); in the order to place them."""
        held, placed = set(held), {}
        for part in reversed(self.of_kind(VIEW)):
            node = graph.nodes[part.first]
            operand, result = node.inputs[0], node.outputs[0]
            if result in held and operand not in held and graph.value(operand).kind == "virtual":
                placed[operand] = result
                held.add(operand)
        return placed

    @property
    def fallbacks(self) -> tuple[Part, ...]:
        return self.of_kind(TORCH)

    @property
    def counts(self) -> Counts:
        cudnn = self.of_kind(CUDNN)
        keys = {build_key(p.graph) for p in cudnn}
        return Counts(len(cudnn), len(keys), len(self.of_kind(VIEW)), len(self.fallbacks))

    def lines(self, graph: Graph) -> list[str]:
        """One line per part: which ops, and where they run."""
        out = []
        for k, p in enumerate(self.parts, 1):
            ops = p.ops(graph)
            made = [o for o in (p.graph.outputs if p.graph else ()) if graph.value(o.name).kind != "output"]
            keep = f"; materializes {', '.join(v.name for v in made)}" if made else ""
            out.append(f"part {k}: {ops} — {_where(graph, p)}{keep}{_advice(graph, p)}")
        return out


def _where(graph: Graph, p: Part) -> str:
    """Where a part runs, as its line says it."""
    if p.kind == VIEW:
        return "view (no launch)"
    if p.kind == TORCH:
        return f"torch fallback (not cuDNN, even alone: {p.why})"
    names = {v.name for v in p.graph.values}
    folded = [n for n in graph.nodes[p.first : p.end] if n.op == CAST and n.inputs[0] not in names]
    casts = "; ".join(f"{n.outputs[0]} written as {p.graph.instances[0].type(n.outputs[0]).dtype}" for n in folded)
    return f"cuDNN graph ({casts}: the cast folded in)" if folded else "cuDNN graph"


def _advice(graph: Graph, p: Part) -> str:
    """The registry's advice (OpSig.alone) for an op that runs in a part of its own, as its line ends."""
    advice = OPS[graph.nodes[p.first].op].alone if p.end - p.first == 1 and p.kind != VIEW else ""
    return f"; to fuse it, {advice}" if advice else ""


def build_key(part: Graph) -> tuple:
    """What one compiled graph serves: parts of one digest (the plan store's key) whose pass-by-value tensors
    hold the same values (the executable holds them) — a part that draws what the reference reads back
    (seeded dropout's mask, in the executable's scratch memory) is served alone."""
    from cudnn_dsl.run.reference import drawn_values

    inst = part.instances[0]
    by_value = tuple((v.uid, v.scalar) for v in part.values if v.kind in ("scalar", "const"))
    alone = part.name if drawn_values(part, inst) else ""
    return graph_digest(part, inst), by_value, alone


def view_refusal(graph: Graph, inst: Instance, index: int) -> str | None:
    """None when node `index` is a reshape whose result is its operand's memory as it lies (row-major, packed,
    the same dtype): a view, with nothing to compute; else why it is not one."""
    node = graph.nodes[index]
    if node.op != "reshape":
        return f"{node.op} is no reshape"
    if graph.value(node.inputs[0]).kind in ("scalar", "const"):
        return "its operand is a scalar"
    if graph.value(node.inputs[0]).view is not None or graph.value(node.outputs[0]).into is not None:
        return "its operand or result is a window on a buffer"
    a, b = inst.type(node.inputs[0]), inst.type(node.outputs[0])
    if a.dtype != b.dtype:
        return f"it converts {a.dtype} to {b.dtype}"
    for what, t in (("operand", a), ("result", b)):
        if not packed_row_major(t.shape, t.strides):
            return f"its {what} is not packed row-major (strides {list(t.strides)})"
    return None


PROBES = 16
"""the most part ends asked of cuDNN from one node (a run of at most this many nodes: every end)"""


def probe_ends(first: int, last: int) -> list[int]:
    """The ends asked of cuDNN for a part from node `first`, at most `last` (the longest allowed), longest first:
    every one for a run of at most PROBES nodes, else the PROBES // 2 longest, then ends at halving lengths."""
    if last - first <= PROBES:
        return list(range(last, first, -1))
    ends = list(range(last, last - PROBES // 2, -1))
    length = (ends[-1] - first) // 2
    while length >= 1 and len(ends) < PROBES:
        ends.append(first + length)
        length //= 2
    return ends if ends[-1] == first + 1 else [*ends[: PROBES - 1], first + 1]


def find_partition(
    graph: Graph,
    inst: Instance,
    accepts: Accepts,
    declined: str,
    fallback: bool,
    first: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Partition:
    """Splits one shape of a graph that cuDNN declined as a whole (`declined` says why), or, given `first`, whose
    first part ends there (the anchor op alone: 1) and the rest is split alike. A reshape of a packed value is a
    view; a cast that would run alone is folded into the part before it where cuDNN takes that. Raises a
    DslError at the op when an op runs on no engine and `fallback` is off. `progress` hears each question
    asked ('partitioning: 12 of 256 ops placed')."""
    n, parts, i, version = len(graph.nodes), [], 0, library_version()
    while i < n:
        view = view_refusal(graph, inst, i)
        if view is None:
            parts.append(Part(i, i + 1, VIEW))
            i += 1
            continue
        why, part = declined, None
        last = min(part_end(graph, i, version), n if i else n - 1)  # the whole is known declined
        ends = [first] if i == 0 and first else probe_ends(i, max(last, i + 1))
        for j in ends:
            if progress:
                progress(f"partitioning: {i} of {n} ops placed, asking about ops {i + 1} to {j}")
            sub = subgraph(graph, inst, i, j, _name(graph, len(parts) + 1))
            why = accepts(sub)
            if why is None:
                part = Part(i, j, CUDNN, sub)
                break
        if part is None or part.end == i + 1:  # alone: a cast writes through the part before it where it can
            folded = _fold_into(graph, inst, parts, i, accepts)
            if folded is not None:
                parts[-1] = folded
                i += 1
                continue
        if part is None:
            part = _fallback(graph, i, why, view, fallback)
        parts.append(part)
        i = part.end
    return Partition(tuple(parts), declined)


def _name(graph: Graph, k: int) -> str:
    return f"{graph.name}_part{k}"


def _fold_into(graph: Graph, inst: Instance, parts: list[Part], i: int, accepts: Accepts) -> Part | None:
    """The cuDNN part before node i, a cast, with the cast folded in (subgraph.cast_folded), where cuDNN takes it."""
    last = parts[-1] if parts else None
    if last is None or last.kind != CUDNN or last.end != i or graph.nodes[i].op != CAST:
        return None
    sub = cast_folded(graph, inst, last.first, i + 1, last.graph.name)
    return Part(last.first, i + 1, CUDNN, sub) if sub is not None and accepts(sub) is None else None


def _fallback(graph: Graph, i: int, why: str, view: str, fallback: bool) -> Part:
    """Node i left to torch (cuDNN declined it alone, saying `why`; a reshape is no view, `view` says why); a
    DslError at the op when `fallback` is off."""
    node = graph.nodes[i]
    why = f"{why}; not a view: {view}" if node.op == "reshape" else why
    if not fallback:
        raise DslError(
            Diagnostic(
                "error",
                f"no cuDNN engine runs {node.op} here, even alone ({why}), and fallback to torch is off",
                node.loc,
            )
        )
    return Part(i, i + 1, TORCH, why=why)


def split_at(
    graph: Graph, inst: Instance, cuts: tuple[int, ...], accepts: Accepts, fallback: bool, declined: str = "", chosen=""
) -> Partition:
    """The partition whose parts start at `cuts` (node indices, increasing, inside the graph): chosen by
    tune or forced. Parts are made as find_partition makes them: a reshape alone that is a view is one, a part
    cuDNN declines is taken with the casts that end it folded in. A part cuDNN declines still is a DslError at
    its first op, unless it is one op and `fallback` leaves it to torch."""
    if list(cuts) != sorted(set(cuts)) or not all(0 < c < len(graph.nodes) for c in cuts):
        raise ValueError(f"cut points {list(cuts)} are not increasing node indices in 1..{len(graph.nodes) - 1}")
    bounds, parts = (0, *cuts, len(graph.nodes)), []
    for k, (i, j) in enumerate(zip(bounds, bounds[1:]), 1):
        view = view_refusal(graph, inst, i)
        if j == i + 1 and view is None:
            parts.append(Part(i, j, VIEW))
            continue
        sub = subgraph(graph, inst, i, j, _name(graph, k))
        why = accepts(sub)
        folded = cast_folded(graph, inst, i, j, sub.name) if why is not None else None
        if folded is not None and accepts(folded) is None:
            sub, why = folded, None
        if why is None:
            parts.append(Part(i, j, CUDNN, sub))
        elif j == i + 1:
            parts.append(_fallback(graph, i, why, view, fallback))
        else:
            node = graph.nodes[i]
            raise DslError(
                Diagnostic("error", f"part {k} ({node.op} onwards) of this split is not built: {why}", node.loc)
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
        c = p.counts
        how = f"{c.launches} cuDNN graphs" + (f", {c.views} view(s)" if c.views else "")
        how += f", {c.fallbacks} op(s) left to torch" if c.fallbacks else ""
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
    """cuDNN's reason without the backend's engine-by-engine dump (the rest whole: cuDNN's words are clipped where
    they are caught, on a word boundary, and a reason of the project's own is short)."""
    return message.split(" (the backend declined")[0]


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
    return None, find_partition(
        graph, inst, deviceless_accepts(options, target), declined, options.fallback, progress=progress
    )


def deviceless_accepts(options, target) -> Accepts:
    """Acceptance by the real cuDNN library, planning for `target` without a device; asked once per distinct
    graph (build_key: the 16 equal parts of a graph of 128 equal ops are one question)."""
    from cudnn_dsl.build.pipeline import compile_shape

    answers: dict[tuple, str | None] = {}

    def accepts(part: Graph) -> str | None:
        key = build_key(part)
        if key not in answers:
            try:
                compile_shape(part, part.instances[0], options, target)
                answers[key] = None
            except DslError as e:
                answers[key] = short(e.diagnostics[0].message)
        return answers[key]

    return accepts
