"""Runtime layer: one shape of a graph that cuDNN declined whole, run as its parts in order.

The parts come from `partition.find_partition`, with acceptance decided by building each
candidate part on this GPU (so each part's plan is in the plan store like any graph's). Tensors
that one part makes and a later part reads are allocated here, in their inferred dtype; an op
no engine runs is its torch reference on the GPU, rounded to its result's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cudnn_dsl.bits import logical
from cudnn_dsl.dtypes import torch_dtype
from cudnn_dsl.ops import IMPLS
from cudnn_dsl.partition import Partition, find_partition, short
from cudnn_dsl.tensors import empty, snapshot, stored, view
from dsl.diagnostics import DslError
from dsl.ir import Graph, Instance


class Staged:
    """The parts of one shape, each a compiled graph (None: a torch fallback), and how to run them."""

    def __init__(self, graph: Graph, inst: Instance, partition: Partition, compiled: list):
        self.graph, self.inst, self.partition, self.compiled = graph, inst, partition, compiled

    @property
    def lines(self) -> list[str]:
        return self.partition.lines(self.graph)

    def run(self, tensors: dict[str, Any], outputs: dict[str, torch.Tensor]) -> None:
        """Runs every part in order: reads `tensors` (inputs and scalars by name), writes `outputs`. An input
        that an output overwrites is read from a copy: a later part reads it as it was before the launch."""
        env: dict[str, Any] = {**snapshot(self.graph, tensors), **outputs}
        for k in range(len(self.compiled)):
            self.run_part(k, env)

    def run_part(self, k: int, env: dict[str, Any]) -> None:
        """Runs part k on the tensors of `env` (by name); what it makes is written into the buffers
        `env` holds for it, or into new ones it adds."""
        part, cg = self.partition.parts[k], self.compiled[k]
        device = next(t.device for t in env.values() if isinstance(t, torch.Tensor))
        if cg is None:
            node = self.graph.nodes[part.first]
            ins = [None if i is None else _wide(self._value(env, i), self.graph, i, device) for i in node.inputs]
            with torch.no_grad():
                results = IMPLS[node.op].ref(
                    ins, self.inst.attrs(part.first), [self.inst.type(o) for o in node.outputs]
                )
            for name, r in zip(node.outputs, results):  # into a buffer as cuDNN would hold it
                t = self.inst.type(name)
                if name not in env:
                    env[name] = empty(t, device)
                env[name].copy_(stored(r.to(torch_dtype(t.dtype)), t))
            return
        made = {v.name: env.get(v.name) for v in cg.graph.outputs}
        for name, buf in made.items():
            if buf is None:
                made[name] = env[name] = empty(self.inst.type(name), device)
        cg({v.name: env[v.name] for v in cg.graph.inputs if v.name in env}, made)

    def _value(self, env: dict, name: str):
        """A tensor as values (a bool one unpacked; a view read off its buffer), or a scalar given by
        value; None: a declared scalar."""
        value, v = env.get(name), self.graph.value(name)
        if value is None and v.view is not None:
            value = view(v, self.inst, env)
        if isinstance(value, torch.Tensor):
            return logical(value, self.inst.type(name))
        return value


def _wide(value, graph: Graph, name: str, device) -> torch.Tensor:
    """An input of a fallback op as its reference wants it: float32 (float64 for double), on the GPU."""
    if not isinstance(value, torch.Tensor):  # a scalar given by value
        value = torch.as_tensor(value if value is not None else graph.value(name).scalar)
    value = value.to(device)
    return value.to(torch.float64 if value.dtype == torch.float64 else torch.float32)


def stage(graph: Graph, inst: Instance, options, declined: DslError, compile_part: Callable[[Graph], Any]) -> Staged:
    """Splits one shape that cuDNN declined (`declined`) into parts built on this GPU by `compile_part`
    (a part graph -> its compiled graph, whose first build raises DslError when cuDNN declines it)."""
    built: dict[tuple, Any] = {}

    def accepts(part: Graph) -> str | None:
        cg = compile_part(part)
        try:
            cg.executable(part.instances[0])
        except DslError as e:
            return short(e.diagnostics[0].message)
        built[part.nodes] = cg
        return None

    partition = find_partition(graph, inst, accepts, short(declined.diagnostics[0].message), options.fallback)
    return Staged(graph, inst, partition, [built[p.graph.nodes] if p.graph else None for p in partition.parts])
