"""Tuning on first use: a torch op's plans for a shape timed the first time it runs at that shape, the fastest kept
in the plan store, so that later calls and later processes run it. cuDNN's heuristics often rank a slower
runtime-compiled fusion first; tuning costs seconds per shape, once (as torch.compile's max-autotune does)."""

from __future__ import annotations

import sys
import warnings

import torch

from cudnn_dsl.store.files import StoreProblem
from dsl.ir import Instance


def ensure_tuned(cg, inst: Instance) -> None:
    """The shape's plans timed and the fastest stored, unless a tuned plan is stored already or a CUDA graph is
    being captured (nothing may be timed then: the heuristics' plan serves). A failure is a warning: the
    heuristics' plan serves."""
    planner = cg.planner
    if torch.cuda.is_current_stream_capturing() or not planner.use_store:
        return
    shape = f"{cg.graph.name} [{inst.label}]" if inst.binding else cg.graph.name
    try:
        entry = planner.store.get(planner.key(inst))
    except StoreProblem:
        entry = None  # rebuilt and replaced by the tuned one
    if entry is not None and entry.tuned:
        return
    from cudnn_dsl.tune.heuristics import tune

    print(f"cudnn-dsl: tuning {shape} (once: the fastest plan is kept in the plan store)", file=sys.stderr)
    try:
        result = tune(cg, inst)
    except Exception as e:  # noqa: BLE001 - any failure leaves the heuristics' plan, said once
        warnings.warn(f"{shape}: not tuned ({e}); the heuristics' plan runs", stacklevel=2)
        return
    if result.winner is None:
        why = result.check or "no plan ran"
        warnings.warn(f"{shape}: not tuned ({why}); the heuristics' plan runs", stacklevel=2)
