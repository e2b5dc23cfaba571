"""The pipeline's stages on the GPU: lowered and planned on a handle, and the last, a Planner's Executable, which is
what a compiled graph runs."""

import pytest

from tests.graphs import ADD

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_store")]


def test_compile_shape_stops_at_each_stage_on_the_gpu():
    import torch

    import cudnn_dsl
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.build.planner import Executable
    from cudnn_dsl.build.steps import STEPS

    cg = cudnn_dsl.compile(ADD)
    g, inst, planner = cg.graph, cg.graph.instances[0], cg.planner
    on_gpu = {"handle": planner.handle, "gpu": planner.device_name}
    assert compile_shape(g, inst, cg.options, stop="lowered", **on_gpu).plan_count == 0
    planned = compile_shape(g, inst, cg.options, **on_gpu)
    assert list(planned.timings) == list(STEPS) and not planned.skipped  # on a GPU every step runs
    exe = compile_shape(g, inst, cg.options, stop="executable", planner=planner)
    assert isinstance(exe, Executable) and exe.plan_name.startswith("eng")
    assert cg.executable(inst) is exe  # the compiled graph runs the same stage's value
    a, b = (torch.randn(4, 8, device="cuda", dtype=torch.half) for _ in range(2))
    torch.testing.assert_close(cg(a=a, b=b)["y"], a + b)
