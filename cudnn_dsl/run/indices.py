"""Index inputs — sequence lengths, page tables, ragged offsets: which inputs they are (from the op
registry's domains, block tables and ragged rows), and their values checked before cuDNN reads them.

cuDNN takes an index as it is: a block index past the cache, or an offset past the buffer, reads or writes
outside the memory it was given. So the values of every index input a caller binds are checked where the
bindings are first checked (the reference, a compiled graph's call, bind, capture and launch plan, `run`'s
inputs), with a located error naming the tensor, the element and the bound.
"""

from __future__ import annotations

import attrs

from cudnn_dsl.run.buffers import BindingError, view
from cudnn_dsl.target import portable
from cudnn_dsl.target.lazy_torch import torch
from dsl.ir import Graph, Instance
from dsl.ops import OPS, Ctx
from dsl.types import TensorType, fmt_shape


@attrs.frozen
class Bounded:
    """An integer input whose op takes only the values lo to hi (OpSig.domains)."""

    lo: int
    hi: int
    what: str
    """the op's port, as the message names it: 'seq_len_kv of sdpa'"""
    blocks: bool
    """a list of a cache's blocks (OpSig.block_tables)"""
    share: int = 1
    """how many sequences share the hi rows: a batch's lengths of a tensor whose batch stride the ragged offsets
    replace (`_`), whose memory holds hi rows for all of them (generated lengths take their share)"""


def bounded_inputs(graph: Graph, instance: Instance) -> dict[str, Bounded]:
    """The integer inputs whose op takes only some values (sdpa's sequence lengths and page tables), by name."""
    out = {}
    for index, n in enumerate(graph.nodes):
        sig = OPS[n.op]
        if sig.domains is None:
            continue
        types = tuple(instance.type(i) if i else None for i in n.inputs)
        ports = sig.inputs + sig.optional
        shared = {  # the lengths of tensors left to their offsets: B sequences in one batch slice
            lengths: t.shape[0]
            for off, port, lengths in sig.ragged
            if off < len(n.inputs) and n.inputs[off]
            for t in [instance.type(n.inputs[port] if port >= 0 else n.outputs[-1 - port])]
            if t.strides[0] == 0
        }
        for i, (lo, hi) in sig.domains(Ctx(n.op, types, instance.attrs(index))).items():
            if n.inputs[i]:
                out[n.inputs[i]] = Bounded(lo, hi, f"{ports[i]} of {n.op}", i in sig.block_tables, shared.get(i, 1))
    return out


@attrs.frozen
class Ragged:
    """Ragged offsets (OpSig.ragged): where each sequence of the tensors they place starts."""

    placed: tuple[tuple[str, TensorType], ...]
    """the tensors they place, by name: one offset input may place several whose sequences take one room"""
    lengths: str
    """the input of the sequences' lengths"""
    what: str

    @property
    def type(self) -> TensorType:
        return self.placed[0][1]


def ragged_offsets(graph: Graph, instance: Instance) -> dict[str, Ragged]:
    """The ragged offset inputs by name; BindingError, at its declaration, for one that places tensors whose
    sequences take different room (no one packing fits both)."""
    out: dict[str, Ragged] = {}
    for n in graph.nodes:
        sig = OPS[n.op]
        for off, port, lengths in sig.ragged:
            if off < len(n.inputs) and n.inputs[off] and n.inputs[lengths]:
                name, placed = n.inputs[off], n.inputs[port] if port >= 0 else n.outputs[-1 - port]
                t = instance.type(placed)
                before = out.get(name)
                if before is not None and _spans(before.type) != _spans(t):
                    raise BindingError(
                        f"ragged offsets '{name}' place tensors whose sequences take different room "
                        f"({fmt_shape(before.type.shape)} and {fmt_shape(t.shape)}): give each its own offsets",
                        graph.value(name).loc,
                    )
                what = f"{(sig.inputs + sig.optional)[off]} of {n.op}"
                out[name] = Ragged((before.placed if before else ()) + ((placed, t),), n.inputs[lengths], what)
    return out


def _spans(t: TensorType) -> tuple[int, int]:
    return portable.ragged_span(t.shape, t.strides)


def check_indices(graph: Graph, inst: Instance, tensors: dict) -> None:
    """The values of the bound index inputs (a view's, on its buffer), checked: each bounded input's elements
    within its op's bounds, then each ragged offset input's sequences in order inside the tensors they place.
    A graph without index inputs costs nothing; one with them copies those (small) tensors to the host once,
    after a synchronization of their device."""
    bounded, ragged = bounded_inputs(graph, inst), ragged_offsets(graph, inst)
    if not bounded and not ragged:
        return
    values = _on_host(graph, inst, tensors, set(bounded) | set(ragged) | {r.lengths for r in ragged.values()})
    for name, b in bounded.items():
        if name in values:
            _check_bounds(graph, name, values[name], b)
    for name, r in ragged.items():
        if name in values and r.lengths in values:
            _check_offsets(graph, name, values[name], values[r.lengths], r)


def _on_host(graph: Graph, inst: Instance, tensors: dict, names: set[str]) -> dict[str, torch.Tensor]:
    """The named inputs' values as int64 CPU tensors of their shapes (those bound, as tensors)."""
    found = {}
    for name in names:
        v = graph.value(name)
        if isinstance(tensors.get(v.view[0] if v.view else name), torch.Tensor):
            found[name] = view(v, inst, tensors)
    for device in {t.device for t in found.values() if t.is_cuda}:
        torch.cuda.synchronize(device)  # whatever stream wrote them, the values are read once it has
    return {name: t.detach().cpu().long() for name, t in found.items()}


def _at(t: torch.Tensor, flat: int) -> str:
    """'element [1, 0, 2, 0]' of a tensor, by its index in row-major order."""
    return "element [" + ", ".join(str(int(i)) for i in torch.unravel_index(torch.tensor(flat), t.shape)) + "]"


def _check_bounds(graph: Graph, name: str, values: torch.Tensor, b: Bounded) -> None:
    flat = values.flatten()
    bad = ((flat < b.lo) | (flat > b.hi)).nonzero()
    if not bad.numel():
        return
    k = int(bad[0])
    which = "the blocks of its cache" if b.blocks else f"the values {b.what} takes"
    raise BindingError(
        f"'{name}' ({b.what}): {_at(values, k)} is {int(flat[k])}, outside {b.lo} to {b.hi} ({which})",
        graph.value(name).loc,
    )


def _check_offsets(graph: Graph, name: str, offsets: torch.Tensor, lengths: torch.Tensor, r: Ragged) -> None:
    """Sequence b of each placed tensor starts at offsets[b] >= 0 and ends at offsets[b + 1] or before, and
    offsets[B] (one past the last, as the frontend defines them) is inside the tensor: the offsets rise, and
    no sequence reaches another or past its buffer."""
    flat, lens, loc = offsets.flatten().tolist(), lengths.flatten().tolist(), graph.value(name).loc
    if flat[0] < 0:
        raise BindingError(f"'{name}' ({r.what}): {_at(offsets, 0)} is {flat[0]}; an offset is at least 0", loc)
    for placed, t in r.placed:
        row, rest = _spans(t)
        for b, length in enumerate(lens):
            end = flat[b] + length * row + rest
            if end > flat[b + 1]:
                raise BindingError(
                    f"'{name}' ({r.what}): sequence {b} of '{placed}' ({length} rows of '{r.lengths}', from "
                    f"element {flat[b]}) ends at element {end}, past {_at(offsets, b + 1)}, {flat[b + 1]}, "
                    f"where the next starts: offsets rise by at least each sequence's room",
                    loc,
                )
        if flat[-1] > t.storage:
            capacity = f", its token capacity of {t.shape[2]} rows" if t.strides[0] == 0 else ""
            raise BindingError(
                f"'{name}' ({r.what}): {_at(offsets, len(flat) - 1)} is {flat[-1]}, past the end of "
                f"'{placed}' ({t.storage} elements{capacity})",
                loc,
            )
