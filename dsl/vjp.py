"""Semantic layer: the vector-Jacobian product of every registry op, in terms of registry ops.

`VJPS[op](e, n)` returns, per input of the node, the name of that input's gradient in the backward
graph (None: no gradient flows there). `n.dy` is the gradient of the node's first result; `e` emits
ops of the backward graph (dsl.autodiff.Emit) and reads forward values: `e.fwd(name)` (an
intermediate is saved by the forward), `e.fwd_t(name)` (its last two axes swapped: a declared view
of the same memory, no transpose op), `e.stats(n, k)`: a norm's first k statistics (the forward computes them
in training phase and saves them). A gradient of a broadcast input is summed back to its shape
by the caller. An op that has no VJP is in NO_VJP with the reason; every registry op is in exactly
one of the two (a test proves it). Where cuDNN 9.19 runs the frontend's backward op (relu_backward and
the other pointwise modes, layernorm_backward and rmsnorm_backward per sample over [N, C, H, W],
batchnorm_backward, instancenorm_backward, sdpa_backward) the rule emits it; elsewhere (a form with no
engine, a gradient of the fused op left unread) it falls back to a chain of registry ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from dsl.diagnostics import RuleError
from dsl.ir import Node
from dsl.ops import OPS, norm_axes
from dsl.types import TensorType


@attrs.frozen
class At:
    """What a rule sees of one forward node."""

    node: Node
    index: int
    """the node's place in the forward graph"""
    attrs: dict
    ins: tuple[TensorType | None, ...]
    outs: tuple[TensorType, ...]
    need: tuple[bool, ...]
    """per input: whether its gradient is wanted"""
    dys: tuple[str | None, ...]
    """per result: its gradient in the backward graph, None where none flows"""

    @property
    def inputs(self) -> tuple[str | None, ...]:
        return self.node.inputs

    @property
    def out(self) -> str:
        return self.node.outputs[0]

    @property
    def dy(self) -> str:
        if self.dys[0] is None or any(d is not None for d in self.dys[1:]):
            raise RuleError(f"{self.node.op}: only the gradient of its first result is derived")
        return self.dys[0]


Rule = Callable[..., tuple[str | None, ...]]


def _unary(deriv: Callable) -> Rule:
    """dx = dy * f'(x), f' from deriv(e, n)."""
    return lambda e, n: (e.call("mul", n.dy, deriv(e, n)),)


def _binary(da: Callable | None, db: Callable | None) -> Rule:
    """Each gradient computed only where wanted."""

    def rule(e, n):
        return tuple(f(e, n) if f is not None and want else None for f, want in zip((da, db), n.need))

    return rule


def _stop(e, n):
    """A bool or integer result: no gradient flows through it."""
    return (None,) * len(n.inputs)


def _x(e, n):
    return e.fwd(n.inputs[0])


def _y(e, n):
    return e.fwd(n.out)


def _relu(e, n):
    """relu_backward. With a slope >= 0 the result is above lower_clip (below upper_clip) exactly where x is:
    the mode reads the result, which the forward writes anyway, rather than a saved input."""
    x = _y(e, n) if n.attrs["negative_slope"] >= 0 else _x(e, n)
    return (e.call("relu_backward", n.dy, x, **n.attrs),)


def _backward_mode(op: str) -> Rule:
    """The frontend's backward mode of a pointwise op: dy * f'(x) in one op, read at the op's input."""
    return lambda e, n: (e.call(f"{op}_backward", n.dy, _x(e, n), **n.attrs),)


def _conv_fprop(e, n):
    x, w = n.ins
    if x.shape[1] != w.shape[1]:
        raise RuleError(
            f"conv_fprop: a grouped convolution ({x.shape[1] // w.shape[1]} groups) has no derived backward"
        )
    pad, stride, dil = n.attrs["padding"], n.attrs["stride"], n.attrs["dilation"]
    dx = dw = None
    if n.need[0]:
        size = [
            (o - 1) * s - 2 * p + d * (r - 1) + 1
            for o, r, p, s, d in zip(n.outs[0].shape[2:], w.shape[2:], pad, stride, dil)
        ]
        extra = [h - s for h, s in zip(x.shape[2:], size)]
        dy = e.cast(n.dy, w.dtype)
        dx = e.call(
            "conv_dgrad", dy, e.fwd(n.inputs[1]), padding=pad, stride=stride, dilation=dil, output_padding=extra
        )
    if n.need[1]:
        dy = e.cast(n.dy, x.dtype)
        dw = e.call("conv_wgrad", e.fwd(n.inputs[0]), dy, padding=pad, stride=stride, dilation=dil, filter=w.shape[2:])
    return dx, dw


def _matmul(e, n):
    """dA = dC B^T, dB = A^T dC; the transposes are views of the saved operands."""
    a, b = n.ins
    da = e.call("matmul", e.cast(n.dy, b.dtype), e.fwd_t(n.inputs[1])) if n.need[0] else None
    db = e.call("matmul", e.fwd_t(n.inputs[0]), e.cast(n.dy, a.dtype)) if n.need[1] else None
    return da, db


def _reduction(e, n):
    mode, x = n.attrs["mode"], n.ins[0]
    if mode == "sum":
        return (e.expand(n.dy, n.inputs[0]),)
    if mode == "avg":
        count = math.prod(x.shape[a] for a in n.attrs["axes"])
        return (e.expand(e.call("mul", n.dy, 1 / count), n.inputs[0]),)
    if mode in ("max", "min"):
        return (e.call("mul", n.dy, e.call("cmp_eq", _x(e, n), _y(e, n))),)
    if mode == "amax":
        xs = _x(e, n)
        g = e.call("mul", n.dy, e.call("cmp_eq", e.call("abs", xs), _y(e, n)))
        return (e.call("binary_select", g, e.call("neg", g), e.call("cmp_ge", xs, 0.0)),)
    raise RuleError(f"reduction: mode={mode} has no derived backward (sum, avg, max, min and amax have)")


def _transpose(e, n):
    perm = n.attrs["perm"]
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return (e.call("transpose", n.dy, perm=inverse),)


def _layer_fits(x, scale, axes) -> bool:
    """layernorm_backward and rmsnorm_backward run on cuDNN 9.19 over [N, C, H, W] normalized per sample
    (statistics [N, 1, 1, 1]); over tokens ([B, S, D], statistics [B, S, 1]) no engine takes them."""
    return len(x.shape) == 4 and 0 not in axes and all(i in axes or x.shape[i] == 1 for i in (1, 2, 3))


def _norm(
    centered: bool,
    over: Callable = lambda x, scale: norm_axes(x.shape, scale.shape),
    dedicated: str | None = None,
    fits: Callable = lambda x, scale, axes: len(x.shape) == 4,
) -> Rule:
    """A norm (centered: layer, instance, batch; else RMS) from its statistics (the forward computes them
    in training phase). The frontend's `dedicated` backward op where it fits (`fits`: the forms cuDNN 9.19
    runs) and every gradient it returns is wanted (an unread result of a fused op is not left dangling);
    else the chain: xhat = (x - mean) * inv_variance, g = dy * scale, and over the normalized axes
    (`over`, N elements) dx = inv_variance * (g - sum(g) / N - xhat * sum(g * xhat) / N); dscale =
    dy * xhat, dbias = dy, summed over the axes scale broadcasts on."""

    def rule(e, n):
        x, scale = n.ins[0], n.ins[1]
        axes = over(x, scale)
        stats = e.stats(n, 2 if centered else 1)
        bias = len(n.inputs) > 2 and n.inputs[2] is not None
        if dedicated and fits(x, scale, axes) and all(n.need[: 3 if bias else 2]) and (bias or not centered):
            given = {"dbias": bias} if dedicated == "rmsnorm_backward" else {}
            dy = e.cast(n.dy, x.dtype)
            grads = e.call(dedicated, dy, e.fwd(n.inputs[0]), e.fwd(n.inputs[1]), *stats, **given)
            return (*grads, *(None,) * (len(n.inputs) - len(grads)))
        count = math.prod(x.shape[a] for a in axes)
        xs = e.fwd(n.inputs[0])
        xhat = e.call("mul", e.call("sub", xs, stats[0]) if centered else xs, stats[-1])
        dx = None
        if n.need[0]:
            g = e.call("mul", n.dy, e.fwd(n.inputs[1]))
            mean = lambda t: e.call("mul", e.call("reduction", t, mode="sum", axes=axes), 1 / count)  # noqa: E731
            t = e.call("sub", g, e.call("mul", xhat, mean(e.call("mul", g, xhat))))
            dx = e.call("mul", e.call("sub", t, mean(g)) if centered else t, stats[-1])
        dscale = e.call("mul", n.dy, xhat) if n.need[1] else None
        dbias = n.dy if bias and n.need[2] else None
        return (dx, dscale, dbias) + (None,) * (len(n.inputs) - 3)

    return rule


def _batchnorm_inference(e, n):
    """y = (x - mean) * inv_variance * scale + bias, all but x per channel."""
    x, mean, inv, scale = (e.fwd(i) for i in n.inputs[:4])
    centered = e.call("sub", x, mean)
    dxhat = e.call("mul", n.dy, scale)
    return (
        e.call("mul", dxhat, inv) if n.need[0] else None,
        e.call("neg", e.call("mul", dxhat, inv)) if n.need[1] else None,
        e.call("mul", dxhat, centered) if n.need[2] else None,
        e.call("mul", n.dy, e.call("mul", centered, inv)) if n.need[3] else None,
        n.dy if n.need[4] else None,
    )


def _rope(e, n):
    """The rotation's transpose is the rotation by the negated angles (output_scale and the unrotated
    leading dims as in the forward)."""
    if n.need[1]:
        raise RuleError("rope: the gradient in freqs (the angles) is not derived; only x's")
    return (e.call("rope", n.dy, e.call("neg", e.fwd(n.inputs[1])), **n.attrs), None)


def _sdpa_keep(e, n, s, transposed: bool):
    """The diagonal band's mask over scores s ([S_q, S_kv], or [S_kv, S_q] transposed); None: no band."""
    a = n.attrs
    if a["left_bound"] is None and a["right_bound"] is None:
        return None
    i = e.call("gen_index", s, axis=3 if transposed else 2)  # the query
    j = e.call("gen_index", s, axis=2 if transposed else 3)  # the key
    diagonal = e.call("sub", j, i)
    if a["diagonal_alignment"] == "bottom_right":
        q, k = n.ins[0], n.ins[1]
        diagonal = e.call("sub", diagonal, float(k.shape[2] - q.shape[2]))
    keep = [e.call("cmp_le", diagonal, float(a["right_bound"]))] if a["right_bound"] is not None else []
    keep += [e.call("cmp_gt", diagonal, float(-a["left_bound"]))] if a["left_bound"] is not None else []
    return keep[0] if len(keep) == 1 else e.call("logical_and", *keep)


_SDPA_BACKWARD_TAKES = ("bias", "seq_len_q", "seq_len_kv")
"""sdpa's optional inputs that sdpa_backward is given as they are (dropout would need 1 / dropout_scale,
pages and ragged offsets it does not take)"""


def _sdpa(e, n):
    """sdpa_backward from the saved output and softmax statistics, with the forward's scale, band, ALiBi,
    bias (dbias where the bias wants a gradient), padding and grouped heads, when dq, dk and dv are all
    wanted (an unread result of the fused op is not left dangling) and the output is in q's dtype (as the
    op reads it); else the composite below."""
    q = n.ins[0]
    given = dict(zip(OPS["sdpa"].optional, n.inputs[3:]))
    if (
        not all(n.need[:3])
        or n.outs[0].dtype != q.dtype
        or any(a is not None for k, a in given.items() if k not in _SDPA_BACKWARD_TAKES)
    ):
        return _sdpa_composite(e, n)
    (stats,) = e.stats(n, 1)
    bwd = OPS["sdpa_backward"]
    attrs = {a.name: n.attrs[a.name] for a in bwd.attrs if a.name in n.attrs and a.name not in bwd.folded}
    dbias = given["bias"] is not None and n.need[3]
    ins = [e.fwd(i) for i in n.inputs[:3]] + [e.fwd(n.out), e.cast(n.dy, q.dtype), stats]
    ins += [given[k] and e.fwd(given[k]) for k in _SDPA_BACKWARD_TAKES]
    grads = e.call("sdpa_backward", *ins, **attrs, dbias=dbias)
    return (*grads[:3], grads[3] if dbias else None, *(None,) * (len(n.inputs) - 4))


def _sdpa_composite(e, n):
    """From the saved softmax statistics (log-sum-exp), with P = exp(q k^T * scale - stats):
    dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = dS K scale, dK = dS^T Q scale. Each transposed
    matrix is computed as such (P^T from k q^T, dS^T from v dO^T) so that every operand is a saved
    value or a view of one. It materializes the score matrices; for some of q, k, v's gradients only."""
    q, k, v = n.ins[:3]
    if any(i is not None for i in n.inputs[3:]) or n.attrs["alibi"] or k.shape[1] != q.shape[1]:
        raise RuleError(
            "sdpa: dropout, pages and ragged offsets have no derived gradient; with a bias, padding, ALiBi or "
            "grouped heads, q, k and v must all want theirs (sdpa_backward computes the three)"
        )
    qs, ks, vs = (e.fwd(i) for i in n.inputs[:3])
    (stats,) = e.stats(n, 1)
    scale = n.attrs["scale"]

    def probs(a, b, lse, transposed):
        s = e.call("matmul", a, b)
        x = e.call("sub", e.call("mul", s, scale), lse)
        keep = _sdpa_keep(e, n, s, transposed)
        return e.call("exp", x if keep is None else e.call("binary_select", x, -1e30, keep))

    dy = e.cast(n.dy, v.dtype)
    grads = [None, None, None]
    pt = probs(ks, e.fwd_t(n.inputs[0]), e.fwd_t(stats), True) if n.need[1] or n.need[2] else None
    if n.need[0]:
        p = probs(qs, e.fwd_t(n.inputs[1]), stats, False)
        rows = e.call("reduction", e.call("mul", n.dy, e.fwd(n.out)), mode="sum", axes=(3,))
        ds = e.call("mul", p, e.call("sub", e.call("matmul", dy, e.fwd_t(n.inputs[2])), rows))
        grads[0] = e.call("mul", e.call("matmul", e.cast(ds, k.dtype), ks), scale)
    if n.need[1]:
        dyt = e.transposed(n.dy)
        rows_t = e.call("reduction", e.call("mul", dyt, e.fwd_t(n.out)), mode="sum", axes=(2,))
        dst = e.call("mul", pt, e.call("sub", e.call("matmul", vs, e.cast(dyt, v.dtype)), rows_t))
        grads[1] = e.call("mul", e.call("matmul", e.cast(dst, q.dtype), qs), scale)
    if n.need[2]:
        grads[2] = e.call("matmul", e.cast(pt, v.dtype), dy)
    return (*grads, *(None,) * (len(n.inputs) - 3))


def _concatenate(e, n):
    """Each input's gradient is its slice of dy along the axis."""
    axis, start, grads = n.attrs["axis"], 0, []
    for t, want in zip(n.ins, n.need):
        lo = tuple(start if i == axis else 0 for i in range(len(t.shape)))
        hi = tuple(start + d if i == axis else n.outs[0].shape[i] for i, d in enumerate(t.shape))
        grads.append(e.call("slice", n.dy, start=lo, end=hi) if want else None)
        start += t.shape[axis]
    return tuple(grads)


_SECOND_ORDER = "it is itself a gradient; second derivatives are not derived"
_WAITS = "waits for the frontend's dedicated backward op in the registry"

VJPS: dict[str, Rule] = {
    "relu": _relu,
    **{
        op: _backward_mode(op)
        for op in ("leaky_relu", "elu", "gelu", "gelu_tanh", "swish", "sigmoid", "tanh", "softplus")
    },
    "exp": _unary(_y),
    "log": lambda e, n: (e.call("div", n.dy, _x(e, n)),),
    "sqrt": lambda e, n: (e.call("div", e.call("mul", n.dy, 0.5), _y(e, n)),),
    "rsqrt": lambda e, n: (
        e.call(
            "neg", e.call("mul", e.call("mul", n.dy, 0.5), e.call("mul", _y(e, n), e.call("mul", _y(e, n), _y(e, n))))
        ),
    ),
    "reciprocal": lambda e, n: (e.call("neg", e.call("mul", n.dy, e.call("mul", _y(e, n), _y(e, n)))),),
    "abs": lambda e, n: (e.call("binary_select", n.dy, e.call("neg", n.dy), e.call("cmp_ge", _x(e, n), 0.0)),),
    "neg": lambda e, n: (e.call("neg", n.dy),),
    "erf": _unary(
        lambda e, n: e.call(
            "mul", e.call("exp", e.call("neg", e.call("mul", _x(e, n), _x(e, n)))), 2 / math.sqrt(math.pi)
        )
    ),
    "sin": _unary(lambda e, n: e.call("cos", _x(e, n))),
    "cos": lambda e, n: (e.call("neg", e.call("mul", n.dy, e.call("sin", _x(e, n)))),),
    "tan": _unary(lambda e, n: e.call("add", e.call("mul", _y(e, n), _y(e, n)), 1.0)),
    "identity": lambda e, n: (n.dy,),
    "floor": lambda e, n: (None,),  # zero almost everywhere
    "ceil": lambda e, n: (None,),
    "add": _binary(lambda e, n: n.dy, lambda e, n: n.dy),
    "sub": _binary(lambda e, n: n.dy, lambda e, n: e.call("neg", n.dy)),
    "mul": _binary(
        lambda e, n: e.call("mul", n.dy, e.fwd(n.inputs[1])), lambda e, n: e.call("mul", n.dy, e.fwd(n.inputs[0]))
    ),
    "div": _binary(
        lambda e, n: e.call("div", n.dy, e.fwd(n.inputs[1])),
        lambda e, n: e.call("neg", e.call("div", e.call("mul", n.dy, _y(e, n)), e.fwd(n.inputs[1]))),
    ),
    "max": _binary(
        lambda e, n: e.call("mul", n.dy, e.call("cmp_ge", _x(e, n), e.fwd(n.inputs[1]))),
        lambda e, n: e.call("mul", n.dy, e.call("cmp_lt", _x(e, n), e.fwd(n.inputs[1]))),
    ),
    "min": _binary(
        lambda e, n: e.call("mul", n.dy, e.call("cmp_le", _x(e, n), e.fwd(n.inputs[1]))),
        lambda e, n: e.call("mul", n.dy, e.call("cmp_gt", _x(e, n), e.fwd(n.inputs[1]))),
    ),
    "pow": _binary(  # a > 0 (the registry's domain): a^(b-1) = y / a
        lambda e, n: e.call("div", e.call("mul", e.call("mul", n.dy, e.fwd(n.inputs[1])), _y(e, n)), _x(e, n)),
        lambda e, n: e.call("mul", e.call("mul", n.dy, _y(e, n)), e.call("log", _x(e, n))),
    ),
    "add_square": _binary(lambda e, n: n.dy, lambda e, n: e.call("mul", e.call("mul", n.dy, e.fwd(n.inputs[1])), 2.0)),
    "bias": _binary(lambda e, n: n.dy, lambda e, n: n.dy),
    "scale": _binary(
        lambda e, n: e.call("mul", n.dy, e.fwd(n.inputs[1])), lambda e, n: e.call("mul", n.dy, e.fwd(n.inputs[0]))
    ),
    "binary_select": lambda e, n: (
        e.call("mul", n.dy, e.fwd(n.inputs[2])) if n.need[0] else None,
        e.call("mul", n.dy, e.call("logical_not", e.fwd(n.inputs[2]))) if n.need[1] else None,
        None,
    ),
    **{op: _stop for op in ("cmp_eq", "cmp_neq", "cmp_gt", "cmp_ge", "cmp_lt", "cmp_le", "gen_index")},
    **{op: _stop for op in ("logical_and", "logical_or", "logical_not")},
    "conv_fprop": _conv_fprop,
    "matmul": _matmul,
    "reduction": _reduction,
    "transpose": _transpose,
    "concatenate": _concatenate,
    "rope": _rope,
    "sdpa": _sdpa,
    "reshape": lambda e, n: (e.call("reshape", n.dy, shape=n.ins[0].shape),),
    "layernorm": _norm(centered=True, dedicated="layernorm_backward", fits=_layer_fits),
    "rmsnorm": _norm(centered=False, dedicated="rmsnorm_backward", fits=_layer_fits),
    "adalayernorm": _norm(centered=True),  # adalayernorm_backward: no engine on cuDNN 9.19
    "instancenorm": _norm(
        centered=True, over=lambda x, scale: tuple(range(2, len(x.shape))), dedicated="instancenorm_backward"
    ),
    "batchnorm": _norm(
        centered=True, over=lambda x, scale: (0, *range(2, len(x.shape))), dedicated="batchnorm_backward"
    ),
    "batchnorm_inference": _batchnorm_inference,
}

STATISTICS = {"layernorm", "rmsnorm", "batchnorm", "instancenorm", "adalayernorm", "sdpa", "sdpa_fp8"}
"""ops whose results after the first are statistics: no gradient flows back from them (as in torch)"""

EMIT_STATISTICS: dict[str, tuple[str, object]] = {
    "layernorm": ("phase", "training"),
    "rmsnorm": ("phase", "training"),
    "instancenorm": ("phase", "training"),
    "adalayernorm": ("phase", "training"),
    "sdpa": ("stats", True),
    "sdpa_fp8": ("stats", True),
}
"""the attribute that makes an op also return its statistics (batchnorm always does): `e.stats` sets it
in the derived forward when the graph leaves it off"""

NO_VJP: dict[str, str] = {
    "mod": "its gradient in b needs trunc(a / b), which no registry op computes",
    "slice": "its gradient pads with zeros, which no registry op does",
    "conv_dgrad": _SECOND_ORDER,
    "conv_wgrad": _SECOND_ORDER,
    **{op: _SECOND_ORDER for op in OPS if op.endswith(("_backward", "_bwd"))},  # the frontend's gradient ops
    "sdpa_fp8": f"it {_WAITS} (sdpa_fp8_backward)",
    "genstats": "its statistics feed a norm's backward, not derived yet",
}
