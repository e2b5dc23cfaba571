"""torch.compile patterns from .cdg graphs: a graph's reference, as a PyTorch model computes it, is an Inductor
search pattern whose replacement calls the graph's torch op, under the dtype, layout and shape conditions of
its declarations.

    with cudnn_dsl.patterns.install("blocks/*.cdg") as patterns:
        y = torch.compile(model, fullgraph=True)(x)
    print(patterns.report)

The search is the graph's reference in run.reference's native mode (each op in the tensors' own dtypes), its
inputs as a model holds them and its Linear and norms written as torch's modules write them (search.py), traced
by Inductor with its decompositions, so that it is the aten graph Inductor sees of a model that computes the
same ops. Inductor matches it on the joint graph (`joint_custom_post_pass`), before the forward and backward
are split:

- A region that needs no gradient (under `torch.no_grad()`, or of frozen weights) matches the forward-only
  pattern; the replacement is the graph's op.
- A region whose inputs want gradients (in training, and in an eval model run with autograd on) matches a
  pattern traced with its backward (`joint_fwd_bwd`): the replacement is the op's augmented forward and its
  derived backward (torch_op.training). That pattern depends on which inputs want gradients: the forward,
  matched first whatever reads its values, says which, and the pattern for that set is traced the first time a
  region wants it.

Graphs whose searches are one pattern to Inductor (one block at several shapes) are registered once, and a
match is replaced by the first of them whose declarations its inputs meet: each matched input has the declared
dtype, rank and strides (those of dims of size 1 aside: they address nothing) and its sizes are a shape the
graph declares; a symbolic size is guarded to the dim's range, so torch.compile recompiles, unreplaced, outside
it. A match that fails these is a near miss, reported with its reason; a compute op (a convolution, a matmul, a
norm, attention) that no graph's ops cover is reported too. Inductor's FX graph cache is bypassed while
patterns are installed (the pass's uuid is None): a cached graph would skip the pass and the report.
"""

from __future__ import annotations

import glob
import os

import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.pattern_matcher import (
    PatternMatcherPass,
    PatternPrettyPrinter,
    fwd_only,
    gen_pattern_and_search_gm,
)

from cudnn_dsl.api import compile as compile_graph
from cudnn_dsl.patterns import library
from cudnn_dsl.patterns.matching import GraphPattern, PatternGroup, wanting_gradients
from cudnn_dsl.patterns.report import NearMiss, Replaced, Report, Unmatched, largest
from cudnn_dsl.patterns.search import WRITTEN_RMS_NORMS
from cudnn_dsl.run.reference import drawn_values
from cudnn_dsl.torch_op.op import TorchOp, as_torch_op
from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Graph
from dsl.pipeline import load

__all__ = ["Installed", "NearMiss", "Replaced", "Report", "Unmatched", "install", "install_library"]


def _refusal(graph: Graph, op: TorchOp) -> str | None:
    """Why a graph cannot be a pattern: what a torch model never computes as the graph declares it."""
    inst = graph.instances[0]
    if op.in_place:
        return "an output is written in place"
    if any(v.view is not None for v in graph.values if v.kind == "input"):
        return "an input is a view of a buffer"
    if any(inst.type(v.name).dtype == "bool" for v in graph.values if v.kind in ("input", "output")):
        return "a bool tensor is bit-packed, as cuDNN keeps it, not a torch bool"
    if drawn_values(graph, inst):
        return "its reference needs what the GPU draws"
    return None


class _Pass(CustomGraphPass):
    """The installed patterns as Inductor's joint-graph custom pass, after the pass it replaced."""

    def __init__(self, sets: list[Installed], before):
        self.sets, self.before = sets, before

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.before is not None:
            self.before(graph)
        wanting = wanting_gradients(graph)
        sizes = largest(graph)
        for s in self.sets:
            if wanting is not None:
                s.discover(graph, wanting)
            s.matcher.apply(graph)
        for s in self.sets:
            s.report.settle(graph, sizes, joint=wanting is not None)

    def uuid(self):
        return None  # no FX graph cache: a cached graph would skip the pass, and the report with it


class _Stack:
    """The pattern sets installed, in order, as one pass: rebuilt from those still installed when one is
    uninstalled, in any order, after the pass found when the first of them was installed."""

    def __init__(self):
        self.sets: list[Installed] = []
        self.before = None

    def push(self, installed: Installed) -> None:
        # torch.compile serves a frame compiled before (another instance of the model's class too) without
        # running Inductor's passes again: started afresh, what is compiled from now on sees these patterns
        torch._dynamo.reset()
        if not self.sets:
            self.before = inductor_config.joint_custom_post_pass
        self.sets.append(installed)
        self.set_pass()

    def remove(self, installed: Installed) -> None:
        if installed in self.sets:
            self.sets.remove(installed)
            self.set_pass()

    def set_pass(self) -> None:
        inductor_config.joint_custom_post_pass = _Pass(list(self.sets), self.before) if self.sets else self.before


_STACK = _Stack()


class Installed:
    """Patterns installed into torch.compile until `uninstall()`, or the end of a `with` block."""

    def __init__(self, graphs: list[GraphPattern], report: Report):
        self.graphs, self.report = graphs, report
        self.matcher = PatternMatcherPass(pass_name="cudnn_dsl_patterns")
        self.discovery = PatternMatcherPass(pass_name="cudnn_dsl_gradients")
        self.groups = [PatternGroup(members, report) for members in _by_pattern(graphs)]
        for g in self.groups:
            g.register(self.matcher, self.discovery)
        _STACK.push(self)

    def discover(self, graph: torch.fx.Graph, wanting: set[torch.fx.Node]) -> None:
        """Trace the patterns with their backward that the regions of a joint graph want."""
        for g in self.groups:
            g.wanting = wanting
        self.discovery.apply(graph)

    def uninstall(self) -> None:
        _STACK.remove(self)

    def __enter__(self) -> Installed:
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        return f"<cudnn_dsl patterns: {', '.join(g.label for g in self.graphs)}>"


def _by_pattern(graphs: list[GraphPattern]) -> list[list[GraphPattern]]:
    """The graphs grouped by the pattern Inductor makes of their searches: the same ops with shapes ignored,
    traced to the same graph, is one pattern (Inductor refuses it twice). Graphs of the same ops whose integer
    arguments differ (a convolution's stride and padding) are two patterns: Inductor's first pass over a region
    ignores those arguments, its check of the search traced again on the region's inputs does not."""
    groups: dict[tuple[str, str], list[GraphPattern]] = {}
    for g in graphs:
        pattern, gm = gen_pattern_and_search_gm(g.search, g.natives, fwd_only)
        groups.setdefault((PatternPrettyPrinter.run(pattern), str(gm.graph)), []).append(g)
    return list(groups.values())


def _files(sources) -> list[str]:
    files = []
    for source in sources:
        found = sorted(glob.glob(os.fspath(source))) if glob.has_magic(os.fspath(source)) else [os.fspath(source)]
        if not found:
            raise FileNotFoundError(f"no .cdg file matches {os.fspath(source)!r}")
        files += found
    return files


def install(*sources: str | os.PathLike, device: str = "cpu", tune: bool = False) -> Installed:
    """Every graph of the files (paths or glob patterns) as a torch.compile pattern, traced for tensors on
    `device` (the device of the model: Inductor's graph of an op differs by device). A graph that cannot be
    one (an output in place, a view input, a bool tensor, dropout cuDNN draws) is a located DslError.
    `tune`: on a GPU, each replaced region's plans (its backward's too) are timed the first time it runs at a
    shape, the fastest kept in the plan store for later runs (torch_op.tuning): seconds per shape, once."""
    graphs = []
    for path in _files(sources):
        graphs += _patterns(load(path), device, lambda name, path=path: compile_graph(path, name), tune)
    return Installed(graphs, Report())


def install_library(
    *families: str,
    dtype: str | tuple[str, ...] = "half",
    channels_last: bool = True,
    device: str = "cpu",
    tune: bool = False,
    autocast: bool = False,
    training: bool | None = None,
    norm_eps: float = library.NORM_EPS,
) -> Installed:
    """The bundled library's graphs (patterns.library: "resnet", "gpt", "llama", "mlp"; all of them when none is
    named) in a dtype ("float", "half", "bf16") or several, as install() installs a file's. `autocast`: for a
    float model run under torch.autocast to `dtype`: its convolutions, matmuls and attention in `dtype` (their
    BatchNorms' affine parameters float), its norms in float. `training`: with the graphs of a BatchNorm in
    training mode (by default, except on CUDA: library.TRAINING_ON_CUDA says why). `norm_eps`: the eps of the
    model's LayerNorms and RMSNorms (a norm of another is left to torch, named in the report)."""
    dtypes = (dtype,) if isinstance(dtype, str) else tuple(dtype)
    if autocast:
        dtypes += ("float",) * ("float" not in dtypes)
    names = families or tuple(library.FAMILIES)
    if training is None:
        training = device != "cuda" or library.TRAINING_ON_CUDA
    text = "\n".join(library.source(names, d, channels_last, autocast, training, norm_eps) for d in dtypes)
    file = f"pattern library ({', '.join(dtypes)}{', autocast' if autocast else ''})"
    compiled = lambda name: compile_graph(text=text, graph=name, file=file)  # noqa: E731
    graphs = _patterns(load(text=text, file=file), device, compiled, tune, library.INFERENCE_ONLY)
    return Installed(graphs, Report())


def _patterns(result, device: str, compiled, tune: bool, inference_only: tuple[str, ...] = ()) -> list[GraphPattern]:
    """The graphs' patterns; those whose names start with one of `inference_only` are not taken with a backward."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r}: torch here sees no CUDA GPU; the patterns are traced for the model's device "
            "(device='cpu' for a model on the CPU)"
        )
    result.raise_if_errors()
    graphs = []
    for g in result.program.graphs:
        op = as_torch_op(compiled(g.name))
        why = _refusal(g, op)
        if why is not None:
            raise DslError(Diagnostic("error", f"graph '{g.name}' cannot be a torch.compile pattern: {why}", g.loc))
        op.tune = tune
        training = not g.name.startswith(inference_only)
        searched = GraphPattern(op, device, training=training)
        variants: list[dict] = []
        if searched.batchnorm:
            # also as the pointwise ops: a model's eval BatchNorm of any eps, or its own arithmetic, without
            # gradients (with them, torch's BatchNorm backward is matched through F.batch_norm only)
            variants.append({"batchnorm": False})
        if searched.cast_per_linear:  # also as a model that casts once for every Linear writes it
            variants.append({"cast_per_linear": False})
        if searched.written_rms_norm:  # also as a model's own RMSNorm module spells it out
            variants += [{"rms_norm": f} for f in WRITTEN_RMS_NORMS]
        # also as HF transformers writes a Linear (Conv1D) and GPT-2's GELU, each with torch's spelling of the other
        for conv1d, gelu in [(True, False), (False, True), (True, True)]:
            if (searched.kn_linear or not conv1d) and (searched.tanh_gelu or not gelu):
                variants.append({"conv1d": conv1d, "written_gelu": gelu})
        graphs += [GraphPattern(op, device, training=training, **v) for v in variants]
        if searched.token_rows is not None:  # each also over a model's 2-D input: its tokens as rows
            graphs += [GraphPattern(op, device, training=training, rows=True, **v) for v in [*variants, {}]]
        graphs.append(searched)
    return graphs
