"""emit --format cpp: a project's files (the inputs run draws, the stand-in driver, refusals at their place), and,
marked slow, every example's C++ twin built in one project and planned without a device, its plan name equal to
the Python path's for the same target. On a GPU, a twin's outputs equal `run`'s bit for bit with the same plan."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cudnn_dsl.build.pipeline import compile_shape
from cudnn_dsl.build.steps import first_plan_name
from cudnn_dsl.interop.emit_cpp import STAND_IN, emit_cpp, namespace, project, twin
from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.partition import plan_for_target
from cudnn_dsl.target.driver import CUDA_ERROR_NO_DEVICE
from cudnn_dsl.target.library import Target
from dsl.diagnostics import DslError
from dsl.pipeline import load

ROOT = Path(__file__).parent.parent
TARGET = "h200"
#: (file, graph): every graph of every example, at its first shape; CUDNN_DSL_CPP_EXAMPLES=a.cdg,b.cdg narrows it
EXAMPLES = [
    (f, g.name)
    for f in sorted(ROOT.glob("examples/**/*.cdg"))
    if not os.environ.get("CUDNN_DSL_CPP_EXAMPLES") or f.name in os.environ["CUDNN_DSL_CPP_EXAMPLES"].split(",")
    for g in load(str(f)).program.graphs
]
TOOLS = pytest.mark.skipif(not shutil.which("cmake") or not shutil.which("c++"), reason="needs cmake and c++")


def _graph(file: Path, name: str):
    return next(g for g in load(str(file)).program.graphs if g.name == name)


def _key(file: Path, name: str) -> str:
    """The twin's name in the project of every example: its file under examples/, and its graph."""
    return f"{file.relative_to(ROOT / 'examples').with_suffix('')}:{name}"


def _write(top: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_bytes(data)


def test_project_files(tmp_path):
    """A twin's input files hold the memory of the inputs run draws, and the project's stand-in driver answers
    CUDA_ERROR_NO_DEVICE."""
    file = ROOT / "examples/conv_bias_relu.cdg"
    g = _graph(file, "conv_bias_relu")
    inst = g.instances[0]
    files = emit_cpp(g, inst, g.options, Target.named(TARGET))
    drawn = generate_inputs(g, inst, "cpu", g.options.seed)
    inputs = sorted(rel for rel in files if rel.startswith("inputs/"))
    assert len(inputs) == len(drawn) == 3
    for rel, (name, t) in zip(inputs, drawn.items()):
        want = ctypes.string_at(t.data_ptr(), t.untyped_storage().nbytes())
        assert files[rel] == want, name
        assert f'"{name}", {len(want)}, "{rel}"' in files["graphs.cpp"].decode()
    _write(tmp_path, {STAND_IN: files[STAND_IN]})
    driver = ctypes.CDLL(str(tmp_path / STAND_IN))  # local: the process's own driver, or stand-in, is untouched
    assert driver.cuInit(0) == driver.cuDeviceGetCount(None) == CUDA_ERROR_NO_DEVICE


def test_twins_need_distinct_namespaces():
    g = _graph(ROOT / "examples/conv_bias_relu.cdg", "conv_bias_relu")
    target = Target.named(TARGET)
    a, b = (twin(name, g, g.instances[0], g.options, target) for name in ("a-b", "a_b"))
    assert namespace(a.name) == namespace(b.name)
    with pytest.raises(ValueError, match="distinct C\\+\\+ namespaces"):
        project([a, b], target)


def test_unspelled_call_is_located(tmp_path):
    """A frontend call with no C++ spelling (transpose) is refused at the op that makes it."""
    src = tmp_path / "g.cdg"
    src.write_text(
        "graph g {\n  io half\n  compute float\n  input x : half[2, 8, 16]\n"
        "  y = transpose(x, perm=[0, 2, 1])\n  output y\n}\n"
    )
    g = load(str(src)).program.graphs[0]
    with pytest.raises(DslError) as e:
        emit_cpp(g, g.instances[0], g.options, Target.named(TARGET))
    assert "emit --format cpp" in str(e.value)
    assert str(e.value).startswith(f"{src}:5:")


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """One C++ project holding every example's twin (named FILE:GRAPH), built once; and the examples refused,
    with why (a graph cuDNN takes only in parts, a frontend call the emitter has no C++ spelling for)."""
    top = tmp_path_factory.mktemp("cpp")
    target, refused, twins = Target.named(TARGET), {}, []
    for file, name in EXAMPLES:
        g = _graph(file, name)
        inst = g.instances[0]
        try:
            partition = plan_for_target(g, inst, g.options, target)[1]
            twins.append(twin(_key(file, name), g, inst, g.options, target, None, partition))
        except DslError as e:
            refused[_key(file, name)] = str(e)
    _write(top, project(twins, target))
    subprocess.run(["cmake", "-S", top, "-B", top / "build"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", top / "build", "-j2"], check=True, capture_output=True)
    return top, refused


@TOOLS
@pytest.mark.slow
@pytest.mark.parametrize(("file", "name"), EXAMPLES, ids=[_key(f, n) for f, n in EXAMPLES])
def test_plan_name_equals_python(built, file, name):
    top, refused = built
    key = _key(file, name)
    if key in refused:
        assert "emit --format cpp" in refused[key], refused[key]
        pytest.skip(f"refused: {refused[key].splitlines()[0]}")
    g = _graph(file, name)
    expected = first_plan_name(compile_shape(g, g.instances[0], g.options, Target.named(TARGET)))
    out = subprocess.run([top / "build/main", key, "--deviceless"], check=True, capture_output=True, text=True)
    assert out.stdout == f"graph {key}: plan {expected} for {Target.named(TARGET).name}\n"


def _bits(x):
    """A tensor's elements as integers of their width: equal exactly where the bytes are."""
    import torch

    return (
        x
        if x.dtype == torch.bool
        else x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])
    )


@TOOLS
@pytest.mark.gpu
@pytest.mark.parametrize(("file", "name"), EXAMPLES, ids=[_key(f, n) for f, n in EXAMPLES])
def test_outputs_equal_run_bit_for_bit(built, file, name, tmp_path):
    """The twin's outputs, on the GPU, against the same graph run by cudnn_dsl: the inputs run draws (the twin
    reads them from the files emit wrote with the same generator), the plan cudnn_dsl ran (its engine id and
    knobs, pinned with main's --plan), each output's elements compared as bytes, but those the reference marks
    unspecified. Planned at the one static shape the twin is, as the twin builds it."""
    import torch

    from cudnn_dsl.api import compile as compile_graph
    from cudnn_dsl.target import bits
    from cudnn_dsl.target.memory import as_type, empty

    top, refused = built
    key = _key(file, name)
    if key in refused:
        pytest.skip("refused")
    g = _graph(file, name)
    inst = g.instances[0]
    cg = compile_graph(str(file), graph=name, shape_mode="static")
    inputs = generate_inputs(g, inst, "cuda", g.options.seed)
    undefined = getattr(cg.reference({k: v.clone() for k, v in inputs.items()}), "undefined", {})
    results = cg(**inputs)
    engine, knobs, _ = cg.planner.plan_of(cg.executable(inst))
    pin = f"{engine}:" + ",".join(f"{k}={v}" for k, v in knobs.items())
    out = subprocess.run(
        [top / "build/main", key, "--plan", pin, "--outputs", tmp_path], check=True, capture_output=True, text=True
    ).stdout
    for v in g.outputs:
        t = inst.type(v.name)
        data = (tmp_path / key / f"{v.name}.bin").read_bytes()
        memory = empty(t, "cpu")
        assert len(data) == memory.untyped_storage().nbytes(), (v.name, out)
        ctypes.memmove(memory.data_ptr(), data, len(data))
        got = bits.logical(as_type(memory, t), t)
        want = bits.logical(results[v.name], t).cpu()
        if (mask := undefined.get(v.name)) is not None:
            got, want = got.masked_fill(mask.cpu(), 0), want.masked_fill(mask.cpu(), 0)
        assert torch.equal(_bits(got), _bits(want)), (v.name, pin, out)
