"""Every bundled example compiles with cuDNN as one graph (split=False), runs on the GPU and matches its PyTorch
reference."""

from pathlib import Path

import pytest

from tests.helpers import matches

pytestmark = pytest.mark.gpu

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.cdg"))


def _cases():
    from dsl.pipeline import program

    for path in EXAMPLES:
        for g in program(path).graphs:
            for inst in g.instances:
                yield pytest.param(
                    path, g.name, dict(inst.binding), id=f"{path.stem}:{g.name}:{inst.label or 'static'}"
                )


@pytest.mark.parametrize("path,graph,binding", list(_cases()))
def test_example_matches_reference(path, graph, binding):
    import cudnn_dsl

    cg = cudnn_dsl.compile(str(path), graph=graph, split=False)
    matches(cg, cg.allocate_inputs(binding))
