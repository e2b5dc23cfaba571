"""The bench's statistics, on the CPU (the timing itself is on the GPU: tests/gpu/test_bench_gpu.py)."""

import pytest

from cudnn_dsl.tune.bench import import_script, percentile


def test_percentiles_interpolate_between_ranks():
    xs = [float(x) for x in range(1, 11)]  # 1..10, shuffled order must not matter
    assert percentile(xs[::-1], 50) == pytest.approx(5.5)
    assert percentile(xs, 90) == pytest.approx(9.1)
    assert percentile(xs, 99) == pytest.approx(9.91)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 10.0
    assert percentile([3.0], 99) == 3.0


def test_an_ejected_script_is_imported_as_a_module_from_its_file():
    from cudnn_dsl.interop.emit import emit_cudnn
    from dsl.pipeline import program

    g = program("examples/conv_bias_relu.cdg").graphs[0]
    mod = import_script(emit_cudnn(g, g.instances[0]), g.name)
    assert mod.__file__.endswith(f"{g.name}_ejected.py")
    buffers = mod.make_buffers(device="cpu")
    assert set(mod.INPUTS) <= set(buffers) and callable(mod.build)
