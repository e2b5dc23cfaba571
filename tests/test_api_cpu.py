"""The Python API without a GPU: it checks, plans deviceless, runs the reference, and says what it cannot."""

from pathlib import Path

import pytest
import torch

import cudnn_dsl
from cudnn_dsl.run.buffers import BindingError
from cudnn_dsl.target.library import BackendUnavailable

ROOT = Path(__file__).resolve().parents[1]
MM = ROOT / "examples" / "plan_serialization.cdg"

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without a GPU")


def test_the_readme_quick_start_says_what_it_cannot_do():
    cg = cudnn_dsl.compile(str(ROOT / "examples" / "conv_bias_relu.cdg"))
    ins = cg.allocate_inputs()
    assert ins["x"].device.type == "cpu"
    with pytest.raises(BackendUnavailable, match="no CUDA GPU is visible here; cg.reference"):
        cg(**ins)


def test_the_reference_and_deviceless_planning_run_without_a_gpu():
    cg = cudnn_dsl.compile(MM)
    ins = cg.allocate_inputs()
    out = cg.reference(**ins)["c"]
    torch.testing.assert_close(out.float(), (ins["a"].float() @ ins["b"].float()).bfloat16().float())
    low = cg.plan("h200")
    assert low.plan_count >= 1


@pytest.mark.parametrize(
    "change,words",
    [
        (lambda t: t.update(b=torch.zeros(8, 512, 128, dtype=torch.bfloat16)), "'b': expected shape [8, 512, 256]"),
        (lambda t: t.pop("b"), "input 'b' is not bound"),
        (lambda t: t.update(zz=torch.zeros(1)), "has no input zz (inputs: a, b)"),
        (lambda t: t.update(a=t["a"].float()), "dtype bf16, given float"),
    ],
)
def test_the_reference_checks_its_inputs_like_a_binding(change, words):
    cg = cudnn_dsl.compile(MM)
    ins = cg.allocate_inputs()
    change(ins)
    with pytest.raises(
        BindingError, match=words.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")
    ):
        cg.reference(**ins)


def test_options_are_validated_as_the_file_s_are():
    with pytest.raises(ValueError, match="option 'heuristics' must be one of A, B, FALLBACK; got Z"):
        cudnn_dsl.compile(MM, heuristics="Z")
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        cudnn_dsl.compile(MM, bogus=1)
    assert cudnn_dsl.compile(MM, heuristics="a,b", iterations=3).options.heuristics == ("A", "B")


def test_the_checkers_warnings_reach_python_users():
    text = "graph g {\n  input x : half[2, 4, 8, 8]\n  input w : half[4, 4, 3, 3]\n  output y = conv_fprop(x, w)\n}\n"
    with pytest.warns(cudnn_dsl.DslWarning, match="convolution input 'x' is not channels-last"):
        cudnn_dsl.compile(text=text)


def test_paths_and_texts_are_told_apart(tmp_path):
    odd = tmp_path / "a{b}.cdg"
    odd.write_text(MM.read_text())
    assert cudnn_dsl.compile(str(odd)).graph.name == "plan_serialization"
    assert cudnn_dsl.compile("graph g { input x : half[4]; output y = relu(x) }").graph.name == "g"
    with pytest.raises(FileNotFoundError, match="no such file"):
        cudnn_dsl.compile(str(tmp_path / "missing.cdg"))


def test_inputs_named_like_keywords_of_the_api_can_be_bound():
    cg = cudnn_dsl.compile(
        text="graph g {\n  input out : float[4]\n  input atol : float[4]\n  output y = out + atol\n}\n"
    )
    ins = cg.allocate_inputs()
    y = cg.reference(out=ins["out"], atol=ins["atol"])["y"]
    torch.testing.assert_close(y, ins["out"] + ins["atol"])
    assert torch.equal(cg.reference(ins)["y"], y)  # the dict form, too
