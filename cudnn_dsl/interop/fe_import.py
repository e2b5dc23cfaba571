"""A cuDNN Frontend graph (its JSON, version 1.0 or 2.0, or a frontend log holding it) -> .cdg text.

The graph is read by fe_graph; what each frontend node becomes is the table-driven fe_nodes (a registry op
that no row produces is in NOT_IMPORTED with the reason; what a .cdg file says that the JSON does not carry is
in NOT_CARRIED; every field of a node is either read by its row or must hold its neutral value, so a setting
the language cannot express is an error naming the node, never silently dropped). This module writes the
graph as .cdg text and checks the result against the JSON. Pure Python and the language only (no torch, no
cuDNN): `cudnn-dsl import` starts fast.
"""

from __future__ import annotations

import json
import re

import attrs

from cudnn_dsl.interop.fe_graph import (
    MALFORMED,
    VERSIONS,
    Node,
    Tensor,
    f32_text,
    ints_text,
    language_dtype,
    number_text,
)
from cudnn_dsl.interop.fe_json import Located, Source, find_graphs
from cudnn_dsl.interop.fe_nodes import (
    INFIX_SYMBOL,
    NEUTRAL,
    NODES,
    keeps_dims,
    ragged_offset,
)
from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Program
from dsl.ops import OPS
from dsl.types import DEFAULT_MATH, UNSET, TensorType

#: words the grammar reserves, and the literals true/false: a tensor name is never one of them
_RESERVED = {"graph", "io", "intermediate", "compute", "option", "dim", "input", "scalar", "output", "strides"}
_RESERVED |= {"uid", "in", "true", "false", "buffer", "at", "step", "init"}


# ---- a graph -> .cdg text ------------------------------------------------------------------------------------


def ident(name: str, used: set[str]) -> str:
    """A frontend tensor name as a .cdg name: 'conv_fprop.0::Y' -> 'conv_fprop_0_Y', unique in the graph."""
    base = re.sub(r"\W+", "_", name, flags=re.ASCII).strip("_") or "t"
    if base[0].isdigit():
        base = "t" + base
    if base in _RESERVED:
        base += "_"
    out, k = base, 2
    while out in used:
        out, k = f"{base}_{k}", k + 1
    used.add(out)
    return out


@attrs.frozen
class Imported:
    """One frontend graph as .cdg statements, and what was read."""

    name: str
    lines: tuple[str, ...]
    tensors: tuple[Tensor, ...]
    nodes: tuple[dict, ...]
    where: str
    """'json_version 2.0, frontend 13200, cuDNN 9.28.1'"""
    src: Source
    """the text it was read from, where its tensors and nodes are located"""


def import_graph(src: Source, j: Located, name: str, scalars: dict[str, str]) -> Imported:
    version = j.get("json_version")
    if version is None:
        raise src.error(
            f"no json_version: not a cuDNN Frontend graph JSON this importer reads (versions {' and '.join(VERSIONS)}, "
            "written by frontends from 1.6 on)",
            j.pos,
        )
    if version not in VERSIONS:
        raise src.error(
            f"json_version {json.dumps(version)}: this importer reads the frontend's graph JSON "
            f"versions {' and '.join(VERSIONS)}",
            j.pos,
        )
    nodes, raw = j.get("nodes"), j.get("tensors")
    if not isinstance(nodes, list) or not isinstance(raw, (list, dict)):
        raise src.error("a graph JSON needs a 'nodes' list and 'tensors'", j.pos)
    used: set[str] = set()
    entries = (
        raw.items() if isinstance(raw, dict) else ((str(t.get("uid")) if isinstance(t, dict) else "", t) for t in raw)
    )
    tensors: dict[str, Tensor] = {}
    for key, t in entries:
        problem = _tensor_problem(t)
        if problem:
            why, field = problem
            pos = src.field(t, field) if field else getattr(t, "pos", j.pos)
            raise src.error(f"tensors[{json.dumps(key)}] is not a tensor: {why}", pos)
        if key in tensors:  # a list's tensors are keyed by uid, so nodes could not tell these apart
            first = tensors[key].json.get("name") or key
            raise src.error(f"uid {key} is given to both {first} and {t.get('name') or key}", src.field(t, "uid"))
        tensors[key] = Tensor(key, ident(t.get("name") or f"t{t.get('uid', key)}", used), t)
    for i, nj in enumerate(nodes):
        if not isinstance(nj, dict) or not isinstance(nj.get("tag"), str):
            raise src.error(f"nodes[{i}] is not a node (no tag)", getattr(nj, "pos", j.pos))
        for side in ("inputs", "outputs"):
            for port, ref in (nj.get(side) or {}).items():
                if ref is not None and str(ref) not in tensors:
                    raise src.error(
                        f"nodes[{i}] ({nj['tag']}): {side[:-1]} {port} names tensor {ref}, which is not in 'tensors'",
                        nj.pos,
                    )
                if ref is not None:
                    t = tensors[str(ref)]
                    if side == "outputs":
                        t.producer = i
                    else:
                        t.consumers += 1
                    offset = ragged_offset(tensors, t)
                    if offset is not None:  # read by the node, though no port names it
                        offset.consumers += 1
    ctx = j.get("context") or {}
    io = language_dtype(ctx.get("io_data_type"))
    lines = [f"io {io}"] if io else []
    compute, intermediate = (_graph_type(src, ctx, f"{k}_data_type") for k in ("compute", "intermediate"))
    lines += [f"intermediate {intermediate or UNSET}", f"compute {compute or UNSET}", ""]
    _composite_k(nodes, tensors)
    absorbed = _absorbed(nodes, tensors)
    for t in sorted(tensors.values(), key=lambda t: (t.uid is None, t.uid or 0)):  # in UID order, as declared
        if t.producer is None and t.key not in absorbed and t.consumers:
            try:
                lines.append(_declare(src, j, t, scalars))
            except MALFORMED as e:
                raise src.error(f"tensor '{t.json.get('name', t.key)}': {e}", getattr(t.json, "pos", j.pos)) from None
    lines.append("")
    for i, nj in enumerate(nodes):
        node = Node(src, nj, i, tensors, scalars)
        try:
            lines += _statements(node, compute, intermediate)
        except MALFORMED as e:
            raise node.fail(str(e)) from None
    fe, be = j.get("cudnn_frontend_version", "?"), j.get("cudnn_backend_version", "?")
    where = f"json_version {version}, frontend {fe}, cuDNN {be}"
    return Imported(name, tuple(lines), tuple(tensors.values()), tuple(nodes), where, src)


def _graph_type(src: Source, ctx, key: str) -> str | None:
    """The graph's intermediate or compute type: None (unset) where the JSON says null or NOT_SET, as a graph that
    never sets it does; the language's default where the JSON says nothing, as a file without the line."""
    if key not in ctx:
        return DEFAULT_MATH
    v = ctx[key]
    if v is None or v == "NOT_SET":
        return None
    d = language_dtype(v)
    if d is None:
        raise src.error(f"context {key} {json.dumps(v)}: the language has no such dtype", src.field(ctx, key))
    return d


def _ints_from(v, low: int) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= low for x in v)


#: cuDNN's CUDNN_DIM_MAX: no frontend graph holds a tensor of more dims
MAX_RANK = 8


def _tensor_problem(t) -> tuple[str, str | None] | None:
    """What makes a JSON value not a frontend tensor, and the field it is in; or None."""
    if not isinstance(t, dict):
        return "not an object", None
    dims, strides, uid = t.get("dim") or [], t.get("stride") or [], t.get("uid")
    if isinstance(dims, list) and len(dims) > MAX_RANK:
        return f"dim has {len(dims)} dims; cuDNN's tensors have at most {MAX_RANK}", "dim"
    if not _ints_from(dims, 1):
        return f"dim {json.dumps(dims)} is not a list of positive integers", "dim"
    if not _ints_from(strides, 0) or (strides and len(strides) != len(dims)):
        return f"stride {json.dumps(strides)} is not one integer >= 0 per dim", "stride"
    dtype = language_dtype(t.get("data_type"))
    if dtype and strides and TensorType(dtype, tuple(dims), tuple(strides)).too_large:
        return f"dim {json.dumps(dims)} and stride {json.dumps(strides)}: its size overflows a 64-bit integer", "stride"
    if uid is not None and not _ints_from([uid], 0):
        return f"uid {json.dumps(uid)} is not an integer >= 0", "uid"
    if not isinstance(t.get("name") or "", str):
        return f"name {json.dumps(t.get('name'))} is not a string", "name"
    for flag in ("is_virtual", "is_pass_by_value"):  # read as truth values: a string would be taken as true
        if t.get(flag) is not None and not isinstance(t.get(flag), bool):
            return f"{flag} {json.dumps(t.get(flag))} is not true or false", flag
    return None


def _composite_k(nodes: list, tensors: dict[str, Tensor]) -> None:
    """The frontend's composite sdpa (chosen for a dropout mask, among others) transposes K in place to [B, H, D, S]
    and its JSON shows that K; its sdpa_backward and sdpa_fp8_backward do so to K and V. Put them back as the
    language (and the frontend's caller) gave them."""
    for nj in nodes:
        composite = nj["tag"] == "SDPA" and nj.get("implementation") == "COMPOSITE"
        ports = ("K",) if composite else ("K", "V") if nj["tag"] in ("SDPA_BWD", "SDPA_FP8_BWD") else ()
        for port in ports:
            ref = (nj.get("inputs") or {}).get(port)
            if ref is None:
                continue
            t = tensors[str(ref)]
            for field in ("dim", "stride"):
                v = list(t.json.get(field) or [])
                if len(v) == 4:
                    t.json[field] = v[:2] + v[:1:-1]


def _absorbed(nodes: list, tensors: dict[str, Tensor]) -> set[str]:
    """Pass-by-value inputs that the language spells as an attribute of their node (epsilon, the sdpa scale, but
    for an sdpa's scale that the frontend holds in no attn_scale_value: that is the language's attn_scale, and an
    epsilon or momentum with dims of its own: a declared scalar the attribute names)."""
    ports = {
        **dict.fromkeys(("LAYER_NORM", "RMS_NORM", "INSTANCE_NORM", "ADA_LAYER_NORM"), ("EPSILON",)),
        "BATCHNORM": ("EPSILON", "MOMENTUM"),
        "SDPA": ("Attn_scale",),
        "SDPA_FP8_FWD": ("Attn_scale",),
        "SDPA_BWD": ("Attn_scale",),
        "SDPA_FP8_BWD": ("Attn_scale",),
    }
    out = set()
    for nj in nodes:
        if nj["tag"] in ("SDPA", "SDPA_BWD") and nj.get("attn_scale_value") is None:
            continue
        for port in ports.get(nj["tag"], ()):
            ref = (nj.get("inputs") or {}).get(port)
            if ref is None or not tensors[str(ref)].by_value:
                continue
            x = (nj.get("inputs") or {}).get("X")
            if port in ("EPSILON", "MOMENTUM") and keeps_dims(tensors[str(ref)], tensors.get(str(x))):
                continue  # a declared scalar (fe_nodes.keeps_dims)
            out.add(str(ref))
    return out


def _declare(src: Source, j: Located, t: Tensor, scalars: dict[str, str]) -> str:
    what = f"tensor '{t.json.get('name', t.key)}'"
    pos = getattr(t.json, "pos", j.pos)
    if t.virtual:
        raise src.error(f"{what} is virtual but no node computes it", pos)
    if t.dtype is None:
        raise src.error(f"{what} has data_type {json.dumps(t.json.get('data_type'))}, which the language lacks", pos)
    uid = f" uid={t.uid}" if t.uid is not None else ""
    if t.by_value:
        value = t.value(scalars)
        if value is None:
            raise src.error(
                f"{what} is passed by value, and the JSON does not hold its value (the frontend leaves out values "
                f"bound at launch): give it with --scalar {t.name}=VALUE",
                pos,
            )
        text = value if isinstance(value, str) else f32_text(value) if t.dtype == "float" else number_text(value)
        return f"scalar {t.name} : {t.dtype}{ints_text(t.dims) if t.dims else ''} = {text}{uid}"
    if not t.dims or not t.strides:
        raise src.error(f"{what} has no {'strides' if t.dims else 'dims'}", pos)
    return f"input {t.name} : {t.dtype}{ints_text(t.dims)} strides {ints_text(t.strides)}{uid}"


def _statements(n: Node, compute: str, intermediate: str) -> list[str]:
    row = NODES.get(n.tag)
    if row is None:
        raise n.fail(f"the language has no op for frontend nodes of type {n.tag}", "tag")
    call = row.convert(n)
    _check_neutral(n)
    node_compute = language_dtype(n.get("compute_data_type"))
    default = OPS[call.op].compute or compute  # logic ops compute in bool unless told
    if node_compute is None and default is None:
        raise n.fail("has no compute_data_type, and the graph's is unset", "compute_data_type")
    kwargs = list(call.attrs) + ([("compute", node_compute)] if node_compute and node_compute != default else [])
    outs = [n.tensor(p, "outputs") for p in call.outputs]
    extra = [p for p, ref in (n.j.get("outputs") or {}).items() if ref is not None and p not in call.outputs]
    extra = [p for p in extra if p not in call.unused or not _dangling(n.tensor(p, "outputs"))]
    if extra:
        raise n.fail(f"gives outputs {', '.join(extra)}, which the language's {call.op} does not")
    missing = [p for p, o in zip(call.outputs, outs) if o is None]
    if missing:
        raise n.fail(f"has no {', '.join(missing)} output, which the language's {call.op} gives")
    if call.op in INFIX_SYMBOL and len(call.args) == 2 and not kwargs:
        expr = f"{call.args[0]} {INFIX_SYMBOL[call.op]} {call.args[1]}"
    else:
        expr = f"{call.op}({', '.join(list(call.args) + [f'{k}={v}' for k, v in kwargs])})"
    if len(outs) == 1 and not outs[0].virtual:
        return [f"output {_output_decl(outs[0])} = {expr}"]
    if len(outs) == 1 and outs[0].dtype and outs[0].dtype != _virtual_dtype(n, call.op, intermediate):
        return [f"{outs[0].name} : {outs[0].dtype} = {expr}"]  # a typed intermediate
    lines = [f"{', '.join(o.name for o in outs)} = {expr}"]
    return lines + [f"output {_output_decl(o)}" for o in outs if not o.virtual]


def _virtual_dtype(n: Node, op: str, intermediate: str) -> str | None:
    """The dtype the language gives a virtual result that declares none (docs/language.md, Precision)."""
    sig = OPS[op]
    first = n.tensor(next(iter(n.j.get("inputs") or {}), ""))
    return sig.result_dtype or (first.dtype if sig.keeps_dtype and first else None) or intermediate


def _dangling(t: Tensor) -> bool:
    return t.virtual and not t.consumers


def _output_decl(t: Tensor) -> str:
    text = t.name
    if t.dtype:
        text += f" : {t.dtype}" + (
            ints_text(t.dims) + (f" strides {ints_text(t.strides)}" if t.strides else "") if t.dims else ""
        )
    return text + (f" uid={t.uid}" if t.uid is not None else "")


def _check_neutral(n: Node) -> None:
    neutral = NEUTRAL.get(n.tag, {})
    for field, v in n.j.items():
        if field in n.read or v in (None, False, []):
            continue
        ok = neutral.get(field, ())
        if ok != "*" and v not in ok:
            raise n.fail(f"{field}={json.dumps(v)} has no spelling in the language", field)


# ---- the whole file ------------------------------------------------------------------------------------------


def to_cdg(
    text: str, file: str, *, name: str = "imported", scalars: dict[str, str] | None = None
) -> tuple[str, list[Imported]]:
    """The canonical .cdg text for every graph in a frontend JSON file or log; DslError (located in the
    input) for what the language cannot express."""
    from dsl.syntax.parser import parse
    from dsl.syntax.printer import fmt_module

    src = Source(file, text.removeprefix("\ufeff"))
    graphs = find_graphs(src)
    used: set[str] = set()
    imported = []
    for j in graphs:
        try:
            gname = ident(str((j.get("context") or {}).get("name") or name), used)
            imported.append(import_graph(src, j, gname, scalars or {}))
        except MALFORMED as e:  # a field of the wrong type where nothing more precise catches it
            raise src.error(f"not the cuDNN Frontend's graph JSON: {type(e).__name__}: {e}", j.pos) from None
    raw = cdg_text(f"Imported by `cudnn-dsl import` from {file}", [(g.where, g.name, g.lines) for g in imported])
    return fmt_module(parse(raw, "<imported>")), imported


def cdg_text(header: str, graphs) -> str:
    """A .cdg file (not yet canonical) of graphs given as (comment, name, statements), under a header comment:
    what every importer writes."""
    out = [f"# {header}"]
    for where, name, lines in graphs:
        out += ["", f"# {where}", f"graph {name} {{"] + [f"  {line}" if line else "" for line in lines] + ["}"]
    return "\n".join(out) + "\n"


_GRAPH_LINE = re.compile(r"\s*graph\s+(\w+)")
_DECLARES = re.compile(r"\s*(?:(?:input|output|scalar)\s+(\w+)|(\w+)\s*(?::[^=]*)?=)")


def in_json(diagnostics, cdg: str, imported: list[Imported]) -> list[Diagnostic]:
    """The checker's diagnostics of the imported text, each one on a statement that declares a tensor of the JSON
    located at that tensor's field in the JSON instead (its dims or strides, when it speaks of them): what a user
    reads is the file, not the text made of it."""
    lines = cdg.splitlines()
    graphs = {g.name: g for g in imported}
    out = []
    for d in diagnostics:
        above = lines[: d.loc.line]
        graph = next((m.group(1) for line in reversed(above) if (m := _GRAPH_LINE.match(line))), None)
        m = _DECLARES.match(lines[d.loc.line - 1]) if 0 < d.loc.line <= len(lines) else None
        g = graphs.get(graph)
        t = next((t for t in g.tensors if m and t.name in m.groups()), None) if g else None
        if t is None:
            out.append(d)
            continue
        field = "stride" if "stride" in d.message else "dim" if re.search(r"\[\d", d.message) else "name"
        named = t.json.get("name", t.key)
        message = f"tensor '{named}'{f' (imported as {t.name!r})' if t.name != named else ''}: {d.message}"
        out.append(Diagnostic(d.severity, message, g.src.loc(g.src.field(t.json, field)), d.notes))
    return out


def verify(program: Program, imported: list[Imported]) -> None:
    """Refuses, at the field of the JSON, a tensor the JSON describes otherwise than the checked .cdg types it
    (dtype, dims, strides): a virtual or output tensor the JSON gives other dims or strides than its producer
    makes, say. The import must be the same graph, not a plausible one. DslError with every such field."""
    problems = []
    for graph, g in zip(program.graphs, imported):
        inst = graph.instances[0]
        names = {v.name for v in graph.values}
        nodes = g.nodes
        for t in g.tensors:
            if t.name not in names:
                continue
            ty = inst.type(t.name)
            checks = [("data_type", t.dtype, ty.dtype)]
            if t.by_value:  # a scalar's declared dims are those cuDNN gets
                checks += [("dim", t.dims, list(graph.value(t.name).dims or ()))]
            else:
                checks += [("dim", t.dims, list(ty.shape)), ("stride", t.strides, list(ty.strides))]
            what = f"tensor '{t.json.get('name', t.key)}'"
            if t.producer is not None:
                made = nodes[t.producer]
                by = f"node '{made.get('name', '')}' ({made.get('tag')}, nodes[{t.producer}]) makes"
            else:
                by = "the imported graph has"
            for field, want, got in checks:
                if want and want != got:
                    message = f"{what}: {field} {json.dumps(want)} contradicts its graph: {by} {json.dumps(got)}"
                    problems.append(Diagnostic("error", message, g.src.loc(g.src.field(t.json, field))))
    if problems:
        raise DslError(problems)
