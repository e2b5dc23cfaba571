"""The whole engine space: every engine and knob combination cuDNN enumerates (tune --exhaustive)."""

from __future__ import annotations

import attrs

from cudnn_dsl.build.constraints import frontend_knobs, note_filters
from cudnn_dsl.build.lower import Lowered, clean
from dsl.options import Options


@attrs.frozen
class KnobRange:
    """One knob of an engine as cuDNN enumerates it: its frontend name, least and greatest value, stride."""

    name: str
    lo: int
    hi: int
    stride: int

    @property
    def values(self) -> range:
        return range(self.lo, self.hi + 1, max(self.stride, 1))


def engine_space(low: Lowered) -> dict[int, list[KnobRange] | str]:
    """Every engine id cuDNN has for this graph (get_engine_count) with its knobs (get_knobs_for_engine), or why
    cuDNN has no knobs for it here (an engine that cannot serve the graph)."""
    g, out = low.g, {}
    for e in range(int(g.get_engine_count())):
        try:
            out[e] = [
                KnobRange(k.type.name, int(k.min_value), int(k.max_value), int(k.stride))
                for k in g.get_knobs_for_engine(e)
            ]
        except Exception as ex:  # noqa: BLE001 - cuDNN says NOT_SUPPORTED for an engine that cannot run the graph
            out[e] = clean(ex, 200)
    return out


def add_plan(low: Lowered, engine: int, knobs: dict[str, int], options: Options) -> int:
    """Appends the plan of this engine and knobs to the graph's list (create_execution_plan), under the options'
    note constraints, and returns its index; raises when cuDNN refuses the configuration."""
    low.g.create_execution_plan(engine, frontend_knobs(knobs))
    low.plan_count = int(low.g.get_execution_plan_count())
    note_filters(low.g, options)
    return low.plan_count - 1
