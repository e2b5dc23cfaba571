"""The `cudnn_dsl` namespace in torch.library, shared by the graph ops and their training ops: its one
Library fragment, the tags of its ops, and a kernel's outputs as a schema returns them."""

from __future__ import annotations

import torch

NAMESPACE = "cudnn_dsl"
LAYOUT_TAGS = (torch.Tag.needs_exact_strides,)
"""the tags of every op of the namespace: Inductor passes each argument with the strides eager mode gives it
(not a layout of its choosing, padded or reordered), so that the layout contract (torch_op.layout) sees them"""
_LIB: list = []
"""the one torch.library.Library fragment of the namespace, made on first use"""


def fragment() -> torch.library.Library:
    if not _LIB:
        _LIB.append(torch.library.Library(NAMESPACE, "FRAGMENT"))
    return _LIB[0]


def returned(outs: list):
    """A kernel's result as its schema returns it: nothing, one tensor, or a tuple."""
    return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)


def results(result) -> tuple:
    """A kernel's result as a tuple (nothing, one tensor, or several): `returned` undone."""
    return () if result is None else (result,) if isinstance(result, torch.Tensor) else tuple(result)
