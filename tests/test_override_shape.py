"""`option shape_mode = override`: one graph at the largest shape in cuDNN's override-shape mode, planned
deviceless by the real cuDNN library (9.28 here; the mode needs 9.21), and the version check below 9.21."""

import json
from pathlib import Path

import pytest

from dsl.diagnostics import DslError
from dsl.pipeline import program
from tests.cli_util import run_cli

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "serve_matmul.cdg"
MATMUL = EXAMPLE.read_text().replace("  dim T in", "  option shape_mode = override\n  dim T in")
CONV = """graph c {
  io half
  compute float
  option shape_mode = override
  dim N in {8, 16}
  input x : half[N, 64, 14, 14] nhwc
  input w : half[64, 64, 3, 3] nhwc
  output y = relu(conv_fprop(x, w, padding=[1, 1]))
}
"""


def graph_of(text: str, file: str = "o.cdg"):
    return program(text=text, file=file).graphs[0]


@pytest.fixture(scope="module")
def cudnn_version():
    from cudnn_dsl.target.library import load_cudnn

    return load_cudnn().backend_version()


@pytest.fixture
def override_cudnn(cudnn_version):
    from cudnn_dsl.build.override import OVERRIDE_MIN_CUDNN
    from cudnn_dsl.target.quirks import version_text

    if cudnn_version < OVERRIDE_MIN_CUDNN:
        pytest.skip(f"cuDNN {version_text(cudnn_version)} here has no override-shape mode (needs 9.21)")


def test_the_option_takes_override_and_says_what_else_it_takes():
    assert graph_of(MATMUL).options.shape_mode == "override"
    with pytest.raises(DslError, match="auto, static, dynamic, override") as e:
        graph_of(MATMUL.replace("= override", "= overide"))
    assert e.value.diagnostics[0].loc.line == 6


def test_the_version_check_names_both_versions():
    from cudnn_dsl.build.override import override_unavailable
    from cudnn_dsl.target.quirks import version_text

    assert version_text(92801) == "9.28.1"
    assert override_unavailable(91900) == "cuDNN 9.19.0 has no override-shape mode (it needs 9.21.0 or later)"
    assert override_unavailable(92100) is None
    assert override_unavailable(92801) is None


def test_the_graph_is_built_at_every_dims_largest_value():
    from cudnn_dsl.build.override import representative

    assert dict(representative(graph_of(MATMUL)).binding) == {"T": 4096}
    two = (
        "graph g {\n  dim N in {8, 32, 16}\n  dim K in 1..40 step 3\n  input x : half[N, K]\n  output y = relu(x)\n}\n"
    )
    assert dict(representative(graph_of(two)).binding) == {"N": 32, "K": 40}


def test_the_overrides_are_the_values_own_dims_and_strides_as_cudnn_sees_them():
    from cudnn_dsl.build.lower import override_args

    g = graph_of(MATMUL)
    got = override_args(g, g.instance({"T": 48}))
    assert got["override_uids"] == [1, 2, 3, 6]  # x, w, b and the output y; no virtual tensor
    assert got["override_shapes"] == [[1, 48, 1024], [1, 1024, 1024], [1, 1, 1024], [1, 48, 1024]]
    assert got["override_strides"] == [[48 * 1024, 1024, 1], [1024 * 1024, 1024, 1], [1024, 1024, 1]] + [
        [48 * 1024, 1024, 1]
    ]
    small = graph_of("graph g {\n  dim T in 8..64 step 8\n  input x : half[T, 16]\n  output y = relu(x)\n}\n")
    got = override_args(small, small.instance({"T": 24}))
    assert got["override_shapes"] == [[1, 24, 16]] * 2  # a unit dim in front, as the graph was lowered
    assert got["override_strides"] == [[24 * 16, 16, 1]] * 2


def test_cudnn_plans_the_graph_in_override_shape_mode_for_an_h200(override_cudnn):
    from cudnn_dsl.build.pipeline import compile_override
    from cudnn_dsl.target.library import Target

    g = graph_of(MATMUL)
    low = compile_override(g, g.options, Target.named("h200"))
    assert dict(low.instance.binding) == {"T": 4096}
    assert low.plan_count >= 1 and low.g.get_plan_name_at_index(low.selected).startswith("eng")
    context = json.loads(repr(low.g))["context"]  # the frontend's own serialization of what cuDNN got
    assert context["is_override_shape_enabled"] is True and context["is_dynamic_shape_enabled"] is False
    dims = {t["name"]: t["dim"] for t in json.loads(repr(low.g))["tensors"]}
    assert dims["x"] == [1, 4096, 1024] and dims["y"] == [1, 4096, 1024]


def test_a_graph_no_engine_takes_in_override_shape_mode_is_declined_with_cudnns_reason(override_cudnn):
    from cudnn_dsl.build.override import OverrideDeclined
    from cudnn_dsl.build.pipeline import compile_override, compile_shape
    from cudnn_dsl.target.library import Target

    g = graph_of(CONV)
    h200 = Target.named("h200")
    with pytest.raises(OverrideDeclined, match="cuDNN declines it in override-shape mode: cuDNN create_execution_pl"):
        compile_override(g, g.options, h200)
    assert compile_shape(g, g.instance({"N": 16}), g.options, h200).plan_count >= 1  # the same shape, static


def test_check_target_says_the_shape_mode_and_plans_the_override_graph(tmp_path, override_cudnn):
    f = tmp_path / "ov.cdg"
    f.write_text(MATMUL)
    p = run_cli("check", f, "--target", "h200")
    assert p.returncode == 0, p.stderr
    [line] = [x for x in p.stdout.splitlines() if "shape mode" in x]
    assert "shape mode override: one plan for all 256 shapes, built at T=4096" in line
    assert "falls back to a plan per shape" in line
    out = tmp_path / "r.json"
    assert run_cli("check", f, "--target", "h200", "--json", out).returncode == 0
    [record] = json.loads(out.read_text())["files"][0]["shape_modes"]
    assert record["shape_mode"] == "override" and record["binding"] == {"T": 4096} and record["candidates"] >= 1


def test_check_target_says_when_the_override_graph_falls_back(tmp_path, override_cudnn):
    f = tmp_path / "c.cdg"
    f.write_text(CONV)
    p = run_cli("check", f, "--target", "h200")
    assert p.returncode == 0, p.stderr
    assert "shape mode override: per-value plans as under auto instead (2 shapes): cuDNN declines it" in p.stdout


def test_check_target_says_the_default_shape_mode(tmp_path):
    p = run_cli("check", EXAMPLE, "--target", "h200")
    assert p.returncode == 0, p.stderr
    assert "shape mode auto: a plan per shape" in p.stdout and "(256 shapes)" in p.stdout
