"""Numbers from outside a .cdg file (command-line values, imported frontend JSON) are the language's
numbers: ASCII digits, within range of what holds them, refused with a message naming the flag or field."""

import json
import math
from pathlib import Path

import pytest
from cli_util import run_cli

from dsl.diagnostics import RuleError
from dsl.inits import parse
from dsl.pipeline import load
from dsl.values import natural, number

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
MM = EX / "plan_serialization.cdg"  # inputs a, b; output c
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.mark.parametrize("text", ["٣", "３", "1_0", "inf", "nan", "0x10", "2**70", "", "-٣", "1e400"])
def test_number_takes_only_the_languages_spelling(text):
    with pytest.raises(ValueError):
        number(text)


@pytest.mark.parametrize("text,value", [("3", 3), ("-0.5", -0.5), ("+1e-5", 1e-5), (" 7 ", 7), (".5", 0.5)])
def test_number_reads_the_languages_spelling(text, value):
    assert number(text) == value


@pytest.mark.parametrize("text", ["٣", "²", "1_0", "-1", "3.0", ""])
def test_natural_takes_only_ascii_digits(text):
    with pytest.raises(ValueError):
        natural(text)


@pytest.mark.parametrize(
    "text,words",
    [
        ("randint(0,1180591620717411303424)", "hi 1180591620717411303424 is out of range"),
        ("randint(-1e300, 0)", "lo -1e+300 is out of range"),
        ("randint(0,2**70)", "'2**70' is not a number (ASCII digits"),
        ("randn(٣)", "argument 1: '٣' is not a number"),
        ("full(" + "9" * 400 + ")", "value must be a finite 64-bit float"),
        ("full(1e400)", "1e400 is out of range of a 64-bit float"),
        ("uniform(-1e308, 1e308)", "hi - lo is out of range of a 64-bit float"),
    ],
)
def test_init_arguments_out_of_syntax_or_range_are_refused(text, words):
    with pytest.raises(RuleError) as e:
        parse(text)
    assert words in str(e.value)


def test_randint_takes_the_integers_a_float_holds():
    assert parse(f"randint(-{2**53}, {2**53})").args == (-(2.0**53), 2.0**53)


def test_a_files_init_out_of_range_is_located():
    src = "graph g {\n  input a : float[4] init=randint(0, 1180591620717411303424)\n  output y = relu(a)\n}\n"
    result = load(text=src, file="f.cdg")
    assert not result.ok
    assert "out of range" in result.render() and "f.cdg:2:" in result.render()


def test_non_ascii_digits_in_a_file_are_a_syntax_error():
    src = "graph g {\n  input a : half[٤, 8]\n  output y = relu(a)\n}\n"
    result = load(text=src, file="f.cdg")
    assert "f.cdg:2:18: error: syntax error: unexpected character '٤'" in result.render()


@pytest.mark.parametrize(
    "args,words",
    [
        (("run", MM, "--init", "a=randint(0,1180591620717411303424)"), "--init a=randint(0,1180591620717411303424):"),
        (("run", MM, "--init", "a=randint(0,2**70)"), "'2**70' is not a number"),
        (("run", MM, "--init", "a=uniform(٠, 1)"), "'٠' is not a number"),
        (("run", EX / "dynamic_shapes.cdg", "--shape", "N=٨"), "'٨' is not a whole number"),
        (("run", EX / "dynamic_shapes.cdg", "--shape", "N=²"), "'²' is not a whole number"),
        (("run", MM, "--iterations", "٣"), "--iterations"),
        (("tune", MM, "--top-k", "٣"), "argument --top-k: '٣' is not a whole number"),
        (("tune", MM, "--exhaustive", "--budget", "inf"), "argument --budget: 'inf' is not a number"),
        (("bench", MM, "--rounds", "1_0"), "argument --rounds: '1_0' is not a whole number"),
        (("run", MM, "--device", "٠"), "argument --device"),
    ],
)
def test_cli_numbers_out_of_syntax_or_range_are_usage_errors(args, words):
    p = run_cli(*args)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert words in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_scalar_in_other_digits_is_refused(tmp_path):
    g = tmp_path / "s.cdg"
    g.write_text("graph g {\n  input x : float[4]\n  scalar s : float = 1\n  output y = x * s\n}\n")
    for value in ("٣", "３"):
        p = run_cli("run", g, "--scalar", f"s={value}")
        assert p.returncode == 2 and f"--scalar s={value}: '{value}' is not a number" in p.stderr, p.stderr


def test_import_scalar_in_other_digits_is_refused():
    p = run_cli("import", FIXTURES / "frontend_v1.json", "--scalar", "s=٣")
    assert p.returncode == 2 and "--scalar takes NAME=NUMBER, got 's=٣'" in p.stderr, p.stderr


def _import_error(tmp_path, text: str) -> str:
    src = tmp_path / "g.json"
    src.write_text(text)
    p = run_cli("import", src, "-o", tmp_path / "g.cdg")
    assert p.returncode == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-2000:])
    assert not (tmp_path / "g.cdg").exists()
    return p.stderr.replace(str(src), "g.json")


def _v1(edit) -> str:
    j = json.loads((FIXTURES / "frontend_v1.json").read_text())
    edit(j)
    return json.dumps(j, indent=1)  # non-finite floats as Infinity and NaN, as Python's json writes them


def _line_of(text: str, needle: str) -> int:
    return text.count("\n", 0, text.index(needle)) + 1


@pytest.mark.parametrize(
    "nest,words",
    [
        ("[" * 2000 + "]" * 2000, "g.json:1:"),
        ("[" * 100_000 + "]" * 100_000, "g.json:1:"),
        ('{"a": ' * 5000 + "1" + "}" * 5000, "g.json:1:"),
    ],
    ids=["list-2k", "list-100k", "object-5k"],
)
def test_import_of_deeply_nested_json_is_located(tmp_path, nest, words):
    err = _import_error(tmp_path, '{"json_version": "2.0", "x": ' + nest + "}\n")
    assert err.startswith(words) and "the JSON nests deeper than 64 levels" in err, err[:300]


@pytest.mark.parametrize(
    "edit,field,value,words",
    [
        (lambda j: j["nodes"][0].update(pre_padding=[math.inf, 1]), "pre_padding", "Infinity", "Infinity is not JSON"),
        (lambda j: j["nodes"][0].update(post_padding=[1, math.nan]), "post_padding", "NaN", "NaN is not JSON"),
        (lambda j: j["tensors"]["x"].update(stride=[2**63, 1, 1, 1]), "stride", str(2**63), "out of range of int64"),
        (
            lambda j: j["nodes"][2].update(relu_upper_clip=1e300),
            "relu_upper_clip",
            '"relu_upper_clip": 1e+300',
            "out of range of a float32",
        ),
        (
            lambda j: j["nodes"][2].update(relu_upper_clip="3F"),
            "relu_upper_clip",
            '"relu_upper_clip": "3F"',
            "must be a number or the value's bytes as hex, 8 digits for float",
        ),
    ],
)
def test_import_refuses_an_out_of_range_number_at_its_field(tmp_path, edit, field, value, words):
    text = _v1(edit)
    first = _import_error(tmp_path, text).splitlines()[0]
    assert first.startswith(f"g.json:{_line_of(text, value)}:"), first[:300]
    assert f"{field}: " in first and words in first, first[:300]


def test_import_refuses_an_integer_of_5000_digits_at_its_field(tmp_path):
    text = _v1(lambda j: j["tensors"]["x"].update(uid=987654321)).replace("987654321", "9" * 5000)
    first = _import_error(tmp_path, text).splitlines()[0]
    assert first.startswith(f"g.json:{_line_of(text, '9' * 5000)}:"), first[:300]
    assert "uid: the integer 999999999999999999999999... is out of range of int64" in first, first[:300]


def test_import_refuses_a_tensor_of_more_dims_than_cudnn_takes(tmp_path):
    text = _v1(lambda j: j["tensors"]["x"].update(dim=[1] * 1000, stride=[1] * 1000))
    err = _import_error(tmp_path, text)
    assert "dim has 1000 dims; cuDNN's tensors have at most 8" in err, err[:300]
    assert err.startswith("g.json:"), err[:300]
