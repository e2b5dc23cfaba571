"""What every op family shares: the signature row (OpSig), what a shape rule sees and gives, canonical
attributes, and what a VJP rule sees of a node.

A family module (``dsl/ops/<family>.py``) holds its rows, their shape rules, flop counts and VJP rules;
``dsl.ops`` assembles the registry from them. A row's name is written once: a family's rows are built with
``Family.op`` and keyed by ``by_name``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import attrs

from dsl.diagnostics import RuleError
from dsl.ir import Node
from dsl.types import TensorType, fmt_shape, is_float
from dsl.values import DERIVED, REQUIRED, Attr


@attrs.frozen
class Out:
    """One inferred result of an op: shape, stride order, and a dtype when the op fixes it."""

    shape: tuple[int, ...]
    order: tuple[int, ...]
    dtype: str | None = None
    """set when the op fixes its result's dtype (sdpa's stats are float)"""


@attrs.frozen
class Ctx:
    """What a shape rule sees: the input types (None for absent optionals) and the canonical attributes."""

    op: str
    inputs: tuple[TensorType | None, ...]
    attrs: dict


@attrs.frozen
class Statistics:
    """The op's results after the first (`OpSig.outputs` names them) are statistics of its inputs: a norm's
    mean and inv_variance, attention's log-sum-exp. No gradient flows back from them, as in torch."""

    switch: tuple[str, object] | None = None
    """the attribute value that makes the op return them (a norm's phase=training, sdpa's stats=true), which
    a derived forward sets when its backward reads them; None: the op always returns them (batchnorm)"""
    written: Literal["as_asked", "together", "always"] = "as_asked"
    """which of them cuDNN must write: "as_asked" (the outputs), "together" (all or none: layernorm's mean and
    inv_variance), "always" (batchnorm's); what no output asks for goes to scratch memory"""

    def all_written(self, asked: bool) -> bool:
        """Whether cuDNN writes every statistic, `asked`: whether the graph outputs any."""
        return self.written == "always" or self.written == "together" and asked


@attrs.frozen
class OpSig:
    name: str
    family: str
    inputs: tuple[str, ...]
    infer: Callable[[Ctx], list[Out]]
    optional: tuple[str, ...] = ()
    attrs: tuple[Attr, ...] = ()
    outputs: tuple[str, ...] = ("out",)
    doc: str = ""
    positive: tuple[int, ...] = ()
    """inputs whose domain is positive (generated test data avoids 0 and negatives there)"""
    prologue: tuple[int, ...] = ()
    """inputs that a pointwise op recomputed in the backward fuses into, in one cuDNN graph, though the op
    reads them from memory otherwise (a norm backward's scale: the zero-centred gamma's `+ 1`; cuDNN 9.28 plans
    both for an H200, tests/test_recompute.py)"""
    flops: Callable[[Ctx, list], int] | None = None
    """floating-point operations for these input and output types (default: one per output element)"""
    results: Callable[[dict], int] | None = None
    """how many of `outputs` a call returns, given its attributes (default: all of them where the call
    returns its statistics, else one)"""
    statistics: Statistics | None = None
    """set when the results after the first are statistics of the inputs"""
    derive: Callable[[Ctx], dict] | None = None
    """fills the attributes whose default is DERIVED, from the input types"""
    lint: Callable[[tuple], list[tuple[int, str]]] | None = None
    """warnings about the declared inputs, as (input index, message); the checker locates them"""
    notes: Callable[[Ctx, dict], list[tuple[int | str, str]]] | None = None
    """what the checker notes about a call, from its types and canonical attributes and the attributes as given:
    a reading of the shapes the call did not spell (a grouped convolution), an attribute given that has no effect
    (so that none the user wrote vanishes in silence); as (culprit: an input index or an attribute name, text)"""
    alone: str = ""
    """advice for where cuDNN runs this op in a part of its own (or leaves it to torch): the spelling that fuses"""
    keeps_dtype: bool = False
    """cuDNN wants the result in the input's dtype (its layout ops do)"""
    result_dtype: str | None = None
    """the result's dtype unless the file declares another (comparisons give bool)"""
    compute: str | None = None
    """this op's compute dtype unless the call says `compute=` (logic ops compute in bool)"""
    inner_tensors: bool = False
    """the frontend makes tensors inside the op in the graph's intermediate type (attention's), and refuses the op
    in a graph that leaves that type unset"""
    variadic: bool = False
    """the last input repeats: a call takes len(inputs) or more (concatenate)"""
    ragged: tuple[tuple[int, int, int], ...] = ()
    """ragged offsets, as (offset input, the tensor it places: an input index, or -1 - k for output k,
    the lengths input): sequence b of that tensor starts at element offset[b], in place of b times
    its batch stride; generated offsets pack the sequences back to back (sdpa's THD layout)"""

    by_value: tuple[str, ...] = ()
    """inputs that a host `scalar` may feed, as cuDNN's pass-by-value tensor set per call (attention's
    scale and dropout scales); a scalar feeds no other port of an op outside the pointwise family"""

    folded: tuple[str, ...] = ()
    """attributes that only spell others: `derive` folds them in and the IR drops them"""
    domains: Callable[[Ctx], dict[int, tuple[int, int]]] | None = None
    """integer inputs' valid values [lo, hi], by input index, from the input types and canonical
    attributes (sdpa's sequence lengths are in [1, S], its page tables index K/V's blocks);
    generated test data stays inside, and the values a caller binds are checked against them"""
    block_tables: tuple[int, ...] = ()
    """inputs among `domains` that list blocks of a cache (sdpa's page tables): generated as a random
    permutation of the blocks, so that no two sequences share one while the cache has enough"""

    @property
    def ports(self) -> str:
        """How messages and docs list the inputs: `x, w, [bias]`, or `x, x, ...` when the last repeats."""
        more = (self.inputs[-1], "...") if self.variadic else ()
        return ", ".join(self.inputs + more + tuple(f"[{p}]" for p in self.optional))

    def placed(self, inputs) -> set[int]:
        """The ports whose tensor one of the given ragged offsets places (an input index, or -1 - k for output k)."""
        return {port for off, port, _ in self.ragged if off < len(inputs) and inputs[off]}

    def count_results(self, attrs_: dict) -> int:
        if self.results is not None:
            return self.results(attrs_)
        stats = self.statistics
        if stats is not None and (stats.switch is None or attrs_.get(stats.switch[0]) == stats.switch[1]):
            return len(self.outputs)
        return 1

    def count_flops(self, ctx: Ctx, outs: list[TensorType]) -> int:
        if self.flops is not None:
            return self.flops(ctx, outs)
        return sum(math.prod(o.shape) for o in outs)

    def attr(self, name: str) -> Attr | None:
        for a in self.attrs + COMMON_ATTRS:
            if a.name == name:
                return a
        return None

    @property
    def all_attrs(self) -> tuple[Attr, ...]:
        return self.attrs + COMMON_ATTRS


RETYPABLE = ("pointwise", "matmul", "conv")
"""the op families whose result cuDNN writes in whichever dtype the graph declares for it"""


@attrs.frozen
class Family:
    """What ops of one kind share: the word cuDNN's messages use for them, and advice for when
    cuDNN declines a graph holding one."""

    name: str
    words: tuple[str, ...]
    advice: str

    def op(self, name: str, inputs: tuple[str, ...], infer: Callable[[Ctx], list[Out]], **fields) -> OpSig:
        """A row of this family."""
        return OpSig(name, self.name, inputs, infer, **fields)


def by_name(*sigs: OpSig) -> dict[str, OpSig]:
    """Rows keyed by their names, each name once."""
    out = {s.name: s for s in sigs}
    assert len(out) == len(sigs), [s.name for s in sigs]
    return out


COMMON_ATTRS = (
    Attr("compute", "dtype", None, doc="compute data type of this op (default: the graph's)", optional=True),
)


def canonical(sig: OpSig, given: dict, inputs: tuple[TensorType | None, ...]) -> dict:
    """The full attribute set of one application: given values, defaults, spatial lists expanded to
    the spatial rank, derived values computed. RuleError(at=name) when a given value does not fit."""
    out: dict[str, Any] = {}
    for a in sig.attrs:
        v = given.get(a.name, a.default)
        if a.kind == "spatial" and v is not None:
            n = len(inputs[0].shape) - 2
            if isinstance(v, int):
                v = (v,) * n
            elif len(v) != n:
                raise RuleError(f"{sig.name}: '{a.name}' has {len(v)} values, the input has {n} spatial dims", a.name)
        out[a.name] = v
    if sig.derive is not None:
        out.update(sig.derive(Ctx(sig.name, inputs, out)))
    for name in sig.folded:
        del out[name]
    assert not any(v is DERIVED or v is REQUIRED for v in out.values()), out
    return out


# ---- shape rules and flop counts of several families --------------------------------------------------------


def row_major(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


def same_kind(ctx: Ctx, *idx: int) -> None:
    """Floats and integers do not mix; a bool mixes with either, as 0 and 1 (cuDNN's bitmask samples
    multiply a gradient by a bool mask)."""
    ts = [(i, ctx.inputs[i]) for i in idx if ctx.inputs[i] is not None and ctx.inputs[i].dtype != "bool"]
    for i, t in ts[1:]:
        if is_float(t.dtype) != is_float(ts[0][1].dtype):
            raise RuleError(
                f"{ctx.op}: dtype conflict: input {ts[0][0] + 1} is {ts[0][1].dtype}, input {i + 1} is {t.dtype}",
                i,
            )


def same_shape(ctx: Ctx, sig: OpSig, i: int, want: tuple[int, ...], what: str) -> None:
    """Input i of `sig`, when given, is of shape `want` (`what` says why)."""
    t = ctx.inputs[i]
    if t is not None and t.shape != want:
        name = (sig.inputs + sig.optional)[i]
        raise RuleError(f"{ctx.op}: {name} {fmt_shape(t.shape)} must be {fmt_shape(want)} ({what})", i)


def flops_per_element(n: int) -> Callable[[Ctx, list], int]:
    """An estimate: `n` operations per element of the first input (a norm's statistics, normalization, scale
    and shift)."""
    return lambda ctx, outs: n * math.prod(ctx.inputs[0].shape)


# ---- VJP rules ----------------------------------------------------------------------------------------------
# `VJPS[op](e, n)` returns, per input of the node, the name of that input's gradient in the backward
# graph (None: no gradient flows there). `n.dy` is the gradient of the node's first result; `e` emits
# ops of the backward graph (dsl.autodiff.Emit) and reads forward values: `e.fwd(name)` (an
# intermediate is saved by the forward), `e.fwd_t(name)` (its last two axes swapped: a declared view
# of the same memory, no transpose op), `e.fwd_flat_t(name)` ([B.., M, K] as the view [1.., K, B*M], or None
# where its strides make no view), `e.stats(n, k)`: the op's first k statistics (the forward returns them, or
# is made to: Statistics.switch); `e.cast(g, dtype)` and `e.reshape(g, shape)` give a backward value in another
# dtype or shape. A gradient of a broadcast input is summed back to its shape by the caller. An op that has
# no VJP is in NO_VJP with the reason. Where the cuDNN that runs the graph has the frontend's backward op for
# the form (`e.avoid`: the quirks table), the rule emits it; elsewhere (a form with no engine, a gradient of the
# fused op left unread) it falls back to a chain of registry ops.


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

Recompute = Callable[..., str]
"""`RECOMPUTE[op](e, op, args, attrs)`: a cheap op's result computed again in the backward graph from `args` (backward
names, numbers, None for an optional input not given) with the node's canonical `attrs`, in registry ops that fuse
with the pointwise ops reading it; dsl.autodiff chooses it over saving the result where that saves bytes"""


def recompute_as_itself(e, op: str, args: tuple, attrs: dict) -> str:
    """A pointwise op, recomputed as it is."""
    return e.call(op, *args, **attrs)


def x_of(e, n: At) -> str:
    """The node's first input, saved by the forward."""
    return e.fwd(n.inputs[0])


def y_of(e, n: At) -> str:
    """The node's first result, saved by the forward."""
    return e.fwd(n.out)


SECOND_ORDER = "it is itself a gradient; second derivatives are not derived"
