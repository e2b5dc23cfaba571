"""A PyTorch function or module, traced by torch.export -> a checked .cdg graph of its aten ops, with the
declared layouts of its example inputs, and a located refusal naming each node the language cannot express.

The trace is torch.export's, functionalized (an in-place op is its pure op; what it writes into an input or
buffer, an output written in place of it); a module's parameters and buffers are inputs named by their place in
the module. An input through the view ops applied to it is one declared input with the view's dims and strides
(`linear.weight` is `[1, IN, OUT] col_major`), which `bind` makes of the call's own tensors. Each other node is
one statement, from the table CONVERTERS (from_torch_ops); the text is checked before it is returned, and a
rule it breaks is reported at the node.
"""

from __future__ import annotations

import inspect
import linecache
import operator
import os
import warnings

import attrs
import torch
import torch.fx.proxy
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.operator_schemas import normalize_function

from cudnn_dsl.interop.fe_graph import ints_text
from cudnn_dsl.interop.fe_import import cdg_text, ident
from cudnn_dsl.interop.from_torch_ops import (
    CONVERTERS,
    Fold,
    Items,
    Refused,
    Source,
    Stmt,
    Value,
    number,
)
from cudnn_dsl.target.dtypes import from_torch as language_dtype
from dsl.diagnostics import Diagnostic, DslError, Loc, RuleError
from dsl.ir import Program
from dsl.types import dense_strides, layout_order

aten = torch.ops.aten


@attrs.frozen
class GraphInput:
    """A declared input of the imported graph: an argument of the function, or a parameter or buffer of the
    module, through the view ops applied to it; or an eval BatchNorm's scale or shift, folded from its state."""

    name: str
    """its name in the .cdg file"""
    source: str
    """the export placeholder it is read from ('' for a folded one)"""
    views: tuple
    """(aten view op, its other arguments), applied in order"""
    fold: Fold | None = None
    """how a folded input is computed from the module's state"""


@attrs.frozen
class Imported:
    """A traced function as a checked .cdg graph, and how its inputs are read from the function's."""

    text: str
    """the canonical .cdg file"""
    program: Program
    inputs: tuple[GraphInput, ...]
    outputs: tuple[str, ...]
    """the graph's outputs, in the order the function returns them"""
    program_state: dict = attrs.field(repr=False)
    """export placeholder -> the module's parameter, buffer or constant it reads"""
    user_inputs: tuple[str, ...] = attrs.field(repr=False)
    """the export placeholders of the function's arguments, in order"""
    notes: tuple[Diagnostic, ...] = ()
    """what the function does that the graph leaves out (a BatchNorm's batch count), located at the node"""

    def bind(self, *args: torch.Tensor) -> dict[str, torch.Tensor]:
        """The graph's inputs for a call of the function with these tensors (the module's state added): views of
        the same memory, as the graph declares them (an output in place writes through them), and an eval
        BatchNorm's scale and shift, computed from the module's state as it is now."""
        if len(args) != len(self.user_inputs):
            raise TypeError(f"the function takes {len(self.user_inputs)} tensors, got {len(args)}")
        values = dict(self.program_state, **dict(zip(self.user_inputs, args)))
        out = {}
        for gi in self.inputs:
            t = gi.fold(values) if gi.fold is not None else values[gi.source]
            for op, rest in gi.views:  # a folded input has none
                t = op(t, *rest)
            out[gi.name] = t
        return out


def layout_text(t: torch.Tensor) -> str:
    """A tensor's memory order in the language: '' (row-major), a layout name, or explicit strides."""
    shape, strides = tuple(t.shape), tuple(t.stride())

    def same(want):  # the strides of size-1 dims address nothing
        return all(n == 1 or s == w for n, s, w in zip(shape, strides, want))

    if same(dense_strides(shape)):
        return ""
    for layout in ("nhwc", "ndhwc", "col_major", "channels_last"):  # rank 3: col_major, as docs/pytorch.md says
        try:
            order = layout_order(layout, len(shape))
        except RuleError:  # the layout does not fit the rank
            continue
        if same(dense_strides(shape, order)):
            return f" {layout}"
    return f" strides {ints_text(strides)}"


def type_text(t: torch.Tensor) -> str:
    dtype = language_dtype(t.dtype)
    if dtype is None:
        raise Refused(f"the language has no dtype {t.dtype}")
    if t.dim() == 0 or 0 in t.shape:
        raise Refused(f"a tensor of shape {list(t.shape)}: the language's tensors have dims of size 1 or more")
    return f"{dtype}{ints_text(t.shape)}"


# ---- where a node comes from -------------------------------------------------------------------------------


def _frame(node: torch.fx.Node) -> tuple[str, int, str] | None:
    """The user's `(file, line, code)` of a node: the innermost frame of its stack trace outside torch and
    this module (whose wrapper of a plain function is a frame too)."""
    torch_dir = os.path.dirname(torch.__file__)
    lines = (node.meta.get("stack_trace") or "").splitlines()
    found = None
    for i, ln in enumerate(lines):
        parts = ln.strip().split(", ")
        if not (parts[0].startswith('File "') and len(parts) >= 2 and parts[1].startswith("line ")):
            continue
        file = parts[0].removeprefix('File "').removesuffix('"')
        if not file.startswith(torch_dir) and file != __file__:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            found = (file, int(parts[1].removeprefix("line ")), code)
    return found


def _loc(node: torch.fx.Node, label: str) -> tuple[Loc, str]:
    """Where a node is in the user's source, and the source line (empty when the trace kept none)."""
    frame = _frame(node)
    if frame is None:
        return Loc(label, 0, 0, 0, 0), ""
    file, line, code = frame
    text = linecache.getline(file, line)
    col = len(text) - len(text.lstrip()) + 1 if text.strip() else 1
    return Loc(file, line, col, line, col + len(text.strip())), code


def _refusal(node: torch.fx.Node, label: str, why: str) -> Diagnostic:
    loc, code = _loc(node, label)
    where = f", at `{code}`" if code else ""
    return Diagnostic("error", f"cannot express node '{node.name}' ({node.target}{where}): {why}", loc)


# ---- the import -----------------------------------------------------------------------------------------------


@attrs.define
class _Statement:
    """One statement of the graph: the node it comes from, the names it gives, its expression."""

    node: torch.fx.Node
    names: tuple[str, ...]
    expr: str
    layout_of: Source | Value | None = None
    dtype: str | None = None
    """the dtype it is declared with, where the op's own is not torch's (an operand of a matmul or conv)"""


class Importer:
    """One walk over a functionalized export graph's nodes, in order: declarations, statements and refusals."""

    def __init__(self, ep: torch.export.ExportedProgram, label: str, arg_names: tuple[str, ...] = ()):
        self.ep, self.label = ep, label
        users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
        self.arg_names = dict(zip(users, arg_names))
        self.used: set[str] = set()  # the graph's names
        self.env: dict[torch.fx.Node, Source | Value | Items | None] = {}
        self.decls: list[tuple[str, torch.fx.Node]] = []
        self.statements: list[_Statement] = []
        self.made: dict[str, _Statement] = {}
        self.inputs: list[GraphInput] = []
        self.declared: dict[str, torch.Tensor] = {}  # input name -> its meta tensor
        self.refusals: list[Diagnostic] = []
        self.notes: list[Diagnostic] = []
        self.returned: list[str] = []
        self.in_place: dict[str, str] = {}  # output -> the input it is written over
        self.node: torch.fx.Node | None = None
        self.scalars = 0

    def tensor(self, arg, rank: int | None = None, typed: bool = False) -> str:
        """An operand's name, with unit dims in front up to `rank` (torch aligns trailing dims; the language
        broadcasts only over declared dims of size 1); `typed`: in torch's dtype (a matmul's, conv's, norm's)."""
        v = self.env[arg]
        extra = 0 if rank is None else rank - v.meta.dim()
        if extra < 0:
            raise Refused(f"'{arg.name}' has {v.meta.dim()} dims where {rank} are wanted")
        if isinstance(v, Source):
            if extra:
                v = v.view(aten.reshape.default, (1,) * extra + tuple(v.meta.shape))
            return self.declare(v)
        if typed:
            self.typed(v)
        if extra:
            return f"reshape({v.name}, shape={ints_text((1,) * extra + tuple(v.meta.shape))})"
        return v.name

    def meta(self, arg) -> torch.Tensor:
        return self.env[arg].meta

    def operand(self, arg, rank: int) -> str:
        """A tensor or a number, as a pointwise op takes it."""
        if isinstance(arg, torch.fx.Node):
            return self.tensor(arg, rank)
        text = number(arg)
        if not text.startswith("-"):
            return text
        name = ident(f"c{self.scalars}", self.used)  # a literal is never negative: `-2.0` is neg(2.0)
        self.scalars += 1
        self.decls.append((f"scalar {name} : {'float' if isinstance(arg, float) else 'int32'} = {text}", self.node))
        return name

    def declare(self, src: Source) -> str:
        key = (src.placeholder, tuple((op, rest) for op, rest in src.views))
        for gi in self.inputs:
            if (gi.source, gi.views) == key:
                return gi.name
        return self._input(ident(src.base, self.used), src.meta, GraphInput("", src.placeholder, key[1]))

    def fold(self, name: str, fold: Fold) -> str:
        """An input computed from the module's state when the graph's inputs are bound."""
        meta = torch.empty(fold.shape, dtype=fold.dtype, device="meta")
        return self._input(ident(name, self.used), meta, GraphInput("", "", (), fold))

    def _input(self, name: str, meta: torch.Tensor, gi: GraphInput) -> str:
        self.decls.append((f"input {name} : {type_text(meta)}{layout_text(meta)}", self.node))
        self.inputs.append(attrs.evolve(gi, name=name))
        self.declared[name] = meta
        return name

    def emit(self, names: tuple[str, ...], expr: str) -> tuple[str, ...]:
        """A statement of several results, named so."""
        names = tuple(ident(n, self.used) for n in names)
        self._add(_Statement(self.node, names, expr))
        return names

    def typed(self, v: Value) -> None:
        """Declares the statement that computes v (through the layout ops that keep its dtype) in torch's dtype."""
        want = language_dtype(v.meta.dtype)
        st = self.made.get(v.name)
        while st is not None and isinstance(st.layout_of, Value) and st.dtype is None:
            st = self.made.get(st.layout_of.name)
        if st is None or st.dtype is not None or isinstance(st.layout_of, Source) or len(st.names) > 1:
            return  # an input's dtype is torch's; a statement of several results is told by the checker
        if want != "float":  # the language's compute type: what an op gives with no declaration
            st.dtype = want

    def _add(self, st: _Statement) -> None:
        self.statements.append(st)
        for n in st.names:
            self.made[n] = st

    def run(self) -> None:
        specs = {s.arg.name: s for s in self.ep.graph_signature.input_specs}
        nodes = list(self.ep.graph.nodes)
        kept = self._kept_outputs(nodes[-1])
        needed, todo = set(), [n for n, _ in kept if isinstance(n, torch.fx.Node)]
        while todo:  # the nodes the kept outputs are computed from: a node nothing kept reads is not imported
            n = todo.pop()
            if n not in needed:
                needed.add(n)
                todo += n.all_input_nodes
        for node in nodes:
            self.node = node
            if node.op == "placeholder":
                val = node.meta.get("val")
                base = specs[node.name].target or self.arg_names.get(node.name, node.name)
                if not isinstance(val, torch.Tensor):
                    self.env[node] = None
                    self.refusals.append(_refusal(node, self.label, f"'{base}' is not a tensor"))
                    continue
                meta = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")
                self.env[node] = Source(node.name, base, (), meta)
            elif node.op == "call_function" and node in needed:
                self.call(node)
        for node, target in kept:
            self.output(node, target)

    def _kept_outputs(self, out: torch.fx.Node) -> list[tuple[object, str | None]]:
        """(the value, None for a returned one, else the placeholder it is written over) of each output of the
        graph the language keeps; a 0-dim buffer's update (a BatchNorm's batch count) is left out, and noted."""
        placeholder = {s.target: s.arg.name for s in self.ep.graph_signature.input_specs}
        kept = []
        for arg, spec in zip(out.args[0], self.ep.graph_signature.output_specs):
            if spec.kind == OutputKind.USER_OUTPUT:
                kept.append((arg, None))
            elif spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION):
                val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
                if isinstance(val, torch.Tensor) and val.dim() == 0 and spec.kind == OutputKind.BUFFER_MUTATION:
                    why = "a 0-dim buffer, which the language's tensors cannot hold; torch reads a BatchNorm's count"
                    why = f"the graph does not update '{spec.target}' ({why} only where its momentum is None)"
                    self.notes.append(Diagnostic("warning", why, _loc(arg, self.label)[0]))
                    continue
                kept.append((arg, placeholder.get(spec.target, spec.target)))
            else:
                self.refusals.append(_refusal(out, self.label, f"an output of kind {spec.kind.name}"))
        return kept

    def call(self, node: torch.fx.Node) -> None:
        convert = CONVERTERS.get(node.target)
        if convert is None and node.target is not operator.getitem:
            self.env[node] = None
            self.refusals.append(_refusal(node, self.label, f"the language has no op for {node.target}"))
            return
        if any(self.env.get(a, 0) is None for a in node.all_input_nodes):
            self.env[node] = None  # an input was refused: that node is the one reported
            return
        name = node.name
        try:
            if convert is None:  # getitem: one result of an op of several
                items, k = self.env[node.args[0]], node.args[1]
                if not isinstance(items, Items):
                    raise Refused(f"getitem of {node.args[0].target}")
                name, result = f"{items.name}_{k}", items.items[k]()
            else:
                kwargs = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
                result = convert(self, node, **kwargs.kwargs)
        except Refused as e:
            self.env[node] = None
            self.refusals.append(_refusal(node, self.label, str(e)))
            return
        if isinstance(result, (Source, Value, Items)):  # a view of an input, an op that changes nothing, results
            self.env[node] = result
            return
        st = result if isinstance(result, Stmt) else Stmt(result)
        made = ident(st.name or name, self.used)
        self._add(_Statement(node, (made,), st.expr, st.layout_of))
        self.env[node] = Value(made, node.meta["val"])

    def output(self, arg, target: str | None) -> None:
        """A returned value (target None), or one written over the input `target` reads."""
        v = self.env.get(arg) if isinstance(arg, torch.fx.Node) else None
        if target is None and isinstance(v, Source):
            why = "the function returns an input (or a view of one); every output of a graph is computed"
            self.refusals.append(_refusal(arg, self.label, why))
        elif target is None and not isinstance(arg, torch.fx.Node):
            self.refusals.append(_refusal(self.node, self.label, f"the function returns {arg!r}, not a tensor"))
        elif isinstance(v, Value):
            try:
                if target is None:
                    type_text(v.meta)  # refuses a 0-dim result
                    self.returned.append(v.name)
                else:
                    self.in_place[v.name] = self._over(v, target)
            except Refused as e:
                self.refusals.append(_refusal(arg, self.label, str(e)))

    def _over(self, v: Value, placeholder: str) -> str:
        """The declared input of `placeholder` an output of v's dims is written over (declared so if none is)."""
        if any(over == placeholder for over in self.in_place.values()):
            raise Refused("a second value written over the same input")
        reshapes = (aten.view.default, aten.reshape.default)  # views that keep the elements' order
        reads = [gi for gi in self.inputs if gi.source == placeholder]
        name = next((gi.name for gi in reads if all(op in reshapes for op, _ in gi.views)), None)
        if name is None or tuple(self.declared[name].shape) != tuple(v.meta.shape):
            src = next(s for s in self.env.values() if isinstance(s, Source) and s.placeholder == placeholder)
            try:  # the placeholder's own (the first); aten.view: the output is written through the bound view
                name = self.declare(src.view(aten.view.default, tuple(v.meta.shape)))
            except RuntimeError as e:
                raise Refused(f"written over an input that no view of its dims reaches ({e})") from None
        other = [gi.name for gi in self.inputs if gi.source == placeholder and gi.name != name]
        if other:  # a fused kernel could read an element another thread has written
            raise Refused(f"written in place over an input the graph also reads through another view ('{other[0]}')")
        return name

    def lines(self) -> tuple[list[str], list[torch.fx.Node | None]]:
        """The graph's statements, and the node each comes from (a checker's error is reported there)."""
        lines: list[str] = ["compute float", ""]
        nodes: list[torch.fx.Node | None] = [None, None]
        for text, node in self.decls:
            lines.append(text)
            nodes.append(node)
        lines.append("")
        nodes.append(None)
        outs = set(self.returned)
        for st in self.statements:
            name = st.names[0]
            if len(st.names) > 1:
                marks = [
                    f"output {n} in {self.in_place[n]}" if n in self.in_place else f"output {n}"
                    for n in st.names
                    if n in self.in_place or n in outs
                ]
                lines += [f"{', '.join(st.names)} = {st.expr}", *marks]
                nodes += [st.node] * (1 + len(marks))
                continue
            if name in self.in_place:
                lines.append(f"output {name} in {self.in_place[name]} = {st.expr}")
            elif name in outs:
                val = st.node.meta["val"]
                lines.append(f"output {name} : {type_text(val)}{layout_text(val)} = {st.expr}")
            elif st.dtype is not None:
                lines.append(f"{name} : {st.dtype} = {st.expr}")
            else:
                lines.append(f"{name} = {st.expr}")
            nodes.append(st.node)
        return lines, nodes


# ---- the front door -----------------------------------------------------------------------------------------

#: the lines of cdg_text's file before a graph's first statement (the header, a blank, the comment, `graph {`)
_PREAMBLE = 4


class _Function(torch.nn.Module):
    """A plain function as the module torch.export takes."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def from_torch(fn, example_inputs, *, name: str | None = None) -> Imported:
    """A function, an nn.Module or a torch.export program as a checked .cdg graph, traced on `example_inputs`
    (their dims, dtypes and strides are the graph's declarations). DslError names every node the language
    cannot express, located at the user's source line its stack trace gives."""
    from dsl.pipeline import load
    from dsl.syntax.parser import parse
    from dsl.syntax.printer import fmt_module

    what = getattr(fn, "__qualname__", None) or type(fn).__name__
    if isinstance(fn, torch.export.ExportedProgram):
        ep = fn
    else:
        if not isinstance(fn, torch.nn.Module):
            # torch.export keeps the frames of `forward` methods only, and of the functions anchored so (a private
            # hook of torch's, so a torch without it gives refusals with no line of the function's)
            anchor = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
            if anchor is not None:
                anchor(fn)
        module = fn if isinstance(fn, torch.nn.Module) else _Function(fn)
        ep = torch.export.export(module, tuple(example_inputs), strict=False)
    with warnings.catch_warnings():  # torch's own use of its deprecated LeafSpec, copying the program
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
        ep = ep.run_decompositions({})  # functionalized: in-place ops are pure, and what they write is an output
    label = f"<{what}>"
    imp = Importer(ep, label, _parameters(fn))
    imp.run()
    if imp.refusals:
        raise DslError(imp.refusals)
    lines, nodes = imp.lines()
    gname = ident(name or what.split(".")[-1].lower(), set())
    raw = cdg_text(
        f"Imported by cudnn_dsl.from_torch from {what}",
        [(f"traced by torch.export, torch {torch.__version__}", gname, lines)],
    )
    checked = load(text=raw, file=label)
    errors = [d for d in checked.diagnostics if d.severity == "error"]
    if errors:
        raise DslError([_at_node(d, nodes, label) for d in errors])
    text = fmt_module(parse(raw, label))
    program = load(text=text, file=f"{gname}.cdg").program
    specs = ep.graph_signature.input_specs
    state = {**ep.state_dict, **ep.constants}
    return Imported(
        text=text,
        program=program,
        inputs=tuple(imp.inputs),
        outputs=tuple(imp.returned),
        program_state={s.arg.name: state[s.target] for s in specs if s.target is not None},
        user_inputs=tuple(s.arg.name for s in specs if s.target is None),
        notes=tuple(imp.notes),
    )


def _parameters(fn) -> tuple[str, ...]:
    """A plain function's parameter names (torch.export calls them args_0, ...)."""
    if isinstance(fn, (torch.nn.Module, torch.export.ExportedProgram)):
        return ()
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return ()


def _at_node(d: Diagnostic, nodes: list, label: str) -> Diagnostic:
    """A checker's error in the imported text, told at the node its statement comes from."""
    k = d.loc.line - _PREAMBLE - 1
    node = nodes[k] if 0 <= k < len(nodes) else None
    if node is None:
        return d
    return _refusal(node, label, f"the language refuses it: {d.message}")
