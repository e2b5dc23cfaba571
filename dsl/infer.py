"""Shape, stride, dtype and attribute inference for one binding of a graph's symbolic dims.

The checker resolves names once into a ``Resolved`` record; a Typer then gives every value a
concrete TensorType and every node its canonical attributes for one binding, reporting into its
own sink so that the checker can merge what several bindings found.
"""

from __future__ import annotations

from typing import Any

import attrs

from dsl.diagnostics import Loc, RuleError, Sink
from dsl.ops import OPS, RETYPABLE, Ctx, canonical
from dsl.resolved import Resolved
from dsl.types import (
    ALIGNMENT,
    INT64_MAX,
    TensorType,
    dense_strides,
    fmt_shape,
    is_float,
    itemsize,
    layout_order,
    left_to_offsets,
    overlap,
    shares_elements,
    storage_elements,
    stride_values,
    token_batch,
)


@attrs.frozen
class Typed:
    types: dict[str, TensorType]
    node_attrs: tuple[tuple[tuple[str, Any], ...], ...]
    """per node: its canonical attributes, sorted by name (empty for a node that failed)"""


class Typer:
    """Infers every value's concrete type, and every node's attributes, for one binding."""

    def __init__(self, resolved: Resolved, binding: dict[str, int], sink: Sink):
        self.r, self.binding, self.sink = resolved, binding, sink
        self.types: dict[str, TensorType] = {}
        self.poisoned: set[str] = set(resolved.poisoned)
        """values whose type could not be inferred in this instance (no cascading errors)"""
        self.scalars: dict[str, TensorType] = {}
        """host scalars typed by their first use: all-ones shape of the rank they meet"""
        self.scalar_uses: dict[str, tuple[int, Loc]] = {}
        self.node_attrs: list[tuple] = []
        self.producer = {o: n for n in resolved.nodes for o in n.outputs}
        self.reads: dict[str, int] = {}
        """how many inputs of the graph's nodes each value is"""
        self.placed: set[str] = set()
        """the inputs a node's ragged offsets place"""
        for n in resolved.nodes:
            for i in n.inputs:
                self.reads[i] = self.reads.get(i, 0) + 1
            self.placed.update(n.inputs[p] for p in OPS[n.op].placed(n.inputs) if p >= 0)

    def concrete(self, dims) -> tuple[int, ...]:
        return tuple(self.binding[d] if isinstance(d, str) else d for d in dims)

    def run(self) -> Typed:
        for name, b in self.r.buffers.items():
            if name not in self.poisoned:
                self.types[name] = TensorType(b.dtype, b.dims, dense_strides(b.dims))
        for name, d in self.r.decls.items():
            if name in self.poisoned or d.kind != "input":
                continue
            self.poisoned.add(name)  # until typed below
            shape = self.concrete(d.dims)
            if d.strides is not None:
                strides = stride_values(d.strides, self.binding)
                if self.stride_too_big(strides, d.loc):
                    continue
                left = int(left_to_offsets(d.strides))  # the offsets place each batch: it aliases no other
                if not left and name in self.placed and token_batch(shape, strides):
                    strides, left = (0, *strides[1:]), 1
                if (ov := overlap(shape[left:], strides[left:])) is not None:
                    a, b = (axis + left for axis in ov)
                    what = f"axis {a} (size {shape[a]}) has stride 0" if a == b else f"axes {a} and {b} overlap"
                    if d.view is None:
                        self.sink.error(f"strides {list(strides)} alias elements of {fmt_shape(shape)}: {what}", d.loc)
                        continue
                    if a != b:  # a view only read may alias; a stride 0 repeats on purpose, a partial overlap rarely
                        self.sink.warning(
                            f"view '{name}' reads elements twice: {what} (strides {list(strides)})", d.loc
                        )
            else:
                strides = dense_strides(shape, layout_order(d.layout or "row_major", len(shape)))
            t = TensorType(d.dtype, shape, strides)
            if self.too_big(t, name, d.loc) or (d.view is not None and not self.in_buffer(name, t, d)):
                continue
            self.types[name] = t
            self.poisoned.discard(name)
        for node in self.r.nodes:
            self.node_attrs.append(self.node(node))
        for name, d in self.r.decls.items():
            if left_to_offsets(d.strides) and name in self.types and not self.reads.get(name):
                self.sink.error(
                    f"'{name}' leaves its batch stride to ragged offsets (`_`), but no op reads it to place it", d.loc
                )
        return Typed({**self.types, **self.scalars}, tuple(self.node_attrs))

    def left(self, name: str | None) -> bool:
        """Whether an input's or an output's declared strides leave its batch stride to ragged offsets (`_`)."""
        d = self.r.decls.get(name) or self.r.outputs.get(name)
        return d is not None and left_to_offsets(d.strides)

    def too_big(self, t: TensorType, name: str, loc: Loc) -> bool:
        if t.too_large:
            self.sink.error(f"'{name}' {fmt_shape(t.shape)} is too large: its size overflows a 64-bit integer", loc)
            return True
        return False

    def stride_too_big(self, strides: tuple[int, ...], loc: Loc) -> bool:
        """A product of dims (`H*W*C`) can pass what a 64-bit stride holds, for some binding."""
        if any(s > INT64_MAX for s in strides):
            self.sink.error(f"strides {list(strides)}: a stride past 2^63-1", loc)
            return True
        return False

    def in_buffer(self, name: str, t: TensorType, d) -> bool:
        """Proves that a view stays inside its buffer and that its address keeps the buffer's alignment."""
        buf, offset = d.view
        size = self.types[buf].numel
        end = offset + storage_elements(t.shape, t.strides)
        if end > size:
            self.sink.error(
                f"{_view_name(d)} {fmt_shape(t.shape)} strides {list(t.strides)} at {offset} reaches element {end - 1} "
                f"of buffer '{buf}', which holds {size}",
                d.view_loc,
            )
            return False
        if offset * itemsize(t.dtype) % ALIGNMENT:
            self.sink.error(
                f"{_view_name(d)} at {offset} starts {offset * itemsize(t.dtype)} bytes into '{buf}', not a multiple "
                f"of {ALIGNMENT}: cuDNN wants {ALIGNMENT}-byte aligned tensors",
                d.view_loc,
            )
            return False
        return True

    def other_views(self, name: str, o) -> None:
        """An output in place of a view must not write what another view of the buffer reads, nor what
        another output placed in the buffer writes."""
        target = self.r.decls[o.into]
        if target.view is None:
            return
        for other, d in self.r.decls.items():
            if other == o.into or d.view is None or d.view[0] != target.view[0] or other not in self.types:
                continue
            shared = shares_elements(self.types[o.into], target.view[1], self.types[other], d.view[1])
            does = "writes" if d.placed_for else "reads"
            if shared:
                self.sink.error(
                    f"output '{name}' {_place_text(o, target)} overwrites elements that {_view_name(d)} {does}",
                    o.into_loc,
                    [(f"'{d.placed_for or other}' is declared here", d.loc)],
                )
            elif shared is None:
                self.sink.warning(
                    f"output '{name}' {_place_text(o, target)}: no proof that it leaves alone what "
                    f"{_view_name(d)} {does} (their dims or strides differ)",
                    o.into_loc,
                )

    def scalar_type(self, name: str, rank: int, loc: Loc) -> TensorType | None:
        """The all-ones type of a host scalar at the rank it meets; None (reported) when a scalar
        meets a second rank: cuDNN gives a pass-by-value tensor one shape."""
        d = self.r.decls[name]
        prev = self.scalar_uses.setdefault(name, (rank, loc))
        if prev[0] != rank and d.kind == "scalar":
            self.sink.error(
                f"scalar '{name}' is used with tensors of rank {prev[0]} and {rank}; declare one scalar per rank",
                loc,
                [("first use", prev[1])],
            )
            return None
        shape = (1,) * rank
        return self.scalars.setdefault(name, TensorType(d.dtype, shape, dense_strides(shape)))

    def node(self, n) -> tuple:
        """Types one node's results; returns its canonical attributes (empty when it failed)."""
        if not n.ok or any(
            i is not None and (i in self.poisoned or (i not in self.types and i not in self.r.decls)) for i in n.inputs
        ):
            self.poisoned.update(n.outputs)
            return ()
        sig = OPS[n.op]
        placed, ports = sig.placed(n.inputs), sig.inputs + sig.optional
        for k, i in enumerate(n.inputs):
            if self.left(i) and k not in placed:
                port = ports[min(k, len(ports) - 1)]
                self.sink.error(
                    f"{n.op}: '{i}' leaves its batch stride to ragged offsets (`_`), but none place it as {port}",
                    n.arg_locs[k],
                )
                self.poisoned.update(n.outputs)
                return ()
        tensor_rank = next((len(self.types[i].shape) for i in n.inputs if i in self.types), None)
        ins = []
        for k, i in enumerate(n.inputs):
            if i is None:
                ins.append(None)
            elif i in self.types:
                ins.append(self.types[i])
            elif tensor_rank is None:
                self.sink.error(f"{n.op}: needs at least one tensor input, not only scalars", n.loc)
                self.poisoned.update(n.outputs)
                return ()
            elif (st := self.scalar_type(i, tensor_rank, n.arg_locs[k])) is None:
                self.poisoned.update(n.outputs)
                return ()
            else:
                ins.append(st)
        if any(self.scalar_type(s, tensor_rank, n.attr_locs[a]) is None for a, s in n.scalars.items()):
            self.poisoned.update(n.outputs)
            return ()
        try:
            full = canonical(sig, n.attrs, tuple(ins))
            outs = sig.infer(Ctx(n.op, tuple(ins), full))
        except RuleError as e:
            self.sink.error(str(e), _at(n, e.at))
            self.poisoned.update(n.outputs)
            return ()
        for at, text in sig.notes(Ctx(n.op, tuple(ins), full), n.attrs) if sig.notes is not None else ():
            self.sink.note(text, _at(n, at))
        first = next(t for t in ins if t is not None)
        for name, out in zip(n.outputs, outs):
            self.result(name, out, first, n)
        return tuple(sorted(full.items()))

    def result(self, name: str, out, first: TensorType, n) -> None:
        self.poisoned.add(name)  # until typed at the end
        o = self.r.outputs.get(name)
        v = self.r.typed.get(name)  # `name : DTYPE = ...`
        sig = OPS[n.op]
        keeps = sig.keeps_dtype
        what = f"output '{name}'" if o else f"'{name}'"
        declared = [d.dtype for d in (o, v) if d is not None and d.dtype]
        if len(set(declared)) > 1:
            self.sink.error(f"{what} is declared {declared[1]} where it is computed, and {declared[0]} here", o.loc)
            return
        if declared and out.dtype and declared[0] != out.dtype:
            where = next(d for d in (o, v) if d is not None and d.dtype).loc
            self.sink.error(f"{what} is declared {declared[0]} but {n.op} gives {out.dtype}", where)
            return
        for d in (o, v):
            if d is not None and d.dims is not None:
                want = self.concrete(d.dims)
                if want != out.shape:
                    self.sink.error(
                        f"{what} is declared {fmt_shape(want)} but {n.op} gives {fmt_shape(out.shape)}",
                        d.dims_loc or d.loc,
                    )
                    return
        if o is None:
            dtype = (
                (declared or [None])[0]
                or out.dtype
                or sig.result_dtype
                or (first.dtype if keeps else self.r.intermediate)
            )
            if dtype is None:
                self.no_dtype(name, n)
                return
            t = TensorType(dtype, out.shape, dense_strides(out.shape, out.order))
        elif o.into is not None:
            if o.into not in self.types:  # the input failed, and said so
                return
            t = self.types[o.into]
            if (o.dtype or out.dtype or t.dtype) != t.dtype or out.shape != t.shape:
                target = self.r.decls[o.into]
                self.sink.error(
                    f"output '{name}' is {o.dtype or out.dtype or ''}{fmt_shape(out.shape)}; written "
                    f"{_place_text(o, target)} {t}, it must have that dtype and shape",
                    o.into_loc,
                )
                return
            if overlap(t.shape, t.strides) is not None:
                self.sink.error(
                    f"output '{name}' cannot be written {_place_text(o, self.r.decls[o.into])}: its strides "
                    f"{list(t.strides)} make elements share an address",
                    o.into_loc,
                )
                return
            self.other_views(name, o)
        else:
            dtype = (declared or [None])[0] or out.dtype or sig.result_dtype or self.r.types.get("io", first.dtype)
            strides = dense_strides(out.shape, out.order)
            if o.layout:
                try:
                    strides = dense_strides(out.shape, layout_order(o.layout, len(out.shape)))
                except RuleError as e:
                    self.sink.error(str(e), o.loc)
                    return
            elif o.strides:
                strides = stride_values(o.strides, self.binding)
                if len(strides) != len(out.shape):
                    self.sink.error(f"{len(strides)} strides for output '{name}' of rank {len(out.shape)}", o.loc)
                    return
                if self.stride_too_big(strides, o.loc):
                    return
                left = int(left_to_offsets(o.strides))
                placed = -1 - n.outputs.index(name) in OPS[n.op].placed(n.inputs)
                if not left and placed and token_batch(out.shape, strides):
                    strides, left = (0, *strides[1:]), 1
                if overlap(out.shape[left:], strides[left:]) is not None:
                    self.sink.error(
                        f"strides {list(strides)} overlap for output '{name}' {fmt_shape(out.shape)}", o.loc
                    )
                    return
                if left and not placed:
                    self.sink.error(
                        f"output '{name}' leaves its batch stride to ragged offsets (`_`), but {n.op} is given none "
                        "that place it",
                        o.loc,
                    )
                    return
            t = TensorType(dtype, out.shape, strides)
        if keeps and t.dtype != first.dtype and not self.retyped(n, t.dtype, what):
            where = "declared" if declared else "the graph's io"
            fix = f"declare '{'output ' if o else ''}{name} : {first.dtype}'"
            if o and n.inputs[0] not in self.r.decls:  # a virtual input: its dtype is the intermediate one
                fix += f", or compute the input as {t.dtype} ('intermediate {t.dtype}')"
            self.sink.error(
                f"{n.op}: cuDNN keeps the input's dtype, {first.dtype}, but {what} is {t.dtype} ({where}); {fix}",
                n.loc,
            )
            return
        if not self.too_big(t, name, n.loc):
            self.types[name] = t
            self.poisoned.discard(name)

    def no_dtype(self, name: str, n) -> None:
        """A virtual value that nothing gives a dtype in a graph whose intermediate type is unset: says what to add."""
        if len(n.outputs) > 1:
            what, fix = (
                f"'{name}'",
                f"make it an output ('output {name} : DTYPE'), or give the graph an intermediate type",
            )
        elif name in self.r.user_names:
            what, fix = f"'{name}'", f"declare it ('{name} : DTYPE = ...')"
        else:
            what, fix = f"the result of {n.op}", f"name it and declare its dtype ('NAME : DTYPE = {n.op}(...)')"
        self.sink.error(
            f"{what} has no dtype: the graph's intermediate type is unset; {fix}",
            n.loc,
            [("the graph's intermediate type is unset here", self.r.type_locs["intermediate"])],
        )

    def retyped(self, n, dtype: str, what: str) -> bool:
        """Types a layout op's input in `dtype`, the dtype its result must have (cuDNN keeps it), where that input
        is a virtual value that an op of a RETYPABLE family computes, directly or through other layout ops, and
        only the next op of the chain reads; notes it at that op. False (nothing changed) where not."""
        chain, v = [], n.inputs[0]
        while True:
            p = self.producer.get(v)
            if p is None or v in self.r.outputs or v in self.r.typed or self.reads[v] != 1 or len(p.outputs) != 1:
                return False
            if not (is_float(self.types[v].dtype) and is_float(dtype)):  # a bool or an index is no rounding
                return False
            chain.append(v)
            if OPS[p.op].family in RETYPABLE:
                break
            if not OPS[p.op].keeps_dtype or len(p.inputs) != 1:
                return False
            v = p.inputs[0]
        was = self.types[chain[-1]].dtype
        for v in chain:
            self.types[v] = attrs.evolve(self.types[v], dtype=dtype)
        self.sink.note(
            f"{p.op} writes its result in {dtype}, not {was}: {n.op} keeps its input's dtype in "
            f"cuDNN, and {what} is {dtype}",
            p.loc,
        )
        return True


def _view_name(d) -> str:
    """A view as a message names it: the output placed in a buffer that it was declared for, or the view."""
    return f"output '{d.placed_for}'" if d.placed_for else f"view '{d.name}'"


def _place_text(o, target) -> str:
    """Where an output is written, as written: 'in dqkv at 512' (placed in a buffer), 'in place of x'."""
    return f"in '{target.view[0]}' at {target.view[1]}" if target.placed_for else f"in place of '{o.into}'"


def _at(n, at: int | str | None) -> Loc:
    """Where a node's culprit is written: an input (by index), an attribute (by name), else the call."""
    if isinstance(at, int) and at < len(n.arg_locs):
        return n.arg_locs[at]
    if isinstance(at, str) and at in n.attr_locs:
        return n.attr_locs[at]
    return n.loc
