"""The canonical .cdg printer (fmt), the AST and IR dumps, and the check summary."""

from __future__ import annotations

import math

import attrs

from dsl.ir import Graph, Program
from dsl.options import Options
from dsl.syntax import ast
from dsl.types import UNSET

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


# ---- fmt: ast -> canonical text ---------------------------------------------------


def fmt_value(v) -> str:
    if isinstance(v, ast.Number):
        return v.text or repr(v.value)
    if isinstance(v, ast.Ident):
        return v.name
    if isinstance(v, ast.String):
        return f'"{v.value}"'
    if isinstance(v, ast.ListValue):
        return "[" + ", ".join(fmt_value(x) for x in v.items) + "]"
    raise TypeError(v)


def fmt_expr(e, prec: int = 0) -> str:
    if isinstance(e, ast.Ref):
        return e.name
    if isinstance(e, ast.Number):
        return fmt_value(e)
    if isinstance(e, ast.Neg):
        return "-" + fmt_expr(e.operand, 3)
    if isinstance(e, ast.Call):
        args = [fmt_expr(a) for a in e.args] + [
            f"{k.name}={fmt_value(k.value)}" + (f" uid={k.uid}" if k.uid is not None else "") for k in e.kwargs
        ]
        return f"{e.op}({', '.join(args)})"
    if isinstance(e, ast.BinOp):
        p = _PREC[e.op]
        text = f"{fmt_expr(e.lhs, p)} {e.op} {fmt_expr(e.rhs, p + 1)}"
        return f"({text})" if p < prec else text
    raise TypeError(e)


def _fmt_type(t: ast.TypeSpec) -> str:
    if t.dims is None:
        return t.dtype
    return t.dtype + "[" + ", ".join(str(d.value) for d in t.dims) + "]"


def _fmt_stride(stride: int | tuple[int | str, ...]) -> str:
    """A declared stride as written: `8`, or a product `H*W*C`."""
    return str(stride) if isinstance(stride, int) else "*".join(map(str, stride))


def _fmt_specs(specs, view: bool = False) -> str:
    """Specs as written, the place last; a view's offset always shown (`in qkv at 0`)."""
    out = []
    for s in sorted(specs, key=lambda s: isinstance(s, ast.Place)):
        if isinstance(s, ast.Layout):
            out.append(s.name)
        elif isinstance(s, ast.Strides):
            out.append("strides [" + ", ".join(_fmt_stride(v) for v in s.values) + "]")
        elif isinstance(s, ast.Place):
            offset = s.offset if s.offset is not None or not view else 0
            out.append(f"in {s.target}" + (f" at {offset}" if offset is not None else ""))
        elif isinstance(s, ast.InitSpec):
            out.append(f"init={s.dist}" + (f"({', '.join(fmt_value(a) for a in s.args)})" if s.args else ""))
        else:
            out.append(f"uid={s.value}")
    return "".join(" " + x for x in out)


def fmt_stmt(st) -> str:
    if isinstance(st, ast.TypesDecl):
        return f"{st.kind} {st.dtype}"
    if isinstance(st, ast.OptionDecl):
        return f"option {st.name} = {fmt_value(st.value)}"
    if isinstance(st, ast.DimDecl):
        if st.span is not None:
            lo, hi, step = st.span
            return f"dim {st.name} in {lo}..{hi}" + (f" step {step}" if step != 1 else "")
        return f"dim {st.name} in {{{', '.join(map(str, st.values))}}}"
    if isinstance(st, ast.InputDecl):
        return f"input {st.name} : {_fmt_type(st.type)}{_fmt_specs(st.specs, view=True)}"
    if isinstance(st, ast.ScalarDecl):
        dims = "" if st.dims is None else "[" + ", ".join(str(d.value) for d in st.dims) + "]"
        return f"scalar {st.name} : {st.dtype}{dims} = {fmt_value(st.value)}{_fmt_specs(st.specs)}"
    if isinstance(st, ast.OutputDecl):
        text = f"output {st.name}"
        if st.type is not None:
            text += f" : {_fmt_type(st.type)}"
        text += _fmt_specs(st.specs)
        return text + (f" = {fmt_expr(st.expr)}" if st.expr is not None else "")
    if isinstance(st, ast.BufferDecl):
        return f"buffer {st.name} : {_fmt_type(st.type)}{_fmt_specs(st.specs)}"
    if isinstance(st, ast.Assign):
        typed = f" : {_fmt_type(st.type)}" if st.type is not None else ""
        return f"{', '.join(st.targets)}{typed} = {fmt_expr(st.expr)}"
    raise TypeError(st)


def fmt_module(m: ast.Module) -> str:
    """Canonical text of a module; comments and single blank lines between groups are kept."""
    comments = list(m.comments)
    out: list[str] = []
    last = [0]

    def flush(before: int, indent: str) -> None:
        while comments and comments[0][0] < before:
            line, text = comments.pop(0)
            gap(line, indent)
            out.append(indent + text)
            last[0] = line

    def gap(line: int, indent: str) -> None:
        if last[0] and line > last[0] + 1 and out and out[-1].strip() not in ("", "{") and not out[-1].endswith("{"):
            out.append("")

    def trailing(line: int) -> str:
        if comments and comments[0][0] == line:
            return "  " + comments.pop(0)[1]
        return ""

    for i, g in enumerate(m.graphs):
        if i:
            out.append("")  # one blank line between graphs
        flush(g.loc.line, "")
        out.append(f"graph {g.name} {{" + trailing(g.loc.line))
        last[0] = g.loc.line
        last_on_line = {
            st.loc.end_line: st for st in g.stmts
        }  # a line's trailing comment goes after its last statement
        for st in g.stmts:
            flush(st.loc.line, "  ")
            gap(st.loc.line, "  ")
            tail = trailing(st.loc.end_line) if last_on_line[st.loc.end_line] is st else ""
            out.append("  " + fmt_stmt(st) + tail)
            last[0] = st.loc.end_line
        flush(g.loc.end_line, "  ")
        out.append("}" + trailing(g.loc.end_line))
        last[0] = g.loc.end_line
    flush(10**9, "")
    return "\n".join(out) + "\n"


# ---- dumps ----------------------------------------------------------------------------


def dump_ast(node, indent: int = 0) -> str:
    """An indented dump of an AST node, locations left out."""
    pad = "  " * indent
    if isinstance(node, tuple):
        return "\n".join(dump_ast(x, indent) for x in node)
    if not attrs.has(type(node)):
        return pad + repr(node)
    fields = [f for f in attrs.fields(type(node)) if f.eq and f.name != "comments"]
    simple = [(f.name, getattr(node, f.name)) for f in fields if not _is_tree(getattr(node, f.name))]
    head = pad + type(node).__name__ + "".join(f" {k}={v!r}" for k, v in simple)
    kids = [(f.name, getattr(node, f.name)) for f in fields if _is_tree(getattr(node, f.name))]
    lines = [head]
    for k, v in kids:
        if isinstance(v, tuple) and not v:
            continue
        lines.append(f"{pad}  {k}:")
        lines.append(dump_ast(v, indent + 2))
    return "\n".join(lines)


def _is_tree(v) -> bool:
    return attrs.has(type(v)) or (isinstance(v, tuple) and any(attrs.has(type(x)) for x in v))


def _merge(values: list[tuple[int, ...]], graph: Graph, bindings) -> str:
    """One shape over every instance: a symbol where it follows one, a|b where it varies."""
    parts = []
    for axis in range(len(values[0])):
        col = [v[axis] for v in values]
        if len(set(col)) == 1:
            parts.append(str(col[0]))
            continue
        sym = next(
            (s.name for s in graph.symbols if all(dict(b).get(s.name) == c for b, c in zip(bindings, col))), None
        )
        parts.append(sym or "|".join(str(c) for c in dict.fromkeys(col)))
    return "[" + ", ".join(parts) + "]"


def _type_str(graph: Graph, name: str) -> tuple[str, str]:
    ts = [inst.type(name) for inst in graph.instances]
    binds = [inst.binding for inst in graph.instances]
    shape = ts[0].dtype + _merge([t.shape for t in ts], graph, binds)
    return shape, _merge([t.strides for t in ts], graph, binds)


def _options_str(o: Options) -> str:
    default = Options()
    parts = []
    for f in attrs.fields(Options):
        v = getattr(o, f.name)
        if v != getattr(default, f.name):
            parts.append(f"{f.name}={', '.join(v) if isinstance(v, tuple) else v}")
    return "; ".join(parts) or "defaults"


def _attr_str(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, tuple):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v).lower() if isinstance(v, bool) else str(v)


def _attrs_str(graph: Graph, index: int) -> str:
    """A node's canonical attributes; one that differs between shapes shows each value, a|b."""
    per_inst = [inst.node_attrs[index] for inst in graph.instances]
    parts = []
    for k, _ in per_inst[0]:
        values = dict.fromkeys(_attr_str(dict(a)[k]) for a in per_inst)
        parts.append(f"{k}={'|'.join(values)}")
    return ", ".join(parts)


def _place(v) -> str:
    """Where a value lives, when not in memory of its own: ' in %qkv at 256' (a view), ' in %x' (in place)."""
    if v.view is not None:
        return f" in %{v.view[0]} at {v.view[1]}"
    return f" in %{v.into}" if v.into is not None else ""


def dump_ir(program: Program) -> str:
    out = []
    for g in program.graphs:
        out.append(
            f"graph {g.name} (io={g.io or 'auto'}, intermediate={g.intermediate or UNSET}, "
            f"compute={g.compute or UNSET})"
        )
        out.append(f"  options {_options_str(g.options)}")
        for s in g.symbols:
            out.append(f"  dim {s.name} in {s.text}")
        for b in g.buffers:
            init = f" init={b.init}" if b.init else ""
            out.append(f"  %{b.name} = buffer : {_type_str(g, b.name)[0]}{init}")
        for v in g.of_kind("input", "scalar", "const"):
            if v.kind == "input":
                t, st = _type_str(g, v.name)
                init = f" init={v.init}" if v.init else ""
                out.append(f"  %{v.name} = input uid={v.uid} : {t} strides={st}{_place(v)}{init}")
            else:
                dims = "" if v.dims is None else "[" + ", ".join(map(str, v.dims)) + "]"
                out.append(f"  %{v.name} = {v.kind} uid={v.uid} : {v.dtype}{dims} value={v.scalar}")
        for index, n in enumerate(g.nodes):
            ins = ", ".join("%" + i if i else "_" for i in n.inputs)
            res = ", ".join("%" + o for o in n.outputs)
            a = _attrs_str(g, index)
            uids = " uids {" + ", ".join(f"{k}={u}" for k, u in n.uids) + "}" if n.uids else ""
            types = "; ".join(
                f"{g.value(o).kind} uid={g.value(o).uid} {_type_str(g, o)[0]} strides={_type_str(g, o)[1]}"
                + _place(g.value(o))
                for o in n.outputs
            )
            out.append(f"  {res} = {n.op}({ins}){' {' + a + '}' if a else ''}{uids} compute={n.compute} : {types}")
        out.append("")
    return "\n".join(out)


def summary(program: Program) -> str:
    """The human summary that `cudnn-dsl check` prints for a clean file."""
    out = []
    for g in program.graphs:
        shapes = f"{len(g.instances)} shapes" if len(g.instances) > 1 else "1 shape"
        if g.typer is not None:
            total = math.prod(s.count for s in g.symbols if s.name in dict(g.instances[0].binding))
            checked = f"{len(g.instances)} checked now: each range's ends; the others on first use"
            shapes = f"{total} shape{'s' * (total != 1)} ({checked})"
        out.append(f"{program.file}: graph {g.name}: {len(g.nodes)} ops, {shapes}")
        out.append(
            f"  types    io {g.io or '(from inputs)'}, intermediate {g.intermediate or UNSET}, "
            f"compute {g.compute or UNSET}"
        )
        out.append(f"  options  {_options_str(g.options)}")
        for s in g.symbols:
            out.append(f"  dim      {s.name} in {s.text}")
        producers = {o: n for n in g.nodes for o in n.outputs}
        rows = [("buffer", b.name, "-", _type_str(g, b.name)[0], "dense, bound by the caller") for b in g.buffers]
        for v in g.values:
            if v.kind in ("scalar", "const"):
                rows.append((v.kind, v.name, str(v.uid), f"{v.dtype} = {v.scalar}", "(host, by value)"))
                continue
            t, st = _type_str(g, v.name)
            producer = producers.get(v.name)
            src = f"{producer.op}({', '.join(i or '_' for i in producer.inputs)})" if producer else ""
            where = _place(v).replace("%", "")
            rows.append((v.kind, v.name, str(v.uid), t, f"strides {st}{where}" + (f"  <- {src}" if src else "")))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for r in rows:
            out.append("  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
        out.append("")
    return "\n".join(out)


def to_json(program: Program) -> dict:
    graphs = []
    for g in program.graphs:
        insts = []
        for inst in g.instances:
            insts.append(
                {
                    "binding": dict(inst.binding),
                    "types": {
                        k: {"dtype": t.dtype, "shape": list(t.shape), "strides": list(t.strides)} for k, t in inst.types
                    },
                    "attrs": [{k: list(v) if isinstance(v, tuple) else v for k, v in a} for a in inst.node_attrs],
                }
            )
        graphs.append(
            {
                "name": g.name,
                "io": g.io,
                "intermediate": g.intermediate,
                "compute": g.compute,
                "options": {f.name: getattr(g.options, f.name) for f in attrs.fields(Options)},
                "dims": {
                    s.name: list(s.values) if s.span is None else dict(zip(("first", "last", "step"), s.span))
                    for s in g.symbols
                },
                "buffers": [b.name for b in g.buffers],
                "values": [
                    {
                        "name": v.name,
                        "kind": v.kind,
                        "uid": v.uid,
                        "scalar": v.scalar,
                        "dtype": v.dtype,
                        "dims": list(v.dims) if v.dims is not None else None,
                        "view": list(v.view) if v.view else None,
                        "into": v.into,
                    }
                    for v in g.values
                ],
                "nodes": [
                    {
                        "op": n.op,
                        "inputs": list(n.inputs),
                        "outputs": list(n.outputs),
                        "compute": n.compute,
                        "uids": dict(n.uids),
                        "loc": str(n.loc),
                    }
                    for n in g.nodes
                ],
                "instances": insts,
            }
        )
    return {"file": program.file, "graphs": graphs}


# ---- the reference tables of docs/language.md ---------------------------------------------


def _default(a) -> str:
    from dsl.values import DERIVED, REQUIRED

    if a.default is REQUIRED:
        return " (required)"
    if a.default is DERIVED or a.default is None:
        return ""
    return f" = {_attr_str(a.default)}"


def _attr_doc(a) -> str:
    what = f"{'/'.join(a.choices)}" if a.choices else a.kind
    uid = "; a cuDNN tensor, takes `uid=N`" if a.tensor else ""
    return f"`{a.name}`{_default(a)} ({what}{': ' + a.doc if a.doc else ''}{uid})"


def _bounds(a) -> str:
    from dsl.types import INT64_MAX

    lo = f">= {_attr_str(a.lo)}" if a.lo is not None else ""
    hi = f"<= {_attr_str(a.hi)}" if a.hi is not None and a.hi != INT64_MAX else ""
    return " " + " and ".join(x for x in (lo, hi) if x) if lo or hi else ""


def options_table() -> str:
    """The options of a graph, from dsl.options.OPTIONS (docs/language.md holds this text)."""
    from dsl.options import OPTIONS

    out = ["| option | values | default | what it does |", "| --- | --- | --- | --- |"]
    for a in OPTIONS.values():
        default = "none" if a.default is None else _attr_str(a.default)
        out.append(f"| `{a.name}` | {a.described}{_bounds(a)} | {default} | {a.doc} |")
    return "\n".join(out) + "\n"


def ops_tables() -> str:
    """One table of ops per family, from dsl.ops.OPS (docs/language.md holds this text)."""
    from dsl.ops import FAMILIES, OPS

    out = []
    for family in FAMILIES:
        out += [f"### {family}", "", "| op | inputs | attributes | what it computes |", "| --- | --- | --- | --- |"]
        for s in (s for s in OPS.values() if s.family == family):
            attrs_ = "; ".join(_attr_doc(a) for a in s.attrs) or "–"
            out.append(f"| `{s.name}` | {s.ports} | {attrs_} | {s.doc} |")
        out.append("")
    return "\n".join(out)


def inits_table() -> str:
    """The distributions of `init=` and `run --init`, from dsl.inits.DISTS (docs/language.md holds this text)."""
    from dsl.inits import DISTS, num_text

    out = ["| distribution | parameters | what it draws |", "| --- | --- | --- |"]
    for d in DISTS.values():
        params = ", ".join(p if v is None else f"{p} = {num_text(v)}" for p, v in zip(d.params, d.defaults))
        out.append(f"| `{d.name}` | {params} | {d.doc} |")
    return "\n".join(out) + "\n"
