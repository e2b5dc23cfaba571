"""A range dim on the GPU: values never typed at check time compile on first use and match the reference."""

from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_store")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "serve_matmul.cdg"


def test_values_inside_a_range_compile_on_first_use_and_match():
    import cudnn_dsl

    cg = cudnn_dsl.compile(EXAMPLE)
    for t in (16, 48, 1000 - 1000 % 16, 4096):
        results = cg.check(cg.allocate_inputs({"T": t}))
        assert all(r.ok for r in results), (t, [str(r) for r in results])
    built = {dict(binding)["T"] for binding in cg.planner.built}
    assert {48, 992} <= built  # the two values typed only when they were first called
