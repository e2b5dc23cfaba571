"""Eject layer: standalone scripts — the cuDNN Frontend calls of a graph, and its torch reference.

The cuDNN script is produced by running the real lowering pass against a recorder that writes
each call it receives as a line of Python, so the script and `cudnn-dsl run` cannot drift apart.
"""

from __future__ import annotations

import keyword
import re

from cudnn_dsl.dtypes import torch_dtype_name
from cudnn_dsl.lower import lower
from dsl.ir import Graph, Instance


class _Script:
    def __init__(self):
        self.lines: list[str] = []
        self.names: set[str] = set()

    def var(self, hint: str) -> str:
        base = re.sub(r"\W", "_", hint) or "t"
        if base[0].isdigit() or keyword.iskeyword(base) or base in ("cudnn", "torch", "g", "handle"):
            base = "t_" + base
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name


class _Sym:
    """A value of the emitted script; attribute access and calls become script text."""

    def __init__(self, script: _Script, expr: str):
        self._script, self._expr = script, expr

    def __repr__(self) -> str:
        return self._expr

    def __getattr__(self, name: str) -> "_Sym":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Sym(self._script, f"{self._expr}.{name}")

    def __getitem__(self, i) -> "_Sym":
        return _Sym(self._script, f"{self._expr}[{i!r}]")

    def __call__(self, *args, **kwargs) -> "_Sym":
        parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        call = f"{self._expr}({', '.join(parts)})"
        method = self._expr.rsplit(".", 1)[-1]
        if method.startswith("set_"):
            self._script.lines.append(call)
            return self
        hint = "g" if method == "pygraph" else str(kwargs.get("name") or method)
        name = "g" if method == "pygraph" else self._script.var(hint)
        self._script.lines.append(f"{name} = {call}")
        return _Sym(self._script, name)


def emit_cudnn(graph: Graph, inst: Instance) -> str:
    """A runnable script: build the graph with the cuDNN Frontend, run it once, print the outputs."""
    script = _Script()
    low = lower(graph, inst, handle=_Sym(script, "handle"), cudnn=_Sym(script, "cudnn"))
    o = graph.options
    policy = "ALL" if o.build_policy == "all" else "HEURISTICS_CHOICE"
    body = "\n".join("    " + line for line in script.lines)
    modes = ", ".join(f"cudnn.heur_mode.{m}" for m in o.modes())
    ws_limit = f"\n    g.deselect_workspace_greater_than({o.workspace_limit})" if o.workspace_limit is not None else ""
    tensors = [(v.name, v.uid, inst.type(v.name)) for v in graph.values if v.kind in ("input", "output")]
    buffers = "\n".join(
        f"        {n!r}: torch.empty_strided({list(t.shape)}, {list(t.strides)}, dtype={torch_dtype_name(t.dtype)}, device=device),"
        for n, _, t in tensors)
    inputs = [v.name for v in graph.of_kind("input")]
    outputs = [v.name for v in graph.outputs]
    host = ", ".join(f"{uid}: torch.full((1,), {val!r}, dtype={torch_dtype_name(dt)})" for uid, (val, dt) in low.host_values.items())
    shape = f" ({inst.label})" if inst.binding else ""
    return f'''"""Graph '{graph.name}'{shape} built with the cuDNN Frontend directly.

Emitted by `cudnn-dsl emit --target cudnn` from {graph.file}. Standalone: needs only torch and cudnn.
"""

import cudnn
import torch

UIDS = {{{", ".join(f"{n!r}: {uid}" for n, uid, _ in tensors)}}}
INPUTS = {inputs!r}
OUTPUTS = {outputs!r}


def host_scalars():
    """Pass-by-value scalars, by uid (cuDNN reads them from host memory at launch)."""
    return {{{host}}}


def build(handle):
    """validate -> build_operation_graph -> create_execution_plans -> check_support -> build_plans."""
{body}
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([{modes}]){ws_limit}
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.{policy})
    return g


def make_buffers(device="cuda", seed={o.seed}):
    """Inputs filled with uniform values in [-1, 1], outputs empty, each in the graph's layout."""
    buffers = {{
{buffers}
    }}
    gen = torch.Generator(device=device).manual_seed(seed)
    for name in INPUTS:
        buffers[name].copy_(torch.rand(buffers[name].shape, generator=gen, device=device) * 2 - 1)
    return buffers


def execute(g, handle, buffers, workspace, scalars):
    pack = {{UIDS[name]: t for name, t in buffers.items()}}
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
        examples.append(empty(t, "cpu") if v.kind == "input" else torch.tensor(float(v.scalar)))
    gm = make_fx(fn, tracing_mode="fake")(*examples)
    code = gm.code.strip()
    code = re.sub(r"def forward\(self, ([^)]*)\)", lambda m: f"def reference({', '.join(names)})", code, count=1)
    args = re.search(r"def forward\(self, (.*?)\):", gm.code).group(1).split(", ")
    renames = "\n".join(f"    {a.strip()} = {n}" for a, n in zip(args, names))
    code = code.replace(":\n", ":\n" + renames + "\n", 1)
    sig = ", ".join(f"{v.name}: {inst.type(v.name)}" for v in graph.inputs)
    outs = ", ".join(v.name for v in graph.outputs)
    return f'''"""PyTorch reference of graph '{graph.name}', emitted by `cudnn-dsl emit --target torch` from {graph.file}.

Inputs: {sig}. Returns ({outs},). Math in float32; outputs rounded to their dtypes.
"""

import torch


{code}
'''
