"""A run of a graph's nodes as a graph of its own (what partitioning builds on).

The nodes keep their attributes; UIDs are numbered afresh, in the order the nodes name their tensors,
so that two runs of one structure (three weight gradients of equal shapes) are one graph to the plan
store and to the runner. Values the run reads but does not make become its inputs (tensors an earlier
part made are materialized there, in their inferred dtype); values it makes that a later node or the
caller reads become its outputs. A part keeps the buffers its views read; its outputs are plain
outputs (the runner binds an output in place to its input's memory).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import attrs

from dsl.ir import Graph, Instance, Node, Value
from dsl.ops import OPS
from dsl.types import is_float, itemsize

CAST = "identity"
"""the op that only converts its operand's dtype: a producer can write its result directly"""


def subgraph(graph: Graph, inst: Instance, first: int, end: int, name: str) -> Graph:
    """Nodes [first, end) of one shape of `graph`, as a one-shape graph named `name`."""
    nodes = graph.nodes[first:end]
    made = {o for n in nodes for o in n.outputs}
    read = [i for n in nodes for i in n.reads if i not in made]
    later = {i for n in graph.nodes[end:] for i in n.inputs if i is not None}
    for n in nodes:  # cuDNN wants an op's statistics alike: one materialized (a later part reads it), all are
        if any(o in later or graph.value(o).kind == "output" for o in n.outputs[1:]):
            later |= set(n.outputs[1:])
    values = []
    for v in graph.values:
        if v.name in made:
            kind = "output" if v.kind == "output" or v.name in later else "virtual"
            values.append(attrs.evolve(v, kind=kind, into=None))
        elif v.name in read:
            values.append(v if v.kind in ("input", "scalar", "const") else attrs.evolve(v, kind="input"))
    buffers = tuple(b for b in graph.buffers if any(v.view and v.view[0] == b.name for v in values))
    names = {v.name for v in values} | {b.name for b in buffers}
    attrs_of = tuple(inst.node_attrs[first:end]) if inst.node_attrs else ()
    part = Instance((), tuple((k, t) for k, t in inst.types if k in names), attrs_of)
    values, nodes = _numbered(values, nodes)
    return attrs.evolve(
        graph,
        name=name,
        symbols=(),
        values=values,
        nodes=nodes,
        buffers=buffers,
        instances=(part,),
        input_dims=(),
        typer=None,
    )


def _numbered(values: list[Value], nodes: tuple[Node, ...]) -> tuple[tuple[Value, ...], tuple[Node, ...]]:
    """The values in the order the nodes first name them, UIDs 1, 2, ... in that order, and the UIDs of
    attributes lowered to pass-by-value tensors after them: the canonical numbering of a part."""
    order = list(dict.fromkeys(n for node in nodes for n in (*node.reads, *node.outputs)))
    uid = {name: k for k, name in enumerate(order, 1)}
    by_name = {v.name: v for v in values}
    numbered, attr_uid = [], len(order)
    for node in nodes:
        uids = tuple((a, attr_uid + k) for k, (a, _) in enumerate(node.uids, 1))
        attr_uid += len(uids)
        numbered.append(attrs.evolve(node, uids=uids) if uids else node)
    return tuple(attrs.evolve(by_name[n], uid=uid[n]) for n in order), tuple(numbered)


def cast_folded(graph: Graph, inst: Instance, first: int, end: int, name: str) -> Graph | None:
    """Nodes [first, end) as `subgraph` makes them, with the casts that end the run (identity ops) folded into
    the nodes that make their operands: such a node writes the cast's result, named and typed as the cast's, and
    the operand is never made. None when the last node is no cast that folds: one whose operand is made in the
    run, is read by no other node and is no output of the graph."""
    whole = graph
    while end - first > 1 and (folded := _fold_last(graph, inst, first, end)) is not None:
        graph, inst = folded
        end -= 1
    return subgraph(graph, inst, first, end, name) if graph is not whole else None


def _fold_last(graph: Graph, inst: Instance, first: int, end: int) -> tuple[Graph, Instance] | None:
    """(the graph and its shape with node end - 1, a cast, folded into the node of [first, end - 1) that makes its
    operand), or None when it does not fold (cast_folded)."""
    cast = graph.nodes[end - 1]
    if cast.op != CAST:
        return None
    operand, result = cast.inputs[0], cast.outputs[0]
    maker = next((k for k in range(first, end - 1) if operand in graph.nodes[k].outputs), None)
    readers = [n for n in graph.nodes if operand in n.inputs]
    if maker is None or len(readers) != 1 or graph.value(operand).kind == "output":
        return None
    if not _narrows(inst.type(operand).dtype, inst.type(result).dtype):
        return None
    node = graph.nodes[maker]
    writes = attrs.evolve(node, outputs=tuple(result if o == operand else o for o in node.outputs))
    nodes = graph.nodes[:maker] + (writes,) + graph.nodes[maker + 1 : end - 1] + graph.nodes[end:]
    node_attrs = inst.node_attrs[: end - 1] + inst.node_attrs[end:] if inst.node_attrs else ()
    shape = Instance(inst.binding, tuple((k, t) for k, t in inst.types if k != operand), node_attrs)
    values = tuple(v for v in graph.values if v.name != operand)
    return attrs.evolve(graph, values=values, nodes=nodes, instances=(shape,), typer=None), shape


def _narrows(source: str, to: str) -> bool:
    """Whether writing `to` where `source` was made rounds as the cast does: a float to a float no wider (a
    widening cast keeps the narrow value's rounding, which the producer would skip)."""
    return is_float(source) and is_float(to) and itemsize(to) <= itemsize(source)


def unconnected(graph: Graph) -> tuple[int, int] | None:
    """(a node, a node of another computation) when the graph's nodes form more than one connected
    computation; None when they form one. Nodes are joined by a value one makes and another reads, and
    in a graph of pointwise ops only, also by an input they both read. What cuDNN 9.19 did on the H200:
    two pointwise chains over the halves of one tensor (examples/rope_in_place.cdg) ran right as one
    graph; two pointwise chains reading nothing in common, or a conv_wgrad beside a relu_backward that
    shares its input, built and ran with one chain's output never written."""
    parent = list(range(len(graph.nodes)))
    if len(parent) < 2:
        return None

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    pointwise = all(OPS[n.op].family == "pointwise" for n in graph.nodes)
    joins: dict[str, int] = {o: k for k, n in enumerate(graph.nodes) for o in n.outputs}
    for k, n in enumerate(graph.nodes):
        for i in n.inputs:
            if i is None:
                continue
            if i in joins:
                parent[root(k)] = root(joins[i])
            elif pointwise and graph.value(i).kind == "input":
                joins[i] = k
    other = next((k for k in range(len(parent)) if root(k) != root(0)), None)
    return None if other is None else (0, other)


def fusion_order(nodes: Sequence[tuple[str, tuple[str, ...], tuple[str, ...]]], inputs: set[str]) -> list[int]:
    """A topological order of `nodes` ((op, inputs, outputs), given in a valid order; `inputs`: the graph's
    input names) that keeps together what cuDNN may fuse, for the partitioner, which splits a declined graph
    into runs of consecutive nodes. It grows one run at a time:
    - next, a pointwise op joined to the run as `unconnected` joins nodes (it reads a value the run made,
      or, in a run of pointwise ops, an input the run reads); else one making another operand of a
      pointwise op that reads the run;
    - when none is ready, a reduction of a value the run made ends the run (a matmul's or conv's epilogue);
    - then the other ready reductions: cuDNN runs a reduction after no pointwise op alone, so each is a part
      of its own, and placed early it readies more ops for the next run;
    - then a new run starts: at a matmul, conv or other op before a pointwise op (which may yet join a
      run), and at an op that readies one of its readers before one that does not.
    Before all, the reshapes of inputs (views: they launch nothing, and between two ops they would cut a run).
    Among equals, the op whose inputs were made last, then the one given first: deterministic.
    A step looks at the ready pointwise ops and reductions and at their neighbours; the other ready nodes wait
    in a heap by `start` (a key that only grows, as nodes are placed): what is ready, and what the run reads, is
    kept up to date, so a long graph costs about its length, not its length times the nodes waiting."""
    made_by = {o: k for k, (_, _, outs) in enumerate(nodes) for o in outs}
    deps = [{made_by[i] for i in ins if i in made_by} for _, ins, _ in nodes]
    readers: list[list[int]] = [[] for _ in nodes]
    for c, ds in enumerate(deps):
        for d in ds:
            readers[d].append(c)
    family = [OPS[op].family for op, _, _ in nodes]
    pos: dict[int, int] = {}
    waiting = [len(ds) for ds in deps]  # the unplaced nodes each node reads
    ready: dict[str, set[int]] = {"pointwise": set(), "reduction": set(), "other": set()}
    starts: list[tuple] = []  # every ready node by -start (stale entries skipped: a key only grows)
    key: dict[int, tuple] = {}
    run: set[int] = set()
    run_pointwise, run_inputs = True, set()  # whether the run is of pointwise ops alone; the inputs it reads

    def latest(k: int) -> tuple[int, int]:
        return max((pos[d] for d in deps[k]), default=-1), -k

    def joins(k: int) -> bool:
        return bool(deps[k] & run) or run_pointwise and any(i in run_inputs for i in nodes[k][1])

    def feeds(k: int) -> bool:
        return any(family[c] == "pointwise" and deps[c] & run for c in readers[k])

    def start(k: int) -> tuple:
        readies = not readers[k] or any(deps[c] - {k} <= pos.keys() for c in readers[k])
        return family[k] != "pointwise", readies, *latest(k)

    def wait(k: int) -> None:
        """(Re)files a ready node by its start key."""
        if key.get(k) != (now := start(k)):
            key[k] = now
            heapq.heappush(starts, (tuple(-x for x in now), k))

    def first_to_start() -> int:
        while starts[0][1] in pos or tuple(-x for x in starts[0][0]) != key[starts[0][1]]:
            heapq.heappop(starts)
        return starts[0][1]

    def placed(k: int) -> None:
        pos[k] = len(pos)
        ready[_kind(family[k])].discard(k)
        for c in readers[k]:
            waiting[c] -= 1
            if not waiting[c]:
                ready[_kind(family[c])].add(c)
                wait(c)
            for d in deps[c]:  # k may have made c's other operands start readier
                if d not in pos and not waiting[d]:
                    wait(d)

    for k in range(len(nodes)):
        if not deps[k] and nodes[k][0] == "reshape":
            placed(k)  # an input's view, first: it launches nothing, and between two ops it would cut their run
    for k in range(len(nodes)):
        if not deps[k] and k not in pos:
            ready[_kind(family[k])].add(k)
            wait(k)
    while any(ready.values()):
        pointwise = ready["pointwise"]
        grow = [k for k in pointwise if joins(k)] or [k for k in pointwise if feeds(k)]
        reductions = ready["reduction"]
        ends = [k for k in reductions if deps[k] & run]
        if grow:
            k = max(grow, key=latest)
        else:
            k = max(ends or reductions, key=start) if reductions else first_to_start()
            run, run_pointwise, run_inputs = set(), True, set()
        if grow or family[k] != "reduction":
            run.add(k)
            run_pointwise = run_pointwise and family[k] == "pointwise"
            run_inputs |= {i for i in nodes[k][1] if i in inputs}
        placed(k)
    return sorted(pos, key=pos.get)


def _kind(family: str) -> str:
    return family if family in ("pointwise", "reduction") else "other"


def one_op_graphs(graph: Graph, inst: Instance) -> list[tuple[Node, Graph]]:
    """One graph per node of `graph` at this shape: the node alone, with the types the whole graph gives it.
    Its tensor operands are inputs (an intermediate keeps its dtype), its scalars and constants stay what
    they were, its results are outputs; UIDs are numbered afresh."""
    out = []
    for index, node in enumerate(graph.nodes):
        names = list(dict.fromkeys(node.reads))
        values = []
        for uid, name in enumerate(names, 1):
            v = graph.value(name)
            kind = v.kind if v.kind in ("scalar", "const") else "input"
            values.append(Value(name, kind, uid, v.scalar, v.dtype, v.loc, dims=v.dims))
        values += [Value(o, "output", len(names) + k, loc=node.loc) for k, o in enumerate(node.outputs, 1)]
        types = tuple((v.name, inst.type(v.name)) for v in values)
        alone = Instance(inst.binding, types, (inst.node_attrs[index],))
        one = Graph(
            name=f"{graph.name}.{node.outputs[0]}",
            file=graph.file,
            io=graph.io,
            intermediate=graph.intermediate,
            compute=graph.compute,
            options=graph.options,
            symbols=(),
            values=tuple(values),
            nodes=(node,),
            instances=(alone,),
            loc=node.loc,
        )
        out.append((node, one))
    return out
