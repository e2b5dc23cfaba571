"""Backward graphs derived from a forward graph (reverse mode, one VJP per op, dsl.ops.VJPS).

`derive(graph, inst)` walks one shape of a graph's nodes in reverse, asks each op's VJP for its
inputs' gradients and adds the gradients of a value read by several ops. It returns two graphs, as
canonical .cdg text and as checked IR: the forward, made to also output the intermediates the
backward reads (saved values), and the backward, whose inputs are the forward values it reads and
the gradients of the forward's outputs (`grad_<output>`), and whose outputs are the gradients of
the forward's float inputs (in the input's dtype; a sum of narrower values in float, the only output
cuDNN's reductions plan with, which torch autograd casts to the input's dtype); a buffer's gradient is a
buffer of the backward, its views' gradients written in place over views of it at the same offsets. Both
are written with every type, stride and attribute explicit, so the text is the whole truth and re-checks
to the same graph.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Callable

import attrs

from dsl.diagnostics import Diagnostic, DslError, RuleError
from dsl.inits import Init, num_text
from dsl.ir import Graph, Instance
from dsl.ops import EMIT_STATISTICS, NO_VJP, OPS, RECOMPUTE, RETYPABLE, STATISTICS, VJPS, At, Ctx, canonical
from dsl.options import OPTIONS, Options
from dsl.subgraph import fusion_order
from dsl.syntax import ast
from dsl.syntax.printer import fmt_module
from dsl.types import UNSET, TensorType, dense_strides, is_float, itemsize, merged_stride, packed_row_major
from dsl.values import from_python


@attrs.frozen
class Derived:
    forward: Graph
    backward: Graph
    forward_text: str
    backward_text: str
    bind: tuple[tuple[str, str, str], ...]
    """per backward input: (its name, what it is, the forward value). What it is: 'value'; 'transposed' (its last two
    axes swapped); 'flat_transposed' ([B.., M, K] read as [1.., K, B*M]: its batch dims merged into its rows, then
    transposed); 'rows' (a value packed row-major read in another shape of as many elements: a norm's operands as
    the [rows, columns, 1, 1] its backward op takes); 'grad', 'grad_transposed' or 'grad_rows' (an output's gradient,
    as it is, transposed, or in another shape). Each is a view of the value's memory. A forward buffer is bound as a
    'value' and read through views; 'buffer_grad' is the gradient buffer of a forward buffer, which the backward
    writes whole, 'buffer_grad_zeroed' one it writes in part (bound zeroed: no view reads the rest, whose gradient is
    zero)."""
    grads: tuple[tuple[str, str], ...]
    """(forward input or buffer, the backward output or buffer that is its gradient: in the input's shape, or in
    another of as many elements row-major where a fused op writes it so (a norm's backward op per sample))"""
    choices: tuple[str, ...] = ()
    """per intermediate the backward reads: whether the forward saves it or the backward recomputes it, and why"""


# ---- text: statements of a graph, written from types and canonical attributes -------------


def _type(t: TensorType, shape: bool = True) -> ast.TypeSpec:
    return ast.TypeSpec(t.dtype, tuple(ast.Dim(d) for d in t.shape) if shape else None)


def _init_spec(init: Init) -> ast.InitSpec:
    if init.source is not None:
        return ast.InitSpec(init.dist, (ast.Ident(init.source),))
    return ast.InitSpec(init.dist, tuple(ast.Number(a, num_text(a)) for a in init.args))  # as the file spells it


def _num(v: float | int) -> ast.Number:
    return ast.Number(v, repr(v))


def _call(
    op: str, args, attrs_: dict, uids: dict | None = None, compute: str | None = None, scalars: dict | None = None
) -> ast.Call:
    """`op(args, attrs)`; an attribute in `scalars` names the declared scalar that carries it (`epsilon=eps`)."""
    sig = OPS[op]
    scalars = scalars or {}
    kwargs = [
        ast.Kwarg(k, ast.Ident(scalars[k]) if k in scalars else from_python(sig.attr(k), v), uid=(uids or {}).get(k))
        for k, v in attrs_.items()
        if v is not None
    ]
    if compute is not None:
        kwargs.append(ast.Kwarg("compute", ast.Ident(compute)))
    given = args[: len(sig.inputs)] if not sig.variadic else args
    ins = tuple(ast.Ref(a) if isinstance(a, str) else _num(a) for a in given)
    named = [ast.Kwarg(k, ast.Ident(a)) for k, a in zip(sig.optional, args[len(given) :]) if a is not None]
    return ast.Call(op, ins, tuple(named + kwargs))


def _header(graph: Graph) -> list:
    out = [ast.TypesDecl("io", graph.io)] if graph.io else []
    out += [
        ast.TypesDecl("intermediate", graph.intermediate or UNSET),
        ast.TypesDecl("compute", graph.compute or UNSET),
    ]
    default = Options()
    for name, a in OPTIONS.items():
        v = getattr(graph.options, name)
        if v != getattr(default, name):
            out.append(ast.OptionDecl(name, from_python(a, list(v) if isinstance(v, tuple) else v)))
    return out


def _scalar_decl(name: str, dtype: str, value, dims: tuple[int, ...] | None) -> ast.ScalarDecl:
    """`scalar NAME : DTYPE[DIMS] = VALUE`, its dims where declared."""
    return ast.ScalarDecl(name, dtype, _num(value), (), dims=None if dims is None else tuple(map(ast.Dim, dims)))


def _input(name: str, t: TensorType, *specs) -> ast.InputDecl:
    return ast.InputDecl(name, _type(t), (ast.Strides(t.strides), *specs))


def _buffer(name: str, t: TensorType) -> ast.BufferDecl:
    return ast.BufferDecl(name, _type(t), ())


def _result(name: str, t: TensorType, expr, output: bool, into: str | None = None, placed=None):
    """`output NAME : T strides [...] [in BUFFER at OFFSET] = expr` (placed: (buffer, offset)), `output NAME : T
    in INPUT = expr`, or `NAME : dtype = expr` for a virtual value."""
    if output:
        if into:
            return ast.OutputDecl(name, _type(t), (ast.Place(into, None),), expr)  # in place: the input's layout
        specs = (ast.Strides(t.strides),) + ((ast.Place(*placed),) if placed else ())
        return ast.OutputDecl(name, _type(t), specs, expr)
    return ast.Assign((name,), expr, type=_type(t, shape=False))


def forward_stmts(
    graph: Graph, inst: Instance, saved: set[str], trained: dict[int, tuple[str, ...]], types: dict
) -> list:
    """The statements of one shape of `graph`, with the virtual values in `saved` made outputs, and the ops
    in `trained` (node index -> statistics' names, typed in `types`) made to return their statistics, as
    outputs."""
    consts = {v.name: v.scalar for v in graph.of_kind("const")}
    into = {v.name: v.into for v in graph.in_place}
    typed = {**dict(inst.types), **types}
    out = _header(graph) + [_buffer(b.name, inst.type(b.name)) for b in graph.buffers]
    for v in graph.values:
        if v.kind == "input":
            init = (_init_spec(v.init),) if v.init else ()
            place = (ast.Place(*v.view),) if v.view else ()
            out.append(_input(v.name, inst.type(v.name), *init, *place))
        elif v.kind == "scalar":
            out.append(_scalar_decl(v.name, v.dtype, v.scalar, v.dims))
    for index, n in enumerate(graph.nodes):
        sig = OPS[n.op]
        compute = n.compute if n.compute != (sig.compute or graph.compute) else None
        args = [consts.get(i, i) for i in n.inputs]
        stats = trained.get(index, ())
        given = dict(inst.attrs(index))
        if stats:
            attr, value = EMIT_STATISTICS[n.op]
            given[attr] = value
        call = _call(n.op, args, given, dict(n.uids), compute, dict(n.scalars))
        outputs = [o for o in n.outputs if graph.value(o).kind == "output" or o in saved] + list(stats)
        if len(n.outputs) == 1 and not stats:
            out.append(_result(n.outputs[0], inst.type(n.outputs[0]), call, bool(outputs), into.get(n.outputs[0])))
            continue
        out.append(ast.Assign(tuple(n.outputs) + stats, call))
        out += [_result(o, typed[o], None, True, into.get(o)) for o in outputs]
    return out


def check_text(name: str, text: str, at) -> Graph:
    """The checked graph of a derived text; a derivation that does not check is reported at `at`."""
    from dsl.pipeline import load

    result = load(text=text, file=f"<{name}>")
    if not result.ok:
        why = "; ".join(d.message for d in result.errors)
        raise DslError(Diagnostic("error", f"the derived graph '{name}' does not check: {why}", at))
    return result.program.graphs[0]


# ---- the backward graph, emitted by the VJPs --------------------------------------------------

TOKEN_SUM_FUSES = ("pointwise", "matmul", "conv")
"""the op families a sum over every axis but the last is left at its own rank after, to fuse with them in one cuDNN
graph (over their results, unmaterialized): cuDNN plans it so after a matmul or a convolution, and inside a norm's
chain of pointwise ops; after pointwise ops alone on inputs of its shape it plans at rank 4 only (Emit._over_tokens)"""
DTYPE_FREE = ("pointwise", "reduction")
"""the op families that compute in their own dtype, whatever dtype they read"""
FUSES_PROLOGUE = ("pointwise", "reduction")
"""the op families a recomputed pointwise prologue fuses into in one cuDNN graph (a matmul, a convolution or a
norm's backward op reads its operands from memory)"""


def accumulation(dtype: str) -> str:
    """The dtype a sum of `dtype` values is written in: float where `dtype` is narrower (cuDNN's reductions
    plan with float outputs only)."""
    return "float" if itemsize(dtype) < itemsize("float") else dtype


@attrs.define
class _Stmt:
    targets: tuple[str, ...]
    call: tuple  # (op, args, attrs)
    dtype: str | None = None
    output: TensorType | None = None
    outputs: dict[str, TensorType] = attrs.field(factory=dict)
    """the targets of a statement of several made outputs (a backward op's gradients), with their types"""


class Emit:
    """Builds the backward graph: declares the forward values it reads, types every op it emits with
    the registry's shape rules (as the checker will), and names values uniquely."""

    def __init__(self, graph: Graph, inst: Instance, avoid: Avoid):
        self.graph, self.inst, self.avoid = graph, inst, avoid
        self.known = {v.name for v in graph.values}  # the forward's values (not the statistics it may gain)
        self.taken = self.known | {b.name for b in graph.buffers}
        self.types: dict[str, TensorType] = {}
        self.bind: dict[str, tuple[str, str]] = {}  # backward input -> (kind, forward value)
        self.reads: dict[tuple[str, str], str] = {}  # (kind, forward value) -> the backward input reading it
        self.buffers: dict[str, TensorType] = {}  # the backward's buffers: forward ones read, gradient ones written
        self.views: dict[str, tuple[str, int]] = {}  # a backward view -> (its buffer, element offset)
        self.placed: dict[str, tuple[str, int]] = {}  # an output -> (the gradient buffer it is in, its offset)
        self.scalars: dict[str, tuple[str, float, tuple | None]] = {}  # backward scalar -> (dtype, value, dims)
        self.stmts: list[_Stmt] = []
        self.made: dict[str, _Stmt] = {}
        self.saved: set[str] = set()
        self.casts: dict[tuple[str, str], str] = {}
        self.trained: dict[int, tuple[str, ...]] = {}  # node index -> the statistics an op gains

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def _read(self, kind: str, name: str, t: TensorType) -> str:
        """The backward input that reads forward value `name` as `kind` (Derived.bind), of type t: bound to the
        value, or where the value is a view, a view of type t on its buffer at its offset (the buffer bound)."""
        if (kind, name) in self.reads:
            return self.reads[kind, name]
        b = name if kind == "value" else self.fresh(f"{name}_rows" if kind == "rows" else f"{name}_t")
        view = self.graph.value(name).view if name in self.known else None
        if view is None:
            self.bind[b] = (kind, name)
        else:
            self.views[b] = view
            self.buffers[view[0]] = self.inst.type(view[0])
            self.bind[view[0]] = ("value", view[0])
        self.types[b] = t
        self.reads[kind, name] = b
        return b

    def fwd(self, name: str) -> str:
        """A forward value as the backward reads it: an input, a view, a scalar, or a saved result."""
        v = self.graph.value(name)
        if v.kind in ("scalar", "const"):
            if name not in self.scalars:
                self.scalars[name] = (v.dtype, v.scalar, v.dims)
            return name
        if v.kind == "virtual":
            self.saved.add(name)
        return self._read("value", name, self.inst.type(name))

    def fwd_t(self, name: str) -> str:
        """A forward value with its last two axes swapped: a declared view of the same memory."""
        known = name in self.known  # else a statistic the derived forward gains
        if known and self.graph.value(name).kind == "virtual":
            self.saved.add(name)
        t = self.inst.type(name) if known else self.types[name]
        swap = lambda s: s[:-2] + (s[-1], s[-2])  # noqa: E731
        return self._read("transposed", name, TensorType(t.dtype, swap(t.shape), swap(t.strides)))

    def fwd_flat_t(self, name: str) -> str | None:
        """A forward value [B.., M, K] read as [1.., K, B*M], its batch dims merged into its rows and its last
        two axes swapped: a declared view of the same memory, or None where its strides allow no such view."""
        t = self.inst.type(name)
        row_stride = merged_stride(t.shape[:-1], t.strides[:-1])
        if row_stride is None:
            return None
        if self.graph.value(name).kind == "virtual":
            self.saved.add(name)
        k, k_stride, rows = t.shape[-1], t.strides[-1], math.prod(t.shape[:-1])
        lead = (max(k * k_stride, rows * row_stride),) * (len(t.shape) - 2)
        flat = TensorType(t.dtype, (1,) * len(lead) + (k, rows), lead + (k_stride, row_stride))
        return self._read("flat_transposed", name, flat)

    def stats(self, n: At, k: int, first: int = 0) -> tuple[str, ...]:
        """An op's statistics from the first-th up to the k-th, saved: its own results (a norm in training phase);
        else those it returns and after them the results the forward gains by computing it with EMIT_STATISTICS's
        attribute set (the same y; sdpa_fp8 returns its amax and gains its softmax stats)."""
        return tuple(
            self.fwd(s) if s in self.known else self._read("value", s, self.types[s])
            for s in self.stat_names(n, k)[first:]
        )

    def stat_names(self, n: At, k: int) -> tuple[str, ...]:
        """The forward names of an op's first k statistics (as `stats` reads them), none of them read yet."""
        switch = EMIT_STATISTICS.get(n.node.op)
        have = n.node.outputs[1 : 1 + k]
        if switch is None or n.attrs[switch[0]] == switch[1] or len(have) == k:
            return tuple(have)
        if n.index not in self.trained:
            sig = OPS[n.node.op]
            full = {**n.attrs, switch[0]: switch[1]}
            given = len(n.node.outputs)
            outs = sig.infer(Ctx(n.node.op, n.ins, full))[given:]
            names = tuple(self.fresh(f"{n.out}_{s}") for s in sig.outputs[given:])
            for name, out in zip(names, outs):
                self.types[name] = TensorType(out.dtype, out.shape, dense_strides(out.shape, out.order))
            self.trained[n.index] = names
        return tuple(have) + self.trained[n.index][: k - len(have)]

    def read_once(self, name: str) -> bool:
        """Whether forward value `name` is an input that one op reads once: its gradient is that op's alone, an
        output of the backward as the op writes it (in the input's dtype), never summed nor read further."""
        v = self.graph.value(name)
        return v.kind == "input" and v.view is None and sum(n.inputs.count(name) for n in self.graph.nodes) == 1

    def fwd_rows(self, name: str, shape: tuple[int, ...]) -> str:
        """A forward value read in `shape` (as many elements, row-major): a declared view of its memory where it is
        an input, an output or a statistic lying packed row-major, else a reshape of it."""
        known = name in self.known
        v = self.graph.value(name) if known else None
        t = self.inst.type(name) if known else self.types[name]
        reusable = ("rows", name) not in self.reads or self.types[self.reads["rows", name]].shape == tuple(shape)
        stored = v is None or (v.kind != "virtual" and v.view is None)  # virtual: read as a value (recomputed?)
        if stored and packed_row_major(t.shape, t.strides) and reusable:
            return self._read("rows", name, TensorType(t.dtype, tuple(shape), dense_strides(tuple(shape))))
        return self.reshape(self.fwd(name) if known else self._read("value", name, t), shape)

    def rows(self, g: str, shape: tuple[int, ...]) -> str:
        """A backward value in `shape` (as many elements, row-major): a declared view where it is an output's
        gradient, else a reshape of it."""
        kind, of = self.bind.get(g, (None, None))
        t = self.types[g]
        if kind != "grad" or not packed_row_major(t.shape, t.strides):
            return self.reshape(g, shape)
        return self._grad_view(of, "grad_rows", TensorType(t.dtype, tuple(shape), dense_strides(tuple(shape))), g)

    def transposed(self, g: str) -> str:
        """A backward value with its last two axes swapped: a view where it is an output's gradient, else a
        transpose op."""
        kind, of = self.bind.get(g, (None, None))
        if kind != "grad":
            rank = len(self.types[g].shape)
            return self.call("transpose", g, perm=(*range(rank - 2), rank - 1, rank - 2))
        t = self.types[g]
        swapped = TensorType(t.dtype, t.shape[:-2] + t.shape[:-3:-1], t.strides[:-2] + t.strides[:-3:-1])
        return self._grad_view(of, "grad_transposed", swapped, g)

    def _grad_view(self, of: str, kind: str, t: TensorType, g: str) -> str:
        """The backward input that reads output `of`'s gradient (bound as g) as `kind`, of type t: once."""
        for b, (k, o) in self.bind.items():
            if k == kind and o == of and self.types[b] == t:
                return b
        b = self.fresh(f"{g}_t" if kind == "grad_transposed" else f"{g}_rows")
        self.bind[b] = (kind, of)
        self.types[b] = t
        return b

    def grad_buffer(self, buffer: str, whole: bool) -> str:
        """The gradient of a forward buffer: a buffer of its type, which the backward writes `whole` or in part."""
        b = self.fresh(f"grad_{buffer}")
        self.bind[b] = ("buffer_grad" if whole else "buffer_grad_zeroed", buffer)
        self.buffers[b] = self.inst.type(buffer)
        return b

    def place(self, g: str, view, buffer: str) -> str:
        """Makes g, the gradient of forward view `view`, an output placed in the gradient `buffer` at the view's
        offset and strides."""
        self.taken.add(f"grad_{view.name}_view")  # the name the checker gives the view it is written over
        return self.output(g, self.inst.type(view.name), f"grad_{view.name}", placed=(buffer, view.view[1]))

    def grad_of_output(self, name: str) -> str:
        b = self.fresh(f"grad_{name}")
        self.bind[b] = ("grad", name)
        self.types[b] = self.inst.type(name)
        return b

    def _arg_type(self, a, rank: int) -> TensorType:
        if isinstance(a, str) and a not in self.scalars:
            return self.types[a]
        dtype = self.scalars[a][0] if isinstance(a, str) else "float"
        return TensorType(dtype, (1,) * rank, (1,) * rank)

    def call(self, op: str, *args, dtype: str | None = None, **given):
        """Emits `op(args, attrs)`; returns its result's name (a tuple of names for several). A negative
        number becomes a host scalar (a literal cannot be negative); None is an optional input not given."""
        args = tuple(self.scalar(a) if isinstance(a, (int, float)) and a < 0 else a for a in args)
        sig = OPS[op]
        rank = max(len(self.types[a].shape) for a in args if isinstance(a, str) and a not in self.scalars)
        ins = tuple(None if a is None else self._arg_type(a, rank) for a in args)
        if sig.optional:  # every port, as the checker gives them
            ins += (None,) * (len(sig.inputs) + len(sig.optional) - len(ins))
        full = canonical(sig, given, ins)
        outs = sig.infer(Ctx(op, ins, full))[: sig.count_results(given)]
        first = next(t for t, a in zip(ins, args) if isinstance(a, str) and a not in self.scalars)
        names = tuple(self.fresh(op) for _ in outs)
        for name, out in zip(names, outs):
            d = dtype or out.dtype or sig.result_dtype or (first.dtype if sig.keeps_dtype else self.graph.intermediate)
            self.types[name] = TensorType(d, out.shape, dense_strides(out.shape, out.order))
        st = _Stmt(names, (op, args, {k: full[k] for k in given} if given else {}), dtype)
        self.stmts.append(st)
        self.made.update((n, st) for n in names)
        return names[0] if len(names) == 1 else names

    def scalar(self, value: float, base: str = "c") -> str:
        """A float host scalar of the backward graph holding `value`, which a caller may set per call by its name."""
        name = self.fresh(base)
        self.scalars[name] = ("float", float(value), None)
        return name

    def cast(self, g: str, dtype: str) -> str:
        """g in `dtype` (written once, however many ops read it): written in that dtype where it is computed
        when it can be, else by an identity op."""
        if self.types[g].dtype == dtype or self._retype(g, dtype):
            return g
        if (g, dtype) not in self.casts:
            self.casts[g, dtype] = self.call("identity", g, dtype=dtype)
        return self.casts[g, dtype]

    def _retype(self, g: str, dtype: str) -> bool:
        """Makes the op that computes g write it in `dtype`, where that op is of a RETYPABLE family (g itself, or
        g a reshape of its result: a reshape keeps its input's dtype) and nothing read its result yet where the
        dtype matters; False where not."""
        root = g
        while (st := self.made.get(root)) is not None and st.call[0] == "reshape" and st.dtype is None:
            root = st.call[1][0]
        if st is None or len(st.targets) > 1 or st.dtype is not None or OPS[st.call[0]].family not in RETYPABLE:
            return False
        carriers = self._carriers(root)
        if carriers is None:
            return False
        st.dtype = dtype
        for v in carriers:
            self.types[v] = attrs.evolve(self.types[v], dtype=dtype)
        return True

    def _carriers(self, v: str) -> list[str] | None:
        """v and the reshapes of it, which carry its dtype; None where one of them is read where the dtype
        matters (by an op outside DTYPE_FREE)."""
        out = [v]
        for r in self.stmts:
            if v not in r.call[1]:
                continue
            if r.call[0] == "reshape" and r.dtype is None:
                more = self._carriers(r.targets[0])
                if more is None:
                    return None
                out += more
            elif OPS[r.call[0]].family not in DTYPE_FREE:
                return None
        return out

    def reshape(self, g: str, shape: tuple[int, ...]) -> str:
        """g reshaped to `shape`: a reshape of a reshape is one reshape of the first one's input, and a reshape
        to g's own shape is g."""
        st = self.made.get(g)
        if st is not None and st.call[0] == "reshape" and st.dtype is None:
            g = st.call[1][0]
        if self.types[g].shape == tuple(shape):
            return g
        return self.call("reshape", g, shape=tuple(shape))

    def expand(self, g: str, like: str) -> str:
        """g broadcast to the forward value `like`'s shape (by a mask of all ones; pointwise ops broadcast)."""
        t = self.inst.type(like)
        if self.types[g].shape == t.shape:
            return g
        ones = self.call("cmp_ge", self.call("gen_index", self.fwd(like), axis=0), 0.0)
        return self.call("mul", g, ones)

    def sum_to(self, g: str, like: str) -> str:
        """A gradient summed over the axes where the forward value `like` was broadcast."""
        want, have = self.inst.type(like).shape, self.types[g].shape
        if len(want) < len(have):  # a one-element operand of a lower rank (pointwise ops broadcast it): the total
            total = self.call("reduction", g, mode="sum", axes=tuple(range(len(have)))) if max(have) > 1 else g
            return self.reshape(total, want)
        if any(h == 1 and w != 1 for h, w in zip(have, want)):
            g = self.expand(g, like)
            have = self.types[g].shape
        axes = [i for i, (h, w) in enumerate(zip(have, want)) if w == 1 and h != 1]
        if not axes:
            return g
        t = self.types[g]
        tokens = all(w == 1 for w in want[:-1]) and want[-1] == t.shape[-1] > 1
        if tokens and (self._over_tokens(g) or self._in_memory(g)):
            return self._sum_tokens(g, accumulation(self.inst.type(like).dtype))
        return self.call("reduction", g, mode="sum", axes=axes)

    def _in_memory(self, g: str) -> bool:
        """Whether g, to be summed over its tokens, is packed (so [tokens, N, 1, 1] is a view of it) and is in memory
        whatever reads it: a backward input, or a result of an op the sum is not left to fuse after
        (TOKEN_SUM_FUSES). Such a sum cuDNN plans only as the rank-4 view."""
        t, st = self.types[g], self.made.get(g)
        packed = merged_stride(t.shape, t.strides) == 1
        return packed and (st is None or OPS[st.call[0]].family not in TOKEN_SUM_FUSES)

    def _over_tokens(self, g: str) -> bool:
        """Where g [.., N], to be summed over its tokens, is made by pointwise ops alone from backward inputs of its
        shape that lie packed (an activation's backward from the output's gradient and a saved value, that gradient
        scaled first, ...), and nothing reads it yet: remakes those ops over [tokens, N, 1, 1] on reshapes of the
        inputs, g then a reshape of the last one's result (the same memory), and says True; else False. cuDNN
        declines a sum over the tokens after pointwise ops at rank 3, and fuses them at rank 4."""
        t = self.types[g]
        inputs = None if any(g in other.call[1] for other in self.stmts) else self._pointwise_inputs(g, t.shape)
        if inputs is None:
            return False
        flat = (math.prod(t.shape[:-1]), t.shape[-1], 1, 1)
        # the inputs' reshapes first: a view between two of the ops would cut them into two parts
        views = {a: self.reshape(a, flat) for a in inputs}
        self._rename(self.reshape(self._remade(g, views), t.shape), g)
        return True

    def _pointwise_inputs(self, v: str, shape: tuple[int, ...], root: bool = True) -> dict[str, None] | None:
        """Where v is the one result of a pointwise op, no output, whose operands are backward inputs of `shape`
        lying packed, or values made so that this op alone reads, once (and no cast reuses): those backward inputs,
        in order, once each; else None."""
        st = self.made.get(v)
        if st is None or len(st.targets) != 1 or st.output is not None or OPS[st.call[0]].family != "pointwise":
            return None
        if not root and (v in self.casts.values() or sum(r.call[1].count(v) for r in self.stmts) != 1):
            return None
        found: dict[str, None] = {}
        for a in st.call[1]:
            if not isinstance(a, str) or a in self.scalars:
                continue
            if a in self.bind:
                if self.types[a].shape != shape or not packed_row_major(shape, self.types[a].strides):
                    return None
                found[a] = None
            else:
                more = self._pointwise_inputs(a, shape, root=False)
                if more is None:
                    return None
                found.update(more)
        return found

    def _remade(self, v: str, views: dict[str, str]) -> str:
        """The pointwise ops that make v (_pointwise_inputs) emitted again on `views` of their inputs; their
        statements at v's shape removed."""
        st = self.made[v]
        self.stmts.remove(st)
        op, args, given = st.call
        new = [
            a if not isinstance(a, str) or a in self.scalars else views[a] if a in self.bind else self._remade(a, views)
            for a in args
        ]
        return self.call(op, *new, dtype=st.dtype, **given)

    def _sum_tokens(self, g: str, dtype: str) -> str:
        """g [.., N] summed over every axis but the last, as cuDNN plans it: the view [tokens, N, 1, 1] (which a
        reshape lays out channels-last) summed over [0, 2, 3] in `dtype`, reshaped back to [1.., N]."""
        t = self.types[g]
        n = t.shape[-1]
        flat = self.reshape(g, (math.prod(t.shape[:-1]), n, 1, 1))
        total = self.call("reduction", flat, mode="sum", axes=(0, 2, 3), dtype=dtype)
        return self.reshape(total, (1,) * (len(t.shape) - 1) + (n,))

    def recompute(self) -> tuple[str, ...]:
        """Replaces saved intermediates by their recomputation in the backward, where each is made by a cheap op
        (RECOMPUTE), only ops that fuse with it read it (FUSES_PROLOGUE), and what the forward must save instead
        (the non-cheap values its recomputation reaches) is fewer bytes. Returns a line per saved intermediate."""
        made_by = {o: n for n in self.graph.nodes for o in n.outputs}
        kept, plan, reasons = set(self.saved), set(), {}
        for v in (v.name for v in self.graph.values if v.name in self.saved):
            reasons[v] = self._refusal(v, made_by)
            if reasons[v]:
                continue
            more, reached = set(plan), set()
            self._reach(v, made_by, kept - {v}, more, reached)
            after = (kept - {v}) | reached
            if self._bytes(after) < self._bytes(kept):
                kept, plan = after, more
            else:
                reasons[v] = f"recomputing it would save {', '.join(sorted(reached))} instead"
        recomputed = plan & self.saved
        for v in recomputed:
            b = self.reads.pop(("value", v))
            del self.bind[b], self.types[b]
        self.saved -= recomputed
        start, names = len(self.stmts), {}
        for v in sorted(recomputed):
            self._recomputed(v, made_by, plan, names)
        self.stmts = self.stmts[start:] + self.stmts[:start]  # they read forward values only: first is in order
        for v in recomputed:
            self._rename(names[v], v)
        lines = []
        for v in (v.name for v in self.graph.values if v.name in recomputed | self.saved):
            size = _size(self._bytes({v}))
            if v in recomputed:
                lines.append(
                    f"recomputes {v} ({made_by[v].op}) in the backward, fused with what reads it: {size} unsaved"
                )
            else:
                why = reasons.get(v) or self._refusal(v, made_by)
                lines.append(f"saves {v} ({made_by[v].op}, {size}): {why}")
        return tuple(lines)

    def _refusal(self, v: str, made_by: dict) -> str:
        """Why the saved intermediate v is not recomputed, or '' where it may be."""
        op = made_by[v].op
        if op not in RECOMPUTE or len(made_by[v].outputs) > 1:
            return "not a cheap op to recompute"
        if any(name == v and kind != "value" for kind, name in self.reads):
            return "read as a view of its memory"
        b = self.reads["value", v]
        for st in self.stmts:
            sig, args = OPS[st.call[0]], st.call[1]
            ports = [k for k, a in enumerate(args) if a == b]
            if ports and sig.family not in FUSES_PROLOGUE and not set(ports) <= set(sig.prologue):
                return f"read from memory by {st.call[0]}"
        return ""

    def _reach(self, v: str, made_by: dict, kept: set, plan: set, reached: set) -> None:
        """Adds to `plan` v and the intermediates recomputed with it, to `reached` the saved values they read."""
        plan.add(v)
        for i in made_by[v].inputs:
            if i is None or self.graph.value(i).kind != "virtual" or i in plan:
                continue
            if i in kept or made_by[i].op not in RECOMPUTE or len(made_by[i].outputs) > 1:
                reached.add(i)
            else:
                self._reach(i, made_by, kept, plan, reached)

    def _recomputed(self, v: str, made_by: dict, plan: set, names: dict) -> str:
        """The backward value that recomputes forward value v (emitted once), in v's dtype."""
        if v in names:
            return names[v]
        n = made_by[v]
        consts = {c.name: c.scalar for c in self.graph.of_kind("const")}
        args = tuple(
            None
            if i is None
            else consts[i]
            if i in consts
            else self._recomputed(i, made_by, plan, names)
            if i in plan
            else self.fwd(i)
            for i in n.inputs
        )
        g = RECOMPUTE[n.op](self, n.op, args, dict(self.inst.attrs(self.graph.nodes.index(n))))
        want = self.inst.type(v).dtype
        if self.types[g].dtype != want:
            self.made[g].dtype = want
            self.types[g] = attrs.evolve(self.types[g], dtype=want)
        names[v] = g
        return g

    def _bytes(self, values: set[str]) -> int:
        return sum(itemsize(self.inst.type(v).dtype) * math.prod(self.inst.type(v).shape) for v in values)

    def stmts_ast(self) -> list:
        out = _header(self.graph) + [_buffer(b, t) for b, t in self.buffers.items()]
        out += [_input(name, self.types[name]) for name in self.bind if name not in self.buffers]
        out += [_input(name, self.types[name], ast.Place(*place)) for name, place in self.views.items()]
        for name, (dtype, value, dims) in self.scalars.items():
            out.append(_scalar_decl(name, dtype, value, dims))
        nodes = [(st.call[0], tuple(a for a in st.call[1] if isinstance(a, str)), st.targets) for st in self.stmts]
        inputs = set(self.bind) | set(self.views)
        read = {a for _, args, _ in nodes for a in args}
        for k in fusion_order(nodes, inputs):  # the VJPs' order, rearranged for the partitioner
            st = self.stmts[k]
            op, args, given = st.call
            call = _call(op, args, given)
            if len(st.targets) > 1:
                # results nothing reads go unnamed (sdpa_fp8_backward's amaxes): the checker names them itself
                named = len(st.targets)
                while named > 1 and st.targets[named - 1] not in read and st.targets[named - 1] not in st.outputs:
                    named -= 1
                out.append(ast.Assign(st.targets[:named], call))
                out += [_result(name, t, None, True, placed=self.placed.get(name)) for name, t in st.outputs.items()]
            elif st.output is not None:
                out.append(_result(st.targets[0], st.output, call, True, placed=self.placed.get(st.targets[0])))
            else:
                t = self.types[st.targets[0]]
                out.append(
                    ast.Assign(st.targets, call, type=_type(t, shape=False))
                    if st.dtype
                    else ast.Assign(st.targets, call)
                )
        return out

    def prune(self) -> None:
        """Drops the statements whose results nothing reads and no output is (a reshape that a reshape of it
        now skips), then the inputs nothing reads (a value read in another shape instead: `fwd_rows`, `rows`)."""
        live: set[str] = set()
        kept = []
        for st in reversed(self.stmts):
            if st.output is not None or st.outputs or live.intersection(st.targets):
                live.update(a for a in st.call[1] if isinstance(a, str))
                kept.append(st)
        self.stmts = kept[::-1]
        held = set(self.buffers) | {buffer for buffer, _ in self.views.values()}
        for b, (kind, of) in list(self.bind.items()):
            if b not in live and b not in held:
                del self.bind[b]
                self.reads.pop((kind, of), None)
        self.saved &= {of for _, of in self.bind.values()}

    def output(self, g: str, t: TensorType, name: str, placed: tuple[str, int] | None = None) -> str:
        """Makes g an output of type t (dtype, shape, strides; a sum of narrower values in float, as it is
        computed, unless it is `placed` in a buffer: then cast to the buffer's dtype), or writes an
        identity to one. A result of an op of several (a backward op's) is made an output as it is: an identity
        after a fused op such as sdpa_backward would not fuse."""
        if self._summed(g) and placed is not None:
            g = self.call("identity", g)
        elif self._summed(g):
            t = attrs.evolve(t, dtype=accumulation(t.dtype))
        st = self.made.get(g)
        if st is not None and st.call[0] == "reshape" and st.dtype is None and self.types[g].dtype != t.dtype:
            # a reshape keeps its input's dtype: the op before it writes the output's, else an identity casts it
            if not self._retype(g, t.dtype):
                g = self.call("identity", g, dtype=t.dtype)
                st = self.made[g]
        if placed is None and st is not None and st.call[0] == "reshape" and st.dtype is None:
            src = self.made.get(st.call[1][0])
            if src is not None and len(src.targets) > 1 and st.call[1][0] not in src.outputs:
                # a fused op's result reshaped (a norm's backward op per sample): the output is that result as the
                # op writes it, declared in its shape (the same elements row-major; Derived.grads)
                g, st, shape = st.call[1][0], src, self.types[st.call[1][0]].shape
                t = TensorType(t.dtype, shape, dense_strides(shape))
        if st is not None and len(st.targets) > 1 and g not in st.outputs and self.types[g].shape == t.shape:
            new = self.fresh(name)
            self._rename(g, new)
            st.outputs[new] = self.types[new] = t
        else:
            if st is None or st.output is not None or len(st.targets) > 1:
                g = self.call("identity", g)
                st = self.made[g]
            st.output, st.dtype = t, t.dtype
            new = self.fresh(name)
            self._rename(g, new)
        if placed is not None:
            self.placed[new] = placed
        return new

    def _summed(self, g: str) -> bool:
        """Whether g is a reduction's result, or a reshape of one."""
        st = self.made.get(g)
        while st is not None and st.call[0] == "reshape":
            st = self.made.get(st.call[1][0])
        return st is not None and st.call[0] == "reduction"

    def _rename(self, old: str, new: str) -> None:
        for st in self.stmts:
            op, args, given = st.call
            st.call = (op, tuple(new if a == old else a for a in args), given)
            st.targets = tuple(new if t == old else t for t in st.targets)
        self.types[new] = self.types.pop(old)
        self.made[new] = self.made.pop(old)


def _size(n: int) -> str:
    """'96 bytes', '256 KiB', '1.5 MiB'."""
    if n < 1024:
        return f"{n} bytes"
    return f"{n / 1024:g} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:g} MiB"


def _reject(graph: Graph, active: set[str]) -> None:
    """What a derived backward does not handle yet, located: an output written in place that a gradient flows
    from (a running statistic passes none)."""
    for v in graph.values:
        if v.into is not None and v.name in active:
            raise DslError(
                Diagnostic(
                    "error",
                    f"'{v.name}' is written in place and has a gradient; a graph with one has no derived backward",
                    v.loc,
                )
            )


def _covers(inst: Instance, buffer: str, views) -> bool:
    """Whether the views of `buffer` whose gradients are written into its gradient reach every element of it (the
    rest is zero). DslError at a view that reaches an element twice, its own (a stride 0) or another view's: the
    gradients meeting there would add in memory, which a backward graph's outputs do not."""
    owner = array("I", bytes(4 * math.prod(inst.type(buffer).shape)))  # element -> 1 + the view that reaches it
    for k, v in enumerate(views, 1):
        t = inst.type(v.name)
        axis = max(range(len(t.shape)), key=lambda a: t.shape[a])  # one slice along it per index of the others
        n, step = t.shape[axis], t.strides[axis]
        others = [(d, s) for a, (d, s) in enumerate(zip(t.shape, t.strides)) if a != axis]
        for index in itertools.product(*(range(d) for d, _ in others)):
            start = v.view[1] + sum(i * s for i, (_, s) in zip(index, others))
            run = slice(start, start + (n - 1) * step + 1, step or 1)
            met = next((o for o in owner[run] if o), 0) if step or n == 1 else k
            if met:
                other = "itself" if met == k else f"view '{views[met - 1].name}'"
                raise DslError(
                    Diagnostic(
                        "error",
                        f"view '{v.name}' of '{buffer}' reaches an element that {other} reaches too: their "
                        f"gradients would add in memory, which a derived backward does not write",
                        v.loc,
                    )
                )
            owner[run] = array("I", [k]) * n
    return 0 not in owner


#: (the frontend's backward op, x's type, the scale's type, the normalized axes) -> why the derived backward takes
#: the chain of registry ops instead on the cuDNN that will run it, or None: the op (cudnn_dsl.target.quirks
#: knows which library avoids which form; the language does not)
Avoid = Callable[[str, TensorType, TensorType, tuple[int, ...]], str | None]


def derive(
    graph: Graph,
    inst: Instance | None = None,
    wrt: tuple[str, ...] | None = None,
    suffix: str = "",
    *,
    avoid: Avoid,
    recompute: bool = True,
) -> Derived:
    """The augmented forward and the backward of one shape of `graph` (the only one when inst is None),
    with gradients for `wrt` (default: every float input), named `<graph>_forward<suffix>` and
    `<graph>_backward<suffix>`; a norm's gradients by the frontend's backward op unless `avoid` says why
    not (the caller asks the quirks table for the cuDNN that will plan or run the graphs); a cheap intermediate
    recomputed in the backward rather than saved where that fuses and saves bytes (Emit.recompute), unless
    `recompute` is False. DslError, at the op, when a gradient must pass an op that has no VJP."""
    unset = [k for k in ("intermediate", "compute") if getattr(graph, k) is None]
    if unset:  # the backward's own values and ops take the graph's types
        raise DslError(
            Diagnostic(
                "error",
                f"graph '{graph.name}' has no derived backward while its {' and '.join(unset)} "
                f"type{'s are' if len(unset) > 1 else ' is'} unset; give {'them' if len(unset) > 1 else 'it'} "
                "(" + ", ".join(f"'{k} float'" for k in unset) + ")",
                graph.loc,
            )
        )
    inst = inst or graph.instance()
    floats = {v.name for v in graph.values if v.kind not in ("scalar", "const") and is_float(inst.type(v.name).dtype)}
    inputs = float_inputs(graph, inst)
    wrt = tuple(inputs) if wrt is None else wrt
    for w in wrt:
        if w not in inputs:
            raise DslError(
                Diagnostic(
                    "error",
                    f"graph '{graph.name}': '{w}' is not a float input (they are: {', '.join(inputs)})",
                    graph.loc,
                )
            )
    active = set(wrt) | {v.name for v in graph.views if v.view[0] in wrt}
    for n in graph.nodes:
        if any(i in active for i in n.inputs):
            results = n.outputs[:1] if n.op in STATISTICS else n.outputs
            active |= {o for o in results if o in floats}
    _reject(graph, active)
    e = Emit(graph, inst, avoid)
    grads = {o.name: e.grad_of_output(o.name) for o in graph.outputs if o.name in active}
    for index in reversed(range(len(graph.nodes))):
        n = graph.nodes[index]
        dys = tuple(grads.get(o) for o in n.outputs)
        need = tuple(i is not None and i in active for i in n.inputs)
        if not any(need) or all(d is None for d in dys):
            continue
        rule = VJPS.get(n.op)
        if rule is None:
            raise DslError(Diagnostic("error", f"{n.op} has no derived backward: {NO_VJP[n.op]}", n.loc))
        at = At(
            n,
            index,
            inst.attrs(index),
            tuple(inst.type(i) if i else None for i in n.inputs),
            tuple(inst.type(o) for o in n.outputs),
            need,
            dys,
        )
        try:
            results = rule(e, at)
        except RuleError as err:
            raise DslError(Diagnostic("error", f"no derived backward: {err}", n.loc)) from None
        for name, g, want in zip(n.inputs, results, need):
            if g is None or not want:
                continue
            g = e.sum_to(g, name)
            grads[name] = e.call("add", grads[name], g) if name in grads else g
    outs = []
    for w in wrt:
        views = [v for v in graph.views if v.view[0] == w and v.name in grads]
        if views:  # a buffer: its views' gradients written into its gradient, at their offsets
            buffer = e.grad_buffer(w, _covers(inst, w, views))
            for v in views:
                old = grads[v.name]
                new = e.place(old, v, buffer)
                grads = {k: new if g == old else g for k, g in grads.items()}
            outs.append((w, buffer))
        elif w in grads:
            old = grads[w]
            new = e.output(old, inst.type(w), f"grad_{w}")
            grads = {k: new if g == old else g for k, g in grads.items()}
            outs.append((w, new))
    choices = e.recompute() if recompute else ()
    e.prune()
    if not outs:
        raise DslError(
            Diagnostic(
                "error",
                f"graph '{graph.name}': no gradient reaches {', '.join(wrt) or 'a float input'} from its outputs",
                graph.loc,
            )
        )
    fwd_name, bwd_name = f"{graph.name}_forward{suffix}", f"{graph.name}_backward{suffix}"
    fwd_text = fmt_module(
        ast.Module(
            graph.file, (ast.GraphDef(fwd_name, tuple(forward_stmts(graph, inst, e.saved, e.trained, e.types))),)
        )
    )
    bwd_text = fmt_module(ast.Module(graph.file, (ast.GraphDef(bwd_name, tuple(e.stmts_ast())),)))
    bind = tuple((b, kind, of) for b, (kind, of) in e.bind.items())
    return Derived(
        check_text(fwd_name, fwd_text, graph.loc),
        check_text(bwd_name, bwd_text, graph.loc),
        fwd_text,
        bwd_text,
        bind,
        tuple(outs),
        choices,
    )


def float_inputs(graph: Graph, inst: Instance) -> tuple[str, ...]:
    """What `derive` can give gradients (all of them by default): the float tensors the caller binds, inputs and
    buffers (a view's gradient is written into its buffer's, at its offset)."""
    return tuple(v.name for v in graph.device_inputs if is_float(inst.type(v.name).dtype))
