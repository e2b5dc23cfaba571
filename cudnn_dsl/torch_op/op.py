"""Runtime layer: a compiled graph as a real torch operator, so that torch.compile traces it with no
graph break, torch.export exports it, and CUDA-graph capture replays it.

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
  builds or loads), launched by run.launch (a shape run in parts: each part in turn). The inputs' shapes,
  strides, dtypes and device are checked once per combination, their 16-byte alignment on every call;
  outputs are allocated per call, as a torch op's must be.
- CPU kernel: the graph's **PyTorch reference** (cuDNN runs on CUDA tensors only), its outputs laid out
  as the CUDA kernel lays them out (bool bit-packed), so that opcheck and a model on the CPU run. It is
  not cuDNN.
"""

from __future__ import annotations

import hashlib
import keyword
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from cudnn_dsl.run.buffers import BindingError, view, written
from cudnn_dsl.run.compiled import CompiledGraph
from cudnn_dsl.run.launch import arguments
from cudnn_dsl.target.dtypes import torch_dtype
from cudnn_dsl.target.memory import empty, stored
from dsl.autodiff import Derived, derive
from dsl.diagnostics import DslError
from dsl.ir import Graph, NotFound, Program
from dsl.syntax.printer import dump_ir
from dsl.types import ALIGNMENT, is_float, stride_order

NAMESPACE = "cudnn_dsl"
_LIB: list = []
"""the one torch.library.Library fragment of the namespace, made on first use"""
_OPS: dict[str, TorchOp] = {}
"""op name -> its TorchOp: a graph of the same content and options is one op in a process"""


def _library():
    if not _LIB:
        _LIB.append(torch.library.Library(NAMESPACE, "FRAGMENT"))
    return _LIB[0]


def op_name(graph: Graph, options) -> str:
    """The graph's name made a valid op name, and a hash of its checked content and options: a graph
    compiled twice is one op, two graphs of one name are two."""
    text = dump_ir(Program(graph.file, (graph,))) + repr(options)
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


def _dense(shape, order) -> tuple:
    """Packed strides for a shape that may hold symbolic sizes (dense_strides, without comparing them)."""
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        d = shape[axis]
        step = step * (max(1, d) if isinstance(d, int) else d)
    return tuple(strides)


def _rules(graph: Graph, names: list[str]) -> dict | None:
    """name -> (dims, axis order) of each output, dims as _fit gives them; None when some output is not
    a packed layout of such dims in every shape (the fake kernel then specializes)."""
    insts = _probes(graph)
    bindings = [dict(i.binding) for i in insts]
    out = {}
    for name in names:
        types = [i.type(name) for i in insts]
        order = stride_order(types[0].strides)
        if any(t.strides != _dense(t.shape, order) for t in types):
            return None
        dims = tuple(_fit([t.shape[k] for t in types], bindings) for k in range(len(types[0].shape)))
        if None in dims:
            return None
        out[name] = (dims, order)
    return out


def _returned(outs: list):
    """A kernel's result as its schema returns it: nothing, one tensor, or a tuple."""
    return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)


class TorchOp:
    """A compiled graph registered as `torch.ops.cudnn_dsl.<name>`; call it with the graph's inputs by
    position (the schema's order: tensors, then scalars) or by name. It returns the graph's outputs:
    one tensor, or a tuple in the graph's order. A bool output is cuDNN's bit-packed bytes
    (`cudnn_dsl.unpack_bits` reads it), exactly what the launch writes.

    `op.overload` is the OpOverload itself (`torch.ops.cudnn_dsl.<name>.default`), `op.schema` its schema.
    Called on inputs that require grad, it runs the graph's augmented forward op instead, whose backward
    is the derived backward graph (GradOps); its outputs then carry gradients.
    """

    def __init__(self, name: str, cg):
        self.name = name
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
        self._launches: dict[tuple, Any] = {}
        self.launches = 0
        """how many times the CUDA kernel ran on the host (a CUDA-graph replay runs it on the device only)"""
        self._register()
        self.overload = getattr(getattr(torch.ops, NAMESPACE), name).default

    @property
    def qualname(self) -> str:
        return f"{NAMESPACE}::{self.name}"

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
        lib = _library()
        lib.define(self.name + self.schema)
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
        if kwargs or len(args) < len(self.tensor_names):
            args = self.positional(args, kwargs)
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in args):
            wrt = tuple(n for n, t in zip(self.tensor_names, args) if t.requires_grad)
            result = getattr(getattr(torch.ops, NAMESPACE), _grad_op(self.name, wrt)).default(*args)
            return result if isinstance(result, torch.Tensor) else _returned(list(result[: len(self.fresh)]))
        result = self.overload(*args)
        if not self.in_place:
            return result
        fresh = dict(zip(self.fresh, (result,) if len(self.fresh) == 1 else result or ()))
        names, inst = self.named(args), self.graph.instances[0]
        outs = [
            fresh[v.name] if v.name in fresh else view(self.graph.value(self.in_place[v.name]), inst, names)
            for v in self.graph.outputs
        ]
        return _returned(outs)

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
        if self.rules is None:
            inst = self._concrete(binding)
            outs = [empty(inst.type(n), device) for n in self.fresh]
        else:
            outs = []
            for n in self.fresh:
                dims, order = self.rules[n]
                shape = tuple(d if isinstance(d, int) else binding[d[0]] * d[1] + d[2] for d in dims)
                strides = _dense(shape, order)
                dtype = self.graph.instances[0].type(n).dtype
                if dtype == "bool":  # cuDNN's packed bytes (bits.nbytes)
                    storage = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
                    outs.append(torch.empty(((storage + 7) // 8,), dtype=torch.uint8, device=device))
                else:
                    outs.append(torch.empty_strided(shape, strides, dtype=torch_dtype(dtype), device=device))
        return _returned(outs)

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
        tensors = self.named(args)
        cg = self._serving(torch.device("cpu"))
        inst = cg.instance_for(tensors)
        values = cg.reference(tensors)
        outs = []
        for v in self.graph.outputs:
            t = inst.type(v.name)
            value = stored(values[v.name], t)
            if v.into is not None:
                view(self.graph.value(v.into), inst, tensors).copy_(value)
            else:
                buf = empty(t, "cpu")
                buf.copy_(value)
                outs.append(buf)
        return _returned(outs)

    def cuda_kernel(self, *args):
        """cuDNN on CUDA tensors: the arguments in the schema's order (trailing scalars may be left out)."""
        self.launches += 1
        n = len(self.tensor_names)
        tensors = args[:n]
        key = tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors)
        launch = self._launches.get(key)
        if launch is None or any(t.data_ptr() % ALIGNMENT for t in tensors):
            named = self.named(args)
            launch = self._launches[key] = _off_graph_pools(lambda: self._first(named), tensors[0].device)
        values = args + self.defaults[len(args) - n :]
        if torch.cuda.current_device() != tensors[0].device.index:
            with torch.cuda.device(tensors[0].device):
                return _returned(launch(values))
        return _returned(launch(values))

    def _first(self, named: dict):
        """The launch for inputs of this kind, their every property checked (a BindingError says what is wrong);
        its plans and workspaces made here, off the graph pools."""
        cg = self._serving(named[self.tensor_names[0]].device)
        inst = cg.instance_for(named)
        cg.bind_outputs(inst, named)
        return cg.parts(inst).launcher()

    def forget(self, device: torch.device) -> None:
        """Drops the launches worked out for a device (its compiled graph was replaced)."""
        self._launches = {k: v for k, v in self._launches.items() if k[0][3] != device}


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


def as_torch_op(cg) -> TorchOp:
    """A compiled graph (cudnn_dsl.compile) as a torch operator; the same graph and options give the same
    op in a process. The op runs cuDNN on CUDA tensors and the PyTorch reference on CPU tensors."""
    name = op_name(cg.graph, cg.options)
    op = _OPS.get(name)
    if op is None:
        op = _OPS[name] = TorchOp(name, cg)
    if cg.device is not None and op.compiled.get(cg.device) is not cg:  # the latest graph serves its device
        op.compiled[cg.device] = cg
        op.forget(cg.device)
    return op


# ---- the training path: the augmented forward and the backward as torch ops ---------------------


class GradOps:
    """A graph op's (TorchOp) training path, for the gradients of `wrt`: two torch ops.

    - `<op>_ad<mask>`: the augmented forward. Its arguments are the graph op's; it returns the graph's
      outputs, then the values the backward reads that are no output (saved intermediates, a norm's or
      sdpa's statistics), as torch's own ops return theirs (native_layer_norm's mean and rstd). Its
      autograd is the derived backward, through torch.library.register_autograd.
    - `<op>_bw<mask>`: the backward, `(Tensor[] kept, Tensor?[] grads, SymInt[] dims, scalars) ->
      Tensor[]`: the kept values, the outputs' gradients (None: zero), the symbolic dims' values.

    Both are shape-generic ops whose kernels run the graphs derived for the shape at hand (derived and
    compiled on first use of a shape, each as a graph op of its own: plans from the store, the reference on
    the CPU); their fake kernels specialize on the sizes (the derived graphs are per shape).
    """

    def __init__(self, op: TorchOp, wrt: tuple[str, ...]):
        if op.mutated:
            raise NotImplementedError(
                f"graph '{op.graph.name}' writes an input in place; its torch op has no backward "
                f"(cudnn_dsl.torch_op.autograd.differentiable runs it with one)"
            )
        self.op, self.wrt = op, wrt
        self._shapes: dict[tuple, tuple[Derived, TorchOp, TorchOp]] = {}
        self.symbols = tuple(dict(op.graph.instances[0].binding))
        first = self.shape(op.graph.instances[0].binding)[0]
        self.outputs = tuple(op.fresh)
        self.saved, self.kept = self._values(first)
        self.grads = tuple(w for w, _ in first.grads)
        mask = "".join("1" if n in wrt else "0" for n in op.tensor_names)
        self.name, self.backward_name = f"{op.name}_ad{mask}", f"{op.name}_bw{mask}"
        args = op.schema.split(" -> ")[0][1:-1]
        returns = ", ".join("Tensor" for _ in self.outputs + self.saved)  # one: `(Tensor)` is `Tensor`
        lib = _library()
        lib.define(f"{self.name}({args}) -> ({returns})")
        lib.impl(self.name, lambda *a: self.forward_kernel("cpu_kernel", a), "CPU")
        lib.impl(self.name, lambda *a: self.forward_kernel("cuda_kernel", a), "CUDA")
        torch.library.register_fake(
            f"{NAMESPACE}::{self.name}", lambda *a: self.forward_kernel("fake_kernel", a), lib=lib
        )
        scalars = "".join(", " + s for s in op.scalar_args())
        lib.define(f"{self.backward_name}(Tensor[] kept, Tensor?[] grads, SymInt[] dims{scalars}) -> Tensor[]")
        lib.impl(self.backward_name, lambda *a: self.backward_kernel("cpu_kernel", a), "CPU")
        lib.impl(self.backward_name, lambda *a: self.backward_kernel("cuda_kernel", a), "CUDA")
        torch.library.register_fake(
            f"{NAMESPACE}::{self.backward_name}", lambda *a: self.backward_kernel("fake_kernel", a), lib=lib
        )
        lib.impl(self.backward_name, torch.library.fallthrough_kernel, "Autograd")  # no second derivatives
        self.backward_op = getattr(getattr(torch.ops, NAMESPACE), self.backward_name).default
        torch.library.register_autograd(
            f"{NAMESPACE}::{self.name}", self.backward, setup_context=self.setup_context, lib=lib
        )

    def shape(self, binding) -> tuple[Derived, TorchOp, TorchOp]:
        """(the derivation, the augmented forward's op, the backward's op) of one shape."""
        key = tuple(sorted(dict(binding).items()))
        if key not in self._shapes:
            g = self.op.graph
            d = derive(g, g.instance(dict(key)) if key else g.instances[0], self.wrt)
            if self._shapes and self._values(d) != self._values(next(iter(self._shapes.values()))[0]):
                raise NotImplementedError(
                    f"graph '{g.name}': its derived backward reads other values at {dict(key)} (the op's "
                    f"schema is the first shape's)"
                )
            fwd, bwd = (as_torch_op(CompiledGraph(part, self.op.options)) for part in (d.forward, d.backward))
            self._shapes[key] = (d, fwd, bwd)
        return self._shapes[key]

    def _values(self, d: Derived) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the values the augmented forward returns beyond the graph's outputs, the values the backward reads)"""
        outputs = {v.name for v in self.op.graph.outputs}
        saved = tuple(v.name for v in d.forward.outputs if v.name not in outputs)
        return saved, tuple(dict.fromkeys(of for _, kind, of in d.bind if kind in ("value", "transposed")))

    def _binding(self, tensors: dict) -> dict:
        shapes = {k: tuple(tensors[k].shape) for k in self.op.tensor_names}
        return self.op.graph.binding_of(shapes)

    def forward_kernel(self, kernel: str, args: tuple):
        named = self.op.named(args)
        binding = {k: int(v) for k, v in self._binding(named).items()}
        _, fwd, _ = self.shape(binding)
        result = getattr(fwd, kernel)(*fwd.positional((), named))
        got = dict(zip(fwd.fresh, _results(result)))
        return _returned([got[n] for n in self.outputs + self.saved])

    def backward_kernel(self, kernel: str, args: tuple):
        kept, grads, dims = args[:3]
        d, _, bwd = self.shape(dict(zip(self.symbols, map(int, dims))))
        values = dict(zip(self.kept, kept))
        given = dict(zip(self.outputs, grads))
        real = kernel != "fake_kernel"
        device = kept[0].device if kept else next(g for g in grads if g is not None).device
        bound: dict = {}
        for name, kind, of in d.bind:
            if kind in ("grad", "grad_transposed"):
                t = d.forward.instances[0].type(of)
                g = given.get(of)
                if g is None:
                    g = empty(t, device).zero_()
                elif real and tuple(g.stride()) != t.strides:  # cuDNN reads the declared layout
                    g = empty(t, device).copy_(g)
                value = g.transpose(-1, -2) if kind == "grad_transposed" else g
            else:
                value = values[of].transpose(-1, -2) if kind == "transposed" else values[of]
            bound[name] = value
        scalars = dict(zip((v.name for v in self.op.scalars), args[3:]))
        bound.update((v.name, scalars[v.name]) for v in bwd.scalars if v.name in scalars)  # the forward's, as given
        result = getattr(bwd, kernel)(*bwd.positional((), bound))
        got = dict(zip(bwd.fresh, _results(result)))
        return [got[name] for _, name in d.grads]

    def setup_context(self, ctx, inputs, output):
        named = self.op.named(tuple(inputs))
        values = {**named, **dict(zip(self.outputs + self.saved, _results(output)))}
        ctx.save_for_backward(*(values[k] for k in self.kept))
        binding = self._binding(named)
        ctx.dims = [binding[s] for s in self.symbols]
        ctx.scalars = tuple(named[v.name] for v in self.op.scalars)

    def backward(self, ctx, *grads):
        got = self.backward_op(list(ctx.saved_tensors), list(grads[: len(self.outputs)]), ctx.dims, *ctx.scalars)
        by_input = dict(zip(self.grads, got))
        return tuple(by_input.get(n) for n in self.op.tensor_names) + (None,) * len(ctx.scalars)


def _results(result) -> tuple:
    """A kernel's result as a tuple (one tensor, or several)."""
    return (result,) if isinstance(result, torch.Tensor) else tuple(result)


_GRAD_OPS: dict[tuple[str, tuple[str, ...]], GradOps] = {}


def grad_ops(op: TorchOp, wrt: tuple[str, ...]) -> GradOps:
    """The training path of a graph op for the gradients of `wrt`, made once per process."""
    key = (op.name, wrt)
    if key not in _GRAD_OPS:
        _GRAD_OPS[key] = GradOps(op, wrt)
    return _GRAD_OPS[key]


class GraphModule(torch.nn.Module):
    """A compiled graph as an nn.Module: `state` holds some of its inputs (weights, running statistics), an
    nn.Parameter registered as a parameter and a tensor as a buffer; forward takes the others, by position
    in the graph's order or by name, and returns what the op returns."""

    def __init__(self, graph, **state: torch.Tensor):
        super().__init__()
        self.op = graph if isinstance(graph, TorchOp) else as_torch_op(graph)
        unknown = set(state) - set(self.op.arg_names)
        if unknown:
            raise BindingError(f"graph '{self.op.graph.name}' has no input {', '.join(sorted(unknown))}")
        for name, t in state.items():
            if isinstance(t, torch.nn.Parameter):
                self.register_parameter(name, t)
            else:
                self.register_buffer(name, t)
        self.held = tuple(state)
        self.free = tuple(n for n in self.op.arg_names if n not in state)

    def forward(self, /, *args, **kwargs):
        named = dict(zip(self.free, args))
        named.update(kwargs)
        named.update((n, getattr(self, n)) for n in self.held)
        return self.op(**named)
