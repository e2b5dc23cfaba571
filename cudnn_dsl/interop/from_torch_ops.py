"""The aten ops from_torch spells in the language: the values a converter reads and makes, and one converter
per op of a functionalized torch.export graph (CONVERTERS)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from cudnn_dsl.interop.fe_graph import ints_text, number_text

aten = torch.ops.aten


class Refused(Exception):
    """Why one node has no spelling in the language."""


@attrs.define
class Source:
    """A placeholder through view ops: an input of the graph once an op reads it."""

    placeholder: str
    base: str
    """the name it is declared under"""
    views: tuple
    meta: torch.Tensor
    """a meta tensor of the view's dims, strides and dtype"""

    def view(self, op, *rest) -> Source:
        return Source(self.placeholder, self.base, self.views + ((op, rest),), op(self.meta, *rest))


@attrs.frozen
class Value:
    """A value the graph computes: its name in the .cdg file, and torch's example of it (the language's dims)."""

    name: str
    meta: torch.Tensor


@attrs.frozen
class Stmt:
    """A statement whose name or dtype is not all the node gives."""

    expr: str
    name: str | None = None
    """its name, where the node's is not the one to give it"""
    layout_of: Source | Value | None = None
    """for a layout op's result, the value it rearranges: the language gives it that value's dtype"""


@attrs.frozen
class Items:
    """An op of several results (split, unbind, a BatchNorm's output and statistics): getitem takes one."""

    name: str
    """what the statements of its results are named after"""
    items: tuple[Callable[[], str | Stmt | Source | Value], ...]
    """each result's converter; it raises Refused for a result the language does not compute"""


@attrs.frozen
class Fold:
    """An eval BatchNorm's per-channel scale or shift (the form cuDNN fuses into a convolution's epilogue),
    computed from the module's statistics and affine each time the graph's inputs are bound."""

    part: str
    """'scale' (weight / sqrt(running_var + eps)) or 'shift' (bias - running_mean * scale)"""
    mean: str
    var: str
    weight: str | None
    bias: str | None
    """the export placeholders they are read from (no weight or bias: ones and zeros)"""
    eps: float
    dtype: torch.dtype
    """at least float32: torch's own BatchNorm kernels keep a half block's statistics in float"""
    shape: tuple[int, ...]
    """[1, C, 1, ...], as the language broadcasts a per-channel tensor"""

    def __call__(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        scale = torch.rsqrt(values[self.var].to(self.dtype) + self.eps)
        if self.weight is not None:
            scale = scale * values[self.weight].to(self.dtype)
        if self.part == "scale":
            return scale.reshape(self.shape)
        shift = -values[self.mean].to(self.dtype) * scale
        shift = shift if self.bias is None else shift + values[self.bias].to(self.dtype)
        return shift.reshape(self.shape)


def number(x) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise Refused(f"{x!r} is not a number the language spells")
    return number_text(x)


# ---- pointwise ---------------------------------------------------------------------------------------------------


def _unary(op: str, **fixed):
    def convert(imp, node, input, **kw):
        for k, want in fixed.items():
            if kw.get(k, want) != want:
                raise Refused(f"{k}={kw[k]!r}: the language's {op} has {k}={want!r}")
        return f"{op}({imp.tensor(input)})"

    return convert


def _binary(op: str, infix: str | None = None):
    def convert(imp, node, input, other=None, alpha=1, exponent=None):
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
    clips = [f"lower_clip={number(lower)}"] if lower is not None else []
    return ", ".join(clips + ([f"upper_clip={number(upper)}"] if upper is not None else []))


def _clamp(imp, node, input, min=None, max=None):
    if min is None:
        raise Refused("a clamp with no lower bound: the language's relu clips from below")
    return f"relu({imp.tensor(input)}, {_clip(min, max)})"


def _hardtanh(imp, node, input, min_val=-1.0, max_val=1.0):
    return f"relu({imp.tensor(input)}, {_clip(min_val, max_val)})"


def _leaky_relu(imp, node, input, negative_slope=0.01):
    return f"leaky_relu({imp.tensor(input)}, slope={number(negative_slope)})"


def _where(imp, node, condition, input, other):
    rank = node.meta["val"].dim()
    return f"binary_select({imp.operand(input, rank)}, {imp.operand(other, rank)}, {imp.tensor(condition, rank)})"


def _softmax(imp, node, **_):
    raise Refused(
        "the language has no softmax: attention is sdpa (nn.MultiheadAttention computes softmax(q kᵀ) v by hand "
        "where it returns its weights: call it with need_weights=False, and it calls scaled_dot_product_attention)"
    )


# ---- convolution, matmul, attention ---------------------------------------------------------------------------------


def _spatial(name: str, v, default: int) -> str:
    v = list(v)
    return "" if all(x == default for x in v) else f", {name}={ints_text(v)}"


def _conv(imp, node, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if isinstance(padding, str):
        raise Refused(f"padding='{padding}': give the padding as numbers")
    rank = imp.meta(input).dim()
    expr = f"conv_fprop({imp.tensor(input, typed=True)}, {imp.tensor(weight, typed=True)}"
    expr += _spatial("padding", padding, 0) + _spatial("stride", stride, 1) + _spatial("dilation", dilation, 1) + ")"
    if bias is None:
        return expr
    b = imp.env[bias]
    per_channel = (1, b.meta.shape[0]) + (1,) * (rank - 2)  # torch's [K] bias, the language's [1, K, 1, 1]
    if isinstance(b, Source):
        return f"bias({expr}, {imp.declare(b.view(aten.reshape.default, per_channel))})"
    return f"bias({expr}, reshape({b.name}, shape={ints_text(per_channel)}))"


def _matmul_operands(imp, node, a, b, b_transposed: bool) -> tuple[str, str]:
    ra, rb = imp.meta(a).dim(), imp.meta(b).dim()
    if ra < 2 or rb < 2:
        raise Refused("a matmul of a vector: the language's matmul takes matrices [..., M, K] @ [..., K, N]")
    rank = max(ra, rb)
    if b_transposed:
        v = imp.env[b]
        if not isinstance(v, Source):
            b = imp.tensor(b, rank, typed=True)
            return imp.tensor(a, rank, typed=True), f"transpose({b}, perm={ints_text(_swap_last(rank))})"
        v = v.view(aten.transpose.int, -1, -2)
        v = v.view(aten.reshape.default, (1,) * (rank - rb) + tuple(v.meta.shape)) if rank > rb else v
        return imp.tensor(a, rank, typed=True), imp.declare(v)
    return imp.tensor(a, rank, typed=True), imp.tensor(b, rank, typed=True)


def _swap_last(rank: int) -> tuple[int, ...]:
    return tuple(range(rank - 2)) + (rank - 1, rank - 2)


def _matmul(imp, node, input=None, other=None, mat2=None, **_):
    a, b = _matmul_operands(imp, node, input, other if other is not None else mat2, b_transposed=False)
    return f"matmul({a}, {b})"


def _linear(imp, node, input, weight, bias=None):
    a, b = _matmul_operands(imp, node, input, weight, b_transposed=True)
    expr = f"matmul({a}, {b})"
    return expr if bias is None else f"{expr} + {imp.tensor(bias, node.meta['val'].dim())}"


def _addmm(imp, node, input, mat1, mat2, beta=1, alpha=1):
    """torch.addmm(bias, x, w): a Linear of an [in, out] weight, as HF transformers' Conv1D calls it."""
    if beta != 1 or alpha != 1:
        raise Refused(f"addmm scaling its terms (beta={beta}, alpha={alpha})")
    a, b = _matmul_operands(imp, node, mat1, mat2, b_transposed=False)
    return f"matmul({a}, {b}) + {imp.tensor(input, 2)}"


def _sdpa(imp, node, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_):
    if dropout_p:
        raise Refused("dropout in attention: the language's dropout is cuDNN's seeded mask")
    for arg in (query, key, value):
        if imp.meta(arg).dim() != 4:
            raise Refused("attention of tensors that are not [B, H, S, D]")
    args = [imp.tensor(query, typed=True), imp.tensor(key, typed=True), imp.tensor(value, typed=True)]
    if attn_mask is not None:
        if imp.meta(attn_mask).dtype == torch.bool:
            raise Refused("a boolean attention mask: give padding as seq_len_q/seq_len_kv, or a float mask as a bias")
        if is_causal:  # torch refuses the two together too
            raise Refused("an attention mask with is_causal=True")
        args.append(f"bias={imp.tensor(attn_mask, 4)}")
    if is_causal:
        args.append("causal=true")
    if scale is not None:
        args.append(f"scale={number(scale)}")
    return f"sdpa({', '.join(args)})"


# ---- norms -------------------------------------------------------------------------------------------------------


def _norm_param(imp, arg, shape: tuple[int, ...], what: str) -> str:
    if arg is None:
        raise Refused(f"no {what}: the language's norms take one (an affine norm, or give ones)")
    return imp.tensor(arg, len(shape))


def _layer_norm(imp, node, input, normalized_shape, weight=None, bias=None, eps=1e-5, **_):
    rank = imp.meta(input).dim()
    shape = (1,) * (rank - len(normalized_shape)) + tuple(normalized_shape)
    x = imp.tensor(input, typed=True)  # declared first, as the function takes it
    scale, shift = _norm_param(imp, weight, shape, "weight"), _norm_param(imp, bias, shape, "bias")
    return f"layernorm({x}, {scale}, {shift}, epsilon={number(eps)})"


def _rms_norm(imp, node, input, normalized_shape, weight=None, eps=None):
    rank = imp.meta(input).dim()
    shape = (1,) * (rank - len(normalized_shape)) + tuple(normalized_shape)
    eps = torch.finfo(imp.meta(input).dtype).eps if eps is None else eps  # torch's default
    x = imp.tensor(input, typed=True)
    return f"rmsnorm({x}, {_norm_param(imp, weight, shape, 'weight')}, epsilon={number(eps)})"


def _statistics(imp, **args) -> dict[str, Source | None]:
    """A BatchNorm's weight, bias and running statistics, each a placeholder read as it is (or None)."""
    out = {}
    for what, arg in args.items():
        v = imp.env[arg] if arg is not None else None
        if v is not None and not (isinstance(v, Source) and not v.views):
            raise Refused(f"its {what} is computed: the importer reads a BatchNorm's statistics and affine as inputs")
        out[what] = v
    return out


def _stem(mean: Source) -> str:
    """What a BatchNorm's values are named after: its module ('bn1' of 'bn1.running_mean')."""
    return mean.base.rpartition(".")[0] or "batch_norm"


def _batch_norm(imp, node, input, weight, bias, running_mean, running_var, momentum, eps):
    """An eval BatchNorm as `x * scale + shift`, its scale and shift folded from the statistics and affine (the
    graph's inputs, computed by `bind`): the form cuDNN fuses into a convolution's epilogue, where it declines
    its batchnorm_inference node."""
    read = _statistics(imp, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var)
    mean, var = read["running_mean"], read["running_var"]
    if mean is None or var is None:
        raise Refused("a BatchNorm without running statistics in eval mode")
    x = imp.tensor(input)
    stem = _stem(mean)
    per_channel = (1, mean.meta.shape[0]) + (1,) * (imp.meta(input).dim() - 2)
    dtype = torch.promote_types(mean.meta.dtype, torch.float32)
    w, b = (p and p.placeholder for p in (read["weight"], read["bias"]))
    folded = {
        part: imp.fold(f"{stem}_{part}", Fold(part, mean.placeholder, var.placeholder, w, b, eps, dtype, per_channel))
        for part in ("scale", "shift")
    }
    expr = f"{x} * {folded['scale']} + {folded['shift']}"

    def statistic():
        raise Refused("the batch statistics of an eval BatchNorm (it saves none)")

    return Items(stem, (lambda: Stmt(expr, stem), statistic, statistic))


def _batch_norm_training(imp, node, input, weight, bias, running_mean, running_var, training, momentum, eps):
    """A training BatchNorm as the language's batchnorm: its output, the saved statistics, and the next running
    statistics (the module's buffers, which the graph writes in place)."""
    read = _statistics(imp, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var)
    if read["weight"] is None or read["bias"] is None:
        raise Refused("a BatchNorm without weight and bias: the language's batchnorm takes both (affine=True)")
    channels, rank = read["running_mean"].meta.shape[0], imp.meta(input).dim()
    per_channel = (1, channels) + (1,) * (rank - 2)
    # aten.view, not reshape: the running statistics are written in place, through the bound view
    w, b, rm, rv = (imp.declare(read[k].view(aten.view.default, per_channel)) for k in read)
    stem = _stem(read["running_mean"])
    names = imp.emit(
        (stem, f"{stem}_mean", f"{stem}_inv_variance", f"{stem}_next_mean", f"{stem}_next_var"),
        f"batchnorm({imp.tensor(input, typed=True)}, {w}, {b}, {rm}, {rv}, epsilon={number(eps)}, "
        f"momentum={number(momentum)})",
    )
    stat = torch.empty(per_channel, dtype=torch.float32, device="meta")
    metas = (node.meta["val"][0],) + (stat,) * 4
    return Items(stem, tuple((lambda v=Value(n, m): v) for n, m in zip(names, metas)))


# ---- reductions, views, layout ops ---------------------------------------------------------------------------------


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
        if isinstance(v, Source):
            return v.view(op, *(kw[n] for n in names))
        return Stmt(_layout_op(node, v.name, kw), layout_of=v)

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


def _sliced(imp, input, dim: int, lo: int, hi: int, shape=None) -> Stmt:
    """`input[..., lo:hi, ...]` along dim, reshaped to `shape` where given (a select drops the dim)."""
    dims = list(imp.meta(input).shape)
    starts, ends = [0] * len(dims), list(dims)
    starts[dim], ends[dim] = lo, hi
    expr = f"slice({imp.tensor(input)}, start={ints_text(starts)}, end={ints_text(ends)})"
    if shape is not None:
        expr = f"reshape({expr}, shape={ints_text(shape)})"
    return Stmt(expr, layout_of=imp.env[input])


def _slice(imp, node, input, dim=0, start=None, end=None, step=1):
    if step != 1:
        raise Refused(f"a slice with step {step}")
    d = dim % imp.meta(input).dim()
    lo, hi = slice(start, end).indices(imp.meta(input).shape[d])[:2]
    return _sliced(imp, input, d, lo, hi)


def _select(imp, node, input, dim, index):
    d = dim % imp.meta(input).dim()
    i = index % imp.meta(input).shape[d]
    if node.meta["val"].dim() == 0:
        raise Refused("a select of a single element: the language's tensors have dims of size 1 or more")
    return _sliced(imp, input, d, i, i + 1, tuple(node.meta["val"].shape))


def _split(imp, node, input, split_size=None, split_sizes=None, dim=0):
    """split (chunk's too) and split_with_sizes: a slice per part, made for the parts that are read."""
    d = dim % imp.meta(input).dim()
    n = imp.meta(input).shape[d]
    sizes = split_sizes if split_sizes is not None else [min(split_size, n - s) for s in range(0, n, split_size)]
    bounds = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
    parts = (lambda lo=lo, hi=hi: _sliced(imp, input, d, lo, hi) for lo, hi in zip(bounds, bounds[1:]))
    return Items(node.name, tuple(parts))


def _unbind(imp, node, input, dim=0):
    d = dim % imp.meta(input).dim()
    shape = tuple(s for k, s in enumerate(imp.meta(input).shape) if k != d)
    if not shape:
        raise Refused("an unbind into single elements: the language's tensors have dims of size 1 or more")
    parts = (lambda i=i: _sliced(imp, input, d, i, i + 1, shape) for i in range(imp.meta(input).shape[d]))
    return Items(node.name, tuple(parts))


def _cat(imp, node, tensors, dim=0):
    rank = node.meta["val"].dim()
    return f"concatenate({', '.join(imp.tensor(t) for t in tensors)}, axis={dim % rank})"


#: the unary ops aten and the language name alike
_SAME_NAME = ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs", "neg", "reciprocal", "erf", "sin")
_SAME_NAME += ("cos", "tan", "floor", "ceil")
_POINTWISE = {
    **{getattr(aten, op).default: _unary(op) for op in _SAME_NAME},
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

#: aten op of a functionalized graph (an in-place op is its pure op there) -> its converter: (importer, node, the
#: op's arguments by name) -> a .cdg expression, a Stmt, Items of several results, or the value itself (a view of
#: an input, an op that changes nothing); Refused says why the node has no spelling
CONVERTERS = {
    **_POINTWISE,
    aten.conv1d.default: _conv,
    aten.conv2d.default: _conv,
    aten.conv3d.default: _conv,
    aten.linear.default: _linear,
    aten.matmul.default: _matmul,
    aten.mm.default: _matmul,
    aten.addmm.default: _addmm,
    aten.bmm.default: _matmul,
    aten.layer_norm.default: _layer_norm,
    aten.rms_norm.default: _rms_norm,
    aten._native_batch_norm_legit_no_training.default: _batch_norm,
    aten._native_batch_norm_legit_functional.default: _batch_norm_training,
    aten.scaled_dot_product_attention.default: _sdpa,
    aten.softmax.int: _softmax,
    aten._softmax.default: _softmax,
    aten.sum.dim_IntList: _reduction("sum"),
    aten.mean.dim: _reduction("avg"),
    aten.amax.default: _reduction("max"),
    aten.amin.default: _reduction("min"),
    aten.permute.default: _view(aten.permute.default, "dims"),
    aten.transpose.int: _view(aten.transpose.int, "dim0", "dim1"),
    aten.t.default: _view(aten.t.default),
    aten.view.default: _view(aten.view.default, "size"),
    aten.reshape.default: _view(aten.reshape.default, "shape"),
    aten.unsqueeze.default: _view(aten.unsqueeze.default, "dim"),
    aten.squeeze.dim: _view(aten.squeeze.dim, "dim"),
    aten.squeeze.dims: _view(aten.squeeze.dims, "dim"),
    aten.flatten.using_ints: _view(aten.flatten.using_ints, "start_dim", "end_dim"),
    aten.unflatten.int: _view(aten.unflatten.int, "dim", "sizes"),
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.unbind.int: _unbind,
    aten.cat.default: _cat,
    aten.dropout.default: _same,
    aten.contiguous.default: _same,
    aten.clone.default: _same,
    aten.detach.default: _same,
    aten.alias.default: _same,
}
