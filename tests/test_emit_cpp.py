"""emit --format cpp: a project's files (the inputs run draws, the stand-in driver, refusals at their place), and,
marked slow, every example's C++ twin built in one project and planned without a device, its plan name (each
part's, for a graph cuDNN takes only in parts) equal to the Python path's for the same target
(tests/gpu/test_emit_cpp_gpu.py: on a GPU, its outputs equal `run`'s)."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cudnn_dsl.build.pipeline import compile_shape
from cudnn_dsl.build.steps import first_plan_name
from cudnn_dsl.interop.emit_cpp import STAND_IN, emit_cpp, namespace, project, twin
from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.partition import CUDNN, plan_for_target
from cudnn_dsl.target.driver import CUDA_ERROR_NO_DEVICE
from cudnn_dsl.target.library import Target
from dsl.diagnostics import DslError
from dsl.pipeline import load
from tests.cli_util import run_cli

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


def graph_of(file: Path, name: str):
    return next(g for g in load(str(file)).program.graphs if g.name == name)


def key(file: Path, name: str) -> str:
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
    g = graph_of(file, "conv_bias_relu")
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


def test_cli_writes_the_project(tmp_path):
    """`emit --format cpp -o DIR` writes emit_cpp's files; -o goes with cpp alone."""
    file = ROOT / "examples/conv_bias_relu.cdg"
    r = run_cli("emit", "--format", "cpp", file, "-o", tmp_path / "p")
    assert r.returncode == 0, r.stderr
    assert f"cmake -S {tmp_path / 'p'}" in r.stderr
    g = graph_of(file, "conv_bias_relu")
    files = emit_cpp(g, g.instances[0], g.options, Target.named(TARGET))
    written = {str(p.relative_to(tmp_path / "p")): p.read_bytes() for p in (tmp_path / "p").rglob("*") if p.is_file()}
    assert written == files
    assert "give it with -o DIR" in run_cli("emit", "--format", "cpp", file).stderr
    assert "give it with -o DIR" in run_cli("emit", file, "-o", tmp_path / "q").stderr


def test_a_graph_in_parts_is_its_cuDNN_parts_on_shared_memory(tmp_path):
    """A graph cuDNN declines whole: a define_graph and a Part per cuDNN part, in order, the value one part makes
    for the next in one memory of main's that both bind; a reshape between parts is a view of its operand."""
    target = Target.named(TARGET)
    file = ROOT / "examples/training/resnet_block.cdg"
    r = run_cli("emit", "--format", "cpp", file, "--shape", "N=4", "-o", tmp_path / "p")
    assert r.returncode == 0, r.stderr
    code = (tmp_path / "p/graphs.cpp").read_text()
    assert "void define_part1(fe::graph::Graph& g)" in code and "void define_part2(fe::graph::Graph& g)" in code
    assert ".index = 1," in code and ".index = 2," in code and "define_graph(fe" not in code
    assert code.count('{"h", 524288, nullptr}') == 1  # the intermediate, allocated once
    part1, part2 = code.split(".index = 2,")
    assert '{"h", 6}' in part1.split(".index = 1,")[1] and '{"h", 1}' in part2  # bound in both parts' packs
    g = graph_of(ROOT / "examples/training/transformer_block.cdg", "transformer_block")
    partition = plan_for_target(g, g.instances[0], g.options, target)[1]
    code = twin("t", g, g.instances[0], g.options, target, None, partition).code
    assert '{"q", "q2", 0}' in code and '{"o", "a", 0}' in code
    assert '{"q",' not in code.split(".memories = ")[1].split(".views = ")[0]


def test_the_partition_comment_is_one_line_each_with_no_splice():
    """The lines saying why and how a graph is split are // comments of one line each, none ending in a backslash
    (which would splice the next line of code into the comment): cuDNN's reasons are quoted there."""
    from cudnn_dsl.interop.emit_cpp import _comment

    assert _comment("declined: No valid engine\n  configs \\") == "// declined: No valid engine configs"
    g = graph_of(ROOT / "examples/training/resnet_block.cdg", "resnet_block")
    target = Target.named(TARGET)
    partition = plan_for_target(g, g.instances[0], g.options, target)[1]
    head = twin("r", g, g.instances[0], g.options, target, None, partition).code.split("namespace ")[0]
    comments = head.splitlines()[1:]
    assert comments and all(line.startswith("// ") and not line.endswith("\\") for line in comments), head


def test_a_part_left_to_torch_is_refused_at_its_op():
    file = ROOT / "examples/torch_models/conv_bn_relu.cdg"
    g = graph_of(file, "conv_bn_relu")
    target = Target.named(TARGET)
    partition = plan_for_target(g, g.instances[0], g.options, target)[1]
    with pytest.raises(DslError) as e:
        twin(g.name, g, g.instances[0], g.options, target, None, partition)
    assert str(e.value).startswith(
        f"{file}:20:21: error: emit --format cpp: part 2 of graph 'conv_bn_relu' (batchnorm_inference (line 20)) "
        "is a torch fallback"
    )


def test_twins_need_distinct_namespaces():
    g = graph_of(ROOT / "examples/conv_bias_relu.cdg", "conv_bias_relu")
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
    assert str(e.value).startswith(f"{src}:5:7: error: transpose: emit --format cpp: the frontend's transpose has no")


def build_examples(top: Path) -> tuple[dict[str, str], dict]:
    """Builds one C++ project holding every example's twin (named FILE:GRAPH) in `top`; returns the examples
    refused, with why (a part left to torch, a frontend call the emitter has no C++ spelling for), and each
    example's partition for the target (None: cuDNN takes it whole)."""
    target, refused, partitions, twins = Target.named(TARGET), {}, {}, []
    for file, name in EXAMPLES:
        g = graph_of(file, name)
        inst = g.instances[0]
        try:
            partitions[key(file, name)] = partition = plan_for_target(g, inst, g.options, target)[1]
            twins.append(twin(key(file, name), g, inst, g.options, target, None, partition))
        except DslError as e:
            refused[key(file, name)] = str(e)
    _write(top, project(twins, target))
    subprocess.run(["cmake", "-S", top, "-B", top / "build"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", top / "build", "-j2"], check=True, capture_output=True)
    return refused, partitions


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict[str, str], dict]:
    top = tmp_path_factory.mktemp("cpp")
    return top, *build_examples(top)


@TOOLS
@pytest.mark.slow
@pytest.mark.parametrize(("file", "name"), EXAMPLES, ids=[key(f, n) for f, n in EXAMPLES])
def test_plan_name_equals_python(built, file, name):
    """Each plan main prints, for the graph whole or for each cuDNN part, is the one Python plans for it."""
    top, refused, partitions = built
    named, target = key(file, name), Target.named(TARGET)
    if named in refused:
        assert "emit --format cpp" in refused[named], refused[named]
        pytest.skip(f"refused: {refused[named].splitlines()[0]}")
    g = graph_of(file, name)
    partition = partitions[named]
    if partition is None:
        plans = {"": compile_shape(g, g.instances[0], g.options, target)}
    else:
        plans = {
            f" part {k}": compile_shape(p.graph, p.graph.instances[0], g.options, target)
            for k, p in enumerate(partition.parts, 1)
            if p.kind == CUDNN
        }
    expected = "".join(
        f"graph {named}{part}: plan {first_plan_name(low)} for {target.name}\n" for part, low in plans.items()
    )
    out = subprocess.run([top / "build/main", named, "--deviceless"], check=True, capture_output=True, text=True)
    assert out.stdout == expected


@TOOLS
@pytest.mark.slow
@pytest.mark.parametrize("pin", ["1/4x", "1x/4", "1/4:k24=3x", "1/+4"])
def test_main_takes_a_pin_of_whole_numbers_only_resnet(built, pin):
    """main's --plan reads each number whole, as `run --plan` does: trailing or leading text is refused, not cut
    off; a well-formed pin of a part the graph lacks gets as far as the parts."""
    top = built[0]
    named = key(ROOT / "examples/training/resnet_block.cdg", "resnet_block")

    def main(plan: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [top / "build/main", named, "--deviceless", "--plan", plan], capture_output=True, text=True
        )

    out = main(pin)
    assert out.returncode == 1 and f"main: --plan {pin} is not [PART/]ENGINE[:KNOB=VALUE,...]" in out.stderr
    out = main("9/4:k24=3")
    assert out.returncode == 1 and f"graph {named} has no cuDNN part 9" in out.stderr, out.stderr


@TOOLS
@pytest.mark.slow
def test_main_takes_the_plans_it_prints_as_pins_resnet(built):
    """Each part pinned to the plan main printed for it, spelled as printed (eng4_k24=43), plans the same."""
    top = built[0]
    named = key(ROOT / "examples/training/resnet_block.cdg", "resnet_block")
    main = [top / "build/main", named, "--deviceless"]
    printed = subprocess.run(main, check=True, capture_output=True, text=True).stdout
    parts = re.findall(rf"^graph {re.escape(named)} part (\d+): plan (\S+) for ", printed, re.M)
    assert len(parts) >= 2, printed
    pins = [arg for k, plan in parts for arg in ("--plan", f"{k}/{plan}")]
    assert subprocess.run(main + pins, check=True, capture_output=True, text=True).stdout == printed
