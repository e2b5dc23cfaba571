"""A PyTorch function or module, traced by torch.export -> a checked .cdg graph of its aten ops, with the
declared layouts of its example inputs, and a located refusal naming each node the language cannot express.

The trace is torch.export's (a module's parameters and buffers are inputs of the graph, named by their
place in the module). An input and the view ops applied to it (permute, transpose, view, unsqueeze...) are
one declared input: its dims and strides are the view's, so `linear.weight` is `[1, IN, OUT] col_major` and
an attention block's `.view(B, S, H, D).transpose(1, 2)` is `[B, H, S, D]` with its strides; `bind` makes
those views of the call's own tensors. Each other node is one statement, from the table CONVERTERS keyed by
aten op. The text is checked by the language before it is returned; a rule it breaks is reported at the node.
"""

from __future__ import annotations

import importlib.util
import inspect
import linecache
import os
import re
import sys

import attrs
import torch
import torch.fx.proxy
from torch.fx.operator_schemas import normalize_function

from cudnn_dsl.interop.fe_graph import ints_text, number_text
from cudnn_dsl.interop.fe_import import cdg_text, ident
from cudnn_dsl.target.dtypes import from_torch as language_dtype
from cudnn_dsl.target.dtypes import torch_dtype
from dsl.diagnostics import Diagnostic, DslError, Loc, RuleError
from dsl.ir import Program
from dsl.types import LAYOUTS, dense_strides, layout_order

aten = torch.ops.aten


class Refused(Exception):
    """Why one node has no spelling in the language."""


@attrs.frozen
class GraphInput:
    """A declared input of the imported graph: an argument of the function, or a parameter or buffer of the
    module, through the view ops applied to it."""

    name: str
    """its name in the .cdg file"""
    source: str
    """the export placeholder it is read from"""
    views: tuple
    """(aten view op, its other arguments), applied in order"""


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

    def bind(self, *args: torch.Tensor) -> dict[str, torch.Tensor]:
        """The graph's inputs for a call of the function with these tensors (the module's state added): views of
        the same memory, as the graph declares them."""
        if len(args) != len(self.user_inputs):
            raise TypeError(f"the function takes {len(self.user_inputs)} tensors, got {len(args)}")
        values = dict(self.program_state, **dict(zip(self.user_inputs, args)))
        out = {}
        for gi in self.inputs:
            t = values[gi.source]
            for op, rest in gi.views:
                t = op(t, *rest)
            out[gi.name] = t
        return out


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


# ---- values ---------------------------------------------------------------------------------------------------


@attrs.define
class _Source:
    """A placeholder through view ops: an input of the graph once an op reads it."""

    placeholder: str
    base: str
    """the name it is declared under"""
    views: tuple
    meta: torch.Tensor
    """a meta tensor of the view's dims, strides and dtype"""

    def view(self, op, *rest) -> _Source:
        return _Source(self.placeholder, self.base, self.views + ((op, rest),), op(self.meta, *rest))


@attrs.frozen
class _Value:
    """A value the graph computes: its name in the .cdg file, and torch's example of it."""

    name: str
    meta: torch.Tensor


def _layout_text(t: torch.Tensor) -> str:
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


def _type_text(t: torch.Tensor) -> str:
    dtype = language_dtype(t.dtype)
    if dtype is None:
        raise Refused(f"the language has no dtype {t.dtype}")
    if t.dim() == 0 or 0 in t.shape:
        raise Refused(f"a tensor of shape {list(t.shape)}: the language's tensors have dims of size 1 or more")
    return f"{dtype}{ints_text(t.shape)}"


def _number(x) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise Refused(f"{x!r} is not a number the language spells")
    return number_text(x)


# ---- the import -----------------------------------------------------------------------------------------------


class _Importer:
    """One walk over an exported graph's nodes, in order: declarations, statements and refusals."""

    def __init__(self, ep: torch.export.ExportedProgram, label: str, arg_names: tuple[str, ...] = ()):
        self.ep, self.label = ep, label
        users = [s.arg.name for s in ep.graph_signature.input_specs if s.target is None]
        self.arg_names = dict(zip(users, arg_names))
        self.used: set[str] = set()
        self.env: dict[torch.fx.Node, _Source | _Value | None] = {}
        self.decls: list[tuple[str, torch.fx.Node]] = []
        self.statements: list[tuple[torch.fx.Node, str, str]] = []  # (node, name, expression)
        self.inputs: list[GraphInput] = []
        self.refusals: list[Diagnostic] = []
        self.returned: list[str] = []
        self.node: torch.fx.Node | None = None
        self.scalars = 0

    # operands, as the converters ask for them
    def tensor(self, arg, rank: int | None = None) -> str:
        """An operand's name, with unit dims in front up to `rank` (torch aligns trailing dims; the language
        broadcasts only over declared dims of size 1)."""
        v = self.env[arg]
        extra = 0 if rank is None else rank - v.meta.dim()
        if extra < 0:
            raise Refused(f"'{arg.name}' has {v.meta.dim()} dims where {rank} are wanted")
        if isinstance(v, _Source):
            if extra:
                v = v.view(aten.reshape.default, (1,) * extra + tuple(v.meta.shape))
            return self.declare(v)
        if extra:
            return f"reshape({v.name}, shape={ints_text((1,) * extra + tuple(v.meta.shape))})"
        return v.name

    def meta(self, arg) -> torch.Tensor:
        return self.env[arg].meta

    def operand(self, arg, rank: int) -> str:
        """A tensor or a number, as a pointwise op takes it."""
        if isinstance(arg, torch.fx.Node):
            return self.tensor(arg, rank)
        text = _number(arg)
        if not text.startswith("-"):
            return text
        name = ident(f"c{self.scalars}", self.used)  # a literal is never negative: `-2.0` is neg(2.0)
        self.scalars += 1
        self.decls.append((f"scalar {name} : {'float' if isinstance(arg, float) else 'int32'} = {text}", self.node))
        return name

    def declare(self, src: _Source) -> str:
        key = (src.placeholder, tuple((op, rest) for op, rest in src.views))
        for gi in self.inputs:
            if (gi.source, gi.views) == key:
                return gi.name
        name = ident(src.base, self.used)
        self.decls.append((f"input {name} : {_type_text(src.meta)}{_layout_text(src.meta)}", self.node))
        self.inputs.append(GraphInput(name, src.placeholder, key[1]))
        return name

    # the walk
    def run(self) -> None:
        specs = {s.arg.name: s for s in self.ep.graph_signature.input_specs}
        for node in self.ep.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                val = node.meta.get("val")
                base = specs[node.name].target or self.arg_names.get(node.name, node.name)
                if not isinstance(val, torch.Tensor):
                    self.env[node] = None
                    self.refusals.append(_refusal(node, self.label, f"'{base}' is not a tensor"))
                    continue
                meta = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")
                self.env[node] = _Source(node.name, base, (), meta)
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                self.outputs(node)

    def call(self, node: torch.fx.Node) -> None:
        convert = CONVERTERS.get(node.target)
        if convert is None:
            self.env[node] = None
            self.refusals.append(_refusal(node, self.label, f"the language has no op for {node.target}"))
            return
        if any(self.env.get(a, 0) is None for a in node.all_input_nodes):
            self.env[node] = None  # an input was refused: that node is the one reported
            return
        kwargs = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True).kwargs
        try:
            result = convert(self, node, **kwargs)
        except Refused as e:
            self.env[node] = None
            self.refusals.append(_refusal(node, self.label, str(e)))
            return
        if isinstance(result, (_Source, _Value)):  # a view of an input, or an op that changes nothing
            self.env[node] = result
            return
        name = ident(node.name, self.used)
        self.statements.append((node, name, result))
        self.env[node] = _Value(name, node.meta["val"])

    def outputs(self, node: torch.fx.Node) -> None:
        for arg in node.args[0]:
            v = self.env.get(arg) if isinstance(arg, torch.fx.Node) else None
            if isinstance(v, _Source):
                why = "the function returns an input (or a view of one); every output of a graph is computed"
                self.refusals.append(_refusal(arg, self.label, why))
            elif isinstance(v, _Value):
                self.returned.append(v.name)
            elif not isinstance(arg, torch.fx.Node):
                self.refusals.append(_refusal(node, self.label, f"the function returns {arg!r}, not a tensor"))

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
        for node, name, expr in self.statements:
            if name in outs:
                val = node.meta["val"]
                lines.append(f"output {name} : {_type_text(val)}{_layout_text(val)} = {expr}")
            else:
                lines.append(f"{name} = {expr}")
            nodes.append(node)
        return lines, nodes


# ---- the converters, one per aten op ---------------------------------------------------------------------------


def _unary(op: str, **fixed):
    def convert(imp: _Importer, node, input, **kw):
        for k, want in fixed.items():
            if kw.get(k, want) != want:
                raise Refused(f"{k}={kw[k]!r}: the language's {op} has {k}={want!r}")
        return f"{op}({imp.tensor(input)})"

    return convert


def _binary(op: str, infix: str | None = None):
    def convert(imp: _Importer, node, input, other=None, alpha=1, exponent=None):
        other = exponent if other is None else other
        rank = node.meta["val"].dim()
        a, b = imp.operand(input, rank), imp.operand(other, rank)
        if alpha != 1:
            b = f"{b} * {imp.operand(alpha, rank)}"
        return f"{a} {infix} {b}" if infix else f"{op}({a}, {b})"

    return convert


def _gelu(imp, node, input, approximate="none"):
    return f"{'gelu_tanh' if approximate == 'tanh' else 'gelu'}({imp.tensor(input)})"


def _clip(lower, upper) -> str:
    attrs_ = [f"lower_clip={_number(lower)}"] if lower is not None else []
    return ", ".join(attrs_ + ([f"upper_clip={_number(upper)}"] if upper is not None else []))


def _clamp(imp, node, input, min=None, max=None):
    if min is None:
        raise Refused("a clamp with no lower bound: the language's relu clips from below")
    return f"relu({imp.tensor(input)}, {_clip(min, max)})"


def _hardtanh(imp, node, input, min_val=-1.0, max_val=1.0):
    return f"relu({imp.tensor(input)}, {_clip(min_val, max_val)})"


def _leaky_relu(imp, node, input, negative_slope=0.01):
    return f"leaky_relu({imp.tensor(input)}, slope={_number(negative_slope)})"


def _where(imp, node, condition, input, other):
    rank = node.meta["val"].dim()
    return f"binary_select({imp.operand(input, rank)}, {imp.operand(other, rank)}, {imp.tensor(condition, rank)})"


def _spatial(name: str, v, default: int) -> str:
    v = list(v)
    return "" if all(x == default for x in v) else f", {name}={ints_text(v)}"


def _conv(imp, node, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if isinstance(padding, str):
        raise Refused(f"padding='{padding}': give the padding as numbers")
    rank = imp.meta(input).dim()
    expr = f"conv_fprop({imp.tensor(input)}, {imp.tensor(weight)}"
    expr += _spatial("padding", padding, 0) + _spatial("stride", stride, 1) + _spatial("dilation", dilation, 1) + ")"
    if bias is None:
        return expr
    b = imp.env[bias]
    per_channel = (1, b.meta.shape[0]) + (1,) * (rank - 2)  # torch's [K] bias, the language's [1, K, 1, 1]
    if isinstance(b, _Source):
        return f"bias({expr}, {imp.declare(b.view(aten.reshape.default, per_channel))})"
    return f"bias({expr}, reshape({b.name}, shape={ints_text(per_channel)}))"


def _matmul_operands(imp, node, a, b, b_transposed: bool) -> tuple[str, str]:
    ra, rb = imp.meta(a).dim(), imp.meta(b).dim()
    if ra < 2 or rb < 2:
        raise Refused("a matmul of a vector: the language's matmul takes matrices [..., M, K] @ [..., K, N]")
    rank = max(ra, rb)
    if b_transposed:
        v = imp.env[b]
        if not isinstance(v, _Source):
            return imp.tensor(a, rank), f"transpose({imp.tensor(b, rank)}, perm={ints_text(_swap_last(rank))})"
        v = v.view(aten.transpose.int, -1, -2)
        v = v.view(aten.reshape.default, (1,) * (rank - rb) + tuple(v.meta.shape)) if rank > rb else v
        return imp.tensor(a, rank), imp.declare(v)
    return imp.tensor(a, rank), imp.tensor(b, rank)


def _swap_last(rank: int) -> tuple[int, ...]:
    return tuple(range(rank - 2)) + (rank - 1, rank - 2)


def _matmul(imp, node, input=None, other=None, mat2=None, **_):
    a, b = _matmul_operands(imp, node, input, other if other is not None else mat2, b_transposed=False)
    return f"matmul({a}, {b})"


def _linear(imp, node, input, weight, bias=None):
    a, b = _matmul_operands(imp, node, input, weight, b_transposed=True)
    expr = f"matmul({a}, {b})"
    return expr if bias is None else f"{expr} + {imp.tensor(bias, node.meta['val'].dim())}"


def _norm_param(imp, arg, shape: tuple[int, ...], what: str) -> str:
    if arg is None:
        raise Refused(f"no {what}: the language's norms take one (an affine norm, or give ones)")
    return imp.tensor(arg, len(shape))


def _layer_norm(imp, node, input, normalized_shape, weight=None, bias=None, eps=1e-5, **_):
    rank = imp.meta(input).dim()
    shape = (1,) * (rank - len(normalized_shape)) + tuple(normalized_shape)
    x = imp.tensor(input)  # declared first, as the function takes it
    scale, shift = _norm_param(imp, weight, shape, "weight"), _norm_param(imp, bias, shape, "bias")
    return f"layernorm({x}, {scale}, {shift}, epsilon={_number(eps)})"


def _rms_norm(imp, node, input, normalized_shape, weight=None, eps=None):
    rank = imp.meta(input).dim()
    shape = (1,) * (rank - len(normalized_shape)) + tuple(normalized_shape)
    eps = torch.finfo(imp.meta(input).dtype).eps if eps is None else eps  # torch's default
    x = imp.tensor(input)
    return f"rmsnorm({x}, {_norm_param(imp, weight, shape, 'weight')}, epsilon={_number(eps)})"


def _batch_norm(imp, node, input, weight, bias, running_mean, running_var, training, momentum, eps, **_):
    if training:
        raise Refused(
            "batch norm in training mode (it updates the module's running statistics in place): "
            "export the module in eval mode, or write the language's batchnorm by hand"
        )
    rank = imp.meta(input).dim()
    per_channel = {}
    for what, arg in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        if arg is None:
            raise Refused(f"no {what}: the language's batchnorm_inference takes one")
        v = imp.env[arg]
        if not isinstance(v, _Source):
            raise Refused(f"{what} is computed: the importer reads per-channel statistics as inputs")
        per_channel[what] = imp.declare(v.view(aten.reshape.default, (1, -1) + (1,) * (rank - 2)))
    inv = f"rsqrt({per_channel['running_var']} + {_number(eps)})"
    return (
        f"batchnorm_inference({imp.tensor(input)}, {per_channel['running_mean']}, {inv}, "
        f"{per_channel['weight']}, {per_channel['bias']})"
    )


def _sdpa(imp, node, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_):
    if dropout_p:
        raise Refused("dropout in attention: the language's dropout is cuDNN's seeded mask")
    for arg in (query, key, value):
        if imp.meta(arg).dim() != 4:
            raise Refused("attention of tensors that are not [B, H, S, D]")
    args = [imp.tensor(query), imp.tensor(key), imp.tensor(value)]
    if attn_mask is not None:
        if imp.meta(attn_mask).dtype == torch.bool:
            raise Refused("a boolean attention mask: give padding as seq_len_q/seq_len_kv, or a float mask as a bias")
        args.append(f"bias={imp.tensor(attn_mask, 4)}")
    if is_causal:
        args.append("causal=true")
    if scale is not None:
        args.append(f"scale={_number(scale)}")
    return f"sdpa({', '.join(args)})"


def _reduction(mode: str):
    def convert(imp, node, input, dim=None, keepdim=False, dtype=None, **_):
        rank = imp.meta(input).dim()
        axes = sorted(d % rank for d in (dim if dim else range(rank)))
        expr = f"reduction({imp.tensor(input)}, mode={mode}, axes={ints_text(axes)})"
        if keepdim:
            return expr
        out = tuple(node.meta["val"].shape)
        if not out:
            raise Refused("a reduction to a 0-dim tensor: keep the reduced dims (keepdim=True)")
        return f"reshape({expr}, shape={ints_text(out)})"

    return convert


def _view(op, *names):
    """A view op: of an input, it is part of the input's declaration; of a computed value, a layout op."""

    def convert(imp, node, input, **kw):
        v = imp.env[input]
        if isinstance(v, _Source):
            return v.view(op, *(kw[n] for n in names))
        return _layout_op(node, v.name, kw)

    return convert


def _layout_op(node, name: str, kw) -> str:
    out = node.meta["val"]
    if node.target is aten.permute.default:
        return f"transpose({name}, perm={ints_text(d % out.dim() for d in kw['dims'])})"
    if node.target in (aten.transpose.int, aten.t.default):
        perm = list(range(out.dim()))
        d0, d1 = (kw["dim0"] % out.dim(), kw["dim1"] % out.dim()) if "dim0" in kw else (0, 1)
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return f"transpose({name}, perm={ints_text(perm)})"
    return f"reshape({name}, shape={ints_text(out.shape)})"


def _same(imp, node, input, **kw):
    """An op that changes no value the graph computes (an eval-mode dropout, a copy)."""
    if kw.get("train"):
        raise Refused("dropout in training mode")
    return imp.env[input]


def _slice(imp, node, input, dim=0, start=None, end=None, step=1):
    if step != 1:
        raise Refused(f"a slice with step {step}")
    shape = list(imp.meta(input).shape)
    d = dim % len(shape)
    lo, hi = slice(start, end).indices(shape[d])[:2]
    starts, ends = [0] * len(shape), list(shape)
    starts[d], ends[d] = lo, hi
    return f"slice({imp.tensor(input)}, start={ints_text(starts)}, end={ints_text(ends)})"


def _cat(imp, node, tensors, dim=0):
    rank = node.meta["val"].dim()
    return f"concatenate({', '.join(imp.tensor(t) for t in tensors)}, axis={dim % rank})"


_POINTWISE = {
    aten.relu.default: _unary("relu"),
    aten.sigmoid.default: _unary("sigmoid"),
    aten.tanh.default: _unary("tanh"),
    aten.exp.default: _unary("exp"),
    aten.log.default: _unary("log"),
    aten.sqrt.default: _unary("sqrt"),
    aten.rsqrt.default: _unary("rsqrt"),
    aten.abs.default: _unary("abs"),
    aten.neg.default: _unary("neg"),
    aten.reciprocal.default: _unary("reciprocal"),
    aten.erf.default: _unary("erf"),
    aten.sin.default: _unary("sin"),
    aten.cos.default: _unary("cos"),
    aten.tan.default: _unary("tan"),
    aten.floor.default: _unary("floor"),
    aten.ceil.default: _unary("ceil"),
    aten.silu.default: _unary("swish"),
    aten.elu.default: _unary("elu", alpha=1, scale=1, input_scale=1),
    aten.softplus.default: _unary("softplus", beta=1),
    aten.gelu.default: _gelu,
    aten.leaky_relu.default: _leaky_relu,
    aten.hardtanh.default: _hardtanh,
    aten.clamp.default: _clamp,
    aten.add.Tensor: _binary("add", "+"),
    aten.sub.Tensor: _binary("sub", "-"),
    aten.mul.Tensor: _binary("mul", "*"),
    aten.div.Tensor: _binary("div", "/"),
    aten.maximum.default: _binary("max"),
    aten.minimum.default: _binary("min"),
    aten.pow.Tensor_Tensor: _binary("pow"),
    aten.pow.Tensor_Scalar: _binary("pow"),
    aten.fmod.Tensor: _binary("mod"),
    aten.where.self: _where,
}
_COMPARISONS = {"eq": "cmp_eq", "ne": "cmp_neq", "gt": "cmp_gt", "ge": "cmp_ge", "lt": "cmp_lt", "le": "cmp_le"}
_POINTWISE |= {getattr(aten, t).Tensor: _binary(op) for t, op in _COMPARISONS.items()}
_POINTWISE |= {getattr(aten, t).Scalar: _binary(op) for t, op in _COMPARISONS.items()}

#: aten op -> its converter: (importer, node, the op's arguments by name) -> a .cdg expression, or the value
#: itself (a view of an input, an op that changes nothing); Refused says why the node has no spelling
CONVERTERS = {
    **_POINTWISE,
    aten.conv1d.default: _conv,
    aten.conv2d.default: _conv,
    aten.conv3d.default: _conv,
    aten.linear.default: _linear,
    aten.matmul.default: _matmul,
    aten.mm.default: _matmul,
    aten.bmm.default: _matmul,
    aten.layer_norm.default: _layer_norm,
    aten.rms_norm.default: _rms_norm,
    aten.batch_norm.default: _batch_norm,
    aten.scaled_dot_product_attention.default: _sdpa,
    aten.sum.dim_IntList: _reduction("sum"),
    aten.mean.dim: _reduction("avg"),
    aten.amax.default: _reduction("max"),
    aten.amin.default: _reduction("min"),
    aten.permute.default: _view(aten.permute.default, "dims"),
    aten.transpose.int: _view(aten.transpose.int, "dim0", "dim1"),
    aten.t.default: _view(aten.t.default),
    aten.view.default: _view(aten.reshape.default, "size"),
    aten.reshape.default: _view(aten.reshape.default, "shape"),
    aten.unsqueeze.default: _view(aten.unsqueeze.default, "dim"),
    aten.squeeze.dim: _view(aten.squeeze.dim, "dim"),
    aten.flatten.using_ints: _view(aten.flatten.using_ints, "start_dim", "end_dim"),
    aten.slice.Tensor: _slice,
    aten.cat.default: _cat,
    aten.dropout.default: _same,
    aten.contiguous.default: _same,
    aten.clone.default: _same,
    aten.detach.default: _same,
    aten.alias.default: _same,
}


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
    label = f"<{what}>"
    imp = _Importer(ep, label, _parameters(fn))
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


def load_callable(spec: str):
    """`path/to/module.py:NAME` -> the object NAME of that file, imported as Python imports it: the user's own
    code runs, as pytest runs a test file. A class is instantiated with no arguments."""
    path, sep, attr = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not attr.isidentifier():
        raise ValueError(f"--from-torch takes FILE.py:NAME, got '{spec}'")
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    module_name = os.path.splitext(os.path.basename(path))[0]
    loader = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # the file's own imports of its neighbours
    try:
        loader.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    obj = getattr(module, attr, None)
    if obj is None:
        raise ValueError(f"{path} has no '{attr}'")
    return obj() if isinstance(obj, type) else obj


def example_tensor(text: str, seed: int = 0) -> torch.Tensor:
    """`float[2, 4, 8, 8] nhwc` (a .cdg tensor type and an optional layout name) -> a tensor of that dtype,
    shape and memory order, drawn from a seeded normal distribution (integers: 0 to 9; bool: coin flips)."""
    from dsl.types import canonical_dtype

    m = re.fullmatch(r"\s*(\w+)\s*\[([\d,\s]+)\]\s*(\w+)?\s*", text)
    dtype = canonical_dtype(m.group(1)) if m else None
    layout = (m.group(3) or "row_major") if m else None
    if dtype is None or layout not in LAYOUTS:
        raise ValueError(f"--example takes DTYPE[DIMS] [LAYOUT] (as a .cdg input declares it), got '{text}'")
    shape = tuple(int(d) for d in m.group(2).split(",") if d.strip())
    try:
        strides = dense_strides(shape, layout_order(layout, len(shape)))
    except RuleError as e:
        raise ValueError(f"--example '{text}': {e}") from None
    g = torch.Generator().manual_seed(seed)
    t = torch.empty_strided(shape, strides, dtype=torch_dtype(dtype))
    if t.is_floating_point():
        return t.copy_(torch.randn(shape, generator=g))
    return t.copy_(torch.randint(0, 2 if dtype == "bool" else 10, shape, generator=g))
