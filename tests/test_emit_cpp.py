"""emit --format cpp: every example's C++ twin is emitted, built (one CMake project holding them all, built once
per session) and planned without a device; its plan name equals the Python path's for the same target. On a GPU,
its outputs equal `run`'s bit for bit."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cudnn_dsl.build.pipeline import compile_shape
from cudnn_dsl.build.steps import first_plan_name
from cudnn_dsl.interop.emit_cpp import emit_cpp
from cudnn_dsl.run.partition import plan_for_target
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

pytestmark = pytest.mark.skipif(not shutil.which("cmake") or not shutil.which("c++"), reason="needs cmake and c++")


def _graph(file: Path, name: str):
    return next(g for g in load(str(file)).program.graphs if g.name == name)


def _key(file: Path, name: str) -> str:
    return f"{file.stem}__{name}"


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """One CMake project with every example's twin as a subdirectory, built once; and the examples refused, with
    why (a graph cuDNN takes only in parts, a frontend call the emitter has no C++ spelling for)."""
    top = tmp_path_factory.mktemp("cpp")
    target, refused, subdirs = Target.named(TARGET), {}, []
    for file, name in EXAMPLES:
        g = _graph(file, name)
        inst = g.instances[0]
        try:
            files = emit_cpp(g, inst, g.options, target, None, plan_for_target(g, inst, g.options, target)[1])
        except DslError as e:
            refused[_key(file, name)] = str(e)
            continue
        key = _key(file, name)
        for rel, data in files.items():
            (top / key / rel).parent.mkdir(parents=True, exist_ok=True)
            (top / key / rel).write_bytes(data)
        subdirs.append(key)
    (top / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(examples LANGUAGES C CXX)\n"
        + "".join(f'set(CUDNN_DSL_PREFIX "{k}_")\nadd_subdirectory({k})\n' for k in subdirs)
    )
    subprocess.run(["cmake", "-S", top, "-B", top / "build"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", top / "build", "-j2"], check=True, capture_output=True)
    return top, refused


@pytest.mark.parametrize(("file", "name"), EXAMPLES, ids=[_key(f, n) for f, n in EXAMPLES])
def test_plan_name_equals_python(built, file, name):
    top, refused = built
    key = _key(file, name)
    if key in refused:
        assert "emit --format cpp" in refused[key] or "splits graph" in refused[key]
        pytest.skip(f"refused: {refused[key].splitlines()[0]}")
    g = _graph(file, name)
    expected = first_plan_name(compile_shape(g, g.instances[0], g.options, Target.named(TARGET)))
    main = top / "build" / key / "main"
    out = subprocess.run([main, "--deviceless"], check=True, capture_output=True, text=True).stdout
    assert out.strip().endswith(f"plan {expected} for {Target.named(TARGET).name}"), out


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


@pytest.mark.gpu
@pytest.mark.parametrize(("file", "name"), EXAMPLES, ids=[_key(f, n) for f, n in EXAMPLES])
def test_outputs_equal_run_bit_for_bit(built, file, name, tmp_path):
    """The twin's outputs, on the GPU, against the same graph run by cudnn_dsl on the same inputs and plan."""

    from cudnn_dsl.api import compile as compile_graph
    from cudnn_dsl.run.inputs import generate_inputs

    top, refused = built
    key = _key(file, name)
    if key in refused:
        pytest.skip("refused")
    main = top / "build" / key / "main"
    out = subprocess.run([main, "--outputs", tmp_path], check=True, capture_output=True, text=True).stdout
    g = _graph(file, name)
    inst = g.instances[0]
    cg = compile_graph(str(file), graph=name)
    inputs = generate_inputs(g, inst, "cuda", g.options.seed)
    results = cg(**inputs)
    for v in g.outputs:
        got = (tmp_path / f"{v.name}.bin").read_bytes()
        want = results[v.name] if isinstance(results, dict) else results
        assert got == bytes(want.detach().cpu().contiguous().untyped_storage()), (v.name, out)
