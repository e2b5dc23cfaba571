"""The forms a derived backward takes, each beside the form it avoids, planned by the real cuDNN library for an
H200 without a GPU: the form written plans, the other is declined. docs/training.md's table of forms is this
list's text (`python -m pytest --update-goldens` rewrites it)."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from dsl.pipeline import program

ROOT = Path(__file__).resolve().parents[1]


@attrs.frozen
class Form:
    name: str
    why: str
    written: str
    """the graph as the compiler writes it (planned)"""
    avoided: str
    """the graph it does not write (declined)"""


def _graph(io: str, body: str) -> str:
    return f"graph form {{\n  io {io}\n  compute float\n{body}}}\n"


def _reduction(dtype: str, shape: str, strides: str, out: str, axes: str) -> str:
    return _graph(
        "bf16",
        f"  input g : bf16{shape} strides {strides}\n"
        f"  output db : {dtype}{out} = reduction(g, mode=sum, axes={axes})\n",
    )


def _drelu_dbias(dtype: str) -> str:
    return _graph(
        "half",
        "  input dy : half[32, 64, 32, 32] nhwc\n  input y : half[32, 64, 32, 32] nhwc\n"
        "  output r : half = relu_backward(dy, y)\n"
        f"  output db : {dtype}[1, 64, 1, 1] nhwc = reduction(r, mode=sum, axes=[0, 2, 3])\n",
    )


def _dgrad_drelu_dbias(dtype: str) -> str:
    return _graph(
        "half",
        "  input g : half[32, 64, 32, 32] nhwc\n  input w : half[64, 64, 3, 3] nhwc\n"
        "  input h : half[32, 64, 32, 32] nhwc\n  d = conv_dgrad(g, w, padding=[1, 1])\n"
        "  output r : half = relu_backward(d, h)\n"
        f"  output db : {dtype}[1, 64, 1, 1] nhwc = reduction(r, mode=sum, axes=[0, 2, 3])\n",
    )


def _dgelu_dbias_tokens(rank4: bool) -> str:
    shape, layout, out, axes = (
        ("[1024, 128, 1, 1]", " nhwc", "[1, 128, 1, 1] nhwc", "[0, 2, 3]")
        if rank4
        else ("[8, 128, 128]", "", "[1, 1, 128]", "[0, 1]")
    )
    return _graph(
        "bf16",
        f"  input dy : bf16{shape}{layout}\n  input a : float{shape}{layout}\n"
        "  output g : bf16 = gelu_tanh_backward(dy, a)\n"
        f"  output db : float{out} = reduction(g, mode=sum, axes={axes})\n",
    )


def _layernorm(cast: bool) -> str:
    result = "  output h : bf16 = identity(hn)\n" if cast else "  output hn : bf16\n"
    return _graph(
        "bf16",
        "  input x : bf16[8, 128, 256]\n  input gamma : float[1, 1, 256]\n  input beta : float[1, 1, 256]\n"
        "  hn, mean, inv_variance = layernorm(x, gamma, beta, epsilon=1e-5, phase=training)\n"
        f"{result}  output mean\n  output inv_variance\n",
    )


FORMS = (
    Form(
        "bias gradient",
        "a reduction of a gradient accumulates in float: cuDNN plans reductions with a float output",
        _graph(
            "half",
            "  input g : half[32, 64, 32, 32] nhwc\n"
            "  output db : float[1, 64, 1, 1] nhwc = reduction(g, mode=sum, axes=[0, 2, 3])\n",
        ),
        _graph(
            "half",
            "  input g : half[32, 64, 32, 32] nhwc\n"
            "  output db : half[1, 64, 1, 1] nhwc = reduction(g, mode=sum, axes=[0, 2, 3])\n",
        ),
    ),
    Form(
        "relu_backward + bias gradient",
        "one graph, with the float bias gradient",
        _drelu_dbias("float"),
        _drelu_dbias("half"),
    ),
    Form(
        "conv_dgrad + relu_backward + bias gradient",
        "one graph, with the float bias gradient",
        _dgrad_drelu_dbias("float"),
        _dgrad_drelu_dbias("half"),
    ),
    Form(
        "bias gradient over tokens",
        "the tokens `[B, S, N]` viewed as `[B·S, N, 1, 1]` (channels-last): planned at rank 4, declined at rank 3",
        _reduction("float", "[1024, 128, 1, 1]", "[128, 1, 128, 128]", "[1, 128, 1, 1]", "[0, 2, 3]"),
        _reduction("float", "[8, 128, 128]", "[16384, 128, 1]", "[1, 1, 128]", "[0, 1]"),
    ),
    Form(
        "an activation's backward + bias gradient over tokens",
        "one graph over the tokens' `[B·S, N, 1, 1]` views (its result read by the matmuls as the same memory): "
        "declined at rank 3",
        _dgelu_dbias_tokens(rank4=True),
        _dgelu_dbias_tokens(rank4=False),
    ),
    Form(
        "a rank-4 token view's layout",
        "`[B·S, N, 1, 1]` declared channels-last (the same memory as row-major): cuDNN declines the row-major strides",
        _reduction("float", "[1024, 128, 1, 1]", "[128, 1, 128, 128]", "[1, 128, 1, 1]", "[0, 2, 3]"),
        _reduction("float", "[1024, 128, 1, 1]", "[128, 1, 1, 1]", "[1, 128, 1, 1]", "[0, 2, 3]"),
    ),
    Form(
        "weight gradient of a weight broadcast over the batch",
        "one matmul over every token, `[1, K, B·M] × [1, B·M, N]`, written in the weight's dtype: the batched "
        "product summed over the batch in that dtype is declined",
        _graph(
            "bf16",
            "  input h_t : bf16[1, 256, 1024] strides [262144, 1, 256]\n  input g : bf16[1, 1024, 128]\n"
            "  output dw : bf16[1, 256, 128] = matmul(h_t, g)\n",
        ),
        _graph(
            "bf16",
            "  input h_t : bf16[8, 256, 128] strides [32768, 1, 256]\n  input g : bf16[8, 128, 128]\n"
            "  p = matmul(h_t, g)\n  output dw : bf16[1, 256, 128] = reduction(p, mode=sum, axes=[0])\n",
        ),
    ),
    Form(
        "a cast after layernorm",
        "folded into the norm's output dtype: layernorm followed by an identity is declined",
        _layernorm(cast=False),
        _layernorm(cast=True),
    ),
)


@pytest.fixture(scope="module")
def plans():
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target
    from dsl.diagnostics import DslError

    h200 = Target.named("h200")

    def count(text: str) -> int:
        g = program(text=text, file="form.cdg").graphs[0]
        try:
            return compile_shape(g, g.instances[0], g.options, h200).plan_count
        except DslError:
            return 0

    return count


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.name)
def test_the_form_written_plans_and_the_form_avoided_is_declined(form, plans):
    assert plans(form.written) > 0, f"{form.name}: cuDNN here declines the form the compiler writes"
    assert plans(form.avoided) == 0, f"{form.name}: cuDNN here plans the avoided form too; revisit the choice"


def table() -> str:
    rows = ["| form | what the compiler writes, and why |", "| --- | --- |"]
    rows += [f"| {f.name} | {f.why} |" for f in FORMS]
    return "\n".join(rows) + "\n"


def test_docs_list_the_forms(update_goldens):
    doc = ROOT / "docs" / "training.md"
    text = doc.read_text()
    pattern = re.compile(r"(<!-- generated: backward-forms .*?-->\n)(.*?)(<!-- end generated -->)", re.S)
    if update_goldens:
        doc.write_text(pattern.sub(lambda m: m.group(1) + table() + m.group(3), text))
        return
    assert pattern.search(text).group(2) == table(), "run pytest --update-goldens and review docs/training.md"
