"""The torch reference and cuDNN Frontend lowering of every op, assembled from one module per op family: the
twins of dsl/ops/'s family modules, keyed by the same op names (a test proves it)."""

from __future__ import annotations

from cudnn_dsl.ops import attention, conv, layout, matmul, norm, pointwise, quantize, reduction
from cudnn_dsl.ops.base import OpImpl
from cudnn_dsl.ops.pointwise import CUDNN_NAME
from dsl.ops import BACKWARD_OPS

__all__ = ["BACKWARD_IMPLS", "CUDNN_NAME", "FAMILY_MODULES", "IMPLS", "OpImpl"]

FAMILY_MODULES = (pointwise, conv, matmul, reduction, attention, norm, layout, quantize)

IMPLS: dict[str, OpImpl] = {op: impl for m in FAMILY_MODULES for op, impl in m.IMPLS.items()}
"""every op, the backward ones included"""
BACKWARD_IMPLS = {op: IMPLS[op] for op in BACKWARD_OPS}
"""the frontend's backward ops (dsl.ops.BACKWARD_OPS)"""
