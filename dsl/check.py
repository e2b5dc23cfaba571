"""ast.Module -> ir.Program. Resolves names, declarations, options and attributes
into a ``Resolved`` record, then types each binding of the symbolic dims (``dsl.infer``)."""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from dsl.diagnostics import DslError, Loc, RuleError, Sink
from dsl.infer import Typer
from dsl.inits import DISTS, check_dtype, like, make
from dsl.ir import Buffer, Graph, Instance, Node, Program, Symbol, Value
from dsl.ops import INFIX, OPS, OpSig
from dsl.options import OPTIONS, Options
from dsl.resolved import BufferDecl, Decl, OutDecl, PNode, Resolved
from dsl.syntax import ast
from dsl.types import (
    DEFAULT_MATH,
    DTYPE_ALIASES,
    DTYPES,
    INT64_MAX,
    LAYOUTS,
    LEFT_TO_OFFSETS,
    UNSET,
    canonical_dtype,
    check_value,
    layout_order,
    stride_values,
)
from dsl.values import REQUIRED, convert

MAX_INSTANCES = 64


def check(module: ast.Module, sink: Sink | None = None) -> Program:
    """Checks every graph; raises DslError carrying every error (and warning) found."""
    sink = sink if sink is not None else Sink()
    graphs = []
    seen: dict[str, Loc] = {}
    for gdef in module.graphs:
        if gdef.name in seen:
            sink.error(f"duplicate graph '{gdef.name}'", gdef.loc, [("first defined here", seen[gdef.name])])
            continue
        seen[gdef.name] = gdef.loc
        g = _GraphChecker(module.file, gdef, sink).run()
        if g is not None:
            graphs.append(g)
    if not module.graphs:
        sink.error(
            "no graph in file; a file holds one or more 'graph NAME { ... }' blocks", Loc(module.file, 1, 1, 1, 2)
        )
    sink.raise_if_errors()
    return Program(module.file, tuple(graphs))


class _GraphChecker:
    def __init__(self, file: str, gdef: ast.GraphDef, sink: Sink):
        self.file, self.gdef, self.sink = file, gdef, sink
        self.types: dict[str, tuple[str, Loc]] = {}
        self.options: dict[str, Any] = {}
        self.option_locs: dict[str, Loc] = {}
        self.symbols: dict[str, Symbol] = {}
        self.decls: dict[str, Decl] = {}
        self.buffers: dict[str, BufferDecl] = {}
        self.nodes: list[PNode] = []
        self.produced: dict[str, tuple[PNode, Loc]] = {}
        self.outputs: dict[str, OutDecl] = {}
        self.typed: dict[str, OutDecl] = {}
        self.used: set[str] = set()
        self.poisoned: set[str] = set()
        self.failed: set[str] = set()
        """names assigned from an expression that failed: later uses stay silent"""
        self.counter = itertools.count()
        self.user_names: set[str] = set()
        self.likes: list[tuple[Decl, ast.Ident]] = []
        """inputs drawn like(x), with where x is named: checked once every declaration is read"""

    # ---- helpers --------------------------------------------------------------

    def err(self, msg: str, loc: Loc, notes=()) -> None:
        self.sink.error(msg, loc, notes)

    def dtype(self, name: str, loc: Loc) -> str | None:
        d = canonical_dtype(name)
        if d is None:
            self.err(f"unknown dtype '{name}'{self.sink.hint(name, list(DTYPES) + list(DTYPE_ALIASES))}", loc)
        return d

    def defined_at(self, name: str) -> Loc | None:
        if name in self.decls:
            return self.decls[name].loc
        if name in self.produced:
            return self.produced[name][1]
        if name in self.symbols:
            return self.symbols[name].loc
        if name in self.buffers:
            return self.buffers[name].loc
        return None

    def define(self, name: str, loc: Loc) -> bool:
        prev = self.defined_at(name)
        if prev is not None:
            self.err(f"'{name}' is already defined", loc, [("previous definition", prev)])
            return False
        return True

    def fresh(self, op: str) -> str:
        while True:
            name = f"{op}_{next(self.counter)}"
            if name not in self.user_names:
                return name

    def fresh_name(self, base: str) -> str:
        """`base`, or `base_0`, `base_1`, ... : the first that the graph does not write or define."""
        name, k = base, 0
        while name in self.user_names or self.defined_at(name) is not None:
            name, k = f"{base}_{k}", k + 1
        self.user_names.add(name)
        return name

    # ---- the pass ----------------------------------------------------------------

    def run(self) -> Graph | None:
        n_errors = self.sink.n_errors
        for st in self.gdef.stmts:
            for name in getattr(st, "targets", ()) or (getattr(st, "name", None),):
                if name:
                    self.user_names.add(name)
        for st in self.gdef.stmts:
            getattr(self, "stmt_" + type(st).__name__)(st)
        self.finish_structure()
        if self.sink.n_errors > n_errors and not self.nodes:
            return None
        resolved = Resolved(
            {k: d for k, (d, _) in self.types.items()},
            self.decls,
            tuple(self.nodes),
            self.outputs,
            frozenset(self.poisoned),
            self.buffers,
            self.typed,
            {k: loc for k, (_, loc) in self.types.items()},
            frozenset(self.user_names),
        )
        instances = self.type_instances(resolved)
        if self.sink.n_errors > n_errors:
            return None
        return self.build(instances, resolved)

    def stmt_TypesDecl(self, st: ast.TypesDecl) -> None:
        if st.kind in self.types:
            self.err(f"'{st.kind}' type given twice", st.loc, [("first given here", self.types[st.kind][1])])
            return
        if st.dtype == UNSET:
            if st.kind == "io":
                self.err("'io' is unset where no line gives it: leave out 'io unset'", st.loc)
            else:
                self.types[st.kind] = (None, st.loc)
            return
        d = self.dtype(st.dtype, st.dtype_loc)
        if d:
            self.types[st.kind] = (d, st.loc)

    def stmt_OptionDecl(self, st: ast.OptionDecl) -> None:
        a = OPTIONS.get(st.name)
        if a is None:
            self.err(
                f"unknown option '{st.name}'{self.sink.hint(st.name, OPTIONS)}",
                st.loc,
                [(f"options are: {', '.join(OPTIONS)}", None)],
            )
            return
        if st.name in self.options:
            self.err(f"option '{st.name}' given twice", st.loc, [("first given here", self.option_locs[st.name])])
            return
        try:
            self.options[st.name] = convert(a, st.value)
        except RuleError as e:
            self.err(f"option '{st.name}' {e}", st.value.loc)
            return
        self.option_locs[st.name] = st.loc

    def stmt_DimDecl(self, st: ast.DimDecl) -> None:
        if st.name == LEFT_TO_OFFSETS[0]:
            self.err("`_` names no dimension: as a stride it leaves the batch stride to ragged offsets", st.loc)
            return
        if not self.define(st.name, st.loc):
            return
        if st.span is not None:
            self.dim_range(st)
            return
        if len(set(st.values)) != len(st.values):
            self.err(f"dim '{st.name}': values repeat in {{{', '.join(map(str, st.values))}}}", st.loc)
        if any(v < 1 or v > INT64_MAX for v in st.values):
            self.err(f"dim '{st.name}': values must be between 1 and 2^63-1", st.loc)
            self.poisoned.add(st.name)  # its uses stay silent
            return
        self.symbols[st.name] = Symbol(st.name, tuple(st.values), st.loc)

    def dim_range(self, st: ast.DimDecl) -> None:
        lo, hi, step = st.span
        if not 1 <= lo <= hi <= INT64_MAX:
            self.err(
                f"dim '{st.name}': a range runs from a first value of at least 1 up to a last one, got {lo}..{hi}",
                st.loc,
            )
            self.poisoned.add(st.name)
            return
        if step < 1 or (hi - lo) % step:
            near = lo + (hi - lo) // step * step if step >= 1 else lo
            self.err(
                f"dim '{st.name}': {lo}..{hi} step {step} never reaches {hi}"
                + (f"; the last value would be {near}" if step >= 1 else ""),
                st.loc,
            )
            self.poisoned.add(st.name)
            return
        ends = (lo, hi) if hi > lo else (lo,)
        self.symbols[st.name] = Symbol(st.name, ends, st.loc, span=(lo, hi, step))

    def _dims(self, dims: tuple[ast.Dim, ...]) -> tuple | None:
        out, ok = [], True
        for d in dims:
            if isinstance(d.value, str):
                if d.value not in self.symbols and d.value not in self.poisoned:
                    self.err(
                        f"unknown dimension '{d.value}'{self.sink.hint(d.value, self.symbols)}; declare it "
                        f"with 'dim {d.value} in {{...}}' before use",
                        d.loc,
                    )
                if d.value not in self.symbols:
                    ok = False
                self.used.add(d.value)
            elif d.value < 1 or d.value > INT64_MAX:
                self.err(f"dimension {d.value} out of range (1 to 2^63-1)", d.loc)
                ok = False
            out.append(d.value)
        return tuple(out) if ok else None

    def _specs(self, specs, rank: int, target) -> None:
        """Applies layout / strides / uid / init specs to a Decl or OutDecl (rank -1: not known yet)."""
        for s in specs:
            if isinstance(s, ast.InitSpec):
                self._init(s, target)
            elif isinstance(s, ast.Layout):
                if s.name not in LAYOUTS:
                    self.err(
                        f"unknown layout '{s.name}'{self.sink.hint(s.name, LAYOUTS)}; layouts are {', '.join(LAYOUTS)}",
                        s.loc,
                    )
                elif target.layout or target.strides:
                    self.err("layout given twice", s.loc)
                else:
                    try:
                        if rank >= 0:
                            layout_order(s.name, rank)
                        target.layout = s.name
                    except RuleError as e:
                        self.err(str(e), s.loc)
            elif isinstance(s, ast.Strides):
                if target.layout or target.strides:
                    self.err("layout given twice", s.loc)
                elif rank >= 0 and len(s.values) != rank:
                    self.err(f"{len(s.values)} strides for a rank-{rank} tensor", s.loc)
                elif self._strides_ok(s):
                    target.strides = s.values
                elif isinstance(target, Decl):
                    self.poisoned.add(target.name)  # no warning about the layout it was not given
            elif isinstance(s, ast.Uid):
                if target.uid is not None:
                    self.err("uid given twice", s.loc)
                elif self._uid_ok(s.value, s.loc):
                    target.uid, target.uid_loc = s.value, s.loc

    def _strides_ok(self, s: ast.Strides) -> bool:
        """Every number of a stride in range, every name in its products a dim of the graph (marked used)."""
        ok = True
        for k, v in enumerate(s.values):
            loc = s.value_locs[k] if s.value_locs else s.loc
            if v == LEFT_TO_OFFSETS:
                if k:
                    self.err(f"`_` leaves the batch stride (axis 0) to ragged offsets; axis {k} needs its stride", loc)
                    ok = False
                continue
            for f in (v,) if isinstance(v, int) else v:
                if isinstance(f, int) and f > INT64_MAX:
                    self.err("stride out of range", loc)
                    ok = False
                elif isinstance(f, str) and f not in self.symbols:
                    if f not in self.poisoned:
                        self.err(
                            f"unknown dimension '{f}' in strides{self.sink.hint(f, self.symbols)}; a stride is a "
                            "number or a product of the graph's dims and numbers",
                            loc,
                        )
                    ok = False
                elif isinstance(f, str):
                    self.used.add(f)
        return ok

    def _uid_ok(self, uid: int, loc: Loc) -> bool:
        if uid > INT64_MAX:  # 0 is a uid like any other, in cuDNN and in the frontend's samples
            self.err(f"uid must be between 0 and 2^63-1, got {uid}", loc)
            return False
        return True

    def _place(self, specs, what: str):
        """The one `in NAME [at OFFSET]` of a declaration (None when there is none), and the other specs."""
        places = [s for s in specs if isinstance(s, ast.Place)]
        for extra in places[1:]:
            self.err(f"{what} is placed twice ('in' given twice)", extra.loc)
        return (places[0] if places else None), [s for s in specs if not isinstance(s, ast.Place)]

    def stmt_BufferDecl(self, st: ast.BufferDecl) -> None:
        if not self.define(st.name, st.loc):
            return
        dtype = self.dtype(st.type.dtype, st.type.dtype_loc)
        dims = self._dims(st.type.dims)
        symbolic = [d for d in st.type.dims if isinstance(d.value, str)]
        if symbolic:
            self.err("a buffer's dims are numbers (its views have fixed offsets and strides)", symbolic[0].loc)
        if dtype == "bool":  # cuDNN keeps bools bit-packed: a view's address would fall inside a byte
            self.err("a buffer of bool is bit-packed (eight elements a byte) and cannot hold views", st.type.dtype_loc)
        buf = self.buffers[st.name] = BufferDecl(st.name, dtype, dims, st.loc)
        for s in st.specs:
            if isinstance(s, ast.InitSpec):
                self._init(s, buf)
            else:
                self.err("a buffer takes init= only: it is dense and row-major, and its views are placed", s.loc)
        if dtype in (None, "bool") or dims is None or symbolic:
            self.poisoned.add(st.name)  # its views stay silent

    def _view(self, d: Decl, place: ast.Place, dims) -> None:
        """An input declared `in BUFFER at OFFSET`; its bounds and alignment are proved at typing."""
        buf = self.buffers.get(place.target)
        if buf is None:
            if place.target in self.decls:
                kind = self.decls[place.target].kind
                self.err(f"'{place.target}' is an {kind}, not a buffer; views are of buffers", place.loc)
            else:
                self.err(f"unknown buffer '{place.target}'{self.sink.hint(place.target, self.buffers)}", place.loc)
            self.poisoned.add(d.name)
            return
        self.used.add(buf.name)
        if buf.name in self.poisoned:
            self.poisoned.add(d.name)
        elif d.dtype is not None and d.dtype != buf.dtype:
            what = f"output '{d.placed_for}'" if d.placed_for else f"view '{d.name}'"
            self.err(f"{what} is {d.dtype} but buffer '{buf.name}' is {buf.dtype}", place.loc)
            self.poisoned.add(d.name)
        elif dims is not None and any(isinstance(x, str) for x in dims):
            self.err("a view's dims are numbers (its offset and strides are)", place.loc)
            self.poisoned.add(d.name)
        else:
            d.view, d.view_loc = (buf.name, place.offset or 0), place.loc

    def _into(self, o: OutDecl, place: ast.Place, specs, type_: ast.TypeSpec | None) -> None:
        """An output written over the memory of an input (`output y in x = ...`), or placed in a buffer
        (`output y : T strides [...] in BUFFER at OFFSET`)."""
        if place.target in self.buffers:
            self._placed(o, place, specs, type_)
            return
        target = self.decls.get(place.target)
        prev = next((p for p in self.outputs.values() if p.into == place.target), None)
        if place.offset is not None and target is None:
            self.err(f"unknown buffer '{place.target}'{self.sink.hint(place.target, self.buffers)}", place.loc)
        elif place.offset is not None:
            self.err(
                f"an output in place names the input it overwrites ('in {place.target}'); 'at' places views of buffers",
                place.loc,
            )
        elif target is None or target.kind != "input":
            self.err(
                f"output '{o.name}' in place: '{place.target}' is not an input or a buffer"
                f"{self.sink.hint(place.target, [*self.decls, *self.buffers])}",
                place.loc,
            )
        elif any(not isinstance(s, ast.Uid) for s in specs):
            self.err(f"output '{o.name}' is written in place of '{place.target}' and takes its layout", place.loc)
        elif prev is not None:
            self.err(
                f"'{place.target}' is already overwritten by output '{prev.name}'",
                place.loc,
                [("first written here", prev.into_loc)],
            )
        else:
            o.into, o.into_loc = place.target, place.loc
            self.used.add(place.target)  # its memory is the output's: no input left unused

    def _placed(self, o: OutDecl, place: ast.Place, specs, type_: ast.TypeSpec | None) -> None:
        """An output placed in a buffer: the checker declares the view of the buffer it is written over (named
        after it, `NAME_view`), so that the output is one written in place of a view, with that view's proofs of
        bounds, alignment and what other views read. The view takes the declared dims, strides or layout, and
        dtype (the buffer's by default); the output keeps its uid."""
        if type_ is None or type_.dims is None:
            self.err(
                f"output '{o.name}' placed in buffer '{place.target}' declares its dims and strides, as a view does "
                f"('output {o.name} : DTYPE[DIMS] strides [...] in {place.target} at OFFSET')",
                place.loc,
            )
            return
        name = self.fresh_name(f"{o.name}_view")
        d = Decl(name, "input", place.loc, dtype=o.dtype or self.buffers[place.target].dtype, placed_for=o.name)
        self.decls[name] = d
        dims = self._dims(type_.dims)
        self._specs([s for s in specs if not isinstance(s, ast.Uid)], len(type_.dims), d)
        self._specs([s for s in specs if isinstance(s, ast.Uid)], len(type_.dims), o)
        self._view(d, place, dims)
        if d.dtype is None or dims is None:
            self.poisoned.add(name)
        d.dims = dims or ()
        o.into, o.into_loc = name, place.loc
        self.used.add(name)

    def _init(self, s: ast.InitSpec, target) -> None:
        if not isinstance(target, BufferDecl) and getattr(target, "kind", None) != "input":
            self.err("only an input or a buffer takes init= (how `run` fills it)", s.loc)
        elif target.init is not None:
            self.err("init given twice", s.loc)
        elif s.dist not in DISTS:
            self.err(
                f"unknown distribution '{s.dist}'{self.sink.hint(s.dist, DISTS)}; the distributions are "
                f"{', '.join(DISTS)}",
                s.loc,
            )
        elif s.dist == "like":
            if isinstance(target, BufferDecl):
                self.err("a buffer is drawn, not copied: like(x) is an input's init", s.loc)
            elif len(s.args) != 1 or not isinstance(s.args[0], ast.Ident):
                self.err("init: like takes one input's name: like(x)", s.args[0].loc if s.args else s.loc)
            else:
                target.init = like(s.args[0].name)
                self.likes.append((target, s.args[0]))
        else:
            named = next((a for a in s.args if isinstance(a, ast.Ident)), None)
            if named is not None:
                self.err(f"init: {s.dist} takes numbers; only like(x) names an input", named.loc)
                return
            try:
                target.init = make(s.dist, tuple(a.value for a in s.args))
                if target.dtype is not None:
                    check_dtype(target.init, target.dtype)
            except RuleError as e:
                at = s.args[e.at].loc if isinstance(e.at, int) and e.at < len(s.args) else s.loc
                self.err(f"init: {e}", at)

    def check_likes(self) -> None:
        """like(x): x is a plain input (no view: a view is drawn with its buffer) of the target's dtype and dims,
        itself drawn, not copied."""
        for d, ref in self.likes:
            src = self.decls.get(ref.name)
            if src is None or src.kind != "input":
                known = [n for n, x in self.decls.items() if x.kind == "input"]
                what = "no input" if ref.name not in self.user_names else "not an input"
                self.err(f"init: like({ref.name}): {what} '{ref.name}'{self.sink.hint(ref.name, known)}", ref.loc)
            elif src is d:
                self.err(f"init: input '{d.name}' cannot be drawn like itself", ref.loc)
            elif src.view is not None:
                self.err(f"init: like({ref.name}): '{ref.name}' is a view, drawn with its buffer", ref.loc)
            elif src.init is not None and src.init.source is not None:
                self.err(f"init: like({ref.name}): '{ref.name}' is itself like({src.init.source}); name that", ref.loc)
            elif (src.dtype, src.dims) != (d.dtype, d.dims) and src.dtype and d.dtype:
                self.err(
                    f"init: like({ref.name}): '{ref.name}' is {src.dtype}{_dims_text(src.dims)}, "
                    f"'{d.name}' is {d.dtype}{_dims_text(d.dims)}: a copy needs the same dtype and dims",
                    ref.loc,
                )
            else:
                self.used.add(ref.name)

    def stmt_InputDecl(self, st: ast.InputDecl) -> None:
        if not self.define(st.name, st.loc):
            return
        d = Decl(st.name, "input", st.loc)
        self.decls[st.name] = d
        d.dtype = self.dtype(st.type.dtype, st.type.dtype_loc)
        dims = self._dims(st.type.dims)
        place, specs = self._place(st.specs, f"input '{st.name}'")
        if place is not None:  # one draw fills a buffer: a view's own would be drawn over, or draw over it
            for s in (s for s in specs if isinstance(s, ast.InitSpec)):
                self.err(f"a view is drawn with its buffer: put init= on buffer '{place.target}'", s.loc)
            specs = [s for s in specs if not isinstance(s, ast.InitSpec)]
        self._specs(specs, len(st.type.dims), d)
        if place is not None:
            self._view(d, place, dims)
        if d.dtype is None or dims is None:
            self.poisoned.add(st.name)
        d.dims = dims or ()

    def stmt_ScalarDecl(self, st: ast.ScalarDecl) -> None:
        if not self.define(st.name, st.loc):
            return
        d = Decl(st.name, "scalar", st.loc, scalar=st.value.value)
        self.decls[st.name] = d
        d.dtype = self.dtype(st.dtype, st.dtype_loc)
        for s in st.specs:
            if not isinstance(s, ast.Uid):
                self.err("a scalar takes no layout, strides, place or init", s.loc)
        self._specs([s for s in st.specs if isinstance(s, ast.Uid)], -1, d)
        if st.dims is not None:
            d.by_value_dims = self._scalar_dims(st)
        if d.dtype is None:
            self.poisoned.add(st.name)
            return
        try:
            check_value(d.dtype, st.value.value)
        except RuleError as e:
            self.err(f"scalar '{st.name}': {e}", st.value.loc)
            self.poisoned.add(st.name)

    def _scalar_dims(self, st: ast.ScalarDecl) -> tuple[int, ...] | None:
        """A scalar's declared dims: ones, as it holds one value."""
        for dim in st.dims:
            if dim.value != 1:
                self.err(f"scalar '{st.name}' holds one value: its dims are all 1, not {dim.value}", dim.loc)
                return None
        return tuple(d.value for d in st.dims)

    def stmt_OutputDecl(self, st: ast.OutputDecl) -> None:
        if st.name in self.outputs:
            self.err(f"'{st.name}' is already an output", st.loc, [("first marked here", self.outputs[st.name].loc)])
            return
        o = OutDecl(st.name, st.loc)
        if st.type is not None:
            o.dtype = self.dtype(st.type.dtype, st.type.dtype_loc)
            if st.type.dims is not None:
                o.dims = self._dims(st.type.dims)
                o.dims_loc = st.type.loc
        rank = len(st.type.dims) if st.type is not None and st.type.dims is not None else -1
        place, specs = self._place(st.specs, f"output '{st.name}'")
        if place is None or place.target not in self.buffers:
            self._specs(specs, rank, o)
        if place is not None:
            self._into(o, place, specs, st.type)
        self.outputs[st.name] = o
        if st.expr is not None:
            self.assign((st.name,), st.expr, st.loc)
        elif st.name not in self.produced and st.name not in self.failed:
            if st.name in self.decls:
                self.err(
                    f"'{st.name}' is an {self.decls[st.name].kind}; an output must be computed "
                    f"(write 'output {st.name}_out = identity({st.name})' to copy it)",
                    st.loc,
                )
            else:
                self.err(f"output '{st.name}' is never computed{self.sink.hint(st.name, self.produced)}", st.loc)

    def stmt_Assign(self, st: ast.Assign) -> None:
        if st.type is not None:
            t = OutDecl(st.targets[0], st.loc, self.dtype(st.type.dtype, st.type.dtype_loc))
            if st.type.dims is not None:
                t.dims, t.dims_loc = self._dims(st.type.dims), st.type.loc
            self.typed[t.name] = t
        self.assign(st.targets, st.expr, st.loc)

    def assign(self, targets: tuple[str, ...], expr, loc: Loc) -> None:
        if len(set(targets)) != len(targets):
            self.err("a name appears twice on the left of '='", loc)
            return
        if not isinstance(expr, ast.Call) and len(targets) > 1:
            self.err(f"{len(targets)} names on the left of '=' but the right is a single value", loc)
            return
        if isinstance(expr, (ast.Ref, ast.Number)):  # a plain copy
            expr = ast.Call("identity", (expr,), (), expr.loc, expr.loc)
        node = self.expr(expr, targets)
        if not isinstance(node, PNode):  # the expression failed (and said why): its names are silent
            self.failed.update(t for t in targets if self.defined_at(t) is None)
            return
        for t, produced in zip(targets, node.outputs):
            if self.define(t, loc):
                self.produced[t] = (node, loc)
            elif produced == t:
                node.ok = False

    def expr(self, e, targets: tuple[str, ...] = ()) -> PNode | str | None:
        """Flattens an expression into nodes; returns the node (for calls) or a value name."""
        if isinstance(e, ast.Ref):
            if e.name in self.decls or e.name in self.produced:
                self.used.add(e.name)
                return e.name
            if e.name in self.failed:
                return None
            if e.name in self.symbols:
                self.err(f"'{e.name}' is a dimension, not a tensor", e.loc)
            elif e.name in self.buffers:
                self.err(f"'{e.name}' is a buffer; read it through a view ('input NAME : ... in {e.name} at 0')", e.loc)
            elif e.name in self.user_names:
                self.err(f"'{e.name}' is used before it is defined", e.loc)
            else:
                known = itertools.chain(self.decls, self.produced)  # read only while hints are given
                self.err(f"unknown name '{e.name}'{self.sink.hint(e.name, known)}", e.loc)
            return None
        if isinstance(e, ast.Number):
            name = self.fresh("const")
            self.decls[name] = Decl(name, "const", e.loc, dtype=DEFAULT_MATH, scalar=float(e.value))
            try:
                check_value(DEFAULT_MATH, e.value)
            except RuleError as err:
                self.err(f"number literal: {err}", e.loc)
                self.poisoned.add(name)
            self.used.add(name)
            return name
        if isinstance(e, ast.Neg):
            e = ast.Call("neg", (e.operand,), (), e.loc, e.loc)
        if isinstance(e, ast.BinOp):
            e = ast.Call(INFIX[e.op], (e.lhs, e.rhs), (), e.loc, e.loc)
        return self.call(e, targets)

    def call(self, e: ast.Call, targets: tuple[str, ...]) -> PNode | None:
        sig = OPS.get(e.op)
        args = [self.expr(a) for a in e.args]
        arg_names = [a.outputs[0] if isinstance(a, PNode) else a for a in args]
        if sig is None:
            self.err(f"unknown op '{e.op}'{self.sink.hint(e.op, OPS)}", e.op_loc)
            return None
        n_min, n_max = len(sig.inputs), len(sig.inputs) + len(sig.optional)
        if sig.variadic:  # the last input repeats: at least two of it
            n_min, n_max = n_min + 1, max(n_min + 1, len(e.args))
        if not n_min <= len(e.args) <= n_max:
            want = f"{n_min}" if n_min == n_max else f"{n_min} to {n_max}"
            want += " or more" if sig.variadic else ""
            self.err(f"{e.op} takes {want} input{'s' if n_max > 1 else ''} ({sig.ports}), got {len(e.args)}", e.loc)
            return None
        exprs = list(e.args) + [None] * (n_max - len(e.args))
        arg_names += [None] * (n_max - len(arg_names))
        named_ok = self.named_inputs(sig, e, exprs, arg_names)
        uids: dict[str, tuple[int, Loc]] = {}
        scalars: dict[str, str] = {}
        attrs_, attr_locs, ok = self.attrs(sig, e, uids, scalars)
        ok = ok and named_ok
        n_results = sig.count_results(attrs_)
        if len(targets) > n_results:
            self.err(
                f"{e.op} returns {n_results} value{'s' if n_results > 1 else ''} here, "
                f"but {len(targets)} names are assigned",
                e.loc,
            )
            ok = False
        outs = list(targets[:n_results]) + [self.fresh(e.op) for _ in range(n_results - len(targets[:n_results]))]
        compute = attrs_.pop("compute", None) or sig.compute or self.types.get("compute", (DEFAULT_MATH, None))[0]
        if compute is None and "compute" not in attr_locs:
            self.err(
                f"{e.op} has no compute type: the graph's is unset; give it one ('{e.op}(..., compute=float)')",
                e.loc,
                [("the graph's compute type is unset here", self.types["compute"][1])],
            )
            ok = False
        if sig.inner_tensors and self.types.get("intermediate", (DEFAULT_MATH, None))[0] is None:
            self.err(
                f"{e.op} needs the graph's intermediate type: cuDNN makes the tensors inside it in that type; give "
                "the graph one ('intermediate float')",
                e.loc,
                [("the graph's intermediate type is unset here", self.types["intermediate"][1])],
            )
            ok = False
        node = PNode(
            e.op,
            arg_names,
            outs,
            attrs_,
            compute,
            e.loc,
            [a.loc if a is not None else e.loc for a in exprs],
            attr_locs,
            ok and all(n is not None for n, a in zip(arg_names, exprs) if a is not None),
            uids,
            scalars,
        )
        if sig.family != "pointwise":
            by_value = {(sig.inputs + sig.optional).index(p) for p in sig.by_value}
            for i, (name, a) in enumerate(zip(arg_names, exprs)):
                if a is None or i in by_value:
                    continue
                if name in self.decls and self.decls[name].kind in ("scalar", "const"):
                    self.err(
                        f"{e.op}: '{a.name if isinstance(a, ast.Ref) else a.value}' is a host scalar; "
                        "only pointwise ops take scalars"
                        + (f" (and {e.op}'s {', '.join(sig.by_value)})" if sig.by_value else ""),
                        a.loc,
                    )
                    node.ok = False
        self.nodes.append(node)
        for o in outs[len(targets) :]:
            self.produced[o] = (node, e.loc)
        return node

    def attrs(self, sig: OpSig, e: ast.Call, uids: dict, scalars: dict) -> tuple[dict, dict, bool]:
        """The given attributes, converted (defaults and canonical forms come at typing); the uids given
        to attributes go into `uids`, the scalars named by attributes (`epsilon=eps`) into `scalars`."""
        out, locs, ok = {}, {}, True
        for kw in e.kwargs:
            if kw.name in sig.optional:
                continue  # an input given by name (named_inputs)
            a = sig.attr(kw.name)
            if a is None:
                names = [x.name for x in sig.all_attrs]
                takes = [f"attributes {', '.join(names)}"] if names else []
                takes += [f"the optional inputs {', '.join(sig.optional)}"] if sig.optional else []
                self.err(
                    f"{sig.name}: unknown argument '{kw.name}'{self.sink.hint(kw.name, names + list(sig.optional))}"
                    + (f"; it takes {' and '.join(takes)}" if takes else ""),
                    kw.loc,
                )
                ok = False
                continue
            if kw.name in locs:
                self.err(f"{sig.name}: attribute '{kw.name}' given twice", kw.loc)
                ok = False
                continue
            locs[kw.name] = kw.loc
            if a.tensor and isinstance(kw.value, ast.Ident):
                ok = self.scalar_attr(sig, kw, out, scalars) and ok
                continue
            try:
                out[kw.name] = convert(a, kw.value)
            except RuleError as err:
                self.err(f"{sig.name}: attribute '{kw.name}' {err}", kw.value.loc)
                ok = False
            if kw.uid is not None and not a.tensor:
                takes = [x.name for x in sig.attrs if x.tensor]
                self.err(
                    f"{sig.name}: attribute '{kw.name}' is no cuDNN tensor, so it takes no uid"
                    + (f" (uids go on {', '.join(takes)})" if takes else ""),
                    kw.uid_loc,
                )
                ok = False
            elif kw.uid is not None and self._uid_ok(kw.uid, kw.uid_loc):
                uids[kw.name] = (kw.uid, kw.uid_loc)
        for a in sig.attrs:
            if a.default is REQUIRED and a.name not in locs:
                self.err(
                    f"{sig.name}: missing attribute '{a.name}'"
                    + (f" (one of {', '.join(a.choices)})" if a.choices else ""),
                    e.loc,
                )
                ok = False
        return out, locs, ok

    def scalar_attr(self, sig: OpSig, kw: ast.Kwarg, out: dict, scalars: dict) -> bool:
        """`epsilon=eps`: the attribute is the value of the float scalar `eps`, and cuDNN gets that scalar's
        pass-by-value tensor (its dims and uid, as a graph written with `graph.tensor(x)` gives them)."""
        name = kw.value.name
        d = self.decls.get(name)
        if d is None or d.kind != "scalar":
            what = "no declared scalar" if d is None else f"a{'n' if d.kind[0] in 'aeiou' else ''} {d.kind}"
            self.err(
                f"{sig.name}: attribute '{kw.name}' names '{name}', {what}: it takes a number or a scalar", kw.value.loc
            )
            return False
        if kw.uid is not None:
            self.err(f"{sig.name}: attribute '{kw.name}' takes the uid of scalar '{name}': put uid= on it", kw.uid_loc)
            return False
        self.used.add(name)
        if d.dtype is not None and d.dtype != "float":
            self.err(f"{sig.name}: attribute '{kw.name}' is a float; scalar '{name}' is {d.dtype}", kw.value.loc)
            return False
        out[kw.name] = float(d.scalar)
        scalars[kw.name] = name
        return True

    def named_inputs(self, sig: OpSig, e: ast.Call, exprs: list, names: list) -> bool:
        """Optional inputs given by name (`sdpa(q, k, v, seq_len_q=lens)`), put at their ports."""
        ok = True
        for kw in e.kwargs:
            if kw.name not in sig.optional:
                continue
            port = len(sig.inputs) + sig.optional.index(kw.name)
            if exprs[port] is not None:
                self.err(f"{sig.name}: input '{kw.name}' given twice", kw.loc)
                ok = False
            elif not isinstance(kw.value, ast.Ident):
                self.err(f"{sig.name}: input '{kw.name}' takes a tensor's name", kw.value.loc)
                ok = False
            else:
                ref = ast.Ref(kw.value.name, kw.value.loc)
                exprs[port], names[port] = ref, self.expr(ref)
        return ok

    def finish_structure(self) -> None:
        self.check_likes()
        if not self.outputs and not self.sink.n_errors:
            self.err(f"graph '{self.gdef.name}' has no outputs; mark results with 'output NAME = ...'", self.gdef.loc)
        for name, d in self.decls.items():
            if d.kind in ("input", "scalar") and name not in self.used:
                self.sink.warning(f"{d.kind} '{name}' is never used", d.loc)
        for name, (_, loc) in self.produced.items():
            # a name starting with `_` is left unread on purpose (an op's result named only to reach a later one)
            if name not in self.used and name not in self.outputs and name in self.user_names and name[0] != "_":
                self.sink.warning(f"'{name}' is computed but never used", loc)
        for s in self.symbols.values():
            if s.name not in self.used:
                self.sink.warning(f"dim '{s.name}' is never used", s.loc)
        for b in self.buffers.values():
            if b.name not in self.used:
                self.sink.warning(f"buffer '{b.name}' has no views", b.loc)
        self.lint()

    def lint(self) -> None:
        """The registry's per-op warnings about declared inputs, each input warned about once."""
        warned = set()
        for n in self.nodes:
            sig = OPS[n.op]
            if sig.lint is None:
                continue
            seen = tuple(
                (d.name, len(d.dims), d.layout, self.first_strides(d))
                if (d := self.decls.get(i)) and d.kind == "input" and i not in self.poisoned
                else None
                for i in n.inputs
            )
            for i, message in sig.lint(seen):
                if n.inputs[i] not in warned:
                    warned.add(n.inputs[i])
                    self.sink.warning(message, self.decls[n.inputs[i]].loc)

    def first_strides(self, d: Decl) -> tuple[int, ...] | None:
        """An input's declared strides at the first value of each dim (what a lint judges), None without any."""
        if d.strides is None:
            return None
        return stride_values(d.strides, {name: sym.values[0] for name, sym in self.symbols.items()})

    # ---- typing ------------------------------------------------------------------

    def bindings(self) -> list[dict[str, int]]:
        syms = [s for s in self.symbols.values() if s.name in self.used]
        combos = list(itertools.islice(itertools.product(*(s.values for s in syms)), MAX_INSTANCES + 1))
        if len(combos) > MAX_INSTANCES:
            self.err(f"the symbolic dims give more than {MAX_INSTANCES} shapes; use fewer values", syms[0].loc)
            combos = combos[:1]
        return [dict(zip((s.name for s in syms), c)) for c in combos]

    def type_instances(self, resolved: Resolved) -> list[Instance]:
        """Types every binding of the symbolic dims (a range's ends); an error found in several shapes
        is reported once."""
        instances = []
        found: dict[tuple, list] = {}
        bindings = self.bindings()
        for binding in bindings:
            local = Sink()
            typed = Typer(resolved, binding, local).run()
            for d in local.items:
                found.setdefault((d.severity, d.loc), [d, []])[1].append(binding)
            if not local.n_errors:
                instances.append(_instance(binding, typed))
        for d, where in found.values():
            notes = d.notes
            if len(bindings) > 1:
                label = ", ".join(f"{k} = {v}" for k, v in where[0].items())
                more = f" (and {len(where) - 1} more of the {len(bindings)} shapes)" if len(where) > 1 else ""
                notes += ((f"with {label}{more}", None),)
            self.sink.add(attrs.evolve(d, notes=notes))
        return instances

    def build(self, instances: list[Instance], resolved: Resolved) -> Graph:
        uids = _assign_uids(self)
        values = []
        for name, d in self.decls.items():
            dtype = d.dtype if d.kind != "input" else None
            values.append(
                Value(name, d.kind, uids[name], d.scalar, dtype, d.loc, view=d.view, init=d.init, dims=d.by_value_dims)
            )
        for n in self.nodes:
            for o in n.outputs:
                kind = "output" if o in self.outputs else "virtual"
                into = self.outputs[o].into if kind == "output" else None
                values.append(Value(o, kind, uids[o], loc=self.produced[o][1], into=into))
        nodes = tuple(
            Node(
                n.op,
                tuple(n.inputs),
                tuple(n.outputs),
                n.compute,
                n.loc,
                tuple((a, u) for a, (u, _) in n.uids.items()),
                tuple(sorted(n.scalars.items())),
            )
            for n in self.nodes
        )
        opts = Options(**self.options)
        used = [s for s in self.symbols.values() if s.name in self.used]
        io = self.types.get("io", (None, None))[0]
        inter = self.types.get("intermediate", (DEFAULT_MATH, None))[0]
        compute = self.types.get("compute", (DEFAULT_MATH, None))[0]
        return Graph(
            self.gdef.name,
            self.file,
            io,
            inter,
            compute,
            opts,
            tuple(self.symbols.values()),
            tuple(values),
            nodes,
            tuple(instances),
            self.gdef.loc,
            tuple(Buffer(b.name, b.loc, b.init) for b in self.buffers.values()),
            input_dims=tuple((name, d.dims) for name, d in self.decls.items() if d.kind == "input"),
            typer=_typer(resolved, tuple(dict(instances[0].binding))) if any(s.span for s in used) else None,
        )


def _dims_text(dims: tuple) -> str:
    return "[" + ", ".join(str(getattr(d, "value", d)) for d in dims) + "]"


def _instance(binding: dict[str, int], typed) -> Instance:
    return Instance(tuple(binding.items()), tuple(typed.types.items()), typed.node_attrs)


def _typer(resolved: Resolved, names: tuple[str, ...]):
    """Types a binding met after checking (a value inside a range); DslError with what its shape breaks."""

    def type_binding(binding: dict[str, int]) -> Instance:
        binding = {k: binding[k] for k in names}
        local = Sink()
        typed = Typer(resolved, binding, local).run()
        errors = [d for d in local.items if d.severity == "error"]
        if errors:
            note = (f"with {', '.join(f'{k} = {v}' for k, v in binding.items())}", None)
            raise DslError([attrs.evolve(d, notes=d.notes + (note,)) for d in errors])
        return _instance(binding, typed)

    return type_binding


def _assign_uids(gc: _GraphChecker) -> dict[str, int]:
    """Explicit UIDs first; the rest numbered from 1 in declaration order, skipping taken ones."""
    explicit: dict[int, str] = {}
    uids: dict[str, int] = {}
    given = [(name, spec.uid, spec.uid_loc) for name, spec in list(gc.decls.items()) + list(gc.outputs.items())]
    given += [(f"{n.op}'s {a}", uid, loc) for n in gc.nodes for a, (uid, loc) in n.uids.items()]
    for name, uid, loc in given:
        if uid is None:
            continue
        if uid in explicit:
            gc.err(f"uid {uid} is already used by '{explicit[uid]}'", loc)
            continue
        explicit[uid] = name
        uids[name] = uid
    order = list(gc.decls) + [o for n in gc.nodes for o in n.outputs]
    nxt = 1
    for name in order:
        if name in uids:
            continue
        while nxt in explicit:
            nxt += 1
        uids[name] = nxt
        nxt += 1
    return uids
