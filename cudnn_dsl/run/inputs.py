"""A graph's inputs: generated from each input's `init=` (seeded, as the ejected scripts draw them), with
ragged offsets packed, or loaded from .pt, .npy and .safetensors files."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cudnn_dsl.run.buffers import BindingError, view
from cudnn_dsl.run.indices import Bounded, bounded_inputs, ragged_offsets
from cudnn_dsl.target import bits, portable
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.lazy_torch import torch
from cudnn_dsl.target.memory import empty, owned, stored
from dsl import files
from dsl.inits import Init, make
from dsl.inits import default as default_init
from dsl.ir import Graph, Instance
from dsl.ops import OPS
from dsl.types import DTYPE_RANGE, TensorType, is_float


def _positive_inputs(graph: Graph) -> set[str]:
    """Bound names whose data an op wants positive (a view's buffer, for a view; the input a copy is like)."""
    out = set()
    for n in graph.nodes:
        for i in OPS[n.op].positive:
            if i < len(n.inputs) and n.inputs[i]:
                v = graph.value(n.inputs[i])
                out.add(v.view[0] if v.view else v.name)
    return out | {v.init.source for v in graph.device_inputs if v.name in out and v.init and v.init.source}


def copied_inputs(graph: Graph, inits: dict[str, Init] | None = None) -> dict[str, str]:
    """The inputs drawn `like(x)`: name -> x, whose values (generated or given) they take once every other
    input is filled. `inits` (run --init) draws an input instead."""
    inits = inits or {}
    return {v.name: v.init.source for v in graph.device_inputs if v.init and v.init.source and v.name not in inits}


def input_inits(graph: Graph, instance: Instance, inits: dict[str, Init] | None = None) -> dict[str, Init]:
    """How each drawn input is drawn: `inits` (run --init), else the file's `init=`, else the default of its
    dtype (positive values where an op of the registry wants them). The copies (`copied_inputs`) are not drawn."""
    inits, positive, bounded = inits or {}, _positive_inputs(graph), bounded_inputs(graph, instance)
    copies = copied_inputs(graph, inits)
    return {  # a buffer is drawn once for all its views
        v.name: inits.get(v.name)
        or v.init
        or (_within(bounded[v.name]) if v.name in bounded else None)
        or default_init(instance.type(v.name).dtype, v.name in positive)
        for v in graph.device_inputs
        if v.name not in copies
    }


def view_inits(graph: Graph, instance: Instance, inits: dict[str, Init] | None = None) -> dict[str, Init]:
    """The index inputs that are views drawn on their own, over their buffer's draw: a page table or a sequence
    length in a shared allocation takes its op's values (`_within`) where no init names the buffer."""
    inits, bounded = inits or {}, bounded_inputs(graph, instance)
    return {
        v.name: _within(bounded[v.name])
        for v in graph.views
        if v.name in bounded and not inits.get(v.view[0]) and graph.value(v.view[0]).init is None
    }


def _within(b: Bounded) -> Init:
    """What an index input is drawn from by default: its op's values (a page table: the cache's blocks, each
    once while there are enough; lengths whose sequences share a token capacity, their share of it)."""
    return make("permutation" if b.blocks else "randint", (b.lo, max(b.lo, b.hi // b.share)))


def draw_input(init: Init, t: TensorType, seed: int, name: str) -> torch.Tensor:
    """The values of one input, row-major on the CPU in its dtype (portable.draw_values: the ejected scripts
    draw them with the same code); big inputs are drawn on every core."""
    clamp = None if is_float(t.dtype) or t.dtype == "bool" else DTYPE_RANGE[t.dtype]
    args = (init.dist, init.args, t.shape, torch_dtype(t.dtype), seed, name, clamp)
    if t.numel > portable.CHUNK:
        with ThreadPoolExecutor(min(-(-t.numel // portable.CHUNK), os.cpu_count() or 1)) as pool:  # torch drops the GIL
            return portable.draw_values(*args, chunks=pool.map)
    return portable.draw_values(*args)


def packed_offsets(t: TensorType, lengths: torch.Tensor) -> torch.Tensor:
    """Offsets [B+1] that pack sequences of these lengths back to back in a buffer of type t."""
    return portable.packed_offsets(lengths, t.shape, t.strides)


def packed_ragged(graph: Graph, instance: Instance, inits: dict[str, Init] | None = None) -> dict[str, tuple]:
    """The ragged offset inputs whose generated values pack their sequences (no init names them): name ->
    (the type of the tensor they place, the name of its lengths). The ejected scripts draw them alike."""
    inits = inits or {}
    out = {}
    for name, r in ragged_offsets(graph, instance).items():
        v = graph.value(name)
        bound = graph.value(v.view[0]) if v.view else v  # a view's values are its buffer's draw
        if not inits.get(bound.name) and bound.init is None:
            out[name] = (r.type, r.lengths)
    return out


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
    (packed_offsets of the lengths: generated, or `given`, the tensors taken in place of drawn ones); an
    input drawn like(x) takes x's values last, as generated or given."""
    out = {}
    for name, init in input_inits(graph, instance, inits).items():
        t = instance.type(name)
        buf, index = empty(t, device), owned(t)
        buf[index].copy_(stored(draw_input(init, t, seed, name), t)[index])
        out[name] = buf
    given = given or {}
    out.update(given)
    for name, init in view_inits(graph, instance, inits).items():
        v = graph.value(name)
        if v.view[0] not in given:
            view(v, instance, out).copy_(draw_input(init, instance.type(name), seed, name))
    for name, (placed, lengths) in packed_ragged(graph, instance, inits).items():
        v = graph.value(name)
        if (v.view[0] if v.view else name) not in given:
            offsets = packed_offsets(placed, view(graph.value(lengths), instance, out).cpu())
            view(v, instance, out).copy_(offsets.view(instance.type(name).shape))
    for name, source in copied_inputs(graph, inits).items():
        if name not in given:
            t, index = instance.type(name), owned(instance.type(name))
            values = bits.logical(out[source], instance.type(source))
            out[name] = empty(t, device)
            out[name][index].copy_(stored(values, t)[index])
    return out


TENSOR_FILE_LIMIT = 256 << 30
"""bytes: more than any GPU holds, so a file over it is no input (it would be read into host memory)"""


def load_tensor(path: str | Path) -> torch.Tensor:
    """A tensor from .pt, .npy or .safetensors (a file of one dense tensor); no pickled code runs. Unreadable
    when the path is no regular file of at most TENSOR_FILE_LIMIT bytes."""
    path = Path(path)
    if path.suffix not in (".pt", ".npy", ".safetensors"):
        raise BindingError(f"{path}: unknown tensor file type (use .pt, .npy or .safetensors)")
    with files.open_regular(path, TENSOR_FILE_LIMIT) as f:
        return _tensor_from(path, f)


def _tensor_from(path: Path, f) -> torch.Tensor:
    try:
        if path.suffix == ".pt":
            t = torch.load(f, map_location="cpu", weights_only=True)
        elif path.suffix == ".npy":
            import numpy as np

            t = torch.from_numpy(np.load(f, allow_pickle=False))
        else:
            from safetensors.torch import load

            tensors = load(f.read())
            if len(tensors) != 1:
                raise BindingError(f"{path}: holds {len(tensors)} tensors; give a file of one")
            t = next(iter(tensors.values()))
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
