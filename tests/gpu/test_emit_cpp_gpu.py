"""C++ twins on the GPU: each example's twin (tests/test_emit_cpp.py builds them all in one project) run with the
plan cudnn_dsl ran (each part's, for a graph cuDNN takes only in parts), its outputs equal to cudnn_dsl's bit for
bit."""

import ctypes
import subprocess

import pytest
import torch

from cudnn_dsl.api import compile as compile_graph
from cudnn_dsl.build.constraints import numbered_knobs
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
    return top, *cpp.build_examples(top)


def _cuts(partition) -> list[tuple] | None:
    return None if partition is None else [(p.first, p.end, p.kind) for p in partition.parts]


def _pin(cg, exe) -> str:
    """ENGINE:kN=V,... of the plan a compiled graph ran: the knobs by their numbers in the library, as the plan's
    name spells them (so a knob the frontend reads as NOT_SET is pinned too); by the frontend's names where the
    name is of another form."""
    if (numbered := numbered_knobs(exe.plan_name)) is not None:
        engine, numbers = numbered
        return f"{engine}:" + ",".join(f"k{n}={v}" for n, v in numbers.items())
    engine, knobs, _ = cg.planner.plan_of(exe)
    if "NOT_SET" in knobs:
        pytest.skip(f"plan {exe.plan_name} has a knob the frontend cannot name ({engine}: {knobs})")
    return f"{engine}:" + ",".join(f"{k}={v}" for k, v in knobs.items())


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
    those the reference marks unspecified. cudnn_dsl plans the one static shape the twin is, as the twin does; a
    graph in parts has each part pinned (main --plan K/...)."""
    top, refused, partitions = built
    twin = cpp.key(file, name)
    if twin in refused:
        pytest.skip(f"refused: {refused[twin].splitlines()[0]}")
    g = cpp.graph_of(file, name)
    inst = g.instances[0]
    cg = compile_graph(str(file), graph=name, shape_mode="static")
    inputs = generate_inputs(g, inst, "cuda", g.options.seed)
    undefined = getattr(cg.reference({k: v.clone() for k, v in inputs.items()}), "undefined", {})
    results = cg(**inputs)
    runs, partition = cg.parts(inst), partitions[twin]
    # the twin is whole or in the parts deviceless planning found: this GPU's must be the same
    assert _cuts(getattr(runs, "partition", None)) == _cuts(partition)
    if partition is None:
        pins = [_pin(cg, cg.executable(inst))]
    else:
        pins = [
            f"{k}/" + _pin(c, c.executable(c.graph.instances[0]))
            for k, c in enumerate(runs.compiled, 1)
            if c is not None
        ]
    main = [top / "build/main", twin, *(a for pin in pins for a in ("--plan", pin)), "--outputs", tmp_path]
    out = subprocess.run(main, check=True, capture_output=True, text=True).stdout
    for v in g.outputs:
        t = inst.type(v.name)
        got = _twin_output(tmp_path / twin / f"{v.name}.bin", t)
        want = bits.logical(results[v.name], t).cpu()
        if (mask := undefined.get(v.name)) is not None:
            got, want = got.masked_fill(mask.cpu(), 0), want.masked_fill(mask.cpu(), 0)
        assert torch.equal(_bits(got), _bits(want)), (v.name, pins, out)
