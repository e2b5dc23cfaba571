"""Norms: the torch references and cuDNN lowerings of layernorm, rmsnorm, batchnorm, instancenorm,
adalayernorm, batchnorm_inference and genstats, and of their backward ops."""

from __future__ import annotations

from cudnn_dsl.ops.base import OpImpl, sum_to
from cudnn_dsl.target.lazy_torch import F, torch
from dsl.ops import norm_axes


def _norm_axes(x, scale) -> list[int]:
    return list(norm_axes(tuple(x.shape), tuple(scale.shape)))


def _standardize(x, axes, eps):
    """(x - mean) * inv_variance over `axes`, with the biased variance, as cuDNN's norms compute it."""
    mean = x.mean(axes, keepdim=True)
    inv_var = torch.rsqrt(x.var(axes, keepdim=True, correction=0) + eps)
    return (x - mean) * inv_var, mean, inv_var


def _affine(y, scale, bias):
    y = y * scale if scale is not None else y
    return y + bias if bias is not None else y


def _phase(ctx, a):
    return getattr(ctx.cudnn.norm_forward_phase, a["phase"].upper())


def lower_norm(ctx, ins, a):
    """layernorm, rmsnorm, instancenorm and adalayernorm, by the frontend's builder of the op's name: (x, scale,
    bias, epsilon) in a phase; Y and, in training, the statistics (the node's results)."""
    x, scale, bias = ins
    eps = ctx.constant(a["epsilon"], "epsilon")
    res = getattr(ctx.g, ctx.node.op)(x, scale, bias, eps, norm_forward_phase=_phase(ctx, a), **ctx.kw)
    return [res[i] for i in range(len(ctx.node.outputs))]


def ref_layernorm(ins, a, outs):
    x, scale, bias = ins
    axes = _norm_axes(x, scale)
    first = axes[0]
    if len(outs) == 1 and axes == list(range(first, x.dim())):  # what a PyTorch user writes: one kernel
        tail = x.shape[first:]
        return [F.layer_norm(x, tail, scale.reshape(tail), bias.reshape(tail), a["epsilon"])]
    y, mean, inv_var = _standardize(x, axes, a["epsilon"])
    return [_affine(y, scale, bias), mean, inv_var][: len(outs)]


def ref_rmsnorm(ins, a, outs):
    x, scale, bias = ins
    inv_var = torch.rsqrt(x.square().mean(_norm_axes(x, scale), keepdim=True) + a["epsilon"])
    return [_affine(x * inv_var, scale, bias), inv_var][: len(outs)]


def ref_batchnorm_inference(ins, a, outs):
    x, mean, inv_var, scale, bias = ins
    return [(x - mean) * inv_var * scale + bias]


def lower_batchnorm_inference(ctx, ins, a):
    return [ctx.g.batchnorm_inference(*ins, **ctx.kw)]


def ref_batchnorm(ins, a, outs):
    """Saved statistics with the biased variance; the running variance follows the unbiased one (Bessel's
    correction, as cuDNN and PyTorch update it): next = (1 - momentum) * running + momentum * batch."""
    x, scale, bias, running_mean, running_var = ins
    axes = [d for d in range(x.dim()) if d != 1]
    y, mean, inv_var = _standardize(x, axes, a["epsilon"])
    m = a["momentum"]
    unbiased = x.var(axes, keepdim=True, correction=1)
    return [
        _affine(y, scale, bias),
        mean,
        inv_var,
        (1 - m) * running_mean + m * mean,
        (1 - m) * running_var + m * unbiased,
    ]


def lower_batchnorm(ctx, ins, a):
    x, scale, bias, running_mean, running_var = ins
    res = ctx.g.batchnorm(
        x,
        scale,
        bias,
        running_mean,
        running_var,
        ctx.constant(a["epsilon"], "epsilon"),
        ctx.constant(a["momentum"], "momentum"),
        **ctx.kw,
    )
    return [res[i] for i in range(5)]  # [Y, mean, inv_var, next_running_mean, next_running_var]


def ref_instancenorm(ins, a, outs):
    x, scale, bias = ins
    y, mean, inv_var = _standardize(x, list(range(2, x.dim())), a["epsilon"])
    return [_affine(y, scale, bias), mean, inv_var][: len(outs)]


def ref_adalayernorm(ins, a, outs):
    x, scale, bias = ins
    y, mean, inv_var = _standardize(x, _norm_axes(x, scale), a["epsilon"])
    return [_affine(y, scale, bias), mean, inv_var][: len(outs)]


def ref_genstats(ins, a, outs):
    x = ins[0]
    axes = [d for d in range(x.dim()) if d != 1]
    return [x.sum(axes, keepdim=True), x.square().sum(axes, keepdim=True)]


def lower_genstats(ctx, ins, a):
    res = ctx.g.genstats(ins[0], **ctx.kw)
    return [res[0], res[1]]  # [SUM, SQ_SUM]


# ---- backward ops ------------------------------------------------------------------


def _norm_grads(dy, x, scale, mean, inv_var, axes):
    """dx, dscale, dbias of y = (x - mean) * inv_var * scale + bias, with mean and inv_var the statistics
    of x over `axes` (mean None: an RMS norm): dx = inv_var * (g - mean(g) - xhat * mean(g * xhat)),
    g = dy * scale, the means over `axes`."""
    xhat = (x if mean is None else x - mean) * inv_var
    g = dy * scale
    centred = g - g.mean(axes, keepdim=True) if mean is not None else g
    dx = inv_var * (centred - xhat * (g * xhat).mean(axes, keepdim=True))
    return [dx, sum_to(dy * xhat, scale.shape), sum_to(dy, scale.shape)]


def _ref_norm_backward(axes_of):
    def ref(ins, a, outs):
        dy, x, scale, *stats = ins
        mean, inv_var = stats if len(stats) == 2 else (None, stats[0])
        return _norm_grads(dy, x, scale, mean, inv_var, axes_of(x, scale))[: len(outs)]

    return ref


def lower_norm_backward(ctx, ins, a):
    """By the frontend's builder of the op's name: DX, DScale and DBias (rmsnorm's DBias with dbias=true)."""
    more = {"has_dbias": a["dbias"]} if "dbias" in a else {}
    res = getattr(ctx.g, ctx.node.op)(*ins, **more, **ctx.kw)
    return [res[i] for i in range(len(ctx.node.outputs))]


def _batch_axes(x, scale) -> list[int]:
    return [d for d in range(x.dim()) if d != 1]


def _spatial_axes(x, scale) -> list[int]:
    return list(range(2, x.dim()))


IMPLS: dict[str, OpImpl] = {
    "layernorm": OpImpl(ref_layernorm, lower_norm),
    "rmsnorm": OpImpl(ref_rmsnorm, lower_norm),
    "batchnorm_inference": OpImpl(ref_batchnorm_inference, lower_batchnorm_inference),
    "batchnorm": OpImpl(ref_batchnorm, lower_batchnorm),
    "instancenorm": OpImpl(ref_instancenorm, lower_norm),
    "adalayernorm": OpImpl(ref_adalayernorm, lower_norm),
    "genstats": OpImpl(ref_genstats, lower_genstats),
    "layernorm_backward": OpImpl(_ref_norm_backward(_norm_axes), lower_norm_backward),
    "rmsnorm_backward": OpImpl(_ref_norm_backward(_norm_axes), lower_norm_backward),
    "batchnorm_backward": OpImpl(_ref_norm_backward(_batch_axes), lower_norm_backward),
    "instancenorm_backward": OpImpl(_ref_norm_backward(_spatial_axes), lower_norm_backward),
    "adalayernorm_backward": OpImpl(_ref_norm_backward(_norm_axes), lower_norm_backward),
}
