"""The bench's statistics, on the CPU (the timing itself is on the GPU: tests/gpu/test_bench_gpu.py), and the GPU
run's script as far as a CPU machine can check it."""

import os
import subprocess
from pathlib import Path

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


def test_the_published_bench_figures_plot_one_panel_per_graph_with_a_bar_per_contender(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import json
    from pathlib import Path

    import cudnn_dsl.tune.bench as bench
    from cudnn_dsl.tune import plots

    results = json.loads((Path(__file__).parents[1] / "docs/results/bench-h200.json").read_text())["results"]
    drawn = []
    monkeypatch.setattr(
        bench, "draw", lambda panels, path, **kw: (drawn.extend(panels), plots.draw(panels, path, **kw))
    )
    bench.plot(results, str(tmp_path / "b.png"))
    assert [p.title for p in drawn] == [r["graph"] for r in results]
    for panel, res in zip(drawn, results):
        eager = next(r for r in res["rows"] if r["label"] == "torch eager")
        assert panel.medians[panel.labels.index("torch eager")] == eager["gpu_us_median"]
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_gpu_run_script_parses_and_refuses_an_unknown_section(tmp_path):
    script = Path(__file__).resolve().parents[1] / "bench" / "gpu_all.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {**os.environ, "ONLY": "tests,nope", "OUT": str(tmp_path / "out")}
    p = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "ONLY: no section 'nope'" in p.stderr and "tests,examples" in p.stderr
