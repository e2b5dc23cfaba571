"""Standalone scripts — the cuDNN Frontend calls of a graph, and its torch reference.

The cuDNN script is produced by running the real lowering pass against a recorder that writes
each call it receives as a line of Python, so the script and `cudnn-dsl run` cannot drift apart.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import math
import re

from cudnn_dsl.build.pipeline import compile_shape, dynamic_shapes
from cudnn_dsl.target.dtypes import torch_dtype_name
from dsl.ir import Graph, Instance
from dsl.types import DTYPE_RANGE, is_float

# User text (file path, graph and tensor names, numbers) reaches a script only through _doc (in a
# docstring), _lit (as a literal) or _ident (as a fresh identifier); _name guards the names that
# the lowering and the options write as code.


def _doc(text) -> str:
    """`text` for the inside of a triple-quoted docstring: repr's escapes, and every `"` escaped."""
    return repr(str(text))[1:-1].replace('"', '\\"')


def _lit(x) -> str:
    """Python source for a literal: the repr of its plain type, inf and nan as float('inf'); other types refused."""
    if isinstance(x, (_Sym, bool)) or x is None:
        return repr(x)
    if isinstance(x, (int, str)):  # int() and str() drop subclasses, whose repr may be anything
        return repr(int(x) if isinstance(x, int) else str(x))
    if isinstance(x, float):  # numpy's repr is `np.float64(0.5)`
        return repr(float(x)) if math.isfinite(x) else f"float({str(float(x))!r})"
    if isinstance(x, list):
        return f"[{', '.join(map(_lit, x))}]"
    if isinstance(x, tuple):
        return f"({', '.join(map(_lit, x))}{',' if len(x) == 1 else ''})"
    if isinstance(x, slice):
        return f"slice({_lit(x.start)}, {_lit(x.stop)}, {_lit(x.step)})"
    raise TypeError(f"emit: cannot write a {type(x).__name__} into a script")


def _name(s: str) -> str:
    """A name written as code (cuDNN attribute, keyword argument, heuristic mode): a plain identifier only."""
    if not (s.isascii() and s.isidentifier()) or keyword.iskeyword(s):
        raise ValueError(f"emit: {s!r} is not a plain Python name")
    return s


_HEAD = """import hashlib
import math

import cudnn
import torch
"""

#: names a script reads that it does not bind itself: a .cdg name never takes one (a tensor named `range` would
#: break the script's own loop, one named `Exception` its retries)
_SHADOWED = frozenset(dir(builtins)) | {alias.name for st in ast.parse(_HEAD).body for alias in st.names}


def _ident(hint: str, taken: set[str], reserved=frozenset()) -> str:
    """A fresh identifier for a .cdg name: the name itself when Python allows it and it is free, else
    prefixed `t_` (keywords, builtins, the modules a script imports, `reserved`) and/or suffixed `_2`, `_3`,
    ... (taken)."""
    base = re.sub(r"[^0-9A-Za-z_]", "_", hint) or "t"
    if base[0].isdigit() or keyword.iskeyword(base) or base in _SHADOWED or base in reserved:
        base = "t_" + base
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


class _Script:
    RESERVED = frozenset({"g", "handle", "kernel_cache", "i"})  # the names build() itself binds

    def __init__(self):
        self.lines: list[str] = []
        self.names: set[str] = set()

    def var(self, hint: str) -> str:
        return _ident(hint, self.names, self.RESERVED)


class _Sym:
    """A value of the emitted script; attribute access and calls become script text."""

    def __init__(self, script: _Script, expr: str):
        self._script, self._expr = script, expr

    def __repr__(self) -> str:
        return self._expr

    def __getattr__(self, name: str) -> _Sym:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Sym(self._script, f"{self._expr}.{_name(name)}")

    def __getitem__(self, i) -> _Sym:
        return _Sym(self._script, f"{self._expr}[{_lit(i)}]")

    def __call__(self, *args, **kwargs) -> _Sym:
        parts = [_lit(a) for a in args] + [f"{_name(k)}={_lit(v)}" for k, v in kwargs.items()]
        call = f"{self._expr}({', '.join(parts)})"
        method = self._expr.rsplit(".", 1)[-1]
        if method.startswith("set_"):
            self._script.lines.append(call)
            return self
        hint = "g" if method == "pygraph" else str(kwargs.get("name") or method)
        name = "g" if method == "pygraph" else self._script.var(hint)
        self._script.lines.append(f"{name} = {call}")
        return _Sym(self._script, name)


def _constraints(o) -> str:
    """The options' note constraints, as run applies them (build.constrain)."""
    lines = []
    if o.deterministic:
        lines.append("g.deselect_numeric_notes([cudnn.numerical_note.NONDETERMINISTIC])")
    if o.no_runtime_compilation:
        lines.append("g.deselect_behavior_notes([cudnn.behavior_note.RUNTIME_COMPILATION])")
    return "".join("\n    " + line for line in lines)


def _build_step(o, policy: str) -> str:
    """build_plans, or with excluded engines the first plan of another engine that builds (the frontend's
    deselect_engines matches names by substring: eng4 would bar eng41)."""
    if not o.exclude_engines:
        return f"    g.build_plans(cudnn.build_plan_policy.{policy})"
    engines = sorted(set(o.exclude_engines))
    excluded = _lit(tuple(engines))
    return f"""    for i in range(g.get_execution_plan_count()):  # option exclude_engines = {engines}
        if g.get_engine_and_knobs_at_index(i)[0] not in {excluded}:
            try:
                g.build_plan_at_index(i)
                return g
            except Exception:  # a plan that does not build: the next one
                continue
    raise RuntimeError("no plan of an engine not excluded builds")"""


def _graph_function(fname: str, graph: Graph, inst: Instance, o, doc: str) -> tuple[str, dict, dict]:
    """`def fname(handle)` building `graph` with the frontend (the lowering pass run against a recorder), in
    dynamic-shape mode `def fname(handle, kernel_cache)`, as a run builds it; also its pass-by-value tensors,
    uid -> (value, dtype), and its scratch tensors, name -> uid."""
    script = _Script()
    cache = _Sym(script, "kernel_cache") if dynamic_shapes(graph, o) else None
    handle, cudnn = _Sym(script, "handle"), _Sym(script, "cudnn")
    low = compile_shape(graph, inst, o, stop="lowered", handle=handle, cudnn=cudnn, kernel_cache=cache)
    policy = "ALL" if o.build_policy == "all" else "HEURISTICS_CHOICE"
    body = "\n".join("    " + line for line in script.lines)
    modes = ", ".join(f"cudnn.heur_mode.{_name(m)}" for m in o.modes())
    ws_limit = (
        f"\n    g.deselect_workspace_greater_than({_lit(o.workspace_limit)})" if o.workspace_limit is not None else ""
    )
    text = f'''def {fname}(handle{", kernel_cache" if cache is not None else ""}):
    """{doc}"""
{body}
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([{modes}]){ws_limit}{_constraints(o)}
    g.check_support()
{_build_step(o, policy)}
    return g
'''
    return text, low.host_values, low.scratch


def _host(values: dict) -> str:
    items = (
        f"{_lit(uid)}: torch.full((1,), {_lit(val)}, dtype={torch_dtype_name(dt)})" for uid, (val, dt) in values.items()
    )
    return "{" + ", ".join(items) + "}"


def bound_uids(graph: Graph, scratch: dict) -> list[tuple[str, int]]:
    """(name, uid) of the tensors a graph binds (its scratch tensors too: written, read by no one)."""
    return [(v.name, v.uid) for v in graph.values if v.kind in ("input", "output")] + list(scratch.items())


def _uids(graph: Graph, scratch: dict) -> str:
    return "{" + ", ".join(f"{_lit(n)}: {_lit(uid)}" for n, uid in bound_uids(graph, scratch)) + "}"


def _views(graph: Graph, inst: Instance, into: str, only=None) -> str:
    """Lines setting each view of a buffer (at an element offset) in dict `into`; `only`: of these buffers."""
    return "".join(
        f"\n    {into}[{_lit(v.name)}] = {into}[{_lit(v.view[0])}].as_strided("
        f"{_lit(list(inst.type(v.name).shape))}, {_lit(list(inst.type(v.name).strides))}, {_lit(v.view[1])})"
        for v in graph.views
        if only is None or v.view[0] in only
    )


def own_memory(graph: Graph, extra=()) -> list[str]:
    """The names that get memory of their own: buffers, the bound tensors but views and outputs in place, and
    `extra` (scratch tensors, a split graph's intermediates)."""
    own = [b.name for b in graph.buffers]
    own += [v.name for v in graph.values if v.kind in ("input", "output") and v.view is None and v.into is None]
    return own + list(extra)


def _make_buffers(graph: Graph, inst: Instance, o, inits, extra=()) -> str:
    """`make_buffers`: every input drawn as `run` draws it (portable.draw_values: same seed, same values),
    outputs and `extra` (a split graph's intermediates) empty, a bool tensor as cuDNN's packed bytes."""
    from cudnn_dsl.run.inputs import copied_inputs, input_inits, packed_ragged, view_inits
    from cudnn_dsl.target.memory import owned

    own = own_memory(graph, extra)

    def alloc(t) -> str:
        if t.dtype == "bool":
            return f"torch.zeros({_lit((t.storage + 7) // 8)}, dtype=torch.uint8, device=device)"
        return f"torch.empty_strided({_lit(list(t.shape))}, {_lit(list(t.strides))}, dtype={torch_dtype_name(t.dtype)}, device=device)"

    def fill(name: str, init) -> str:
        t = inst.type(name)
        clamp = "" if is_float(t.dtype) or t.dtype == "bool" else f", {_lit(tuple(DTYPE_RANGE[t.dtype]))}"
        shape = _lit(list(t.shape))
        values = f"draw_values({_lit(init.dist)}, {_lit(init.args)}, {shape}, {torch_dtype_name(t.dtype)}, seed, {_lit(name)}{clamp})"
        if t.dtype == "bool":
            values = f"pack_bool({values}, {shape}, {_lit(list(t.strides))}, {_lit(t.storage)})"
        cut = "[:1]" if owned(t) else ""  # a batch stride left to ragged offsets: batch 0 is the memory
        return f"\n    buffers[{_lit(name)}]{cut}.copy_({values}{cut})"

    def copy(name: str, source: str) -> str:  # like(x): x's values, last, as run copies them
        t, s = inst.type(name), inst.type(source)
        values = f"buffers[{_lit(source)}]"
        if t.dtype == "bool":
            logical = f"unpack_bool({values}, {_lit(list(s.shape))}, {_lit(list(s.strides))}, {_lit(s.storage)})"
            return f"\n    buffers[{_lit(name)}].copy_(pack_bool({logical}, {_lit(list(t.shape))}, {_lit(list(t.strides))}, {_lit(t.storage)}))"
        cut = "[:1]" if owned(t) else ""
        return f"\n    buffers[{_lit(name)}]{cut}.copy_({values}{cut})"

    allocs = "\n".join(f"        {_lit(n)}: {alloc(inst.type(n))}," for n in own)
    fills = "".join(fill(n, init) for n, init in input_inits(graph, inst, inits).items())
    indices = "".join(fill(n, init) for n, init in view_inits(graph, inst, inits).items())  # over their buffers
    indices += "".join(  # ragged offsets as run draws them: the sequences packed back to back, inside the buffers
        f"\n    buffers[{_lit(n)}].copy_(packed_offsets(buffers[{_lit(lengths)}].cpu(), {_lit(list(t.shape))}, "
        f"{_lit(list(t.strides))}).view({_lit(list(inst.type(n).shape))}))"
        for n, (t, lengths) in packed_ragged(graph, inst, inits).items()
    )
    copies = "".join(copy(n, source) for n, source in copied_inputs(graph, inits).items())
    in_place = "".join(f"\n    buffers[{_lit(v.name)}] = buffers[{_lit(v.into)}]" for v in graph.in_place)
    return f'''def make_buffers(device="cuda", seed={_lit(o.seed)}):
    """Inputs drawn as `cudnn-dsl run --seed SEED` draws them (the file's init=, else its dtype's default; on the
    CPU, so the same values on every device), the rest empty, each in the graph's layout (a bool tensor: cuDNN's
    bytes, eight elements a byte)."""
    buffers = {{
{allocs}
    }}{fills}{_views(graph, inst, "buffers")}{indices}{copies}{in_place}
    return buffers
'''


def _bools(graph: Graph, inst: Instance) -> str:
    """{name: (shape, strides, storage)} of the bool outputs: printed unpacked."""
    items = []
    for v in graph.outputs:
        t = inst.type(v.name)
        if t.dtype == "bool":
            items.append(f"{_lit(v.name)}: ({_lit(list(t.shape))}, {_lit(list(t.strides))}, {_lit(t.storage)})")
    return "{" + ", ".join(items) + "}"


_PRINT = """    for name in OUTPUTS:
        t = (unpack_bool(buffers[name], *BOOLS[name]) if name in BOOLS else buffers[name]).float()
        print(f"{name}: shape {tuple(t.shape)}, mean {t.mean().item():.4g}, max |x| {t.abs().max().item():.4g}")
"""


def portable_source() -> str:
    """The constants and functions of cudnn_dsl.target.portable as written there: what a script draws its inputs
    and packs bool tensors with."""
    import inspect

    from cudnn_dsl.target import portable

    text = inspect.getsource(portable)
    nodes = [n for n in ast.parse(text).body if isinstance(n, (ast.FunctionDef, ast.Assign))]
    return "\n\n\n".join(ast.get_source_segment(text, n) for n in nodes)


_DYNAMIC = """

    In cuDNN's dynamic-shape mode (option shape_mode = dynamic), as `cudnn-dsl run` builds it: give the builds of
    every shape of the graph one `kernel_cache` (cudnn.create_kernel_cache()), and they share its kernels."""


def emit_cudnn(graph: Graph, inst: Instance, options=None, partition=None, inits=None) -> str:
    """A runnable script: build the graph with the cuDNN Frontend, run it once, print the outputs. With a
    `partition` (partition.plan_for_target's, of a graph cuDNN declines whole), the script builds each
    part as a graph of its own and runs them in order. `inits`: how inputs are drawn, over the file's init=."""
    o = options or graph.options
    if partition is not None:
        return _emit_parts(graph, inst, o, partition, inits)
    dynamic = dynamic_shapes(graph, o)
    doc = "validate -> build_operation_graph -> create_execution_plans -> check_support -> build_plans."
    build, host, scratch = _graph_function("build", graph, inst, o, doc + (_DYNAMIC if dynamic else ""))
    cache = "\n    kernel_cache = cudnn.create_kernel_cache()" if dynamic else ""
    shape = f" ({_doc(inst.label)})" if inst.binding else ""
    return f'''"""Graph '{_doc(graph.name)}'{shape} built with the cuDNN Frontend directly.

Emitted by `cudnn-dsl emit --format cudnn` from {_doc(graph.file)}. Standalone: needs only torch and cudnn.
"""

{_HEAD}
UIDS = {_uids(graph, scratch)}
INPUTS = {_lit([v.name for v in graph.device_inputs])}
OUTPUTS = {_lit([v.name for v in graph.outputs])}
BOOLS = {_bools(graph, inst)}


{portable_source()}


def host_scalars():
    """Pass-by-value scalars, by uid (cuDNN reads them from host memory at launch)."""
    return {_host(host)}


{build}

{_make_buffers(graph, inst, o, inits, scratch)}

def execute(g, handle, buffers, workspace, scalars):
    pack = {{UIDS[name]: t for name, t in buffers.items() if name in UIDS}}
    pack.update(scalars)
    g.execute(pack, workspace, handle=handle)


if __name__ == "__main__":
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream){cache}
    g = build(handle{", kernel_cache" if dynamic else ""})
    buffers = make_buffers()
    workspace = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device="cuda")
    execute(g, handle, buffers, workspace, host_scalars())
    torch.cuda.synchronize()
{_PRINT}'''


#: the module names a script binds (its imports are _SHADOWED): a part's traced reference takes none of them
_SCRIPT_GLOBALS = frozenset(
    {"UIDS", "INPUTS", "OUTPUTS", "BOOLS", "INTERMEDIATES", "TORCH_PARTS"}
    | {"host_scalars", "build", "make_buffers", "execute", "handle", "graphs", "buffers", "workspace", "size", "name"}
    | {"CHUNK", "stream_seed", "draw", "draw_values", "pack_bool", "unpack_bool", "inf", "nan", "t"}
    | {"ragged_span", "packed_offsets"}
)


def _emit_parts(graph: Graph, inst: Instance, o, partition, inits) -> str:
    """The script of a graph cuDNN declines whole: one frontend graph per part, a part left to torch as its
    traced reference, a view as its operand's memory, the tensors between parts allocated in their inferred
    dtype, the parts run in order."""
    from cudnn_dsl.run.buffers import written
    from cudnn_dsl.run.partition import CUDNN, VIEW, declined_whole
    from dsl.subgraph import subgraph

    taken = set(_SCRIPT_GLOBALS)
    functions, uids, hosts, calls, torch_parts, made = [], [], [], [], [], []
    for k, p in enumerate(partition.parts, 1):
        ops = p.ops(graph)
        sub = p.graph or subgraph(graph, inst, p.first, p.end, f"{graph.name}_part{k}")
        if p.kind != VIEW:  # a view's result is its operand's memory
            made += [v.name for v in sub.outputs if graph.value(v.name).kind != "output" and v.name not in made]
        taken |= {f"build_part{k}", f"run_part{k}"}
        if p.kind == CUDNN:
            doc = f"Part {k}: {_doc(ops)}."
            text, host, scratch = _graph_function(f"build_part{k}", sub, sub.instances[0], o, doc)
            functions.append(text)
            uids.append(_uids(sub, scratch))
            made += [n for n in scratch if n not in made]
            hosts.append(_host(host))
            calls.append(f"build_part{k}(handle)")
        else:
            functions.append(
                _view_part(k, graph, inst, p.first, ops) if p.kind == VIEW else _torch_part(k, sub, ops, p.why, taken)
            )
            uids.append("None")
            hosts.append("None")
            calls.append("None")
            torch_parts.append(f"{k - 1}: run_part{k}")
    shape = f" ({_doc(inst.label)})" if inst.binding else ""
    lines = "\n".join(f"  {_doc(line)}" for line in partition.lines(graph))
    keep = sorted(written(graph))
    snapshot = (
        f"\n    for name in {_lit(keep)}:  # an output overwrites it: later parts read it as it was\n"
        f"        env[name] = buffers[name].clone(){_views(graph, inst, 'env', set(keep))}"
        if keep
        else ""
    )
    parts = "".join(f"    {u},\n" for u in uids)
    body = "\n\n".join(functions)
    return f'''"""Graph '{_doc(graph.name)}'{shape} built with the cuDNN Frontend directly, as {_parts(len(partition.parts))} run in order.

{_doc(declined_whole(partition.declined, "the graph"))}; the parts are those deviceless planning found:
{lines}
Emitted by `cudnn-dsl emit --format cudnn` from {_doc(graph.file)}. Standalone: needs only torch and cudnn.
"""

{_HEAD}
INPUTS = {_lit([v.name for v in graph.device_inputs])}
OUTPUTS = {_lit([v.name for v in graph.outputs])}
INTERMEDIATES = {_lit(made)}
BOOLS = {_bools(graph, inst)}
UIDS = [  # per part, the tensors it binds, name -> uid; None: a part left to torch, or a view
{parts}]


{portable_source()}


def host_scalars():
    """Pass-by-value scalars of each part, by uid (cuDNN reads them from host memory at launch)."""
    return [{", ".join(hosts)}]


{body}

TORCH_PARTS = {{{", ".join(torch_parts)}}}


def build(handle):
    """Every part's cuDNN graph, in order (None: a part left to torch)."""
    return [{", ".join(calls)}]


{_make_buffers(graph, inst, o, inits, made)}

def execute(graphs, handle, buffers, workspace, scalars):
    """Runs the parts in order on `buffers` (by name; the INTERMEDIATES pass from part to part there)."""
    env = dict(buffers){snapshot}
    for k, g in enumerate(graphs):
        if g is None:
            TORCH_PARTS[k](env)
            continue
        pack = {{uid: env[name] for name, uid in UIDS[k].items()}}
        pack.update(scalars[k])
        g.execute(pack, workspace, handle=handle)


if __name__ == "__main__":
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    graphs = build(handle)
    buffers = make_buffers()
    size = max([1] + [g.get_workspace_size() for g in graphs if g is not None])
    workspace = torch.empty(size, dtype=torch.uint8, device="cuda")
    execute(graphs, handle, buffers, workspace, host_scalars())
    torch.cuda.synchronize()
{_PRINT}'''


def _parts(n: int) -> str:
    return f"{n} part" if n == 1 else f"{n} parts"


def _view_part(k: int, graph: Graph, inst: Instance, index: int, ops: str) -> str:
    """`run_part{k}(buffers)`: a reshape that is a view — its result its operand's memory, copied only into a
    buffer of its own (an output)."""
    node = graph.nodes[index]
    operand, result, t = _lit(node.inputs[0]), _lit(node.outputs[0]), inst.type(node.outputs[0])
    seen = f"buffers[{operand}]"
    if t.dtype != "bool":  # a bool tensor's packed bytes are the same bytes
        seen += f".as_strided({_lit(list(t.shape))}, {_lit(list(t.strides))}, {seen}.storage_offset())"
    write = (
        f"buffers[{result}].copy_({seen})"
        if graph.value(node.outputs[0]).kind == "output"
        else f"buffers[{result}] = {seen}"
    )
    return f'''def run_part{k}(buffers):
    """Part {k}: {_doc(ops)}, a view: its operand's memory, no kernel."""
    {write}
'''


def _torch_part(k: int, sub: Graph, ops: str, why: str, taken: set[str]) -> str:
    """`run_part{k}(buffers)`: a part no cuDNN engine runs, as its reference traced to torch calls, reading
    and writing `buffers`; when the reference does not trace, a function that raises, saying so."""
    inst = sub.instances[0]
    doc = f"Part {k}: {_doc(ops)}, on torch: not cuDNN, even alone ({_doc(why)})."
    try:
        fname = _ident(f"part{k}_reference", taken)
        function, _ = _torch_function(sub, inst, fname, taken)
    except Exception as e:  # noqa: BLE001 - what does not trace is said in the script, which raises there
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        message = f"part {k} ({ops}) runs on no cuDNN engine, and its torch reference is not in this script"
        return f'''def run_part{k}(buffers):
    """{doc}"""
    # its torch reference did not trace to plain torch calls: {_doc(reason)}
    raise NotImplementedError({_lit(message)})
'''
    # a scalar on the tensors' device: reshaped to their rank, a CPU one no longer meets CUDA tensors
    on = next((f", device=buffers[{_lit(v.name)}].device" for v in sub.inputs if v.kind != "scalar"), "")
    args = [
        f"torch.tensor({_lit(float(v.scalar))}{on})" if v.kind == "scalar" else f"buffers[{_lit(v.name)}]"
        for v in sub.inputs
    ]
    stores = []
    for i, v in enumerate(sub.outputs):
        t, value = inst.type(v.name), f"made[{i}]"
        if t.dtype == "bool":
            value = f"pack_bool({value}, {_lit(list(t.shape))}, {_lit(list(t.strides))}, {_lit(t.storage)})"
        stores.append(f"\n    buffers[{_lit(v.name)}].copy_({value})")
    return f'''{function}

def run_part{k}(buffers):
    """{doc}"""
    made = {fname}({", ".join(args)}){"".join(stores)}
'''


def emit_torch(graph: Graph, inst: Instance) -> str:
    """The reference as a standalone torch function, traced at aten level with fake tensors."""
    names = [v.name for v in graph.inputs]
    function, params = _torch_function(graph, inst, "reference", {"torch", "reference", "inf", "nan"})
    sig = ", ".join(f"{p}: {inst.type(n)}" + (f" (.cdg name {n})" if p != n else "") for p, n in zip(params, names))
    outs = ", ".join(v.name for v in graph.outputs)
    return f'''"""PyTorch reference of graph '{_doc(graph.name)}', emitted by `cudnn-dsl emit --format torch` from {_doc(graph.file)}.

Inputs, in order: {_doc(sig)}. Returns ({_doc(outs)},). Math in float32; outputs rounded to their dtypes.
"""

import torch

{function}'''


def traceable_reference(graph: Graph, inst: Instance, native: bool = False, device: str = "cpu"):
    """The reference of one shape as a function of the graph's inputs in order, returning its outputs as a
    tuple, and an example of each input on `device` (a scalar as a 0-dim tensor): what make_fx traces.
    `native`: each op as a PyTorch user writes it (run_reference's native mode; a torch.compile pattern's
    search, patterns.py)."""
    import torch

    from cudnn_dsl.run.reference import run_reference
    from cudnn_dsl.target.memory import empty

    names = [v.name for v in graph.inputs]

    def fn(*args):
        outs = run_reference(graph, inst, dict(zip(names, args)), device, native=native)
        return tuple(outs[v.name] for v in graph.outputs)

    examples = [
        torch.tensor(float(v.scalar)) if v.kind == "scalar" else empty(inst.type(v.name), device) for v in graph.inputs
    ]
    return fn, examples


def _torch_function(graph: Graph, inst: Instance, fname: str, taken: set[str]) -> tuple[str, list[str]]:
    """`def fname(inputs...)`, preceded by the module globals it reads: the reference of `graph` traced at
    aten level with fake tensors, returning its outputs; and its parameters. Its parameters and globals take
    names not in `taken` (the module's other names), and are added to it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    names = [v.name for v in graph.inputs]
    fn, examples = traceable_reference(graph, inst)
    gm = make_fx(fn, tracing_mode="fake")(*examples)
    gm.graph.eliminate_dead_code()  # what feeds no output (the compare's masks of undefined elements)
    gm.recompile()
    # fx writes `def forward(self, arg0_1, ...)`: its body is rewritten as a syntax tree, never as text.
    [func] = [s for s in ast.parse(gm.code).body if isinstance(s, ast.FunctionDef)]
    placeholders = [a.arg for a in func.args.args[1:]]
    assert len(placeholders) == len(names), (placeholders, names)
    # Every name the new globals and parameters take is fresh: none hides one the body uses.
    taken |= {n.id for n in ast.walk(func) if isinstance(n, ast.Name)} - {"self"} | {"torch", fname, "inf", "nan"}
    tensors = [p for p, v in zip(placeholders, graph.inputs) if v.kind != "scalar"]
    device = _ident("device", taken) if tensors else None
    consts = _lift_constants(func, taken, device)
    if consts and device:  # read first: fx frees a parameter (`x = None`) after its last use
        func.body.insert(0, ast.parse(f"{device} = {tensors[0]}.device").body[0])
    params = [_ident(n, taken) for n in names]
    rename = dict(zip(placeholders, params))
    for n in ast.walk(func):
        if isinstance(n, ast.Name) and n.id in rename:
            n.id = rename[n.id]
    free = _free_names(func, params)
    globals_ = [f"{n} = float({n!r})" for n in ("inf", "nan") if n in free]  # how fx spells non-finite floats
    globals_ += [
        f"{g} = torch.tensor({_lit(getattr(gm, a).tolist())}, dtype={getattr(gm, a).dtype})" for a, g in consts.items()
    ]
    unknown = free - {"torch", "inf", "nan", *consts.values()} - set(dir(builtins))
    if unknown:
        raise ValueError(f"emit --format torch: the traced reference uses {sorted(unknown)}, which the script lacks")
    lines: list[str] = []
    for st in func.body:  # fx's layout: freeing `x = None` statements on the line of the last use
        frees = isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) and st.value.value is None
        if frees and lines:
            lines[-1] += ";  " + ast.unparse(st)
        else:
            lines.append(ast.unparse(st))
    body = "\n".join("    " + line for line in lines)
    consts_block = "\n".join(globals_) + "\n\n" if globals_ else ""
    text = f"""{consts_block}
def {fname}({", ".join(params)}):
{body}
"""
    return text, params


def _lift_constants(func: ast.FunctionDef, taken: set[str], device: str | None) -> dict[str, str]:
    """Rewrites make_fx's `self._tensor_constantN` (number literals of the graph) as module globals, each
    read on the inputs' device, the variable `device` (a constant reshaped to the inputs' rank is no longer
    a 0-dim tensor that torch moves by itself); returns {attribute: global name}."""
    consts: dict[str, str] = {}

    class Unself(ast.NodeTransformer):
        def visit_Attribute(self, node):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                if node.attr not in consts:
                    consts[node.attr] = _ident(node.attr.lstrip("_"), taken)
                const = ast.Name(consts[node.attr], ast.Load())
                if device is None:
                    return const
                return ast.Call(ast.Attribute(const, "to", ast.Load()), [ast.Name(device, ast.Load())], [])
            return self.generic_visit(node)

    Unself().visit(func)
    return consts


def _free_names(func: ast.FunctionDef, params: list[str]) -> set[str]:
    """The names the body reads but neither assigns nor takes as a parameter."""
    local = set(params) | {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return {n.id for n in ast.walk(func) if isinstance(n, ast.Name)} - local
