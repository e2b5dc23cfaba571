"""A graph as an Inductor search pattern (GraphPattern), and graphs that are one pattern (PatternGroup): the
conditions a match must meet, the replacement, and the patterns traced with their backward for each set of
inputs a model's region wants gradients of."""

from __future__ import annotations

import copy
import inspect
import logging

import torch
from torch._inductor import config as inductor_config
from torch._inductor.fx_passes.joint_graph import constant_fold_uniform_value
from torch._inductor.pattern_matcher import (
    MULTIPLE,
    CallFunction,
    Ignored,
    Match,
    PatternExpr,
    PatternMatcherPass,
    fwd_only,
    gen_pattern,
    joint_fwd_bwd,
    register_graph_pattern,
    register_replacement,
)
from torch._subclasses.fake_tensor import unset_fake_temporarily

from cudnn_dsl.interop.emit import traceable_reference
from cudnn_dsl.patterns.report import NearMiss, Replaced, Report, where
from cudnn_dsl.patterns.search import (
    PLAIN,
    ROWS,
    Spelling,
    batchnorms,
    casts_per_linear,
    forms,
    has_conv1d,
    idioms,
    output_forms,
    running_statistics,
    traces_fused_rms_norm,
)
from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import run_reference
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.torch_op.op import TorchOp
from dsl.diagnostics import DslError
from dsl.ir import Graph, Instance, NotFound


class GraphPattern:
    """One graph's search, as a model computes it, and the conditions its matched inputs must meet. `batchnorm`:
    its eval BatchNorms searched as `F.batch_norm` on running statistics (search.PerChannel), else as the
    pointwise ops they are. `rms_norm`: its RMSNorms as F.rms_norm (None: as torch traces it on `device`), or spelled
    out (one of search.WRITTEN_RMS_NORMS). `conv1d`, `written_gelu`: its Linears as HF's Conv1D, its tanh GELUs
    spelled out as HF's gelu_new (search.Spelling). `rows`: its tokens ([B, T, D]) as a model's rows ([T, D]: B = 1,
    the graph's token_rows)."""

    def __init__(
        self,
        op: TorchOp,
        device: str,
        batchnorm: bool = True,
        cast_per_linear: bool = True,
        training: bool = True,
        rms_norm: str | None = None,
        conv1d: bool = False,
        written_gelu: bool = False,
        rows: bool = False,
    ):
        self.op, self.graph = op, op.graph
        self.training = training
        """whether a region is also taken with its backward (else in a graph without gradients only)"""
        self.label = f"{self.graph.name} ({self.graph.loc})"
        self.token_rows = token_rows(self.graph)
        """the tokens' batch dim where a model may hold the graph's tokens as rows (None: it may not)"""
        if rows and self.token_rows is None:
            raise ValueError(f"graph '{self.graph.name}' has no tokens a model holds as rows")
        self.rows = rows
        inst = _example_instance(self.graph, {self.token_rows: 1} if rows else {})
        names = op.tensor_names
        self.types = {n: inst.type(n) for n in names}
        self.forms = forms(self.graph, inst, batchnorm)
        if rows:  # the model's tokens hold no batch dim
            declared = dict(self.graph.input_dims)
            self.forms.update((n, ROWS) for n in names if declared.get(n, ())[:1] == (self.token_rows,))
        self.out_forms = output_forms(self.graph, self.forms)
        made = {o: k for k, node in enumerate(self.graph.nodes) for o in node.outputs}
        main = [v.name for v in self.graph.outputs if v.name not in self.out_forms]
        self.order = sorted(main, key=lambda n: made.get(n, -1), reverse=True) + list(self.out_forms)
        """the outputs as the search returns them: the region's own, the last made first (where Inductor anchors
        the pattern, so that a larger region's pattern is tried where its last op's own is, and what its shape and
        place are read off), then the running statistics"""
        self.batchnorm = batchnorm and bool(batchnorms(self.graph, inst))
        """whether an eval BatchNorm is searched as F.batch_norm"""
        self.cast_per_linear = cast_per_linear and bool(casts_per_linear(self.graph, inst, self.forms))
        """whether a cast that Linears alone read is searched as one cast per Linear (search.casts_per_linear)"""
        norms = [node for node in self.graph.nodes if node.op == "rmsnorm"]
        self.written_rms_norm = bool(norms) and all(
            not node.scalars
            and not (node.inputs[2:] and node.inputs[2])
            and len(inst.type(node.inputs[1]).shape) - self.form(node.inputs[1]).lead == 1
            for node in norms
        )
        """whether a model may spell its RMSNorms out (each over the last dim, on a [D] weight)"""
        if rms_norm is None:
            fused = any(traces_fused_rms_norm(device, torch_dtype(inst.type(n.inputs[0]).dtype)) for n in norms)
            rms_norm = "fused" if fused else "cpu"
        elif not self.written_rms_norm:
            raise ValueError(f"graph '{self.graph.name}': no RMSNorm of it is one a model spells out")
        self.kn_linear = has_conv1d(self.graph, inst, self.forms)
        """whether a model may compute a Linear of the graph as HF's Conv1D (its weight [K, N])"""
        self.tanh_gelu = any(node.op == "gelu_tanh" for node in self.graph.nodes)
        """whether a model may spell a tanh GELU of the graph out (HF's gelu_new)"""
        if (conv1d and not self.kn_linear) or (written_gelu and not self.tanh_gelu):
            raise ValueError(f"graph '{self.graph.name}' has no op that a model writes so")
        self.spelling = spelling = Spelling(rms_norm, conv1d, written_gelu)
        # Inductor runs the search on its examples: drawn as `run` draws inputs, so that index inputs (page
        # tables, ragged offsets, sequence lengths) are valid.
        drawn = generate_inputs(self.graph, inst, device)
        self.examples = [drawn[n] for n in names]
        self.natives = [self.form(n).native(drawn[n]) for n in names]
        scalars = {v.name: float(v.scalar) for v in op.scalars}
        graph = self.graph

        def search(*tensors):
            # at the inputs' own shape: a symbolic dim's attributes follow it (attention's default scale)
            now = self.instance_at(tensors) or inst
            values = dict(zip(names, tensors), **scalars)
            found = idioms(graph, now, self.forms, cast_per_linear, spelling)
            outs = run_reference(graph, now, values, native=True, idioms=found)
            return outs[graph.outputs[0].name] if len(graph.outputs) == 1 else tuple(outs[v] for v in self.order)

        search.__signature__ = _signature(names)
        self.search = search
        self._flops: dict[tuple, int] = {}

    def form(self, name: str):
        return self.forms.get(name, PLAIN)

    def declared(self, values) -> dict[str, torch.Tensor]:
        """The matched inputs (as the model holds them) in the forms the graph declares: views."""
        return {n: self.form(n).declared(v, len(self.types[n].shape)) for n, v in zip(self.op.tensor_names, values)}

    def instance_at(self, tensors) -> Instance | None:
        """The graph's shape for these inputs (as the model holds them); None when it has no symbolic dims or
        does not declare them."""
        if not self.graph.symbols:
            return None
        hints = {n: tuple(_hint(d) for d in v.shape) for n, v in self.declared(tensors).items()}
        try:
            return self.graph.instance(self.graph.binding_of(hints))
        except (NotFound, DslError):
            return None

    def replace(self, *tensors):
        outs = self.op(*self.declared(tensors).values())
        if self.rows:  # each output a token tensor: the model's rows
            outs = outs[0] if len(self.order) == 1 else tuple(o[0] for o in outs)
        if len(self.order) == 1:
            return outs
        made = dict(zip((v.name for v in self.graph.outputs), outs))
        # running statistics: no gradient, as the functional BatchNorm the search holds returns them, and no view
        # (AOT autograd gives a view of the op's output the gradient of the output it is a view of)
        return tuple(
            self.out_forms[n].native(made[n].detach()).clone() if n in self.out_forms else made[n] for n in self.order
        )

    def dtype_mismatch(self, values: dict[str, torch.Tensor]) -> str | None:
        for name, t in self.types.items():
            model = self.form(name).model_dtype  # a BatchNorm's statistic, in the model's dtype
            want = model or torch_dtype(t.dtype)
            if values[name].dtype != want:
                of = f"the graph's BatchNorm takes it in the model's {want}" if model else f"the graph declares {want}"
                return f"'{name}' is {values[name].dtype}, {of}"
        return None

    def mismatch(self, values: dict[str, torch.Tensor], out: torch.Tensor | None = None) -> str | None:
        """What in these inputs (as the model holds them) breaks the graph's declarations, or what makes the
        region's output `out` another shape than the graph's (Inductor's patterns ignore a convolution's stride
        and padding); None when nothing does."""
        why = self.dtype_mismatch(values)
        if why is not None:
            return why
        for name, t in self.types.items():
            if values[name].dim() > len(t.shape) - self.form(name).lead:
                return f"'{name}' has {values[name].dim()} dims, the graph declares {len(t.shape)}"
        values = self.declared(values[n] for n in self.op.tensor_names)
        hints = {n: tuple(_hint(d) for d in v.shape) for n, v in values.items()}
        try:
            inst = self.graph.instance(self.graph.binding_of(hints))
        except (NotFound, DslError) as e:
            return f"shape outside the graph's: {' '.join(str(e).split())}"
        for name, value in values.items():
            t = inst.type(name)
            if tuple(hints[name]) != tuple(t.shape):
                return f"'{name}' is {list(hints[name])}, the graph declares {list(t.shape)}"
            strides = [_hint(s) for s in value.stride()]
            if any(n != 1 and s != w for n, s, w in zip(t.shape, strides, t.strides)):
                return f"'{name}' has strides {strides}, the graph declares {list(t.strides)}"
        if isinstance(out, torch.Tensor):
            made = [_hint(d) for d in out.shape]
            first = inst.type(self.order[0])
            shape = list(first.shape[1:] if self.rows else first.shape)  # as the model holds it
            if out.dtype != torch_dtype(first.dtype):  # the region's own arguments made another dtype
                return f"the region makes {out.dtype}, the graph {torch_dtype(first.dtype)}"
            if len(made) != len(shape):  # the op's result has the declared rank: not the model's
                return f"the region makes a {len(made)}-dim result, the graph a {len(shape)}-dim one"
            if made != shape:
                return f"the region makes {made}, the graph {shape} (another stride or padding)"
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

    def flops(self, values: dict[str, torch.Tensor]) -> int:
        """The graph's forward FLOPs at the shape of these inputs (torch's flop counter over its reference on
        meta tensors: no memory, no compute)."""
        from torch.utils.flop_counter import FlopCounterMode

        hints = {n: tuple(_hint(d) for d in v.shape) for n, v in self.declared(values.values()).items()}
        key = tuple(sorted(hints.items()))
        if key not in self._flops:
            inst = self.graph.instance(self.graph.binding_of(hints))
            with unset_fake_temporarily(), FlopCounterMode(display=False) as counter:
                fn, examples = traceable_reference(self.graph, inst, native=True, device="meta")
                fn(*examples)
            self._flops[key] = counter.get_total_flops()
        return self._flops[key]


class PatternGroup:
    """Graphs whose searches are one pattern to Inductor (one graph at several shapes, most often): registered
    once, each match replaced by the first graph whose declarations its inputs meet."""

    def __init__(self, members: list[GraphPattern], report: Report):
        self.members, self.report = members, report
        first = members[0]
        self.names = first.op.tensor_names
        # the inputs that may want gradients: floats, but a training-mode BatchNorm's running statistics (a
        # BatchNorm run twice reads the first run's next ones, computed from values that want theirs)
        stats = running_statistics(first.graph)
        self.floats = tuple(n for n, e in zip(self.names, first.examples) if e.is_floating_point() and n not in stats)
        self.traced: set[tuple[str, ...]] = set()  # the gradient sets with a pattern
        self.chosen: GraphPattern | None = None
        self.wanting: set[torch.fx.Node] = set()
        self.search = lambda *tensors: self._search(*tensors)
        self.search.__signature__ = _signature(self.names)

    def _search(self, *tensors):
        """The search, as Inductor traces it again on a region's inputs before it checks them: the first graph's
        whose declarations they meet, else the first graph's (its check then reports the near miss). Inductor's
        first pass ignores a convolution's kernel size, stride and padding, so a region of another group's may
        come here: where the first graph cannot compute it at all, the trace fails (a RuntimeError, which Inductor
        takes for no match, quietly: torch logs each op that fails on fake tensors as an error), and the region is
        left to the group it belongs to."""
        if not all(isinstance(t, torch.Tensor) for t in tensors):  # `x + 1.0` is an add too: not this region
            raise RuntimeError(f"{self.members[0].graph.name}: a Python number where the graph declares a tensor")
        values = dict(zip(self.names, tensors))
        fitting = next((m for m in self.members if m.mismatch(values) is None), None)
        if fitting is not None:
            return fitting.search(*tensors)
        fake_tensor_log = logging.getLogger("torch._subclasses.fake_tensor")
        disabled, fake_tensor_log.disabled = fake_tensor_log.disabled, True
        try:
            return self.members[0].search(*tensors)
        except DslError as e:  # the reference refused these shapes
            raise RuntimeError(f"{self.members[0].graph.name}: {e}") from None
        finally:
            fake_tensor_log.disabled = disabled

    def register(self, into: PatternMatcherPass, discovery: PatternMatcherPass) -> None:
        first = self.members[0]
        self.into = into
        register_replacement(self.search, self.replace, first.natives, fwd_only, into, extra_check=self.valid)
        # Inductor re-traces a match's search in the matched dtypes before `valid` sees it, and that trace
        # casts to the declared ones: a region in another dtype never reaches `valid`. The search as first
        # traced (integers unchecked) finds it, after the replacement above, to report it; it replaces nothing.
        forward = gen_pattern(self.search, first.natives, fwd_only)
        register_graph_pattern(forward, extra_check=self.in_other_dtype, pass_dict=into)(self.report_other_dtype)
        # In a joint graph the forward's values are also read by the backward: matched whatever their users, the
        # forward says which of a region's inputs want gradients, and so which pattern with its backward to trace.
        register_graph_pattern(_any_users(copy.deepcopy(forward)), extra_check=self.discover, pass_dict=discovery)(
            _nothing
        )

    def discover(self, match: Match) -> bool:
        """A region's forward in a joint graph: its pattern with the backward of the gradients it wants, traced
        the first time they are seen (none for a graph taken for inference only)."""
        if not self.members[0].training:
            return False
        self.report.discover(match.nodes)
        wanting = tuple(n for n in self.floats if match.kwargs[n] in self.wanting)
        if wanting and wanting not in self.traced:
            self.traced.add(wanting)
            first = self.members[0]
            with unset_fake_temporarily():  # traced on real examples, outside the compile's fake tensors
                examples = [e.clone().requires_grad_(n in wanting) for n, e in zip(self.names, first.natives)]
                try:
                    pattern = register_replacement(
                        self.search, self.replace, examples, _joint, self.into, extra_check=self.valid_training
                    )
                except (DslError, RuntimeError):  # no backward to trace for these gradients: nothing to match
                    pattern = None
                if pattern:
                    _loosen_lists(pattern)
        return False

    def replace(self, *tensors):
        # Inductor traces the replacement right after `valid` accepted the match, which chose the graph
        return self.chosen.replace(*tensors)

    def valid_training(self, match: Match) -> bool:
        return self.valid(match, training=True)

    def valid(self, match: Match, training: bool = False) -> bool:
        """Whether the matched inputs are what one of the graphs declares; the report says what was done."""
        last = _last(match)
        at = where(last)
        values = _matched(match, self.names)
        out = last.meta.get("val")
        unsearched = _unsearched_argument(match)
        if unsearched is not None:
            self.report.miss(last, NearMiss(self.members[0].label, at, unsearched), match.nodes)
            return False
        whys = []
        for member in self.members:
            why = member.mismatch(values, out)
            if why is None:
                self.chosen = member
                self.report.replace(last, Replaced(member.label, at, training, member.flops(values)))
                return True
            whys.append(why)
        first = self.members[0]
        if len(self.members) == 1:
            self.report.miss(last, NearMiss(first.label, at, whys[0]), match.nodes)
        else:
            label = f"{first.graph.name} and {len(self.members) - 1} graphs of its form"
            why = f"none declares these inputs ({first.graph.name}: {whys[0]})"
            self.report.miss(last, NearMiss(label, at, why), match.nodes)
        return False

    def in_other_dtype(self, match: Match) -> bool:
        values = _matched(match, self.names)
        if not all(isinstance(v, torch.Tensor) for v in values.values()):
            return False  # a Python number (`x + 1.0`): not the graph's region in another dtype
        return all(m.dtype_mismatch(values) is not None for m in self.members)

    def report_other_dtype(self, match: Match, *args, **kwargs) -> None:
        """A region of the graph's ops in other dtypes, as a near miss; the graph is left as it is."""
        first, last = self.members[0], _last(match)
        why = first.dtype_mismatch(_matched(match, self.names))
        self.report.miss(last, NearMiss(first.label, where(last), why), match.nodes)


def _example_instance(graph: Graph, pinned: dict[str, int]) -> Instance:
    """The shape the search is traced at: each symbolic dim's first value from 2 + its place on, so that no size is
    1 (torch traces a matmul or attention over unit dims into other ops) and no two dims are equal (a view of
    equal sizes can trace into nothing), but the `pinned` ones (a unit dim the model's tensors do not hold); the
    graph's first shape where that shape is not one it declares."""
    binding = {}
    for k, s in enumerate(graph.symbols):
        start = 2 + k
        values = range(start, start + 64) if s.span is not None else sorted(v for v in s.values if v >= start)
        binding[s.name] = pinned.get(s.name) or next((v for v in values if s.accepts(v)), None)
    if not binding or None in binding.values():
        return graph.instances[0]
    try:
        return graph.instance(binding)
    except (NotFound, DslError):
        return graph.instances[0]


def token_rows(graph: Graph) -> str | None:
    """The batch dim B of a graph over tokens: every input that has B is [B, T, D], B first, and every output
    [B, T, F], B of any size from 1, so that a model may hold them as rows [T, D] (B = 1: a Linear, a norm over a
    2-D input); None for any other graph (attention's [B, H, T, E], a convolution's [N, C, H, W])."""
    dims = dict(graph.input_dims)
    firsts = {d[0] for d in dims.values() if len(d) == 3 and isinstance(d[0], str)}
    if len(firsts) != 1:
        return None
    b = firsts.pop()
    symbol = next(s for s in graph.symbols if s.name == b)
    if any(b in d and (len(d) != 3 or d[0] != b) for d in dims.values()) or not symbol.accepts(1):
        return None
    for size in (1, 2):
        inst = _example_instance(graph, {b: size})
        if dict(inst.binding).get(b) != size:
            return None
        if any(len(s := inst.type(v.name).shape) != 3 or s[0] != size for v in graph.outputs):
            return None
    return b


def wanting_gradients(graph: torch.fx.Graph) -> set[torch.fx.Node] | None:
    """The forward values of a joint graph that want gradients: those computed from an input whose gradient
    the graph returns; None for a graph with no backward."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not any(str(n.target).startswith("tangents") for n in placeholders):
        return None
    primals = [n for n in placeholders if str(n.target).startswith("primals")]
    [output] = [n for n in graph.nodes if n.op == "output"]
    grads = list(output.args[0])[-len(primals) :] if primals else []
    wanting = {p for p, g in zip(primals, grads) if g is not None}
    for node in graph.nodes:
        if node.op != "call_function" or node.meta.get("partitioner_tag") == "is_backward":
            continue
        if _floating(node.meta.get("val")) and any(a in wanting for a in node.all_input_nodes):
            wanting.add(node)
    return wanting


def _floating(value) -> bool:
    """Whether a node's value is, or holds (a split's tensors), a floating-point tensor."""
    if isinstance(value, (list, tuple)):
        return any(_floating(v) for v in value)
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _joint(fn, args, **kwargs) -> torch.fx.GraphModule:
    """The search traced with its backward as a model's joint graph is when the custom pass sees it: with
    Inductor's uniform constants folded where it folds them (a ReLU's backward reads a `full`, where the trace
    has a `scalar_tensor`)."""
    gm = joint_fwd_bwd(fn, args, **kwargs)
    if inductor_config.joint_graph_constant_folding:
        constant_fold_uniform_value(gm)
    return gm


def _calls(pattern: PatternExpr):
    """Each call in a pattern, once."""
    seen: set[int] = set()
    stack = [pattern]
    while stack:
        p = stack.pop()
        if id(p) in seen:
            continue
        seen.add(id(p))
        if isinstance(p, CallFunction):
            yield p
        stack += [
            a for a in (*getattr(p, "args", ()), *getattr(p, "kwargs", {}).values()) if isinstance(a, PatternExpr)
        ]
        stack += [a for a in getattr(p, "outputs", ()) if isinstance(a, PatternExpr)]


def _any_users(pattern: PatternExpr) -> PatternExpr:
    """The pattern with every node matched whatever its number of users (a joint graph's backward reads them)."""
    for p in _calls(pattern):
        p.users = MULTIPLE
    return pattern


def _loosen_lists(pattern: PatternExpr) -> None:
    """Inductor's first pass matches a call's integer arguments loosely (`*`, lists of them included) but
    compares the structure of its list arguments, which a loose list no longer has: a call with a list of other
    constants as well (a convolution backward's output mask, a `full`'s shape) never matches. Those lists are
    loosened too; the check of the search traced again on the region's inputs compares every argument."""
    for p in _calls(pattern):
        args = (*p.args, *p.kwargs.values())
        if not any(isinstance(a, Ignored) for a in args) or not any(isinstance(a, (list, tuple)) for a in args):
            continue
        p.args = tuple(_loose(a) for a in p.args)
        p.kwargs = {k: _loose(a) for k, a in p.kwargs.items()}
        if not any(isinstance(a, (list, tuple, dict)) for a in (*p.args, *p.kwargs.values())):
            p.flatten = type(p).simple_flatten
            p.flat_args_kwargs = p.flatten(p.args, p.kwargs)


def _loose(arg):
    """A list of constants as Inductor's first pass matches an integer: anything."""
    constant = isinstance(arg, (list, tuple)) and not any(isinstance(x, PatternExpr) for x in arg)
    return Ignored() if constant else arg


#: the reductions a search holds, whose `dtype=` (a model's own) Inductor's match does not compare
_REDUCTIONS = (torch.ops.aten.mean.dim, torch.ops.aten.sum.dim_IntList)


def _unsearched_argument(match: Match) -> str | None:
    """A keyword argument of the region's ops that no search passes and Inductor's match does not compare: an add or
    addmm scaling a term (`torch.add(x, r, alpha=0.5)`, `torch.addmm(b, x, w, beta=0.5)`), a reduction computing
    in a dtype of its own (`x.mean(-1, dtype=torch.float64)`)."""
    for node in (n for n in match.nodes if n.op == "call_function"):
        for scale in ("alpha", "beta"):
            if node.kwargs.get(scale, 1) != 1:
                return f"{node.target} scales a term ({scale}={node.kwargs[scale]}), which the graph does not"
        if node.kwargs.get("dtype") is not None and node.target in _REDUCTIONS:
            return f"{node.target} computes in {node.kwargs['dtype']}, which the graph does not"
    return None


def _nothing(match: Match, *args, **kwargs) -> None:
    """A discovery match replaces nothing (its check did the work)."""


def _signature(names) -> inspect.Signature:
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])


def _last(match: Match) -> torch.fx.Node:
    """A match's output node: the region's last op."""
    return match.output_nodes()[0] or match.nodes[-1]


def _matched(match: Match, names) -> dict[str, torch.Tensor]:
    """The matched inputs' (fake) values by name."""
    return {n: v.meta["val"] if isinstance(v := match.kwargs[n], torch.fx.Node) else v for n in names}


def _hint(size) -> int:
    """A size's value in the example that torch.compile traces (a symbolic one's hint)."""
    return size if isinstance(size, int) else size.node.hint
