"""C++ twins on the GPU: each example's twin (tests/test_emit_cpp.py builds them all in one project) run with the
plan cudnn_dsl ran, its outputs equal to cudnn_dsl's bit for bit."""

import ctypes
import subprocess

import pytest
import torch

from cudnn_dsl.api import compile as compile_graph
from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.target import bits
from cudnn_dsl.target.memory import as_type, empty
from tests import test_emit_cpp as cpp

pytestmark = [cpp.TOOLS, pytest.mark.gpu, pytest.mark.usefixtures("private_store")]

#: integers of each element width: two elements are equal as these exactly when their bytes are
_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    top = tmp_path_factory.mktemp("cpp")
    return top, cpp.build_examples(top)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.bool else x.view(_INTEGERS[x.element_size()])


def _twin_output(path, t) -> torch.Tensor:
    """An output as the twin wrote its memory, read as its type (a bool tensor unpacked)."""
    data = path.read_bytes()
    memory = empty(t, "cpu")
    assert len(data) == memory.untyped_storage().nbytes(), path
    ctypes.memmove(memory.data_ptr(), data, len(data))
    return bits.logical(as_type(memory, t), t)


@pytest.mark.parametrize(("file", "name"), cpp.EXAMPLES, ids=[cpp.key(f, n) for f, n in cpp.EXAMPLES])
def test_outputs_equal_run_bit_for_bit(built, file, name, tmp_path):
    """The inputs run draws (the twin reads them from the files emit wrote with the same generator), the plan
    cudnn_dsl ran pinned by its engine id and knobs (main --plan), each output's elements compared as bytes but
    those the reference marks unspecified. cudnn_dsl plans the one static shape the twin is, as the twin does."""
    top, refused = built
    twin = cpp.key(file, name)
    if twin in refused:
        pytest.skip(f"refused: {refused[twin].splitlines()[0]}")
    g = cpp.graph_of(file, name)
    inst = g.instances[0]
    cg = compile_graph(str(file), graph=name, shape_mode="static")
    inputs = generate_inputs(g, inst, "cuda", g.options.seed)
    undefined = getattr(cg.reference({k: v.clone() for k, v in inputs.items()}), "undefined", {})
    results = cg(**inputs)
    engine, knobs, _ = cg.planner.plan_of(cg.executable(inst))
    if "NOT_SET" in knobs:  # seen with cuDNN 9.19: a knob the frontend has no name for, which --plan cannot name
        pytest.skip(f"the plan cudnn_dsl ran has a knob the frontend cannot name ({engine}: {knobs})")
    pin = f"{engine}:" + ",".join(f"{k}={v}" for k, v in knobs.items())
    main = [top / "build/main", twin, "--plan", pin, "--outputs", tmp_path]
    out = subprocess.run(main, check=True, capture_output=True, text=True).stdout
    for v in g.outputs:
        t = inst.type(v.name)
        got = _twin_output(tmp_path / twin / f"{v.name}.bin", t)
        want = bits.logical(results[v.name], t).cpu()
        if (mask := undefined.get(v.name)) is not None:
            got, want = got.masked_fill(mask.cpu(), 0), want.masked_fill(mask.cpu(), 0)
        assert torch.equal(_bits(got), _bits(want)), (v.name, pin, out)
