"""Eject layer: standalone scripts — the cuDNN Frontend calls of a graph, and its torch reference.

The cuDNN script is produced by running the real lowering pass against a recorder that writes
each call it receives as a line of Python, so the script and `cudnn-dsl run` cannot drift apart.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import math
import re

from cudnn_dsl.dtypes import torch_dtype_name
from cudnn_dsl.lower import lower
from dsl.ir import Graph, Instance

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


def _ident(hint: str, taken: set[str], reserved=frozenset()) -> str:
    """A fresh identifier for a .cdg name: the name itself when Python allows it and it is free, else
    prefixed `t_` (keywords, `__debug__`, `reserved`) and/or suffixed `_2`, `_3`, ... (taken)."""
    base = re.sub(r"[^0-9A-Za-z_]", "_", hint) or "t"
    if base[0].isdigit() or keyword.iskeyword(base) or base == "__debug__" or base in reserved:
        base = "t_" + base
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


class _Script:
    RESERVED = frozenset({"cudnn", "torch", "g", "handle"})  # the names build() itself uses

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


def emit_cudnn(graph: Graph, inst: Instance, options=None) -> str:
    """A runnable script: build the graph with the cuDNN Frontend, run it once, print the outputs."""
    script = _Script()
    low = lower(graph, inst, handle=_Sym(script, "handle"), cudnn=_Sym(script, "cudnn"))
    o = options or graph.options
    policy = "ALL" if o.build_policy == "all" else "HEURISTICS_CHOICE"
    body = "\n".join("    " + line for line in script.lines)
    modes = ", ".join(f"cudnn.heur_mode.{_name(m)}" for m in o.modes())
    ws_limit = (
        f"\n    g.deselect_workspace_greater_than({_lit(o.workspace_limit)})" if o.workspace_limit is not None else ""
    )
    tensors = [(v.name, v.uid, inst.type(v.name)) for v in graph.values if v.kind in ("input", "output")]
    tensors += [(n, uid, inst.type(n)) for n, uid in low.scratch.items()]  # written, read by no one
    own = [(b.name, inst.type(b.name)) for b in graph.buffers]  # memory of its own: buffers, the rest but views
    own += [(n, t) for n, _, t in tensors if graph.value(n).view is None and graph.value(n).into is None]
    buffers = "\n".join(
        f"        {_lit(n)}: torch.empty_strided({_lit(list(t.shape))}, {_lit(list(t.strides))}, dtype={torch_dtype_name(t.dtype)},"
        " device=device),"
        for n, t in own
    )
    shared = "".join(  # views of a buffer at an element offset, outputs over the input they overwrite
        f"\n    buffers[{_lit(v.name)}] = buffers[{_lit(v.view[0])}].as_strided("
        f"{_lit(list(inst.type(v.name).shape))}, {_lit(list(inst.type(v.name).strides))}, {_lit(v.view[1])})"
        for v in graph.views
    ) + "".join(f"\n    buffers[{_lit(v.name)}] = buffers[{_lit(v.into)}]" for v in graph.in_place)
    inputs = [v.name for v in graph.device_inputs]
    outputs = [v.name for v in graph.outputs]
    host = ", ".join(
        f"{_lit(uid)}: torch.full((1,), {_lit(val)}, dtype={torch_dtype_name(dt)})"
        for uid, (val, dt) in low.host_values.items()
    )
    shape = f" ({_doc(inst.label)})" if inst.binding else ""
    return f'''"""Graph '{_doc(graph.name)}'{shape} built with the cuDNN Frontend directly.

Emitted by `cudnn-dsl emit --format cudnn` from {_doc(graph.file)}. Standalone: needs only torch and cudnn.
"""

import cudnn
import torch

UIDS = {{{", ".join(f"{_lit(n)}: {_lit(uid)}" for n, uid, _ in tensors)}}}
INPUTS = {_lit(inputs)}
OUTPUTS = {_lit(outputs)}


def host_scalars():
    """Pass-by-value scalars, by uid (cuDNN reads them from host memory at launch)."""
    return {{{host}}}


def build(handle):
    """validate -> build_operation_graph -> create_execution_plans -> check_support -> build_plans."""
{body}
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([{modes}]){ws_limit}{_constraints(o)}
    g.check_support()
{_build_step(o, policy)}
    return g


def make_buffers(device="cuda", seed={_lit(o.seed)}):
    """Inputs filled with uniform values in [-1, 1] (drawn on the CPU: one seed, the same values on every
    device), outputs empty, each in the graph's layout."""
    buffers = {{
{buffers}
    }}
    gen = torch.Generator().manual_seed(seed)
    for name in INPUTS:
        buffers[name].copy_(torch.rand(buffers[name].shape, generator=gen) * 2 - 1){shared}
    return buffers


def execute(g, handle, buffers, workspace, scalars):
    pack = {{UIDS[name]: t for name, t in buffers.items() if name in UIDS}}
    pack.update(scalars)
    g.execute(pack, workspace, handle=handle)


if __name__ == "__main__":
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    g = build(handle)
    buffers = make_buffers()
    workspace = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device="cuda")
    execute(g, handle, buffers, workspace, host_scalars())
    torch.cuda.synchronize()
    for name in OUTPUTS:
        t = buffers[name].float()
        print(f"{{name}}: shape {{tuple(t.shape)}}, mean {{t.mean().item():.4g}}, max |x| {{t.abs().max().item():.4g}}")
'''


def emit_torch(graph: Graph, inst: Instance) -> str:
    """The reference as a standalone torch function, traced at aten level with fake tensors."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from cudnn_dsl.reference import run_reference
    from cudnn_dsl.tensors import empty

    names = [v.name for v in graph.inputs]

    def fn(*args):
        outs = run_reference(graph, inst, dict(zip(names, args)), "cpu")
        return tuple(outs[v.name] for v in graph.outputs)

    examples = []
    for v in graph.inputs:
        t = inst.type(v.name)
        examples.append(torch.tensor(float(v.scalar)) if v.kind == "scalar" else empty(t, "cpu"))
    gm = make_fx(fn, tracing_mode="fake")(*examples)
    gm.graph.eliminate_dead_code()  # what feeds no output (the compare's masks of undefined elements)
    gm.recompile()
    # fx writes `def forward(self, arg0_1, ...)`: its body is rewritten as a syntax tree, never as text.
    [func] = [s for s in ast.parse(gm.code).body if isinstance(s, ast.FunctionDef)]
    placeholders = [a.arg for a in func.args.args[1:]]
    assert len(placeholders) == len(names), (placeholders, names)
    # Every name the new globals and parameters take is fresh: none hides one the body uses.
    taken = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)} - {"self"} | {"torch", "reference", "inf", "nan"}
    consts = _lift_constants(func, taken)
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
    sig = ", ".join(f"{p}: {inst.type(n)}" + (f" (.cdg name {n})" if p != n else "") for p, n in zip(params, names))
    outs = ", ".join(v.name for v in graph.outputs)
    lines: list[str] = []
    for st in func.body:  # fx's layout: freeing `x = None` statements on the line of the last use
        frees = isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) and st.value.value is None
        if frees and lines:
            lines[-1] += ";  " + ast.unparse(st)
        else:
            lines.append(ast.unparse(st))
    body = "\n".join("    " + line for line in lines)
    consts_block = "\n".join(globals_) + "\n\n" if globals_ else ""
    return f'''"""PyTorch reference of graph '{_doc(graph.name)}', emitted by `cudnn-dsl emit --format torch` from {_doc(graph.file)}.

Inputs, in order: {_doc(sig)}. Returns ({_doc(outs)},). Math in float32; outputs rounded to their dtypes.
"""

import torch

{consts_block}
def reference({", ".join(params)}):
{body}
'''


def _lift_constants(func: ast.FunctionDef, taken: set[str]) -> dict[str, str]:
    """Rewrites make_fx's `self._tensor_constantN` (number literals of the graph) as module globals;
    returns {attribute: global name}."""
    consts: dict[str, str] = {}

    class Unself(ast.NodeTransformer):
        def visit_Attribute(self, node):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                if node.attr not in consts:
                    consts[node.attr] = _ident(node.attr.lstrip("_"), taken)
                return ast.Name(consts[node.attr], ast.Load())
            return self.generic_visit(node)

    Unself().visit(func)
    return consts


def _free_names(func: ast.FunctionDef, params: list[str]) -> set[str]:
    """The names the body reads but neither assigns nor takes as a parameter."""
    local = set(params) | {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return {n.id for n in ast.walk(func) if isinstance(n, ast.Name)} - local
