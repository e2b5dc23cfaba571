"""Launch plans (run.launch_plan): one shape's parts bound once on a first call, each later call rebinding only
its own arguments and outputs. On the CPU a graph's torch parts run for real; a cuDNN part's pack, planned for
an H200 by the real library, is rebound and compared with the pack the frontend builds for those buffers."""

import gc
import weakref

import pytest
import torch

from cudnn_dsl.run.buffers import BindingError, check_inputs, outputs_of
from cudnn_dsl.run.launch import arguments
from cudnn_dsl.run.launch_plan import LaunchPlan, LaunchPlans
from cudnn_dsl.run.partition import TORCH, VIEW, Part, Partition
from cudnn_dsl.run.parts import Parts
from cudnn_dsl.run.reference import run_reference
from dsl.pipeline import program

CPU = torch.device("cpu")

# a torch part per op: h is an intermediate, y is written over a, which the last part reads as it was before
OVERWRITE = """
graph g {
  dim N in {2, 4}
  input a : float[N, 8]
  input b : float[N, 8]
  h = relu(b) * 2.0
  output y in a = h + 1.0
  output z = a + h
}
"""


def torch_parts(g, inst) -> Parts:
    each = Partition(tuple(Part(k, k + 1, TORCH, why="-") for k in range(len(g.nodes))), "-")
    return Parts(g, inst, each, [None] * len(g.nodes))


def first_plan(g, values) -> LaunchPlan:
    """What CompiledGraph.launch_plan does for a GPU, here for the CPU's torch parts: the arguments checked in
    full, the outputs allocated, every part bound on them."""
    names = arguments(g)[0]
    tensors = dict(zip(names, values))
    inst = g.instance(g.binding_of({n: tuple(t.shape) for n, t in tensors.items()}))
    check_inputs(g, inst, tensors, CPU)

    def check(again):
        check_inputs(g, inst, dict(zip(names, again)), CPU)

    return torch_parts(g, inst).launch_plan(tensors, outputs_of(g, inst, tensors, CPU), check)


# a view of an argument read by a torch part, whose result is placed in the output a view makes
VIEWS = """
graph g {
  input a : float[4, 8]
  r = reshape(a, shape=[32, 1])
  h = relu(r)
  output y = reshape(h, shape=[4, 8])
}
"""


def inputs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=gen), torch.randn(n, 8, generator=gen)


def test_a_plan_bound_once_runs_each_calls_own_tensors_into_fresh_outputs():
    g = program(text=OVERWRITE, file="g.cdg").graphs[0]
    plan = first_plan(g, inputs(2, 0))
    kept = plan.env["h"]
    held = []  # every output stays alive: a fresh one cannot take an earlier one's memory
    for seed in (1, 2):
        a, b = inputs(2, seed)
        want = run_reference(g, g.instances[0], {"a": a.clone(), "b": b})
        (z,) = plan((a, b))
        assert torch.equal(a, want["y"]) and torch.equal(z, want["z"])  # y written into a; z read a before it
        assert z.data_ptr() not in [kept.data_ptr()] + [t.data_ptr() for t in held]  # fresh, never the intermediate
        held.append(z)
    assert plan.env["h"] is kept  # the intermediate stays bound


def test_a_plan_keeps_none_of_a_calls_tensors():
    g = program(text=OVERWRITE, file="g.cdg").graphs[0]
    plan = first_plan(g, inputs(2, 0))
    a, b = inputs(2, 1)
    (z,) = plan((a, b))
    gone = [weakref.ref(t) for t in (a, b, z)]
    del a, b, z
    gc.collect()
    assert all(r() is None for r in gone)


def test_plans_check_a_kind_of_arguments_once_and_bind_again_for_another():
    g = program(text=OVERWRITE, file="g.cdg").graphs[0]
    made = []

    def first(values):
        made.append(tuple(values[0].shape))
        return first_plan(g, values)

    plans = LaunchPlans(2, first)
    for n, seed in ((2, 1), (2, 2), (4, 3), (2, 4)):
        a, b = inputs(n, seed)
        want = run_reference(g, g.instance({"N": n}), {"a": a.clone(), "b": b})
        (z,) = plans((a, b))
        assert torch.equal(z, want["z"]) and torch.equal(a, want["y"])
    assert made == [(2, 8), (4, 8)]  # one plan per shape
    with pytest.raises(BindingError, match="dtype float"):  # another dtype is another kind: checked in full
        plans((torch.zeros(2, 8, dtype=torch.half), torch.zeros(2, 8)))
    assert made == [(2, 8), (4, 8), (2, 8)]


def test_a_torch_part_reads_the_scalar_each_call_gives():
    text = "graph s {\n  input x : float[2, 8]\n  scalar s : float = 0.5\n  h = relu(x)\n  output y = h * s\n}\n"
    g = program(text=text, file="s.cdg").graphs[0]
    x = torch.randn(2, 8)
    plan = first_plan(g, (x, 0.5))
    for value in (0.5, 2.0, -3.0):
        (y,) = plan((x, value))
        assert torch.equal(y, run_reference(g, g.instances[0], {"x": x, "s": value})["y"])


def test_alignment_is_checked_on_every_call():
    g = program(text=OVERWRITE, file="g.cdg").graphs[0]
    plans = LaunchPlans(2, lambda values: first_plan(g, values))
    plans(inputs(2, 0))
    misaligned = torch.zeros(2 * 8 + 1)[1:].view(2, 8)  # the same shape, strides and dtype as before
    with pytest.raises(BindingError, match="'a': expected an address aligned to 16 bytes"):
        plans((misaligned, torch.zeros(2, 8)))


# a view of a buffer, a scalar, an output written over the view, a fresh output: every kind of UID a call moves
VIEWED = """
graph r {
  buffer qk : float[4, 2, 16]
  input q : float[1, 4, 16] strides [128, 32, 1] in qk at 16
  input c : float[1, 4, 16]
  scalar s : float = 0.5
  output q2 in q = q * c * s
  output y = c + s
}
"""


def test_rebinding_points_a_cudnn_parts_pack_as_the_frontend_would_for_the_new_buffers():
    """The pack of a graph planned for an H200 (the real library, deviceless; never launched here): bound on
    one call's buffers, then pointed at another's, it holds exactly the pointers the frontend's own pack of
    the second call's buffers holds, in the backend's order."""
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.build.planner import Executable, host_tensors
    from cudnn_dsl.run.inputs import generate_inputs
    from cudnn_dsl.run.launch import Bound, Layout
    from cudnn_dsl.target.library import Target, load_cudnn

    g = program(text=VIEWED, file="r.cdg").graphs[0]
    inst = g.instances[0]
    low = compile_shape(g, inst, g.options, Target.named("h200"))
    no_device = load_cudnn().Handle(None, 0, 0)  # a frontend handle with no backend handle: nothing can launch
    exe = Executable(low, no_device, CPU, torch.empty(1, dtype=torch.uint8), host_tensors(low, "cpu"))
    layout = Layout(g, inst, exe.host)

    def bound_on(tensors, outputs):
        return dict(zip(layout.uids, layout.named(tensors, outputs)))

    first = generate_inputs(g, inst, "cpu", 0)
    out = outputs_of(g, inst, first, CPU)
    bound = Bound(exe, out, bound_on(first, out))
    plan = LaunchPlan(g, inst, first, out, lambda values: None)
    plan.launch(bound, layout)
    ((point, _launch),) = plan.steps

    second = {**generate_inputs(g, inst, "cpu", 1), "s": 0.25}
    out2 = outputs_of(g, inst, second, CPU)
    pack = bound_on(second, out2)
    point([second["qk"].data_ptr(), second["c"].data_ptr(), out2["y"].data_ptr(), pack[g.value("s").uid].data_ptr()])
    want = low.g._normalize(low.g._uid_to_data(pack), exe.workspace)
    got = list(bound.pointers.array)
    assert len(got) == 5 and got == [want.native.pointer(k) for k in range(len(want.uids))]
    assert got[list(want.uids).index(g.value("q").uid)] == second["qk"].data_ptr() + 16 * 4  # the view's window


def test_views_in_a_plan_take_each_calls_argument_and_output():
    """A view's memory is its operand's: the torch part between two views reads each call's argument and writes
    each call's fresh output, not the first call's."""
    g = program(text=VIEWS, file="g.cdg").graphs[0]
    inst = g.instances[0]
    parts = Parts(
        g, inst, Partition(tuple(Part(k, k + 1, kind) for k, kind in enumerate((VIEW, TORCH, VIEW))), "-"), [None] * 3
    )
    first = torch.randn(4, 8)
    outputs = outputs_of(g, inst, {"a": first}, CPU)
    plan = parts.launch_plan({"a": first}, outputs, lambda values: None)
    held = []
    for seed in (1, 2):
        (a,) = inputs(4, seed)[:1]
        (y,) = plan((a,))
        assert torch.equal(y, a.relu()) and y.data_ptr() != outputs["y"].data_ptr()
        assert all(y.data_ptr() != t.data_ptr() for t in held)
        held.append(y)
