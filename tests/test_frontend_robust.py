"""The front end on hostile or odd input: bounded time and memory, located errors, no traceback."""

import cProfile
import gc
import pstats
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from dsl.check import check as check_module
from dsl.diagnostics import DslError, Sink
from dsl.files import Unreadable
from dsl.pipeline import load, no_cycle_collection
from dsl.syntax.parser import MAX_DEPTH, MAX_SOURCE_BYTES, MAX_STATEMENT_TOKENS

ROOT = Path(__file__).resolve().parents[1]


def check(text: str):
    return load(text=text, file="t.cdg")


def calls(fn) -> int:
    """The function calls (Python and builtin) that fn() makes: its work, counted alike on any machine and under
    any load, where a wall clock would not be."""
    profile = cProfile.Profile()
    profile.runcall(fn)
    return pstats.Stats(profile).total_calls


def chain(terms: int) -> str:
    return "graph g {\n  input x : half[4, 4]\n  output y = " + "x + " * terms + "x\n}\n"


def test_a_runaway_statement_is_stopped_while_lexing_in_bounded_memory(tmp_path):
    # without the limit, a 3.6 MB flat chain takes tens of GB of memory and does not finish
    path = tmp_path / "chain.cdg"
    path.write_text(chain(900_000))
    # VmHWM is this process's own peak (ru_maxrss would include the forking pytest's)
    code = (
        f"from dsl.pipeline import load\nr = load({str(path)!r})\nprint(r.errors[0].message)\n"
        f"print([x.split()[1] for x in open('/proc/self/status') if x.startswith('VmHWM')][0])\n"
    )
    # the timeout only stops a hung run; the lexer's work is counted in the next test
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    message, rss_kb = p.stdout.splitlines()
    assert f"statement longer than {MAX_STATEMENT_TOKENS} tokens" in message
    assert int(rss_kb) < 400_000


def test_the_work_on_a_runaway_statement_stops_at_the_token_limit():
    check(chain(10))  # the parser tables and the imports
    # past the limit a statement 4x longer costs no more: the lexer stopped where the limit is
    short, long = calls(lambda: check(chain(6_000))), calls(lambda: check(chain(24_000)))
    assert MAX_STATEMENT_TOKENS < 2 * 6_000 and long <= 1.05 * short, (short, long)


def test_a_file_over_the_size_limit_is_refused_at_once():
    r = check("#" * (MAX_SOURCE_BYTES + 1))
    assert "the limit is" in r.errors[0].message and r.errors[0].loc.line == 1


def test_deep_nesting_is_refused_with_a_location():
    r = check("graph g {\n  input x : half[4]\n  output y = " + "relu(" * 300 + "x" + ")" * 300 + "\n}\n")
    assert "nested more than 200 levels" in r.errors[0].message and r.errors[0].loc.line == 3


def nested_list(depth: int) -> str:
    return "graph g {\n  input x : half[4]\n  output y = relu(x, foo=" + "[" * depth + "1" + "]" * depth + ")\n}\n"


@pytest.mark.parametrize("command", [("fmt", "--check"), ("check", "--emit", "ast"), ("check",)])
def test_deeply_nested_lists_are_refused_with_a_location_by_every_command(command, tmp_path):
    # ~2,450 levels (the most a statement's 5,000 tokens hold) once crashed fmt and the AST dump: exit 70
    from tests.cli_util import run_cli

    f = tmp_path / "deep.cdg"
    f.write_text(nested_list(2450))
    p = run_cli(*command, f)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"deep.cdg:3:{25 + MAX_DEPTH}: error: value nested more than {MAX_DEPTH} levels deep" in p.stderr
    f.write_text(nested_list(MAX_DEPTH - 1))  # within the limit (the call is a level): the command gets through
    p = run_cli(*command, f)
    assert "nested more than" not in p.stderr and "internal error" not in p.stderr, p.stderr


def test_an_over_long_statement_with_a_comment_is_a_located_error():
    # the comments were collected by a second lexing pass that counted the blanks as tokens and raised past the
    # statement limit, out of the parser: a traceback
    items = ", ".join(["1"] * (MAX_STATEMENT_TOKENS * 2 // 3 // 2))  # under the limit without the blanks
    r = check(f"graph g {{\n  input x : half[4]\n  output y = relu(x, foo=[{items}])  # note\n}}\n# end\n")
    assert r.errors[0].message == (
        "relu: unknown argument 'foo'; it takes attributes negative_slope, lower_clip, upper_clip, compute"
    )
    r = load(text="graph g {\n  # one\n  input x : half[4]  # two\n  output y = relu(x)\n}\n# three\n", stop="ast")
    assert r.module.comments == ((2, "# one"), (3, "# two"), (6, "# three"))


def unknown_names(n: int) -> str:
    lines = "".join(f"  y{i} = relu(zz{i})\n" for i in range(n))
    return "graph g {\n  input x : half[4, 4]\n" + lines + "  output o = relu(x)\n}\n"


def test_thousands_of_unknown_names_are_checked_in_linear_time():
    # 20,000 errors once took 262 s: each 'did you mean' matched against every known name (D12)
    def checking(n: int) -> int:
        module = load(text=unknown_names(n), file="t.cdg", stop="ast").module

        def run():
            with pytest.raises(DslError):
                check_module(module, Sink())

        return calls(run)

    check(unknown_names(10))  # the parser tables and the imports
    small, big = checking(300), checking(1200)
    assert big <= 4 * 1.1 * small, (small, big)  # 4x the names, ~4x the work (~17x if every name were matched)
    r = check(unknown_names(1200))
    assert len(r.errors) == 100 and r.diagnostics[-1].message == "1100 more errors and 1100 more warnings not shown"
    assert "(did you mean" in r.errors[0].message or "unknown name 'zz0'" in r.errors[0].message


class _CountedSplits(str):
    """A source text that counts how often it is split into lines."""

    splits = 0

    def split(self, *args, **kwargs):
        _CountedSplits.splits += 1
        return super().split(*args, **kwargs)

    def splitlines(self, *args, **kwargs):
        _CountedSplits.splits += 1
        return super().splitlines(*args, **kwargs)


def test_diagnostics_render_splitting_the_source_once():
    r = check(_CountedSplits(unknown_names(1200) + "# a text not rendered before (split sources are cached)\n"))
    before = _CountedSplits.splits
    assert r.render().count("error:") == 100
    assert _CountedSplits.splits - before == 1  # once however many diagnostics quote it, not once each


def test_parse_and_check_run_no_cycle_collection():
    # the collector's full passes over a heap that grows with the file would make the front end superlinear
    text = "graph g {\n  input x : half[4, 4]\n" + "".join(f"  y{i} = relu(x)\n" for i in range(2000))
    text += "  output o = relu(x)\n}\n"
    passes = []

    def count(phase, info):
        if phase == "start":
            passes.append(info["generation"])

    gc.collect()  # no pass is due on the way in
    gc.callbacks.append(count)
    try:
        r = check(text)
    finally:
        gc.callbacks.remove(count)
    # at most the young objects' pass on the way out, once the collector is back on (left on, it runs hundreds)
    assert r.ok and passes in ([], [0]) and gc.isenabled(), passes


def test_the_collector_is_restored_on_every_path_and_by_the_last_of_overlapping_loads(tmp_path):
    with pytest.raises(ValueError):
        load(text="graph g {}\n", stop="nowhere")
    with pytest.raises(Unreadable):
        load(tmp_path)  # a directory
    assert gc.isenabled()
    # two loads overlapping in time (threads), the first ending first: still off until the second ends
    first, second = no_cycle_collection(), no_cycle_collection()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()
    gc.disable()  # off by the caller's choice: left off
    try:
        load(text="graph g {\n  input x : half[4]\n  output y = relu(x)\n}\n")
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("literal,words", [("1e999", "too large"), ("1e-999", "too small")])
def test_a_number_a_float_cannot_hold_is_an_error(literal, words):
    r = check(f"graph g {{\n  input x : half[4]\n  scalar s : float = {literal}\n  output y = x * s\n}}\n")
    assert not r.ok and words in r.errors[0].message and r.errors[0].loc.line == 3


def test_a_scalar_out_of_its_dtype_range_is_an_error():
    r = check("graph g {\n  input x : half[4]\n  scalar s : half = 1e6\n  output y = x * s\n}\n")
    assert "out of range for half" in r.errors[0].message


def test_a_byte_order_mark_is_accepted(tmp_path):
    f = tmp_path / "bom.cdg"
    f.write_bytes(b"\xef\xbb\xbfgraph g {\n  input x : half[4, 4]\n  output y = relu(x)\n}\n")
    assert load(f).ok


def test_text_that_is_not_utf8_is_a_located_error(tmp_path):
    f = tmp_path / "u16.cdg"
    f.write_bytes(b"graph g {\n" + b"  input x \xff\xfe: half[4]\n")
    r = load(f)
    d = r.errors[0]
    assert "not UTF-8" in d.message and (d.loc.line, d.loc.col) == (2, 11)


def test_an_unexpected_character_names_no_misleading_alternatives():
    # the contextual lexer once said "expected '}', ')'" with no parenthesis open (D20)
    r = check("graph g {\n  input x : half[4, 4]\n  output y = relu(x)\n}\n@\n")
    assert r.errors[0].message == "syntax error: unexpected character '@'"


@pytest.mark.parametrize(
    "text",
    [
        "graph graph {\n  input x : half[4]\n  output y = relu(x)\n}\n",
        "graph g {\n  input input : half[4]\n  output y = relu(input)\n}\n",
        "graph g {\n  input x : half[4]\n  output uid = relu(x)\n}\n",
    ],
)
def test_keywords_cannot_name_things(text):
    # the grammar reserves them everywhere (docs/language.md lists them); they were once accepted as names
    r = check(text)
    keyword = next(w for w in ("graph", "input", "uid") if f"{w} {w}" in text or f"output {w}" in text)
    assert r.errors[0].message.startswith(f"syntax error: unexpected '{keyword}'"), r.render()


def test_after_an_unknown_op_its_result_is_not_reported_again():
    r = check("graph g {\n  input x : half[4]\n  t = frobnicate(x)\n  output y = relu(t)\n}\n")
    assert [d.message for d in r.errors] == ["unknown op 'frobnicate'"]


def test_a_layout_op_output_follows_io_and_keeps_its_inputs_dtype():
    # cuDNN's layout ops keep their input's dtype: a bf16 output of a matmul's result has the matmul write it in
    # bf16 (it once came out float, the graph's io dtype ignored); a declared float input cannot be retyped
    text = (
        "graph g {\n  io bf16\n%s  input a : bf16[2, 4, 8]\n  input b : bf16[2, 8, 4]\n"
        "  output y = reshape(matmul(a, b), shape=[8, 4])\n}\n"
    )
    assert check(text % "  intermediate bf16\n").program.graphs[0].instances[0].type("y").dtype == "bf16"
    r = check(text % "")
    assert r.program.graphs[0].instances[0].type("y").dtype == "bf16"
    assert [d.severity for d in r.diagnostics] == ["note"]
    r = check("graph g {\n  io bf16\n  input a : float[8, 4]\n  output y = reshape(a, shape=[4, 8])\n}\n")
    assert r.errors[0].message == (
        "reshape: cuDNN keeps the input's dtype, float, but output 'y' is bf16 (the graph's io); "
        "declare 'output y : float'"
    )


def test_a_grouped_convolution_read_off_the_channels_is_noted_at_the_weight():
    # the language has no groups= attribute: a weight typed with half the image's channels is a 2-group convolution
    text = (
        "graph g {\n  io half\n  input x : half[8, 64, 16, 16] nhwc\n  input w : half[128, %d, 3, 3] nhwc\n"
        "  output y = conv_fprop(x, w, padding=[1, 1])\n}\n"
    )
    r = check(text % 32)
    [d] = r.diagnostics
    assert (d.severity, str(d.loc)) == ("note", "t.cdg:5:28")  # the weight argument
    assert d.message.startswith(
        "conv_fprop: a grouped convolution, 2 groups: the image has 64 channels and the weight 32"
    )
    assert check(text % 64).diagnostics == ()


def test_conv_wgrad_filter_is_checked_against_the_shapes():
    text = (
        "graph g {\n  input x : half[2, 8, 9, 9] nhwc\n  input dy : half[2, 16, 7, 7] nhwc\n"
        "  output dw = conv_wgrad(x, dy, filter=%s)\n}\n"
    )
    assert check(text % "[3, 3]").ok
    r = check(text % "[5, 5]")
    assert "a filter of [5, 5] does not map image" in r.errors[0].message
    assert r.errors[0].loc.col == text.splitlines()[3].index("filter") + 1


def test_a_line_of_a_megabyte_is_quoted_clipped():
    r = check("graph g {\n  input x : half[4]\n  output y = relu(x)" + " " * 1_000_000 + "$\n}\n")
    lines = r.render().splitlines()
    assert max(len(x) for x in lines) < 300 and lines[-1].strip() == "^"


def test_the_example_files_are_parsed_within_the_memory_of_a_small_machine():
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for f in sorted((ROOT / "examples").glob("*.cdg")):
        assert load(f).ok
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 100_000


def test_warnings_are_capped_like_errors():
    lines = "".join(f"  input u{i} : half[4]\n" for i in range(500))
    r = check("graph g {\n" + lines + "  input x : half[4]\n  output y = relu(x)\n}\n")
    assert r.ok and r.diagnostics[-1].message == "400 more warnings not shown"
