"""Which forward ops of the cuDNN Frontend's `pygraph` the language spells, and why the
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
}

#: backward ops the language leaves out, and why
LEFT_OUT_BACKWARD = {
    **{f"{op}_bwd": _PYTHON_ENGINES for op in ("gdn", "gdn2", "gdp", "kda", "mamba2")},
    **{f"{op}_summary_bwd": _PYTHON_ENGINES for op in ("gdn", "gdn2", "gdp", "kda", "mamba2")},
    "sdpa_mxfp8_backward": "MXFP8 attention's backward reads q, k, v and dO transposed, each with block scales of "
    "its own, and O and dO in half precision besides: not spelled",
}


#: ops of the frontend's C++ graph that its Python `pygraph` has no builder for, and the registry spells: they run
#: as their torch reference until the Python API builds them
CPP_ONLY = ("resample",)


def is_backward(name: str) -> bool:
    return name.endswith(("_backward", "_bwd"))


def pygraph_ops(pygraph) -> tuple[list[str], list[str]]:
    """(forward ops, backward ops) of the frontend's graph class, from its members, and the ops of its C++ graph
    only (CPP_ONLY)."""
    names = [n for n in dir(pygraph) if not n.startswith("_") and n not in GRAPH_METHODS]
    names += [n for n in CPP_ONLY if n not in names]
    return [n for n in names if not is_backward(n)], [n for n in names if is_backward(n)]


def spellings() -> dict[str, list[str]]:
    """pygraph op -> the registry ops that lower to it."""
    out: dict[str, list[str]] = {}
    for op in OPS:
        out.setdefault(CUDNN_NAME.get(op, op), []).append(op)
    return out


def rows(pygraph, backward: bool = False) -> list[tuple[str, list[str], str | None]]:
    """(pygraph op, its .cdg spellings, why it is left out), for the forward ops or the backward ones; the
    reason is None for an op nothing accounts for (the test fails on it)."""
    spelled = spellings()
    forward, backward_ops = pygraph_ops(pygraph)
    reasons = LEFT_OUT_BACKWARD if backward else LEFT_OUT
    return [
        (op, spelled.get(op, []), None if op in spelled else reasons.get(op))
        for op in (backward_ops if backward else forward)
    ]


def _table(rows_) -> list[str]:
    out = ["| `cudnn.pygraph` op | `.cdg` | left out because |", "| --- | --- | --- |"]
    for op, cdg, why in rows_:
        where = " (C++ graph only)" if op in CPP_ONLY else ""
        out.append(f"| `{op}`{where} | {', '.join(f'`{c}`' for c in cdg) or '–'} | {why or ('–' if cdg else '??')} |")
    return out


def table(pygraph) -> str:
    """The coverage tables of docs/language.md: the forward ops, then the backward ones."""
    out = [*_table(rows(pygraph)), "", "Backward ops (gradients):", "", *_table(rows(pygraph, backward=True))]
    return "\n".join(out) + "\n"


def count(pygraph, backward: bool = False) -> tuple[int, int]:
    """(ops the language spells, ops of pygraph), forward or backward."""
    r = rows(pygraph, backward)
    return sum(1 for _, cdg, _ in r if cdg), len(r)
