"""Backend layer: which forward ops of the cuDNN Frontend's `pygraph` the language spells, and why the
rest are left out — the table docs/language.md holds (a test regenerates it and keeps it complete).

The spelling of an op comes from the registry at generation time (dsl.ops.OPS, through the lowering's
names in cudnn_dsl.ops); this module holds only the reasons for what the registry lacks.
"""

from __future__ import annotations

from cudnn_dsl.ops import CUDNN_NAME
from dsl.ops import OPS

#: members of `pygraph` that build, plan, run or inspect a graph rather than add an op to it
GRAPH_METHODS = frozenset(
    {
        "backend_plan_entries",
        "build",
        "build_operation_graph",
        "build_plan_at_index",
        "build_plans",
        "check_support",
        "context",
        "create_execution_plan",
        "create_execution_plans",
        "deselect_behavior_notes",
        "deselect_engines",
        "deselect_numeric_notes",
        "deselect_workspace_greater_than",
        "deserialize",
        "execute",
        "execute_plan_at_index",
        "find_tensor",
        "get_behavior_notes",
        "get_behavior_notes_for_plan_at_index",
        "get_cuda_graph_retention",
        "get_engine_and_knobs_at_index",
        "get_execution_plan_count",
        "get_inputs",
        "get_node",
        "get_outputs",
        "get_plan_name_at_index",
        "get_workspace_size",
        "get_workspace_size_plan_at_index",
        "inspect",
        "key",
        "nodes",
        "plans",
        "populate_cuda_graph",
        "select_behavior_notes",
        "select_numeric_notes",
        "select_plan",
        "selected_engine",
        "serialize",
        "tensor",
        "tensor_like",
        "tensor_scalar",
        "tensors",
        "update_cuda_graph",
        "validate",
    }
)

_PYTHON_ENGINES = (
    "linear attention / state space: only the frontend's own Python engines serve it, not the cuDNN library"
)
_BLOCK_SCALED = "block-scaled (MX) data formats: Blackwell-only (sm_100+), no engine on the H200"

#: forward ops the language leaves out on purpose, and why
LEFT_OUT = {
    "gdn": _PYTHON_ENGINES,
    "gdn2": _PYTHON_ENGINES,
    "gdn2_summary": _PYTHON_ENGINES,
    "gdn_summary": _PYTHON_ENGINES,
    "gdp": _PYTHON_ENGINES,
    "gdp_summary": _PYTHON_ENGINES,
    "kda": _PYTHON_ENGINES,
    "kda_summary": _PYTHON_ENGINES,
    "mamba2": _PYTHON_ENGINES,
    "mamba2_summary": _PYTHON_ENGINES,
    "block_scale_quantize": _BLOCK_SCALED,
    "block_scale_dequantize": _BLOCK_SCALED,
    "sdpa_mxfp8": _BLOCK_SCALED,
    "moe_grouped_matmul": "mixture-of-experts grouped GEMM over ragged per-expert token lists: not in this issue",
}

#: forward ops being added (issue 9) on other branches; the registry's entry wins once it lands
PENDING = {
    "adalayernorm": "not yet (training norms)",
    "batchnorm": "not yet (training norms; `batchnorm_inference` is here)",
    "instancenorm": "not yet (training norms)",
    "genstats": "not yet (training norms)",
    "rope": "not yet",
    "sdpa_fp8": "not yet (FP8 attention)",
}


def is_backward(name: str) -> bool:
    return name.endswith(("_backward", "_bwd"))


def pygraph_ops(pygraph) -> tuple[list[str], list[str]]:
    """(forward ops, backward ops) of the frontend's graph class, from its members."""
    names = [n for n in dir(pygraph) if not n.startswith("_") and n not in GRAPH_METHODS]
    return [n for n in names if not is_backward(n)], [n for n in names if is_backward(n)]


def spellings() -> dict[str, list[str]]:
    """pygraph op -> the registry ops that lower to it."""
    out: dict[str, list[str]] = {}
    for op in OPS:
        out.setdefault(CUDNN_NAME.get(op, op), []).append(op)
    return out


def rows(pygraph) -> list[tuple[str, list[str], str | None]]:
    """(pygraph op, its .cdg spellings, why it is left out); the reason is None for an op nothing
    accounts for (the test fails on it)."""
    spelled = spellings()
    forward, _ = pygraph_ops(pygraph)
    return [(op, spelled.get(op, []), None if op in spelled else LEFT_OUT.get(op) or PENDING.get(op)) for op in forward]


def table(pygraph) -> str:
    """The coverage table of docs/language.md, and its one line of backward ops."""
    out = ["| `cudnn.pygraph` op | `.cdg` | left out because |", "| --- | --- | --- |"]
    for op, cdg, why in rows(pygraph):
        out.append(f"| `{op}` | {', '.join(f'`{c}`' for c in cdg) or '–'} | {why or ('–' if cdg else '??')} |")
    _, backward = pygraph_ops(pygraph)
    out += ["", f"Backward ops: the next issue ({', '.join(f'`{b}`' for b in backward)})."]
    return "\n".join(out) + "\n"


def count(pygraph) -> tuple[int, int]:
    """(forward ops the language spells, forward ops of pygraph)."""
    r = rows(pygraph)
    return sum(1 for _, cdg, _ in r if cdg), len(r)
