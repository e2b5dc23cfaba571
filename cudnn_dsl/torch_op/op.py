"""A compiled graph as a real torch operator, so that torch.compile traces it with no graph break,
torch.export exports it, and CUDA-graph capture replays it.

The op is defined with the low-level `torch.library.Library` API (define, impl, register_fake): a call
through the dispatcher into a Python kernel, without `@torch.library.custom_op`'s wrapping layers
(`bench/torch_op.py` measures both). Its schema is the graph's: every bound tensor (a buffer, an input
that is no view), then every scalar with its declared value as default; an input that an output is
written over (`output y in x`, or a view's buffer) is `Tensor(a!)`. The op returns the outputs it
allocates; an output in place is its input's memory, returned as such by the Python wrapper.

- Fake (meta) kernel: the checker's types. Each output dim is read as `a * D + b` of one symbolic dim D
  of the `.cdg` (fitted on the typed shapes, checked on a third value of a range), so a symbolic size
  stays symbolic; a graph whose outputs follow no such rule (a conv over a symbolic H) specializes on
  the inputs' sizes instead.
- CUDA kernel: the compiled graph's plans (the plan store, as everywhere; the first call of a shape
  builds or loads), run by a launch plan per kind of arguments (run.launch_plan: every part bound once, a
  later call rebinding only its own arguments and outputs, through the backend's raw-pointer launch). The
  inputs' shapes, strides, dtypes and device are checked once per combination, their 16-byte alignment on
  every call; outputs are allocated per call, as a torch op's must be.
- CPU kernel: the graph's **PyTorch reference** (cuDNN runs on CUDA tensors only), its outputs laid out
  as the CUDA kernel lays them out (bool bit-packed), so that opcheck and a model on the CPU run. It is
  not cuDNN. Its arguments are checked as the CUDA kernel's are, once per kind of arguments.

Every kernel holds the arguments to one layout contract (torch_op.layout): one laid out otherwise than
declared is copied into its layout with a LayoutWarning, or refused by a strict op; the ops are tagged so
that Inductor passes them the strides eager mode would (library.LAYOUT_TAGS).
"""

from __future__ import annotations

import atexit
import hashlib
import keyword
import re
from concurrent.futures import ThreadPoolExecutor

import torch

from cudnn_dsl.run.buffers import BindingError, check_inputs, relayout, view, written
from cudnn_dsl.run.compiled import CompiledGraph, specs
from cudnn_dsl.run.launch import arguments
from cudnn_dsl.run.launch_plan import LaunchPlan, LaunchPlans
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.memory import empty, stored
from cudnn_dsl.torch_op.eager import Eager, eligible
from cudnn_dsl.torch_op.layout import Layouts, Relaid, dense, laid_out
from cudnn_dsl.torch_op.library import LAYOUT_TAGS, NAMESPACE, fragment, returned
from cudnn_dsl.torch_op.training import grad_ops
from cudnn_dsl.torch_op.tuning import ensure_tuned
from dsl.diagnostics import DslError
from dsl.ir import Graph, NotFound, Program
from dsl.syntax.printer import dump_ir
from dsl.types import is_float, stride_order

_OPS: dict[str, TorchOp] = {}
"""op name -> its TorchOp: a graph of the same content and options is one op in a process"""


@atexit.register
def _release() -> None:
    """At exit, before the interpreter's teardown, every op lets go of its compiled graphs and launch plans: torch's
    op registry keeps each op alive to the end, past the cuDNN Frontend's module, which would report the frontend
    objects they hold as leaked (a page of nanobind warnings after a script's last line)."""
    for op in _OPS.values():
        op.compiled.clear()
        op.plans.clear()
        op.references.clear()


def op_name(graph: Graph, options, strict: bool = False) -> str:
    """The graph's name made a valid op name, and a hash of its checked content, options and layout contract: a
    graph compiled twice is one op, two graphs of one name are two."""
    text = dump_ir(Program(graph.file, (graph,))) + repr(options) + (" strict" if strict else "")
    base = re.sub(r"[^A-Za-z0-9_]", "_", graph.name)
    return f"{'g_' if base[:1].isdigit() else ''}{base}_{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _arg(name: str) -> str:
    """A graph name as a schema argument: a Python keyword or `self` gets a trailing underscore."""
    return name + "_" if keyword.iskeyword(name) or name == "self" else name


def _scalar_type(dtype: str) -> str:
    return "float" if is_float(dtype) else "bool" if dtype == "bool" else "int"


def _literal(value, dtype: str) -> str:
    if dtype == "bool":
        return str(bool(value))
    return repr(float(value)) if is_float(dtype) else str(int(value))


# ---- shapes as functions of the symbolic dims ---------------------------------------------------


def _probes(graph: Graph) -> list:
    """The typed shapes, plus a middle value of each range (its ends alone fit any line)."""
    insts = list(graph.instances)
    base = dict(insts[0].binding)
    for s in graph.symbols:
        if s.name in base and s.span is not None and s.count > 2:
            lo, _, step = s.span
            try:
                insts.append(graph.instance({**base, s.name: lo + step * (s.count // 2)}))
            except (NotFound, DslError):  # that value breaks a shape rule: the fit is checked on the ends only
                pass
    return insts


def _fit(values: list[int], bindings: list[dict]):
    """One dim over the probes: an int, or (symbol, a, b) for a * symbol + b; None when neither fits."""
    if len(set(values)) == 1:
        return values[0]
    for sym in bindings[0]:
        points = sorted(set(zip((b[sym] for b in bindings), values)))
        if len({x for x, _ in points}) != len(points):  # varies with another dim too
            continue
        (x0, y0), (x1, y1) = points[0], points[-1]
        if (y1 - y0) % (x1 - x0):
            continue
        a = (y1 - y0) // (x1 - x0)
        if all(y == a * x + y0 - a * x0 for x, y in points):
            return (sym, a, y0 - a * x0)
    return None


def _rules(graph: Graph, names: list[str]) -> dict | None:
    """name -> (dims, axis order) of each output, dims as _fit gives them; None when some output is not
    a packed layout of such dims in every shape (the fake kernel then specializes)."""
    insts = _probes(graph)
    bindings = [dict(i.binding) for i in insts]
    out = {}
    for name in names:
        types = [i.type(name) for i in insts]
        order = stride_order(types[0].strides)
        if any(t.strides != dense(t.shape, order) for t in types):
            return None
        dims = tuple(_fit([t.shape[k] for t in types], bindings) for k in range(len(types[0].shape)))
        if None in dims:
            return None
        out[name] = (dims, order)
    return out


class TorchOp:
    """A compiled graph registered as `torch.ops.cudnn_dsl.<name>`; call it with the graph's inputs by
    position (the schema's order: tensors, then scalars) or by name. It returns the graph's outputs:
    one tensor, or a tuple in the graph's order. A bool output is cuDNN's bit-packed bytes
    (`cudnn_dsl.unpack_bits` reads it), exactly what the launch writes.

    `op.overload` is the OpOverload itself (`torch.ops.cudnn_dsl.<name>.default`), `op.schema` its schema.
    Called on inputs that require grad, it runs the graph's augmented forward op instead, whose backward
    is the derived backward graph (training.GradOps); its outputs then carry gradients.

    A tensor argument laid out otherwise than the graph declares is copied into its layout, with a
    LayoutWarning, on every device; a `strict` op raises a BindingError instead (torch_op.layout).
    """

    def __init__(self, name: str, cg, strict: bool = False):
        self.name = name
        self.strict = strict
        self.graph: Graph = cg.graph
        self.options = cg.options
        self.compiled = {}
        """device -> the CompiledGraph serving it: the latest one as_torch_op was given for its device, else
        one made from the same graph and options"""
        self._make = lambda device: CompiledGraph(self.graph, self.options, device)
        g = self.graph
        tensors, scalars = arguments(g)
        self.tensor_names, self.scalars = list(tensors), list(scalars)
        self.arg_names = self.tensor_names + [v.name for v in self.scalars]
        self.defaults = tuple(v.scalar for v in self.scalars)
        self.mutated = [n for n in self.tensor_names if n in written(g)]
        """the arguments an output is written over (`Tensor(a!)` in the schema)"""
        self.fresh = [v.name for v in g.outputs if v.into is None]
        self.in_place = {v.name: v.into for v in g.outputs if v.into is not None}
        if not self.tensor_names:
            raise BindingError(f"graph '{g.name}' binds no tensor: a torch op takes its device from one", g.loc)
        self.schema = self._schema()
        self.rules = _rules(g, self.fresh) if g.symbols else None
        self.plain = not self.in_place
        """no output is written in place (the op returns its fresh outputs as the dispatcher gives them)"""
        self.layouts = Layouts(g, self.tensor_names, strict, "as_torch_op(cg, strict=True)")
        self.plans = LaunchPlans(len(self.tensor_names), lambda values: self._kind(values, self._first))
        """the CUDA kernel's launch plans, one per kind of arguments"""
        self.references = LaunchPlans(len(self.tensor_names), lambda values: self._kind(values, self._reference))
        """the CPU kernel's runs of the reference, one per kind of arguments, as the CUDA kernel's"""
        self.eager = Eager(self)
        """the eager training path (torch_op.eager), taken where nothing traces or intercepts the call"""
        self.launches = 0
        """how many times the CUDA kernel ran on the host (a CUDA-graph replay runs it on the device only)"""
        self.tune = False
        """whether each shape's plans are timed on its first run, the fastest kept in the plan store (tuning)"""
        self._register()
        self.overload = getattr(getattr(torch.ops, NAMESPACE), name).default

    @property
    def qualname(self) -> str:
        return f"{NAMESPACE}::{self.name}"

    def __repr__(self) -> str:
        """The op's name and schema, then its arguments and outputs as the graph declares them."""
        described = (*specs(self.graph, self.graph.inputs).values(), *specs(self.graph, self.graph.outputs).values())
        layout = "strict" if self.strict else "a misplaced input copied"
        lines = [f"TorchOp torch.ops.{NAMESPACE}.{self.name}{self.schema}, graph '{self.graph.name}', layout: {layout}"]
        lines += [f"  {spec!r}" for spec in described]
        lines += [f"  dim {s.name} in {s.text}" for s in self.graph.symbols]
        return "\n".join(lines)

    def _schema(self) -> str:
        alias = {n: f"a{i}" for i, n in enumerate(self.mutated)}
        args = [f"Tensor({alias[n]}!) {_arg(n)}" if n in alias else f"Tensor {_arg(n)}" for n in self.tensor_names]
        returns = "Tensor" if len(self.fresh) == 1 else "(" + ", ".join("Tensor" for _ in self.fresh) + ")"
        return f"({', '.join(args + self.scalar_args())}) -> {returns}"

    def scalar_args(self) -> list[str]:
        """The schema's scalar arguments, each with its declared value as default."""
        inst = self.graph.instances[0]
        return [
            f"{_scalar_type(t.dtype)} {_arg(v.name)}={_literal(v.scalar, t.dtype)}"
            for v, t in ((v, inst.type(v.name)) for v in self.scalars)
        ]

    def _register(self) -> None:
        lib = fragment()
        lib.define(self.name + self.schema, tags=LAYOUT_TAGS)
        lib.impl(self.name, self.cuda_kernel, "CUDA")
        lib.impl(self.name, self.cpu_kernel, "CPU")
        torch.library.register_fake(self.qualname, self.fake_kernel, lib=lib)
        # A fallthrough on the Autograd key: this op is the no-grad path, and register_autograd's kernel
        # would cost it ~25 µs per call. A call whose inputs want a gradient goes to the graph's augmented
        # forward instead (GradOps, chosen by __call__), an op of its own with the
        # derived backward registered.
        lib.impl(self.name, torch.library.fallthrough_kernel, "Autograd")

    # ---- calling ---------------------------------------------------------------------------

    def __call__(self, /, *args, **kwargs):
        if not kwargs and self.plain and len(args) == len(self.tensor_names):  # exactly the schema's tensors
            for t in args:  # one that wants a gradient (or is no tensor) takes the general path
                if getattr(t, "requires_grad", True) and torch.is_grad_enabled():
                    break
            else:
                return self.overload(*args)
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict):
        if kwargs or len(args) < len(self.tensor_names):
            args = self.positional(args, kwargs)
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in args):
            count = len(self.tensor_names)
            if eligible(args[:count]):  # eagerly, nothing else looking: the derived graphs' ops from one Function
                full = args if len(args) == len(self.arg_names) else args + self.defaults[len(args) - count :]
                return self.eager(full, self._grad_ops)
            wrt = tuple(n for n, t in zip(self.tensor_names, args) if t.requires_grad)
            result = getattr(getattr(torch.ops, NAMESPACE), _grad_op(self.name, wrt)).default(*args)
            return result if isinstance(result, torch.Tensor) else returned(list(result[: len(self.fresh)]))
        result = self.overload(*args)
        if not self.in_place:
            return result
        fresh = dict(zip(self.fresh, (result,) if len(self.fresh) == 1 else result or ()))
        names, inst = self.named(args), self.graph.instances[0]
        outs = [
            fresh[v.name] if v.name in fresh else view(self.graph.value(self.in_place[v.name]), inst, names)
            for v in self.graph.outputs
        ]
        return returned(outs)

    def _grad_ops(self, wrt: tuple[str, ...]):
        return grad_ops(self, wrt)

    def positional(self, args: tuple, kwargs: dict) -> tuple:
        """Arguments given by name as the schema orders them; a scalar left out takes its declared value."""
        names = dict(zip(self.arg_names, args))
        twice = set(names) & set(kwargs)
        if twice:
            raise TypeError(f"graph '{self.graph.name}': {', '.join(sorted(twice))} given by position and by name")
        names.update(kwargs)
        unknown = set(names) - set(self.arg_names)
        if unknown:
            raise BindingError(f"graph '{self.graph.name}' has no input {', '.join(sorted(unknown))}")
        for n in self.tensor_names:
            if n not in names:
                v = self.graph.value(n)
                raise BindingError(f"graph '{self.graph.name}': {v.kind} '{n}' is not bound", v.loc)
        return tuple(names[n] for n in self.tensor_names) + tuple(
            names.get(v.name, d) for v, d in zip(self.scalars, self.defaults)
        )

    def named(self, args: tuple) -> dict:
        """The kernel's arguments by graph name; scalars left out take their declared values."""
        return dict(zip(self.arg_names, args + self.defaults[len(args) - len(self.tensor_names) :]))

    def _serving(self, device: torch.device):
        cg = self.compiled.get(device)
        if cg is None:
            cg = self.compiled[device] = self._make(device)
        return cg

    # ---- kernels -------------------------------------------------------------------------------

    def fake_kernel(self, *args):
        """The outputs' shapes, dtypes and strides, from the checker's types, for fake and meta tensors."""
        tensors = self.named(args)
        device = tensors[self.tensor_names[0]].device
        binding = self.graph.binding_of({k: tuple(tensors[k].shape) for k in self.tensor_names})
        self._check_fake(tensors, binding)
        self.layouts.misplaced(tensors)
        if self.rules is None:
            inst = self._concrete(binding)
            outs = [empty(inst.type(n), device) for n in self.fresh]
        else:
            outs = []
            for n in self.fresh:
                dims, order = self.rules[n]
                shape = tuple(d if isinstance(d, int) else binding[d[0]] * d[1] + d[2] for d in dims)
                strides = dense(shape, order)
                dtype = self.graph.instances[0].type(n).dtype
                if dtype == "bool":  # cuDNN's packed bytes (bits.nbytes)
                    storage = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
                    outs.append(torch.empty(((storage + 7) // 8,), dtype=torch.uint8, device=device))
                else:
                    outs.append(torch.empty_strided(shape, strides, dtype=torch_dtype(dtype), device=device))
        return returned(outs)

    def _concrete(self, binding: dict):
        """The shape of these sizes, specializing on them (a graph whose outputs follow no affine rule)."""
        try:
            return self.graph.instance({k: int(v) for k, v in binding.items()})
        except NotFound as e:
            raise BindingError(str(e)) from None

    def _check_fake(self, tensors: dict, binding: dict) -> None:
        """Dtype, rank and dims of each bound tensor while tracing (a symbolic dim against its first use)."""
        declared = dict(self.graph.input_dims)
        inst = self.graph.instances[0]
        for name in self.tensor_names:
            t, v, dtype = tensors[name], self.graph.value(name), inst.type(name).dtype
            want = torch.uint8 if dtype == "bool" else torch_dtype(dtype)
            if t.dtype != want:
                raise BindingError(f"'{name}': expected dtype {want}, given {t.dtype}", v.loc)
            if dtype == "bool":  # packed bytes: their count is checked at launch
                continue
            dims = declared.get(name, inst.type(name).shape)
            sizes = [binding.get(d) if isinstance(d, str) else d for d in dims]
            if len(t.shape) != len(dims) or any(d is not None and n != d for n, d in zip(t.shape, sizes)):
                raise BindingError(f"'{name}': expected shape {list(dims)}, given {list(t.shape)}", v.loc)

    def cpu_kernel(self, *args):
        """The PyTorch reference on the CPU, laid out as the CUDA kernel lays its outputs out: not cuDNN."""
        return returned(self.references(args + self.defaults[len(args) - len(self.tensor_names) :]))

    def _reference(self, values: tuple):
        """The CPU kernel's run of arguments of this kind (checked): the reference, outputs stored as cuDNN's."""
        cg = self._serving(torch.device("cpu"))
        inst = cg.instance_for(self.named(values))

        def run(values: tuple) -> list[torch.Tensor]:
            tensors = self.named(values)
            got = cg.reference(tensors)
            outs = []
            for v in self.graph.outputs:
                if v.into is not None:
                    view(self.graph.value(v.into), inst, tensors).copy_(stored(got[v.name], inst.type(v.name)))
                else:
                    outs.append(relayout(got[v.name], inst.type(v.name), "cpu"))
            return outs

        return run

    def cuda_kernel(self, *args):
        """cuDNN on CUDA tensors: the arguments in the schema's order (trailing scalars may be left out)."""
        self.launches += 1
        if len(args) < len(self.arg_names):
            args = args + self.defaults[len(args) - len(self.tensor_names) :]
        outs = self.plans(args)
        return outs[0] if len(outs) == 1 else returned(outs)

    def _kind(self, values: tuple, make):
        """The run of a new kind of arguments (LaunchPlans' key): their names, dtypes and shapes checked, then
        their layouts (torch_op.layout: one laid out otherwise is copied per call, or refused); `make` makes
        the run on arguments in their declared layouts."""
        named = self.named(values)
        check_inputs(self.graph, self._serving(values[0].device).instance_for(named), named, None)
        at = {n: k for k, n in enumerate(self.tensor_names)}
        laid = {at[n]: s for n, s in self.layouts.misplaced(named).items()}
        if not laid:
            return make(values)
        run = make(tuple(laid_out(v, laid[k]) if k in laid else v for k, v in enumerate(values)))
        return Relaid(run, laid, [at[n] for n in self.mutated])

    def _first(self, values: tuple) -> LaunchPlan:
        """The launch plan for arguments of this kind, their every property checked (a BindingError says what
        is wrong); its plans, workspaces and intermediates made here, off the graph pools."""
        named, device = self.named(values), values[0].device
        cg = self._serving(device)

        # tuned where this thread's stream is not capturing a CUDA graph (nothing may be timed then), on the
        # thread that makes the plan: what tuning keeps, too, belongs to no CUDA graph's pool
        tune = self.tune and not torch.cuda.is_current_stream_capturing()

        def make() -> LaunchPlan:
            if tune:
                ensure_tuned(cg, cg.instance_for(named))
            return cg.launch_plan(named)

        return _off_graph_pools(make, device)

    def derived(self, graph: Graph) -> TorchOp:
        """The op of a graph derived from this one (its training path's), with this op's options, contract and
        tuning."""
        op = as_torch_op(CompiledGraph(graph, self.options), strict=self.strict)
        op.tune = self.tune
        return op

    def forget(self, device: torch.device) -> None:
        """Drops the launch plans made for a device (its compiled graph was replaced)."""
        self.plans.forget(device)


def _off_graph_pools(make, device: torch.device):
    """make() on a thread of its own, on `device`. A launch's first call builds or loads its plan and
    allocates what the plan keeps for every later call (its workspace, scratch memory). torch.compile's
    CUDA-graph trees (mode="reduce-overhead") run a compiled function's first calls (warm-up) with every
    allocation of the calling thread sent to their private pool (_use_cuda_memory_pool_manager:
    `_cuda_beginAllocateCurrentThreadToPool`), and then require each live block of that pool to be one of
    the graph's outputs (check_memory_pool: "tensor(s) in the cudagraph pool not tracked as outputs"). Made
    on another thread, those allocations come from the ordinary caching allocator, as they do outside
    torch.compile. A thread per first call (none is kept): it costs microseconds beside a plan's load."""

    def on_device():
        with torch.cuda.device(device):
            return make()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cudnn_dsl_first_call") as pool:
        return pool.submit(on_device).result()


# Derived and registered once, while tracing too, with no graph break: dynamo runs it and keeps its result
# as a constant, given constant arguments (torch 2.11's dynamo takes no TorchOp object here: its name).
@torch.compiler.assume_constant_result
def _grad_op(name: str, wrt: tuple[str, ...]) -> str:
    """The name of the op that runs the graph op `name`'s graph with the gradients of `wrt` derived (GradOps)."""
    return grad_ops(_OPS[name], wrt).name


def as_torch_op(cg, *, strict: bool = False) -> TorchOp:
    """A compiled graph (cudnn_dsl.compile) as a torch operator; the same graph, options and `strict` give the
    same op in a process. The op runs cuDNN on CUDA tensors and the PyTorch reference on CPU tensors. An
    argument laid out otherwise than declared is copied into its layout with a LayoutWarning, or with
    `strict` refused (a BindingError), on every device."""
    name = op_name(cg.graph, cg.options, strict)
    op = _OPS.get(name)
    if op is None:
        op = _OPS[name] = TorchOp(name, cg, strict)
    if cg.device is not None and op.compiled.get(cg.device) is not cg:  # the latest graph serves its device
        op.compiled[cg.device] = cg
        op.forget(cg.device)
    return op
