"""Checking helpers the CPU and GPU tests share, one of each, the device a parameter where both have one
(tinygrad's `helper_test_op`): `check` runs a graph and holds its outputs to the reference, `check_grads`
holds a derived backward's gradients to torch autograd, `reference` runs a graph's reference on seeded CPU
inputs, `as_recorded` holds what cuDNN does with a form to the outcome last seen, and `Copies` counts the
copies a run makes."""

import importlib.util
from collections.abc import Callable, Collection
from pathlib import Path

import pytest
import torch

from cudnn_dsl.target.quirks import backward_avoid

ROOT = Path(__file__).resolve().parents[1]
#: dsl.autodiff.derive's choices for the H200's cuDNN 9.19, where the quirks table's 'derive' rows were seen
ON_H200 = backward_avoid(91900)


class Copies(torch.overrides.TorchFunctionMode):
    """Counts the copies into tensors (Tensor.copy_) made under it: what a view saves is one."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.Tensor.copy_
        return func(*args, **(kwargs or {}))


def reference(text: str, *, seed: int, file: str = "t.cdg", **given) -> tuple[dict, dict]:
    """The first graph's seeded inputs on the CPU (`given` ones in their place) and its reference's outputs."""
    from cudnn_dsl.run.inputs import generate_inputs
    from cudnn_dsl.run.reference import run_reference
    from dsl.pipeline import program

    g = program(text=text, file=file).graphs[0]
    inst = g.instances[0]
    ins = generate_inputs(g, inst, "cpu", seed=seed)
    ins.update(given)
    return ins, run_reference(g, inst, ins, "cpu")


def check(
    text: str,
    device: str,
    *,
    given: dict | None = None,
    seed: int | None = None,
    atol=None,
    rtol=None,
    expect: Callable[[dict], dict] | None = None,
    **options,
):
    """Runs the graph on `device` on its seeded inputs (`given` ones in their place) and holds every output to
    what it must be; returns the compiled graph and the inputs.

    On "cuda" cuDNN runs it (`options` as cudnn_dsl.compile takes them: split=False where the test is what
    cuDNN computes for the graph whole), and every output must match the reference (CompiledGraph.check: the
    options' or the dtype's tolerance, unless `atol`/`rtol` give one for all or {output: tolerance}).
    On "cpu" the reference is what runs. `expect(inputs)` gives outputs written out by hand ({name: tensor}),
    which the reference must match with torch.testing's per-dtype tolerances, on either device."""
    import cudnn_dsl

    cg = cudnn_dsl.compile(text, device=device, **options)
    inputs = {**cg.allocate_inputs(seed=seed), **(given or {})}
    if expect is not None:
        got = cg.reference(inputs)
        for name, want in expect(inputs).items():
            torch.testing.assert_close(got[name], want, msg=lambda m, name=name: f"{name}: {m}")
    if cg.device is None:
        assert expect is not None, "on the CPU the reference is what runs: `expect` says what it must give"
        assert atol is None and rtol is None, "atol and rtol are the tolerances of cuDNN's outputs"
        return cg, inputs
    matches(cg, inputs, atol, rtol)
    return cg, inputs


def matches(cg, tensors: dict, atol=None, rtol=None) -> list:
    """Runs a compiled graph on `tensors` and its reference on the same (CompiledGraph.check): every output is
    compared, and every one must match. Returns the comparisons."""
    results = cg.check(tensors, atol, rtol)
    assert {r.name for r in results} == {v.name for v in cg.graph.outputs}, [str(r) for r in results]
    assert all(r.ok for r in results), "\n".join(map(str, results))
    return results


# ---- derived backward graphs --------------------------------------------------------------------------

TOL = {torch.float32: (2e-4, 2e-4), torch.float16: (3e-2, 3e-2), torch.bfloat16: (1e-1, 5e-2)}
"""(atol, rtol) per dtype: the derived backward rounds where cuDNN would; autograd runs in float64"""


def autograd_grads(graph, inst, inputs: dict, grads: dict) -> dict:
    """torch autograd through the registry's references, in float64; a buffer's gradient through torch's own
    views of it (as_strided)."""
    from cudnn_dsl.ops import IMPLS

    env = {}
    for b in graph.buffers:  # torch's as_strided views of it carry their gradients into its own
        env[b.name] = inputs[b.name].detach().double().requires_grad_(inputs[b.name].is_floating_point())
    for v in graph.values:
        if v.view is not None:
            t = inst.type(v.name)
            env[v.name] = env[v.view[0]].as_strided(t.shape, t.strides, v.view[1])
        elif v.kind == "input":
            env[v.name] = inputs[v.name].detach().double().requires_grad_(inputs[v.name].is_floating_point())
        elif v.kind in ("scalar", "const"):
            env[v.name] = torch.tensor(v.scalar, dtype=torch.float64).reshape(inst.type(v.name).shape)
    for index, n in enumerate(graph.nodes):
        ins = [env[i] if i else None for i in n.inputs]
        results = IMPLS[n.op].ref(ins, inst.attrs(index), [inst.type(o) for o in n.outputs])
        env.update(zip(n.outputs, results))
    outs = [o for o in grads if grads[o] is not None]
    torch.autograd.backward([env[o] for o in outs], [grads[o].double() for o in outs])
    return {k: env[k].grad for k in inputs if env[k].grad is not None}


def check_grads(
    text: str,
    device: str,
    *,
    graph: str | None = None,
    seed: int = 0,
    frozen: Collection[str] = (),
    flips: float = 0.0,
    **options,
):
    """The gradients of the graph's derived backward (cudnn_dsl.torch_op.autograd.differentiable: run by cuDNN
    on "cuda", as its reference on "cpu") against torch autograd through the forward's reference in float64,
    with TOL's tolerances (atol scaled by the largest gradient); returns the differentiable.

    `frozen`: inputs that do not require grad (a running statistic the graph updates in place). `flips`: the
    share of elements allowed past the tolerance, where a ReLU's mask can differ from autograd's (a
    pre-activation within a half's rounding of zero passes the whole gradient or none); the difference's norm
    must still be within rtol of the gradient's."""
    from cudnn_dsl.run.inputs import generate_inputs
    from cudnn_dsl.target.dtypes import torch_dtype
    from cudnn_dsl.torch_op.autograd import differentiable

    f = differentiable(graph=graph, device=device, text=text, **options)
    inst = f.graph.instances[0]
    inputs = generate_inputs(f.graph, inst, device, seed)
    leaves = {k: v.requires_grad_(v.is_floating_point() and k not in frozen) for k, v in inputs.items()}
    before = {k: v.detach().cpu().clone() for k, v in inputs.items()}  # as autograd reads what runs in place
    outs = f(leaves)
    gen = torch.Generator().manual_seed(seed + 1)
    grads = {
        k: torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype).to(o.device)
        for k, o in outs.items()
        if o.requires_grad
    }
    torch.autograd.backward([outs[k] for k in grads], list(grads.values()))
    want = autograd_grads(f.graph, inst, before, {k: g.cpu() for k, g in grads.items()})
    want = {k: w for k, w in want.items() if k not in frozen}
    assert want, "nothing to compare"
    for name, w in want.items():
        got = leaves[name].grad
        if got is None:  # no gradient flows there (floor): autograd's is zero
            assert not w.any(), name
            continue
        assert got.device.type == torch.device(device).type, (name, got.device)
        assert got.shape == w.shape and got.dtype == leaves[name].dtype, (name, got.shape, got.dtype)
        # a float gradient of a graph computing in a narrower io dtype is as accurate as that dtype allows
        io = [TOL[torch_dtype(f.graph.io)]] if f.graph.io else []
        atol, rtol = max([TOL[got.dtype], *io], key=lambda tol: tol[1])
        atol *= max(1.0, w.abs().max().item())
        d = got.cpu().double() - w
        if flips:
            past = int((d.abs() > atol + rtol * w.abs()).sum())
            assert past <= flips * w.numel() and d.norm() <= rtol * w.norm(), (name, past, (d.norm() / w.norm()).item())
        else:
            torch.testing.assert_close(got.cpu().double(), w, atol=atol, rtol=rtol, msg=name)
    return f


# ---- what cuDNN accepts -----------------------------------------------------------------------------------

ACCEPTED, DECLINED = "accepted", "declined"
SEEN_ON = "cuDNN 9.19 on the H200 (docs/results/pytest-gpu-h200.txt)"
"""where the outcomes the GPU tests record (their RECORDED tables) were last seen"""


def where_refused(text: str, op: str | None = None) -> set[int]:
    """The lines a refusal of the graph may be located at: the graph's and each op's; or `op`'s alone."""
    lines = text.splitlines()
    if op is not None:
        return {i for i, line in enumerate(lines, 1) if op in line and "(" in line}
    return {i for i, line in enumerate(lines, 1) if "(" in line or line.lstrip().startswith("graph ")}


def outcome(attempt: Callable[[], object], refused_at: Collection[int]) -> tuple[str, str]:
    """What cuDNN did with a form: (ACCEPTED, "") when `attempt`, a run that checks its outputs, returns;
    (DECLINED, cuDNN's message) when it raises cuDNN's refusal located at one of the lines `refused_at`. Any
    other error is raised: a wrong result, a refusal located elsewhere, an error that is not cuDNN's."""
    from dsl.diagnostics import DslError

    try:
        attempt()
    except DslError as e:
        d = e.diagnostics[0]
        if "cuDNN" not in d.message or d.loc.line not in refused_at:
            raise
        return DECLINED, d.message
    return ACCEPTED, ""


def _this_cudnn() -> str:
    from cudnn_dsl.target.library import BackendUnavailable, load_cudnn

    try:
        return f"cuDNN {load_cudnn().backend_version()} here"
    except BackendUnavailable:
        return "no cuDNN here"


def as_recorded(
    recorded: dict[str, str], form: str, attempt: Callable[[], object], refused_at: Collection[int]
) -> None:
    """Holds what cuDNN does with `form` to `recorded[form]`, the outcome SEEN_ON: a form recorded as accepted
    must run and match, one recorded as declined must be refused, located (`outcome`). Either change fails,
    and so does a form with no outcome recorded; the message says what to record."""
    seen, why = outcome(attempt, refused_at)
    if form not in recorded:
        pytest.fail(f"{form}: no outcome recorded; {_this_cudnn()} {seen} it ({why or 'it ran and matched'})")
    if seen != recorded[form]:
        pytest.fail(
            f"{form}: {SEEN_ON} {recorded[form]} it, {_this_cudnn()} {seen} it ({why or 'it ran and matched'}); "
            f"if the change is cuDNN's, not this project's, record {seen!r} for it in RECORDED"
        )


def check_as_recorded(recorded: dict[str, str], form: str, text: str, op: str | None = None, **check_args) -> None:
    """`check` of the graph on the GPU, whole (split=False: with splitting on, a graph cuDNN declines would run in
    parts), held to the outcome recorded for `form`; a refusal located at the graph or an op (or at `op`)."""
    as_recorded(recorded, form, lambda: check(text, "cuda", split=False, **check_args), where_refused(text, op))


# ---- the training example ------------------------------------------------------------------------------


def load_train():
    """bench/train.py, loaded as a module."""
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "bench" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
