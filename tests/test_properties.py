"""Property tests: the printer round-trips, and mangled input yields only our own diagnostics."""

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsl.check import check
from dsl.diagnostics import DslError, Sink
from dsl.syntax.parser import parse
from dsl.syntax.printer import fmt_module

EXAMPLES = {p.name: p.read_text() for p in sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.cdg"))}
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+\.?\d*(?:[eE][+-]?\d+)?|#[^\n]*|\n|\S")


def front_end(text: str) -> None:
    """Parse and check; our DslError is the only exception allowed out."""
    try:
        check(parse(text, "fuzz.cdg"), Sink())
    except DslError as e:
        assert e.diagnostics and all(d.loc.file == "fuzz.cdg" for d in e.diagnostics)
        for d in e.diagnostics:
            d.render({"fuzz.cdg": text})  # rendering never fails either


def test_examples_round_trip_through_the_printer():
    for name, text in EXAMPLES.items():
        m = parse(text, name)
        again = parse(fmt_module(m), name)
        assert again.graphs == m.graphs, name
        assert check(again) == check(m), name
        assert fmt_module(again) == fmt_module(m), name


# ---- generated programs ---------------------------------------------------------------

UNARY = ["relu", "gelu", "sigmoid", "tanh", "exp", "abs", "neg"]
dims = st.lists(st.integers(1, 64), min_size=1, max_size=4)


@st.composite
def programs(draw):
    shape = draw(dims)
    n_inputs = draw(st.integers(1, 3))
    lines = ["graph g {", f"  io {draw(st.sampled_from(['half', 'bf16', 'float']))}"]
    names = []
    for i in range(n_inputs):
        b = [d if draw(st.booleans()) else 1 for d in shape]
        lines.append(f"  input in{i} : half[{', '.join(map(str, b if i else shape))}]")
        names.append(f"in{i}")
    for j in range(draw(st.integers(1, 6))):
        a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        form = draw(st.integers(0, 3))
        expr = [
            f"{draw(st.sampled_from(UNARY))}({a})",
            f"{a} {draw(st.sampled_from('+-*/'))} {b}",
            f"({a} - {b}) * {draw(st.floats(0.01, 100).map(lambda x: round(x, 3)))}",
            f"-{a}",
        ][form]
        lines.append(f"  t{j} = {expr}")
        names.append(f"t{j}")
    lines.append(f"  output out = identity({names[-1]})")
    lines.append("}")
    return "\n".join(lines) + "\n"


@settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_generated_programs_round_trip(text):
    m = parse(text, "gen.cdg")
    printed = fmt_module(m)
    assert parse(printed, "gen.cdg").graphs == m.graphs
    try:
        ir = check(m)
    except DslError:
        return  # broadcasting can fail; the round trip of the text is what is tested here
    assert check(parse(printed, "gen.cdg")) == ir


# ---- mutations of the examples --------------------------------------------------------------


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(sorted(EXAMPLES.values())))
    toks = TOKEN.findall(text)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(toks) - 1))
        kind = draw(st.sampled_from(["delete", "duplicate", "swap", "bytes", "huge", "nest", "replace"]))
        if kind == "delete":
            del toks[i]
        elif kind == "duplicate":
            toks.insert(i, toks[i])
        elif kind == "swap":
            j = draw(st.integers(0, len(toks) - 1))
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "bytes":
            toks.insert(i, draw(st.text(min_size=1, max_size=5)))
        elif kind == "huge":
            toks[i] = draw(st.sampled_from(["99999999999999999999999999", "-1", "0", "1e999", "4294967296"]))
        elif kind == "nest":
            depth = draw(st.integers(1, 400))
            toks[i] = "relu(" * depth + toks[i] + ")" * depth
        else:
            toks[i] = draw(st.sampled_from(["graph", "output", "input", "=", ",", "(", "]", "{", "nhwc", "x", "1.5"]))
        if not toks:
            toks = [""]
    return " ".join(t if t != "\n" else "\n" for t in toks)


@settings(max_examples=400, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_examples_give_only_our_diagnostics(text):
    front_end(text)


@settings(max_examples=200, deadline=2000)
@given(st.text(max_size=300))
def test_arbitrary_text_gives_only_our_diagnostics(text):
    front_end(text)
