"""Sweeps: many graphs × shapes × GPU types or (target, cuDNN) pairs planned on the CPU, run by an executor (this
machine's workers, or Ray), their measurements merged into one fleet store whose manifest deployments pin.

    from cudnn_dsl import sweep
    work = sweep.plan(sweep.Spec.load("sweep.toml"))
    print(work.summary())
    result = sweep.run(work, sweep.LocalExecutor())
    print(result.merged.digest)

docs/fleet.md has the spec, the store's layout and the rules of the merge.
"""

from __future__ import annotations

import secrets

import attrs

from cudnn_dsl.sweep.local import LocalExecutor
from cudnn_dsl.sweep.merge import Merged, merge, stored
from cudnn_dsl.sweep.on_ray import RayExecutor
from cudnn_dsl.sweep.run import NotResumable, Result, resume, run
from cudnn_dsl.sweep.spec import Spec, SpecError
from cudnn_dsl.sweep.units import Unit, Work
from cudnn_dsl.sweep.units import plan as _plan

__all__ = [
    "LocalExecutor",
    "Merged",
    "NotResumable",
    "RayExecutor",
    "Result",
    "Spec",
    "SpecError",
    "Unit",
    "Work",
    "merge",
    "plan",
    "resume",
    "run",
]


def plan(spec: Spec, *, retune: bool = False, progress=None) -> Work:
    """The spec's work, planned on the CPU. Shapes the spec's store already answers are skipped, and a sweep of the
    same work run again resumes from its checkpoint; retune runs every shape anew, in a staging directory of its
    own."""
    work = _plan(spec, None if retune or not spec.store else stored(spec.store), progress)
    return attrs.evolve(work, round=secrets.token_hex(8)) if retune else work
