"""Tuning on first use: a torch op's plans for a shape timed the first time it runs at that shape, the fastest kept
in the plan store, so that later calls and later processes run it. cuDNN's heuristics often rank a slower
runtime-compiled fusion first; tuning costs seconds per shape, once (as torch.compile's max-autotune does)."""

from __future__ import annotations

import sys
import warnings

from cudnn_dsl.store.files import StoreProblem
from dsl.ir import Instance


def ensure_tuned(cg, inst: Instance) -> None:
    """The shape's plans timed and the fastest kept (in the plan store, where it is used), unless a tuned plan is
    stored already. A failure is a warning: the heuristics' plan serves. Never call it while a CUDA graph is
    captured (nothing may be timed then)."""
    planner = cg.planner
    shape = f"{cg.graph.name} [{inst.label}]" if inst.binding else cg.graph.name
    try:
        entry = planner.store.get(planner.key(inst)) if planner.use_store and not planner.rebuild else None
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
