"""Pooling (`resample`): its shape rule and located errors, its reference against torch's pooling on the CPU
(and against a window-by-window computation where the padding is wider than torch takes), and what deviceless
planning for an H200 makes of it."""

import re

import pytest
import torch
import torch.nn.functional as F

from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import run_reference
from dsl.diagnostics import DslError
from dsl.pipeline import program


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target

    return Target.named("h200")


def pooled(call: str, x: str = "float[2, 3, 9, 8]") -> str:
    return f"graph p {{\n  input x : {x}\n  output y = {call}\n}}\n"


def reference(call: str, x: str = "float[2, 3, 9, 8]", seed: int = 0):
    g = program(text=pooled(call, x), file="p.cdg").graphs[0]
    inst = g.instances[0]
    ins = generate_inputs(g, inst, "cpu", seed)
    return ins["x"], run_reference(g, inst, ins)["y"], inst.type("y").shape


@pytest.mark.parametrize(
    "call, torch_pool",
    [
        ("resample(x, mode=max, window=3, stride=2, padding=1)", lambda x: F.max_pool2d(x, 3, 2, 1)),
        ("resample(x, mode=avg, window=2, stride=2)", lambda x: F.avg_pool2d(x, 2, 2)),
        ("resample(x, mode=avg, window=3, stride=1, padding=1)", lambda x: F.avg_pool2d(x, 3, 1, 1)),
        (
            "resample(x, mode=avg, window=3, stride=2, padding=1, include_padding=false)",
            lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
        ),
        (
            "resample(x, mode=max, window=[2, 3], stride=[1, 2], padding=[1, 0])",
            lambda x: F.max_pool2d(x, (2, 3), (1, 2), (1, 0)),
        ),
    ],
    ids=["max", "avg", "avg-padded", "avg-exclude", "max-rect"],
)
def test_the_reference_is_torchs_pooling(call, torch_pool):
    x, y, shape = reference(call)
    want = torch_pool(x)
    assert tuple(want.shape) == shape
    torch.testing.assert_close(y, want)


def _windows(x, window, stride, pre, post, mode, include):
    """Pooling one window at a time over the input padded by hand (-inf for max, 0 for avg)."""
    n, c, h, w = x.shape
    fill = float("-inf") if mode == "max" else 0.0
    padded = torch.full((n, c, h + pre[0] + post[0], w + pre[1] + post[1]), fill, dtype=torch.float64)
    padded[:, :, pre[0] : pre[0] + h, pre[1] : pre[1] + w] = x.double()
    inside = torch.zeros(padded.shape[2:], dtype=torch.float64)
    inside[pre[0] : pre[0] + h, pre[1] : pre[1] + w] = 1
    rows = (padded.shape[2] - window[0]) // stride[0] + 1
    cols = (padded.shape[3] - window[1]) // stride[1] + 1
    out = torch.empty(n, c, rows, cols, dtype=torch.float64)
    for i in range(rows):
        for j in range(cols):
            box = (slice(i * stride[0], i * stride[0] + window[0]), slice(j * stride[1], j * stride[1] + window[1]))
            values = padded[:, :, box[0], box[1]]
            if mode == "max":
                out[:, :, i, j] = values.amax((2, 3))
            else:
                count = window[0] * window[1] if include else inside[box].sum()
                out[:, :, i, j] = values.sum((2, 3)) / count
    return out


@pytest.mark.parametrize("mode, include", [("max", True), ("avg", True), ("avg", False)])
def test_padding_wider_than_the_window_pools_the_padded_input(mode, include):
    """pre_padding 3 and post_padding 4 with a window of 2 (torch pools no padding past half the window): windows
    of padding alone are -inf (max), 0 (avg counting the padding) or 0 / 0 (avg counting the input only)."""
    call = (
        f"resample(x, mode={mode}, window=2, stride=[2, 3], pre_padding=[3, 1], post_padding=[4, 2]"
        f"{'' if include else ', include_padding=false'})"
    )
    x, y, shape = reference(call, seed=1)
    want = _windows(x, (2, 2), (2, 3), (3, 1), (4, 2), mode, include)
    assert shape == tuple(want.shape) == (2, 3, 8, 4)
    torch.testing.assert_close(y.double(), want, equal_nan=True)
    if mode == "max":
        assert bool(torch.isinf(y[:, :, 0]).all())  # rows 0-1 of the padded input: padding alone
    elif include:
        assert bool((y[:, :, 0] == 0).all())
    else:
        assert bool(torch.isnan(y[:, :, 0]).all())


def test_a_three_dimensional_input_pools_its_three_spatial_dims():
    x, y, shape = reference("resample(x, mode=max, window=2, stride=2)", x="float[1, 2, 4, 6, 4]")
    torch.testing.assert_close(y, F.max_pool3d(x, 2, 2))
    assert shape == (1, 2, 2, 3, 2)


def test_the_ir_holds_both_sides_of_the_padding():
    one = program(text=pooled("resample(x, mode=avg, window=2, padding=1)"), file="p.cdg").graphs[0]
    two = program(
        text=pooled("resample(x, mode=avg, window=2, pre_padding=[1, 1], post_padding=[1, 1])"), file="p.cdg"
    ).graphs[0]
    assert one.instances[0].attrs(0) == two.instances[0].attrs(0)
    assert dict(one.instances[0].attrs(0))["pre_padding"] == (1, 1)


@pytest.mark.parametrize(
    "call, x, words, at",
    [
        (
            "resample(x, mode=avg, window=12)",
            "float[2, 3, 9, 8]",
            "window 12 is larger than the padded input 9",
            "window",
        ),
        ("resample(x, mode=min, window=2)", "float[2, 3, 9, 8]", "one of avg, max", "min"),
        ("resample(x, window=2)", "float[2, 3, 9, 8]", "mode", "resample"),
        (
            "resample(x, mode=max, window=[2, 2, 2])",
            "float[2, 3, 9, 8]",
            "'window' has 3 values, the input has 2",
            "window",
        ),
        ("resample(x, mode=max, window=2)", "float[3, 9, 8]", "the input must have rank 4 or 5", "x, mode"),
        (
            "resample(x, mode=max, window=2, padding=1, pre_padding=[0, 0])",
            "float[2, 3, 9, 8]",
            "give 'padding'",
            "pre_padding",
        ),
    ],
    ids=["window", "mode", "no-mode", "window-rank", "rank", "padding-twice"],
)
def test_a_bad_pooling_is_located(call, x, words, at):
    text = pooled(call, x)
    with pytest.raises(DslError, match=re.escape(words)) as e:
        program(text=text, file="p.cdg")
    d = next(d for d in e.value.diagnostics if d.severity == "error")
    assert text.splitlines()[d.loc.line - 1][d.loc.col - 1 :].startswith(at), str(e.value)


def test_planned_for_the_h200_the_op_runs_as_its_reference_and_says_why(h200):
    """The installed frontend's Python API builds no resample node: deviceless planning for the H200 says so at
    the op, and the graph runs with the pooling left to torch and the rest on cuDNN."""
    from cudnn_dsl.ops.conv import MISSING_BUILDER
    from cudnn_dsl.run.partition import TORCH, plan_for_target

    text = (
        "graph p {\n  io half\n  compute float\n  input x : half[8, 64, 16, 16] nhwc\n"
        "  y = resample(x, mode=max, window=3, stride=2, padding=1)\n  output z = relu(y)\n}\n"
    )
    g = program(text=text, file="p.cdg").graphs[0]
    low, partition = plan_for_target(g, g.instances[0], g.options, h200)
    assert low is None and MISSING_BUILDER in partition.declined
    assert [(p.first, p.end, p.kind) for p in partition.parts][0] == (0, 1, TORCH)
    assert partition.parts[1].graph is not None  # the relu: a cuDNN graph of its own
    strict = g.options.with_values({"fallback": False})
    with pytest.raises(DslError, match="no cuDNN engine runs resample here, even alone") as e:
        plan_for_target(g, g.instances[0], strict, h200)
    assert e.value.diagnostics[0].loc.line == 5
