"""The PyTorch reference of a graph, generated from the IR by the op registry.

One loop over the nodes (torch.fx Interpreter style). As a reference, inputs are widened to
float32 (float64 for double), every op runs in that precision without TF32, and a computed value is
rounded to its dtype where cuDNN rounds it (`rounded_values`), so the next op reads what it reads on
the GPU; every output is rounded to its dtype. With ``native=True`` the same loop is what a PyTorch
user would write by hand — each op in the tensors' own dtypes (a value declared narrower cast to it), one
kernel per op, differentiable — the eager baseline of `bench` and the search of a torch.compile pattern.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

from cudnn_dsl.ops import IMPLS
from cudnn_dsl.run.buffers import view
from cudnn_dsl.run.compare import rounded_values
from cudnn_dsl.target.bits import logical
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.lazy_torch import torch
from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Graph, Instance


def _narrowed(r: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Native: a value declared narrower than torch computed it (a half sum of float statistics) is cast to
    its dtype and stays so, as a user's `.half()`; one declared wider is left as torch computed it."""
    narrower = r.is_floating_point() and dtype.is_floating_point and dtype.itemsize < r.dtype.itemsize
    return r.to(dtype) if narrower else r


@contextlib.contextmanager
def _full_precision():
    """The reference must not itself use TF32."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64 if t.dtype == torch.float64 else torch.float32)


class NeedsDevice(DslError):
    """The reference needs what only a launch on the GPU gives (seeded dropout's mask, OpImpl.drawn)."""


def drawn_values(graph: Graph, instance: Instance) -> list[str]:
    """The values the reference cannot compute and takes from the device after a launch (OpImpl.drawn)."""
    names = []
    for index, node in enumerate(graph.nodes):
        drawn = IMPLS[node.op].drawn
        names += [node.outputs[i] for i in drawn(instance.attrs(index))] if drawn is not None else []
    return names


def _drawn(node, i: int, drawn: dict | None, device) -> torch.Tensor:
    name = node.outputs[i]
    if drawn is None or drawn.get(name) is None:
        raise NeedsDevice(
            Diagnostic(
                "error",
                f"seeded dropout: the reference needs cuDNN's mask ('{name}', drawn on the GPU from the seed and "
                "offset), which only a launch gives",
                node.loc,
            )
        )
    return _wide(drawn[name].to(device))


def _bound(node, given: dict, inputs: dict) -> dict:
    """A node's attributes, each that a declared scalar carries (`epsilon=eps`) at the value bound this call."""
    bound = {a: float(inputs[s]) for a, s in node.scalars if s in inputs}
    return {**given, **bound} if bound else given


_OWN = object()  # a node computed by its op's reference


class Outputs(dict):
    """The reference's outputs by name, and `undefined`: per output, a bool mask of the elements
    cuDNN leaves unspecified (the compare skips them), for outputs whose op says so."""

    undefined: dict[str, torch.Tensor]


def run_reference(
    graph: Graph,
    instance: Instance,
    inputs: dict[str, torch.Tensor],
    device: torch.device | str | None = None,
    native: bool = False,
    every: bool = False,
    rounded: frozenset[str] | None = None,
    drawn: dict[str, torch.Tensor] | None = None,
    idioms: Mapping[int, Callable | None] | None = None,
) -> dict[str, torch.Tensor]:
    """Evaluates the graph with torch; returns every output, in its dtype, by name (with `every`, every tensor
    value: inputs, intermediates and outputs, each rounded to its declared dtype). A view input is read
    with as_strided on its bound buffer, as cuDNN reads it; `inputs` are the values before any launch (an
    output in place is compared, after the launch, with what the reference computed from them).
    ``rounded``: the values rounded to their dtype where computed (default: `rounded_values`; a test
    compares other models). ``drawn``: the values the device drew (`drawn_values`), as a launch left them;
    NeedsDevice when one is missing. ``idioms`` (native): by node index, a function of the values so far that
    computes the node as a model's code does (patterns.search), or None for a node folded into a later one's."""
    device = torch.device(device) if device is not None else next(iter(inputs.values())).device
    widen = (lambda t: t) if native else _wide
    env: dict[str, torch.Tensor] = {}
    for v in graph.values:
        if v.kind == "input":
            env[v.name] = widen(logical(view(v, instance, inputs).to(device), instance.type(v.name)))
        elif v.kind in ("scalar", "const"):
            value = inputs[v.name] if v.name in inputs else v.scalar
            if native:  # a Python number, as a PyTorch user writes `y * 0.5`
                env[v.name] = float(value)
            else:
                env[v.name] = _wide(torch.as_tensor(value, device=device).reshape(instance.type(v.name).shape))
    rounded = frozenset() if native else rounded_values(graph, instance) if rounded is None else rounded
    precision = contextlib.nullcontext() if native else _full_precision()
    # native: differentiable, as a user's code is (a pattern's search is traced with its backward: patterns.py)
    grad = contextlib.nullcontext() if native else torch.no_grad()
    undefined: dict[str, torch.Tensor] = {}
    with grad, precision:
        for index, node in enumerate(graph.nodes):
            idiom = idioms.get(index, _OWN) if idioms is not None else _OWN
            if idiom is None:
                continue
            ins = [env.get(i) if i else None for i in node.inputs]  # a folded node's output is in no env
            outs = [instance.type(o) for o in node.outputs]
            impl = IMPLS[node.op]
            attrs_ = _bound(node, instance.attrs(index), inputs)
            if impl.drawn is not None:
                ins += [_drawn(node, i, drawn, device) for i in impl.drawn(instance.attrs(index))]
            try:
                results = impl.ref(ins, attrs_, outs) if idiom is _OWN else idiom(env)
                if impl.undefined is not None:
                    masks = impl.undefined(ins, attrs_, outs)
                    undefined.update((o, m) for o, m in zip(node.outputs, masks) if m is not None)
            except (RuntimeError, ValueError) as e:
                where = f"while executing `{', '.join(node.outputs)} = {node.op}(...)` in the reference"
                raise DslError(Diagnostic("error", f"{where}: {e}", node.loc)) from None
            for name, r in zip(node.outputs, results):
                dtype = torch_dtype(instance.type(name).dtype)
                if native:
                    env[name] = _narrowed(r, dtype)
                else:
                    env[name] = r.to(dtype).to(r.dtype) if name in rounded else r
    kept = (
        [v for v in graph.values if v.name in env and v.kind in ("input", "virtual", "output")]
        if every
        else graph.outputs
    )
    values = {v.name: env[v.name].to(torch_dtype(instance.type(v.name).dtype)) for v in kept}
    if native:  # what torch.compile traces (bench): a plain dict, no generator into a dict subclass
        return values
    out = Outputs(values)
    out.undefined = {v.name: undefined[v.name] for v in graph.outputs if v.name in undefined}
    return out
