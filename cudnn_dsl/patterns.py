"""torch.compile patterns from .cdg graphs: a graph's reference, as a PyTorch user writes it, is an Inductor
search pattern whose replacement calls the graph's torch op, under the dtype, layout and shape conditions of
its declarations.

    with cudnn_dsl.patterns.install("blocks/*.cdg") as patterns:
        y = torch.compile(model, fullgraph=True)(x)
    print(patterns.report)

The search is the graph's reference in run.reference's native mode (each op in the tensors' own dtypes, as
`emit --format torch` traces it, interop.emit.traceable_reference), traced by Inductor with its decompositions,
so that it is the aten graph Inductor sees of a model that computes the same ops. Inductor matches it on the
joint graph (`joint_custom_post_pass`), before the forward and backward are split:

- A region that needs no gradient matches the forward-only pattern; the replacement is the graph's op.
- A region whose inputs want gradients matches a pattern traced with its backward (`joint_fwd_bwd`): the
  replacement is the op's augmented forward and its derived backward (torch_op.training). Inductor traces
  each gradient set apart, so two are registered per graph: every float input wanting a gradient, and every
  one but the first (a block's activation at the start of a model).

A structural match is replaced only when each matched input has the declared dtype, rank and strides (those of
dims of size 1 aside: they address nothing) and its sizes are a shape the graph declares; a symbolic size is
guarded to the dim's range, so torch.compile recompiles, unreplaced, outside it. A match that fails these is
a near miss, reported with its reason. Inductor's FX graph cache is bypassed while patterns are installed
(the pass's uuid is None): a cached graph would skip the pass and the report.
"""

from __future__ import annotations

import glob
import inspect
import os

import attrs
import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.pattern_matcher import (
    Match,
    PatternMatcherPass,
    fwd_only,
    gen_pattern,
    joint_fwd_bwd,
    register_graph_pattern,
    register_replacement,
)

from cudnn_dsl.api import compile as compile_graph
from cudnn_dsl.interop.emit import traceable_reference
from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import drawn_values
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.torch_op.op import TorchOp, as_torch_op
from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Graph, NotFound
from dsl.pipeline import load


@attrs.frozen
class Replaced:
    """A region of a compiled model that now runs a graph's op."""

    graph: str
    """the graph's name and where it is declared (file:line:col)"""
    where: str
    """the model's source line of the region's last op, as torch.compile recorded it"""
    training: bool
    """matched with its backward (the op's derived backward replaces the region's)"""

    def __str__(self) -> str:
        return f"replaced at {self.where}: {self.graph}{' (with its backward)' if self.training else ''}"


@attrs.frozen
class NearMiss:
    """A region that has a graph's ops but breaks one of its conditions, and so is left alone."""

    graph: str
    where: str
    why: str

    def __str__(self) -> str:
        return f"not replaced at {self.where}: {self.graph}: {self.why}"


@attrs.define
class Report:
    """What the installed patterns did, in the order Inductor matched."""

    replaced: list[Replaced] = attrs.field(factory=list)
    missed: list[NearMiss] = attrs.field(factory=list)

    def miss(self, near: NearMiss) -> None:
        """A near miss, once: a region the checks of two patterns both see is one region."""
        if near not in self.missed:
            self.missed.append(near)

    def __str__(self) -> str:
        lines = [str(r) for r in self.replaced] + [str(m) for m in self.missed]
        return "\n".join(lines) or "no region matched an installed graph"


def _where(node: torch.fx.Node) -> str:
    """The model's `file:line (function)` of a node: the last frame of the stack trace torch.compile keeps."""
    frames = [ln.strip() for ln in (node.meta.get("stack_trace") or "").splitlines() if ln.strip().startswith("File ")]
    if not frames:
        return f"node '{node.name}'"
    file, line, function = (p.strip() for p in frames[-1].split(",", 2))  # File "m.py", line 12, in forward
    return f"{file.removeprefix('File ').strip(chr(34))}:{line.removeprefix('line ')} ({function.removeprefix('in ')})"


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


class GraphPattern:
    """One graph's search patterns and their conditions."""

    def __init__(self, op: TorchOp, report: Report, device: str):
        self.op, self.graph, self.report = op, op.graph, report
        self.label = f"{self.graph.name} ({self.graph.loc})"
        inst = self.graph.instances[0]
        self.types = {n: inst.type(n) for n in op.tensor_names}
        fn, _ = traceable_reference(self.graph, inst, native=True, device=device)
        # Inductor runs the search on its examples: drawn as `run` draws inputs, so that index inputs (page
        # tables, ragged offsets, sequence lengths) are valid.
        drawn = generate_inputs(self.graph, inst, device)
        self.examples = [drawn[n] for n in op.tensor_names]
        scalars = {v.name: float(v.scalar) for v in op.scalars}
        order = [v.name for v in self.graph.inputs]

        def search(*tensors):
            given = dict(zip(op.tensor_names, tensors), **scalars)
            outs = fn(*(given[n] for n in order))
            return outs[0] if len(outs) == 1 else outs

        def replace(*tensors):
            return op(*(_unit_dims(t, len(self.types[n].shape)) for n, t in zip(op.tensor_names, tensors)))

        signature = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in op.tensor_names]
        )
        search.__signature__ = replace.__signature__ = signature
        self.search, self.replace = search, replace

    def register(self, into: PatternMatcherPass) -> None:
        register_replacement(self.search, self.replace, self.examples, fwd_only, into, extra_check=self.valid)
        # Inductor re-traces a match's search in the matched dtypes before `valid` sees it, and that trace
        # casts to the declared ones: a region in another dtype never reaches `valid`. The search as first
        # traced (integers unchecked) finds it, after the replacement above, to report it; it replaces nothing.
        found = register_graph_pattern(
            gen_pattern(self.search, self.examples, fwd_only), self.in_other_dtype, pass_dict=into
        )
        found(self.report_other_dtype)
        floats = [k for k, e in enumerate(self.examples) if e.is_floating_point()]
        for wanting in {tuple(floats), tuple(floats[1:])} - {()}:
            examples = [e.clone().requires_grad_(k in wanting) for k, e in enumerate(self.examples)]
            register_replacement(
                self.search, self.replace, examples, joint_fwd_bwd, into, extra_check=self.valid_training
            )

    def valid_training(self, match: Match) -> bool:
        return self.valid(match, training=True)

    def valid(self, match: Match, training: bool = False) -> bool:
        """Whether the matched inputs are what the graph declares; the report says what was done."""
        where = _where(_last(match))
        why = self.mismatch(_matched(match, self.op.tensor_names))
        if why is None:
            self.report.replaced.append(Replaced(self.label, where, training))
        else:
            self.report.miss(NearMiss(self.label, where, why))
        return why is None

    def in_other_dtype(self, match: Match) -> bool:
        return self.dtype_mismatch(_matched(match, self.op.tensor_names)) is not None

    def report_other_dtype(self, match: Match, *args, **kwargs) -> None:
        """A region of the graph's ops in other dtypes, as a near miss; the graph is left as it is."""
        why = self.dtype_mismatch(_matched(match, self.op.tensor_names))
        self.report.miss(NearMiss(self.label, _where(_last(match)), why))

    def dtype_mismatch(self, values: dict[str, torch.Tensor]) -> str | None:
        for name, t in self.types.items():
            value, want = values[name], torch_dtype(t.dtype)
            if value.dtype != want:
                return f"'{name}' is {value.dtype}, the graph declares {want}"
        return None

    def mismatch(self, values: dict[str, torch.Tensor]) -> str | None:
        """What in these inputs breaks the graph's declarations; None when nothing does."""
        why = self.dtype_mismatch(values)
        if why is not None:
            return why
        for name, t in self.types.items():
            value = values[name]
            if value.dim() > len(t.shape):
                return f"'{name}' has {value.dim()} dims, the graph declares {len(t.shape)}"
        values = {n: _unit_dims(v, len(self.types[n].shape)) for n, v in values.items()}
        hints = {n: tuple(_hint(d) for d in v.shape) for n, v in values.items()}
        binding = self.graph.binding_of(hints)
        try:
            inst = self.graph.instance(binding)
        except (NotFound, DslError) as e:
            return f"shape outside the graph's: {' '.join(str(e).split())}"
        for name, value in values.items():
            t = inst.type(name)
            if tuple(hints[name]) != tuple(t.shape):
                return f"'{name}' is {list(hints[name])}, the graph declares {list(t.shape)}"
            strides = [_hint(s) for s in value.stride()]
            if any(n != 1 and s != w for n, s, w in zip(t.shape, strides, t.strides)):
                return f"'{name}' has strides {strides}, the graph declares {list(t.strides)}"
        return self._guard(values)

    def _guard(self, values: dict[str, torch.Tensor]) -> str | None:
        """A symbolic size held to its dim's declared values: comparing it guards the compiled model, which
        torch.compile recompiles, unreplaced, for a size outside them."""
        declared = dict(self.graph.input_dims)
        symbols = {s.name: s for s in self.graph.symbols}
        for name, value in values.items():
            for dim, size in zip(declared.get(name, ()), value.shape):
                if isinstance(dim, str) and isinstance(size, torch.SymInt):
                    s = symbols[dim]
                    inside = s.accepts(size) if s.span is not None else size == _hint(size)
                    if not inside:
                        return f"'{name}': {dim} = {size} is not a value the graph declares"
        return None


def _last(match: Match) -> torch.fx.Node:
    """A match's output node: the region's last op."""
    return match.output_nodes()[0] or match.nodes[-1]


def _matched(match: Match, names) -> dict[str, torch.Tensor]:
    """The matched inputs' (fake) values by name."""
    return {n: match.kwargs[n].meta["val"] for n in names}


def _unit_dims(t: torch.Tensor, rank: int) -> torch.Tensor:
    """A tensor of fewer dims than declared, with unit dims in front: the same broadcast to torch (which
    aligns trailing dims), and the explicit rank the graph declares."""
    return t if t.dim() == rank else t.reshape((1,) * (rank - t.dim()) + tuple(t.shape))


def _hint(size) -> int:
    """A size's value in the example that torch.compile traces (a symbolic one's hint)."""
    return size if isinstance(size, int) else size.node.hint


class _Pass(CustomGraphPass):
    """The installed patterns as Inductor's joint-graph custom pass, after the pass it replaced."""

    def __init__(self, patterns: list[PatternMatcherPass], before):
        self.patterns, self.before = patterns, before

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.before is not None:
            self.before(graph)
        for p in self.patterns:
            p.apply(graph)

    def uuid(self):
        return None  # no FX graph cache: a cached graph would skip the pass, and the report with it


class _Stack:
    """The pattern sets installed, in order, as one pass: rebuilt from those still installed when one is
    uninstalled, in any order, after the pass found when the first of them was installed."""

    def __init__(self):
        self.sets: list[Installed] = []
        self.before = None

    def push(self, installed: Installed) -> None:
        if not self.sets:
            self.before = inductor_config.joint_custom_post_pass
        self.sets.append(installed)
        self.set_pass()

    def remove(self, installed: Installed) -> None:
        if installed in self.sets:
            self.sets.remove(installed)
            self.set_pass()

    def set_pass(self) -> None:
        matchers = [s.matcher for s in self.sets]
        inductor_config.joint_custom_post_pass = _Pass(matchers, self.before) if matchers else self.before


_STACK = _Stack()


class Installed:
    """Patterns installed into torch.compile until `uninstall()`, or the end of a `with` block."""

    def __init__(self, graphs: list[GraphPattern], report: Report):
        self.graphs, self.report = graphs, report
        self.matcher = PatternMatcherPass(pass_name="cudnn_dsl_patterns")
        for g in graphs:
            g.register(self.matcher)
        _STACK.push(self)

    def uninstall(self) -> None:
        _STACK.remove(self)

    def __enter__(self) -> Installed:
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        return f"<cudnn_dsl patterns: {', '.join(g.label for g in self.graphs)}>"


def _files(sources) -> list[str]:
    files = []
    for source in sources:
        found = sorted(glob.glob(os.fspath(source))) if glob.has_magic(os.fspath(source)) else [os.fspath(source)]
        if not found:
            raise FileNotFoundError(f"no .cdg file matches {os.fspath(source)!r}")
        files += found
    return files


def install(*sources: str | os.PathLike, device: str = "cpu") -> Installed:
    """Every graph of the files (paths or glob patterns) as a torch.compile pattern, traced for tensors on
    `device` (the device of the model: Inductor's graph of an op differs by device). A graph that cannot be
    one (an output in place, a view input, a bool tensor, dropout cuDNN draws) is a located DslError."""
    report = Report()
    graphs = []
    for path in _files(sources):
        result = load(path)
        result.raise_if_errors()
        for g in result.program.graphs:
            op = as_torch_op(compile_graph(path, g.name))
            why = _refusal(g, op)
            if why is not None:
                raise DslError(Diagnostic("error", f"graph '{g.name}' cannot be a torch.compile pattern: {why}", g.loc))
            graphs.append(GraphPattern(op, report, device))
    return Installed(graphs, report)
