"""The IR is canonical and options are one table: every spelling of a graph is one graph, and every
source of an option value (file, command line, Python API) is held to the same rules."""

import math
import re

import pytest

from cudnn_dsl.store.keys import graph_digest
from dsl.diagnostics import RuleError
from dsl.options import Options
from dsl.pipeline import load, program
from dsl.syntax.printer import dump_ir

CONV = (
    "graph g {\n  io half\n  input x : half[8, 16, 9, 9] nhwc\n  input w : half[32, 16, 3, 3] nhwc\n"
    "  output y = conv_fprop(x, w%s)\n}\n"
)


def test_five_spellings_of_a_default_convolution_are_one_graph():
    spellings = [
        "",
        ", padding=0",
        ", padding=[0, 0]",
        ", padding=[0, 0], stride=[1, 1], dilation=1",
        ", pre_padding=0, post_padding=[0, 0]",
    ]
    graphs = [program(text=CONV % extra, file="g.cdg").graphs[0] for extra in spellings]
    dumps = {dump_ir(program(text=CONV % extra, file="g.cdg")) for extra in spellings}
    digests = {graph_digest(g, g.instances[0]) for g in graphs}
    assert len(dumps) == 1 and len(digests) == 1
    assert "{dilation=[1, 1], post_padding=[0, 0], pre_padding=[0, 0], stride=[1, 1]}" in dumps.pop()


def test_attributes_are_filled_expanded_and_normalized():
    text = (
        "graph g {\n  input a : float[2, 3, 4]\n  output s : float[1, 3, 1] = reduction(a, mode=SUM, axes=[-1, 0])\n"
        "  output r = leaky_relu(a)\n}\n"
    )
    inst = program(text=text, file="g.cdg").graphs[0].instances[0]
    assert inst.attrs(0) == {"mode": "sum", "axes": (0, 2)}  # enum in its declared spelling, axes sorted, positive
    assert inst.attrs(1) == {"slope": 0.01}  # the default, written down


def test_a_default_that_depends_on_the_shape_is_per_shape():
    text = (
        "graph g {\n  dim D in {64, 128}\n  input q : half[1, 2, 16, D]\n  input k : half[1, 2, 16, D]\n"
        "  input v : half[1, 2, 16, D]\n  output o = sdpa(q, k, v)\n}\n"
    )
    g = program(text=text, file="g.cdg").graphs[0]
    assert [i.attrs(0)["scale"] for i in g.instances] == [0.125, 1 / math.sqrt(128)]
    assert f"scale=0.125|{1 / math.sqrt(128)}" in dump_ir(program(text=text, file="g.cdg"))


@pytest.mark.parametrize(
    "name,value,words",
    [
        ("build_policy", "al", "must be one of heuristics_choice, all; got al (did you mean 'all'?)"),
        ("heuristics", "Z", "must be one of A, B, FALLBACK; got Z"),
        ("iterations", 0, "must be >= 1"),
        ("seed", 10**23, "has a value out of range"),
        ("atol", -1, "must be >= 0"),
        ("cuda_graph", "maybe", "must be true or false"),
    ],
)
def test_an_option_is_refused_with_the_same_words_from_every_source(tmp_path, name, value, words):
    import subprocess
    import sys

    import cudnn_dsl

    with pytest.raises(RuleError, match="^" + words.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        Options().with_values({name: value})
    with pytest.raises(ValueError, match=f"option '{name}' {words[:20]}"):
        cudnn_dsl.compile("examples/plan_serialization.cdg", **{name: value})
    spelled = str(value).lower() if name == "cuda_graph" else value
    f = tmp_path / "o.cdg"
    f.write_text(f"graph g {{\n  option {name} = {spelled}\n  input x : half[4]\n  output y = relu(x)\n}}\n")
    r = load(f)
    assert not r.ok and words[:20] in r.errors[0].message
    if name != "cuda_graph":  # a flag of its own (`--cuda-graph`) cannot be given a bad value
        flag = "--" + name.replace("_", "-")
        p = subprocess.run(
            [sys.executable, "-m", "cudnn_dsl", "run", "examples/plan_serialization.cdg", flag, str(value)],
            capture_output=True,
            text=True,
        )
        assert p.returncode == 2 and re.search(f"{flag}( {value})?: {re.escape(words[:20])}", p.stderr), p.stderr


def test_option_values_are_normalized_the_same_way_everywhere():
    a = Options().with_values({"heuristics": "a,fallback"}, source="text")
    b = Options().with_values({"heuristics": ["A", "FALLBACK"]})
    c = program(text="graph g {\n  option heuristics = [a, FALLBACK]\n  input x : half[4]\n  output y = relu(x)\n}\n")
    assert a.heuristics == b.heuristics == c.graphs[0].options.heuristics == ("A", "FALLBACK")


def test_spellings_of_literals_and_names_of_intermediates_do_not_change_the_plan_key():
    base = "graph g {\n  input x : half[4, 8]\n  %s\n}\n"
    texts = [
        "output y = exp(relu(x)) * 2",
        "output y = exp(relu(x)) * 2.0",
        "t = relu(x)\n  output y = exp(t) * 2",
        "hidden = relu(x)\n  output y = exp(hidden) * 3",
    ]
    graphs = [program(text=base % t).graphs[0] for t in texts]
    assert len({graph_digest(g, g.instances[0]) for g in graphs}) == 1  # a literal's value is passed at launch
    assert dump_ir(program(text=base % texts[0])) == dump_ir(program(text=base % texts[1]))


def test_a_layout_op_on_an_input_keeps_its_dtype_inside_the_graph():
    text = (
        "graph g {\n  io bf16\n  input a : bf16[2, 8, 4]\n  input b : bf16[2, 8, 4]\n"
        "  t = transpose(a, perm=[0, 2, 1])\n  output y = matmul(t, b)\n}\n"
    )
    inst = program(text=text).graphs[0].instances[0]
    assert inst.type("t").dtype == "bf16" and inst.type("y").dtype == "bf16"


def test_an_api_option_of_the_wrong_type_is_named():
    with pytest.raises(RuleError, match="must be a list of A, B, FALLBACK, got a dict") as e:
        Options().with_values({"heuristics": {"A": 1}})
    assert e.value.at == "heuristics"
