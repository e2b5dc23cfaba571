"""`option shape_mode = override` on the GPU: below cuDNN 9.21 (the H200 here has 9.19) every value falls back to
its own plan, with a note, and matches the reference; from 9.21 one plan built at the largest value serves the
whole range through execute-time shape overrides, and must match the reference at every value."""

from pathlib import Path

import pytest

from tests.cli_util import run_cli
from tests.helpers import matches

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_store")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "serve_matmul.cdg"
CONV = ROOT / "examples" / "dynamic_shapes.cdg"
NO_OVERRIDE = "has no override-shape mode (it needs 9.21.0 or later)"


def cudnn_version() -> int:
    from cudnn_dsl.target.library import load_cudnn

    return load_cudnn().backend_version()


def check_values(cg, values: list[dict]):
    """Runs each binding against the reference; returns each one's executable."""
    exes = []
    for binding in values:
        matches(cg, cg.allocate_inputs(binding))
        exes.append(cg.executable(cg.graph.instance(binding)))
    return exes


def test_below_9_21_override_falls_back_to_a_plan_per_value_and_matches():
    import cudnn_dsl

    if cudnn_version() >= 92100:
        pytest.skip("this cuDNN has override-shape mode: test_from_9_21_... runs it")
    cg = cudnn_dsl.compile(EXAMPLE, shape_mode="override")
    exes = check_values(cg, [{"T": 16}, {"T": 48}, {"T": 4096}])
    for exe in exes:
        assert not exe.overrides and exe.source != "heuristics, override-shape mode"
        assert exe.notes[0].startswith("shape_mode = override not used, a plan for this shape instead: cuDNN 9.")
        assert NO_OVERRIDE in exe.notes[0]
    assert len({id(exe.low.g) for exe in exes}) == 3  # a cuDNN graph per value


def test_below_9_21_run_prints_why_override_was_not_used(tmp_path):
    if cudnn_version() >= 92100:
        pytest.skip("this cuDNN has override-shape mode")
    f = tmp_path / "ov.cdg"
    f.write_text(EXAMPLE.read_text().replace("  dim T in", "  option shape_mode = override\n  dim T in"))
    p = run_cli("run", f, "--shape", "T=64", "--iterations", "2", "--warmup", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "note       shape_mode = override not used, a plan for this shape instead: cuDNN" in p.stdout
    assert NO_OVERRIDE in p.stdout
    assert "compare    y:" in p.stdout and "MISMATCH" not in p.stdout


def test_from_9_21_one_override_plan_serves_every_value_of_the_range():
    """Skipped on the H200 of this project (cuDNN 9.19); written for a 9.21+ library."""
    import torch

    import cudnn_dsl
    from cudnn_dsl.run.buffers import BindingError

    if cudnn_version() < 92100:
        pytest.skip(f"cuDNN {cudnn_version()} has no override-shape mode (needs 9.21): not executed here")
    cg = cudnn_dsl.compile(EXAMPLE, shape_mode="override")
    values = [{"T": 4096}, {"T": 16}, {"T": 48}, {"T": 992}]
    exes = check_values(cg, values)
    for binding, exe in zip(values, exes):
        assert exe.source == "heuristics, override-shape mode"
        assert exe.overrides["override_shapes"][0] == [1, binding["T"], 1024]
        assert "override-shape plan built once at T=4096" in exe.notes[0]
    assert len({id(exe.low.g) for exe in exes}) == 1  # one cuDNN graph, one plan, for every value
    # bound and replayed through the override path too
    tensors = cg.allocate_inputs({"T": 64})
    want = cg.reference(tensors)["y"]
    got = cg.bind(tensors).run()["y"]
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    # the graph was built for 4096 tokens, but a buffer is checked against the value it is called with
    with pytest.raises(BindingError):
        cg(tensors, {"y": torch.empty(1, 32, 1024, dtype=torch.bfloat16, device=got.device)})


def test_from_9_21_the_torch_op_runs_the_override_plan_at_the_values_shape():
    """The torch op's own launch passes the shape overrides too (it launched the plan at T=4096 on buffers of
    T=64). Skipped on the H200 of this project (cuDNN 9.19)."""
    import torch

    import cudnn_dsl

    if cudnn_version() < 92100:
        pytest.skip(f"cuDNN {cudnn_version()} has no override-shape mode (needs 9.21): not executed here")
    cg = cudnn_dsl.compile(EXAMPLE, shape_mode="override")
    op = cudnn_dsl.as_torch_op(cg)
    for binding in ({"T": 64}, {"T": 4096}, {"T": 16}):
        tensors = cg.allocate_inputs(binding)
        assert cg.executable(cg.graph.instance(binding)).overrides
        got = op(**tensors)
        got = got[0] if isinstance(got, (tuple, list)) else got
        want = cg.reference(tensors)["y"]
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_from_9_21_run_says_the_override_plan_serves_the_value(tmp_path):
    """Skipped on the H200 of this project (cuDNN 9.19)."""
    if cudnn_version() < 92100:
        pytest.skip(f"cuDNN {cudnn_version()} has no override-shape mode (needs 9.21): not executed here")
    f = tmp_path / "ov.cdg"
    f.write_text(EXAMPLE.read_text().replace("  dim T in", "  option shape_mode = override\n  dim T in"))
    p = run_cli("run", f, "--shape", "T=64,128", "--iterations", "2", "--warmup", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("note       override-shape plan built once at T=4096") == 2
    assert p.stdout.count("compare    y: ok") == 2


def test_a_graph_cudnn_declines_in_override_mode_runs_a_plan_per_value_and_matches():
    """The conv of dynamic_shapes.cdg: no engine takes it in override-shape mode (planned deviceless with 9.28);
    below 9.21 the version alone decides."""
    import cudnn_dsl

    cg = cudnn_dsl.compile(CONV, shape_mode="override")
    exes = check_values(cg, [{"N": 8}, {"N": 24}])
    why = "cuDNN declines it in override-shape mode" if cudnn_version() >= 92100 else NO_OVERRIDE
    for exe in exes:
        assert not exe.overrides and why in exe.notes[0]
