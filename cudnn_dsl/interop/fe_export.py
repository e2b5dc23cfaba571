"""The graph as the cuDNN Frontend itself serializes it: lowered and planned up to the frontend's C++ graph."""

from __future__ import annotations

import json

from cudnn_dsl.build.pipeline import compile_shape, dynamic_shapes
from cudnn_dsl.interop.fe_json import by_value_json
from cudnn_dsl.target.library import Target, load_cudnn
from dsl.ir import Graph, Instance


def frontend_json(graph: Graph, inst: Instance, target: Target | None = None, handle=None, plans: bool = True) -> str:
    """The graph as the cuDNN Frontend itself serializes it (the JSON it writes to its log, json_version 2.0),
    lowered for the target without a device, or on the GPU of `handle`, with the value of every pass-by-value
    tensor. Through create_execution_plans: some ops (sdpa) reach the frontend's C++ graph, whose JSON this is,
    only when plans are asked for; `plans=False` stops before, for a graph that no engine takes (sdpa aside).
    In dynamic-shape mode, as a run builds it (its context's is_dynamic_shape_enabled; the kernel cache itself is
    no part of the JSON)."""
    stop = "create_execution_plans" if plans else "build_operation_graph"
    cache = load_cudnn().create_kernel_cache() if dynamic_shapes(graph, graph.options) else None
    low = compile_shape(graph, inst, graph.options, target, stop=stop, handle=handle, kernel_cache=cache)
    j = json.loads(repr(low.g))
    tensors = j.get("tensors") or []
    for t in tensors.values() if isinstance(tensors, dict) else tensors:
        # The frontend leaves out a value bound at launch; the file gives each one, so the JSON holds it, in
        # the frontend's own encoding (as when the value is part of the graph): scalars and epsilons travel.
        if t.get("is_pass_by_value") and t.get("pass_by_value") is None and t.get("uid") in low.host_values:
            t["pass_by_value"] = by_value_json(*low.host_values[t["uid"]])
    return json.dumps(j, indent=1) + "\n"
