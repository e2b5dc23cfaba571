"""Every example lowered and planned by the real cuDNN library for an H200, without a GPU.

No mock: cuDNN itself validates each graph and proposes plans from the H200's descriptor.
"""

from pathlib import Path

import pytest

from dsl.pipeline import program

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.cdg"))


def _cases():
    for path in EXAMPLES:
        for g in program(path).graphs:
            for inst in g.instances:
                yield pytest.param(g, inst, id=f"{path.stem}:{g.name}:{inst.label or 'static'}")


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import BackendUnavailable, Target, load_cudnn

    try:
        load_cudnn()
    except BackendUnavailable as e:
        pytest.fail(f"the cuDNN library must load here for deviceless planning: {e}")
    return Target.named("h200")


@pytest.mark.parametrize("graph,inst", list(_cases()))
def test_example_gets_h200_plans_from_cudnn(graph, inst, h200):
    from cudnn_dsl.build.pipeline import compile_shape

    low = compile_shape(graph, inst, graph.options, h200)
    assert low.plan_count >= 1
    assert low.g.get_plan_name_at_index(0).startswith("eng")
    assert set(low.timings) | set(low.skipped) == {
        "validate",
        "build_operation_graph",
        "create_execution_plans",
        "check_support",
        "build_plans",
    }


def test_a_fusion_cudnn_rejects_is_reported_at_the_graph_with_advice(h200):
    from cudnn_dsl.build.pipeline import compile_shape
    from dsl.diagnostics import DslError

    text = (
        "graph ln_gelu {\n  io bf16\n  input x : bf16[64, 256, 1, 1]\n  input g : float[1, 256, 1, 1]\n"
        "  input b : float[1, 256, 1, 1]\n  output y = gelu(layernorm(x, g, b))\n}\n"
    )
    g = program(text=text, file="ln.cdg").graphs[0]
    with pytest.raises(DslError) as e:
        compile_shape(g, g.instances[0], g.options, h200)
    d = e.value.diagnostics[0]
    assert d.loc.file == "ln.cdg" and "create_execution_plans failed" in d.message
    advice = " ".join(text for text, _ in d.notes)
    assert "Try: norms fuse" in advice and "NHWC" not in advice  # advice for the ops present, not for convs
    assert ("layernorm is here", g.nodes[0].loc) in d.notes  # where the ops are, when cuDNN names none


def test_explicit_uids_reach_cudnn(h200):
    from cudnn_dsl.build.lower import lower

    text = "graph g {\n  input a : half[4, 8] uid=7\n  input b : half[4, 8]\n  output y = a + b\n}\n"
    g = program(text=text, file="u.cdg").graphs[0]
    low = lower(g, g.instances[0], target=h200)
    uids = {t.name: t.uid for t in low.g.get_inputs()}
    assert uids["a"] == 7 and uids["b"] == 1


def test_check_target_command_plans_each_graph_and_shape():
    import subprocess
    import sys

    from cudnn_dsl.target.library import answering

    files = [ROOT / "examples" / "dynamic_shapes.cdg", ROOT / "examples" / "layernorm.cdg"]
    p = subprocess.run(
        [sys.executable, "-m", "cudnn_dsl", "check", "--target", "h200", *map(str, files)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(" plans for NVIDIA H200 (sm_90)") == 6  # 4 batch sizes + 2 norms
    assert p.stdout.count(f"answered by {answering()}") == 2  # once per file


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_emit_fe_json_is_the_frontends_own_graph(path, h200):
    """`emit --format fe-json`: the JSON the frontend serializes, with every input and output of the IR."""
    import json

    from cudnn_dsl.build.lower import cudnn_dims, left_to_offsets
    from cudnn_dsl.interop.fe_export import frontend_json
    from cudnn_dsl.run.indices import ragged_offsets
    from cudnn_dsl.target.dtypes import cudnn_name

    for g in program(path).graphs:
        inst = g.instances[0]
        data = json.loads(frontend_json(g, inst, h200))
        assert data["json_version"] == "2.0"
        tensors = {t["uid"]: t for t in data["tensors"]}
        offsets, left = ragged_offsets(g, inst), left_to_offsets(g, inst)
        for v in g.of_kind("input", "output"):
            t = inst.type(v.name)
            got = tensors[v.uid]
            want = (list(t.shape), cudnn_dims(t, True)[1] if v.name in left else list(t.strides))
            if v.name in offsets and len(t.shape) == 1:  # cuDNN takes offsets at the placed tensor's rank
                want = ([t.shape[0], 1, 1, 1], [1, 1, 1, 1])
            assert (got["name"], got["dim"], got["stride"]) == (v.name, *want)
            assert got["data_type"] == cudnn_name(t.dtype)
        assert len(data["nodes"]) >= len([n for n in g.nodes if n.op != "identity"])


def test_log_flags_point_cudnns_own_logs_at_a_file_or_stderr(tmp_path):
    import subprocess
    import sys

    mm = str(ROOT / "examples" / "plan_serialization.cdg")
    log = tmp_path / "cudnn.log"
    p = subprocess.run(
        [sys.executable, "-m", "cudnn_dsl", "check", "--target", "h200", "--log-file", str(log), mm],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    assert "[cudnn_frontend]" in log.read_text() and "CuDNN (v" in (tmp_path / "cudnn.log.backend").read_text()
    assert f"cuDNN logs go to {log} (frontend) and {log}.backend (library)" in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "cudnn_dsl", "check", "--target", "h200", "-v", mm],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0 and "[cudnn_frontend]" in p.stderr
