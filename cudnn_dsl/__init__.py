"""cudnn-dsl: declarative fused cuDNN graphs. The public Python API.

    import cudnn_dsl
    cg = cudnn_dsl.compile("examples/conv_bias_relu.cdg")
    out = cg(**cg.allocate_inputs())["out"]
"""

from __future__ import annotations

import attrs

from cudnn_dsl.runtime import CompiledGraph
from cudnn_dsl.tensors import BindingError
from dsl.check import load
from dsl.diagnostics import DslError
from dsl.ir import Options

__all__ = ["compile", "CompiledGraph", "DslError", "BindingError", "load"]
__version__ = "0.1.0"


def compile(path_or_text: str, graph: str | None = None, device: int | str | None = None, **options) -> CompiledGraph:
    """Checks a .cdg file (or text) and returns its graph, compiled for the GPU on first call.

    ``options`` override the file's (heuristics, build_policy, workspace_limit, atol, rtol, seed, ...).
    """
    program = load(path_or_text)
    g = program.graph(graph)
    valid = {f.name for f in attrs.fields(Options)}
    bad = set(options) - valid
    if bad:
        raise TypeError(f"unknown option(s) {', '.join(sorted(bad))}; options are {', '.join(sorted(valid))}")
    if "heuristics" in options and isinstance(options["heuristics"], str):
        options["heuristics"] = (options["heuristics"],)
    return CompiledGraph(g, attrs.evolve(g.options, **options), device)
