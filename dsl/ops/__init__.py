"""The op registry of the language, assembled from one module per op family: every op's signature,
attributes, shape and dtype rules, flop count and VJP rule.

The checker reads it; so does the back end (``cudnn_dsl/ops/``: torch reference and cuDNN lowering), whose
family modules hold the same ops as these (a test proves it). Attributes reach the back end canonical: every
default filled, every list at its full length, every enum in its declared spelling (``canonical``), so no
back-end row ever fills a default.
"""

from __future__ import annotations

from dsl.ops import attention, conv, layout, matmul, norm, pointwise, quantize, reduction
from dsl.ops.attention import BSHD, SDPA_ALIGNMENTS
from dsl.ops.base import COMMON_ATTRS, RETYPABLE, At, Ctx, Family, OpSig, Out, Recompute, Rule, Statistics, canonical
from dsl.ops.norm import norm_axes
from dsl.ops.pointwise import INFIX
from dsl.ops.reduction import REDUCTION_MODES

__all__ = [
    "BACKWARD_OPS",
    "BSHD",
    "COMMON_ATTRS",
    "EMIT_STATISTICS",
    "FAMILIES",
    "FAMILY_MODULES",
    "INFIX",
    "NO_VJP",
    "OPS",
    "RECOMPUTE",
    "REDUCTION_MODES",
    "RETYPABLE",
    "SDPA_ALIGNMENTS",
    "STATISTICS",
    "VJPS",
    "At",
    "Ctx",
    "Family",
    "OpSig",
    "Out",
    "Recompute",
    "Rule",
    "Statistics",
    "canonical",
    "norm_axes",
]

FAMILY_MODULES = (pointwise, conv, matmul, reduction, attention, norm, layout, quantize)
"""one module per family, in the order the docs list them"""

FAMILIES = {m.FAMILY.name: m.FAMILY for m in FAMILY_MODULES}
OPS = {name: sig for m in FAMILY_MODULES for name, sig in m.OPS.items()}
"""every op, the backward ones included"""
BACKWARD_OPS = {name: sig for m in FAMILY_MODULES for name, sig in m.BACKWARD_OPS.items()}
"""the frontend's backward ops (`<op>_backward`), which derived backward graphs use"""

VJPS: dict[str, Rule] = {op: rule for m in FAMILY_MODULES for op, rule in m.VJPS.items()}
"""the vector-Jacobian product of each op, in terms of registry ops (dsl.ops.base says how a rule reads)"""
RECOMPUTE: dict[str, Recompute] = {op: rule for m in FAMILY_MODULES for op, rule in m.RECOMPUTE.items()}
"""how each cheap op is computed again in a backward graph instead of saved (dsl.ops.base.Recompute)"""
NO_VJP: dict[str, str] = {op: why for m in FAMILY_MODULES for op, why in m.NO_VJP.items()}
"""the ops with no VJP rule, and why"""

STATISTICS = {op for op, sig in OPS.items() if sig.statistics is not None}
"""ops whose results after the first are statistics: no gradient flows back from them (as in torch)"""
EMIT_STATISTICS: dict[str, tuple[str, object]] = {
    op: sig.statistics.switch for op, sig in OPS.items() if sig.statistics is not None and sig.statistics.switch
}
"""the attribute that makes an op also return its statistics: `e.stats` sets it in the derived forward when the
graph leaves it off"""
