"""A graph's inputs: generated from each input's `init=` (seeded, as the ejected scripts draw them), with
ragged offsets packed, or loaded from .pt, .npy and .safetensors files."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cudnn_dsl.run.buffers import BindingError
from cudnn_dsl.target import portable
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.lazy_torch import torch
from cudnn_dsl.target.memory import empty, stored
from dsl.inits import Init, make
from dsl.inits import default as default_init
from dsl.ir import Graph, Instance
from dsl.ops import OPS, Ctx
from dsl.types import DTYPE_RANGE, TensorType, fmt_shape, is_float


def _positive_inputs(graph: Graph) -> set[str]:
    """Bound names whose data an op wants positive (a view's buffer, for a view)."""
    out = set()
    for n in graph.nodes:
        for i in OPS[n.op].positive:
            if i < len(n.inputs) and n.inputs[i]:
                v = graph.value(n.inputs[i])
                out.add(v.view[0] if v.view else v.name)
    return out


def _domains(graph: Graph, instance: Instance) -> dict[str, tuple[int, int]]:
    """Integer inputs whose op allows only some values (sdpa's sequence lengths), by name."""
    out = {}
    for index, n in enumerate(graph.nodes):
        sig = OPS[n.op]
        if sig.domains is None:
            continue
        types = tuple(instance.type(i) if i else None for i in n.inputs)
        for i, bounds in sig.domains(Ctx(n.op, types, instance.attrs(index))).items():
            if n.inputs[i]:
                out[n.inputs[i]] = bounds
    return out


def input_inits(graph: Graph, instance: Instance, inits: dict[str, Init] | None = None) -> dict[str, Init]:
    """How each input is drawn: `inits` (run --init), else the file's `init=`, else the default of its
    dtype (positive values where an op of the registry wants them)."""
    inits, positive, domains = inits or {}, _positive_inputs(graph), _domains(graph, instance)
    return {  # a buffer is drawn once for all its views
        v.name: inits.get(v.name)
        or getattr(v, "init", None)
        or (make("randint", domains[v.name]) if v.name in domains else None)
        or default_init(instance.type(v.name).dtype, v.name in positive)
        for v in graph.device_inputs
    }


def draw_input(init: Init, t: TensorType, seed: int, name: str) -> torch.Tensor:
    """The values of one input, row-major on the CPU in its dtype (portable.draw_values: the ejected scripts
    draw them with the same code); big inputs are drawn on every core."""
    clamp = None if is_float(t.dtype) or t.dtype == "bool" else DTYPE_RANGE[t.dtype]
    args = (init.dist, init.args, t.shape, torch_dtype(t.dtype), seed, name, clamp)
    if t.numel > portable.CHUNK:
        with ThreadPoolExecutor(min(-(-t.numel // portable.CHUNK), os.cpu_count() or 1)) as pool:  # torch drops the GIL
            return portable.draw_values(*args, chunks=pool.map)
    return portable.draw_values(*args)


def _ragged(graph: Graph, instance: Instance) -> dict[str, tuple[TensorType, str]]:
    """Ragged offset inputs by name (OpSig.ragged): the type of the tensor each places, and its lengths.
    One offset input may place several tensors whose sequences it packs alike (q and o of equal rows)."""
    out: dict[str, tuple[TensorType, str]] = {}
    for n in graph.nodes:
        for off, port, lengths in OPS[n.op].ragged:
            if off < len(n.inputs) and n.inputs[off] and n.inputs[lengths]:
                name, placed = n.inputs[off], n.inputs[port] if port >= 0 else n.outputs[-1 - port]
                t = instance.type(placed)
                if name in out and _spans(out[name][0]) != _spans(t):
                    raise BindingError(
                        f"ragged offsets '{name}' place tensors whose sequences take different room "
                        f"({fmt_shape(out[name][0].shape)} and {fmt_shape(t.shape)}): give each its own offsets",
                        graph.value(name).loc,
                    )
                out[name] = (t, n.inputs[lengths])
    return out


def _spans(t: TensorType) -> tuple[int, int]:
    return portable.ragged_span(t.shape, t.strides)


def packed_offsets(t: TensorType, lengths: torch.Tensor) -> torch.Tensor:
    """Offsets [B+1] that pack sequences of these lengths back to back in a buffer of type t."""
    return portable.packed_offsets(lengths, t.shape, t.strides)


def packed_ragged(graph: Graph, instance: Instance, inits: dict[str, Init] | None = None) -> dict[str, tuple]:
    """The ragged offset inputs whose generated values pack their sequences (no init names them): name ->
    (the type of the tensor they place, the name of its lengths). The ejected scripts draw them alike."""
    drawn = input_inits(graph, instance, inits)
    return {
        name: (placed, lengths)
        for name, (placed, lengths) in _ragged(graph, instance).items()
        if not (inits or {}).get(name) and getattr(graph.value(name), "init", None) is None and name in drawn
    }


def generate_inputs(
    graph: Graph,
    instance: Instance,
    device,
    seed: int = 0,
    inits: dict[str, Init] | None = None,
    given: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Seeded inputs in their declared layout, each drawn as `input_inits` says. Drawn on the CPU, so
    a seed gives the same inputs on every device. Ragged offsets no init names pack their sequences
    (packed_offsets of the lengths: generated, or `given`, the tensors taken in place of drawn ones)."""
    out = {}
    for name, init in input_inits(graph, instance, inits).items():
        t = instance.type(name)
        buf = empty(t, device)
        buf.copy_(stored(draw_input(init, t, seed, name), t))
        out[name] = buf
    given = given or {}
    out.update(given)
    for name, (placed, lengths) in packed_ragged(graph, instance, inits).items():
        if name not in given:
            out[name].copy_(packed_offsets(placed, out[lengths].cpu()).view(out[name].shape))
    return out


def load_tensor(path: str | Path) -> torch.Tensor:
    """A tensor from .pt, .npy or .safetensors (a file of one dense tensor); no pickled code runs."""
    path = Path(path)
    if not path.is_file():
        raise BindingError(f"{path}: no such file")
    try:
        if path.suffix == ".pt":
            t = torch.load(path, map_location="cpu", weights_only=True)
        elif path.suffix == ".npy":
            import numpy as np

            t = torch.from_numpy(np.load(path, allow_pickle=False))
        elif path.suffix == ".safetensors":
            from safetensors.torch import load_file

            tensors = load_file(str(path))
            if len(tensors) != 1:
                raise BindingError(f"{path}: holds {len(tensors)} tensors; give a file of one")
            t = next(iter(tensors.values()))
        else:
            raise BindingError(f"{path}: unknown tensor file type (use .pt, .npy or .safetensors)")
    except BindingError:
        raise
    except ImportError:
        raise BindingError(f"{path}: reading {path.suffix} files needs a package that is not installed") from None
    except Exception as e:  # noqa: BLE001 - unpickling refusals, truncated zips, bad headers: all say "not a tensor file"
        raise BindingError(f"{path}: not a readable tensor file ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(t, torch.Tensor):
        raise BindingError(f"{path}: holds a {type(t).__name__}, not a tensor")
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        raise BindingError(
            f"{path}: holds a {t.layout if t.layout != torch.strided else t.device.type} tensor; give a dense one"
        )
    if t.is_complex():
        raise BindingError(f"{path}: holds a complex tensor; cuDNN graphs take real data")
    return t
