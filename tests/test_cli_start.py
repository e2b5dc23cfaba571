"""What the command line does before the work: deviceless planning and emitting import no torch, a bad flag of a
GPU command is refused before torch, and long work shows its progress on a terminal, and only there."""

import ctypes
import io
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudnn_dsl.cli.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"

#: runs the command line in this interpreter, then says which heavy packages it imported
_WRAPPER = (
    "import sys\nfrom cudnn_dsl.cli import main\ntry:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n"
    "    rc = e.code\nprint('EXIT', rc, 'TORCH', 'torch' in sys.modules, file=sys.stderr)\n"
)


def _cli(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _WRAPPER, *map(str, args)], capture_output=True, text=True, cwd=ROOT, **kw
    )


# The frontend's own norm engines import torch when a graph holds a norm (cudnn.norm.graph_analyzer): these
# graphs hold none, so any torch imported here is ours.
@pytest.mark.parametrize(
    "args",
    [
        ("check", "--target", "h200", EX / "conv_bias_relu.cdg", EX / "sdpa.cdg"),
        ("check", "--emit", "plans", "--target", "h200", EX / "matmul_epilogue.cdg"),
        ("check", "--emit", "backward", "--target", "h200", EX / "training" / "resnet_block.cdg"),
        ("support", "--target", "h200,a100", EX / "residual_block.cdg", EX / "dynamic_matmul.cdg"),
        ("emit", EX / "conv_bias_relu.cdg"),
        ("emit", "--format", "fe-json", EX / "sdpa.cdg"),
        ("check", "--emit", "lowering", EX / "compare_select.cdg"),
    ],
    ids=lambda a: " ".join(str(x).removeprefix(str(ROOT) + "/") for x in a),
)
def test_deviceless_planning_and_emit_import_no_torch(args):
    p = _cli(*args)
    assert "EXIT 0 TORCH False" in p.stderr, p.stderr[-2000:]


def _no_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


@pytest.mark.parametrize(
    "args,words",
    [
        (("bench", EX / "conv_bias_relu.cdg", "--against", "foo"), "--against takes cudnn, torch, compile"),
        (("bench", EX / "conv_bias_relu.cdg", "--rounds", "0"), "--rounds and --samples must be at least 1"),
        (("tune", EX / "conv_bias_relu.cdg", "--max-configs", "3"), "--max-configs goes with --exhaustive"),
    ],
)
def test_a_gpu_commands_usage_error_comes_before_torch(args, words):
    p = _cli(*args)
    assert "EXIT 2 TORCH False" in p.stderr and words in p.stderr, p.stderr[-2000:]


_BUILT = (
    "import sys\nfrom cudnn_dsl.cli import main\nrc = main(sys.argv[1:])\n"
    "print('EXIT', rc, 'BUILT', sorted(m for m in ('cudnn', 'cudnn_dsl.run.compiled') if m in sys.modules), "
    "file=sys.stderr)\n"
)


@pytest.mark.skipif(not _no_driver(), reason="a CUDA driver loads here")
def test_no_gpu_is_said_before_anything_is_built():
    for args in (("bench", EX / "conv_bias_relu.cdg"), ("tune", "--require-gpu", EX / "conv_bias_relu.cdg")):
        p = subprocess.run([sys.executable, "-c", _BUILT, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
        assert "EXIT 1 BUILT []" in p.stderr and "no CUDA GPU is usable here" in p.stderr, p.stderr[-2000:]


# ---- progress ---------------------------------------------------------------------------------------------------


def _on_a_terminal(*args) -> tuple[int, str, str]:
    """Runs the command with stderr on a pseudo-terminal: (exit status, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "200"}  # a new pseudo-terminal has no size
    proc = subprocess.Popen(
        [sys.executable, "-m", "cudnn_dsl", *map(str, args)], stdout=subprocess.PIPE, stderr=slave, cwd=ROOT, env=env
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out = proc.stdout.read().decode()
    return proc.wait(), out, seen.decode(errors="replace")


def test_support_shows_its_progress_on_a_terminal_and_erases_it():
    rc, out, term = _on_a_terminal("support", "--target", "h200,a100", "examples/conv_bias_relu.cdg")
    assert rc == 0 and "fuses" in out
    assert "[1/2] examples/conv_bias_relu.cdg: conv_bias_relu on NVIDIA H200 ..." in term, term
    assert "[2/2, " in term and " left] examples/conv_bias_relu.cdg: conv_bias_relu on NVIDIA A100" in term, term
    assert term.rstrip(" ").endswith("\r\033[K"), repr(term[-80:])  # nothing left on the line
    assert "\033" not in out  # the report itself stays plain


def test_progress_is_silent_when_quiet_or_not_on_a_terminal():
    rc, _, term = _on_a_terminal("check", "--quiet", "--target", "h200", EX / "conv_bias_relu.cdg")
    assert rc == 0 and "\033" not in term and "[1/1]" not in term, term
    p = _cli("check", "--target", "h200", EX / "conv_bias_relu.cdg")
    assert "EXIT 0" in p.stderr and "\033" not in p.stderr and "[1/1]" not in p.stderr, p.stderr


def test_a_progress_line_counts_items_estimates_the_time_left_and_erases_itself():
    stream = io.StringIO()
    progress = Progress(4, enabled=True, stream=stream)
    with progress.item("a.cdg: g [N=8]", part=0.5):
        progress("create_execution_plans")
    assert "[1/4] a.cdg: g [N=8] ..." in stream.getvalue()
    progress.started -= 10  # half a unit took ten seconds: 3.5 more take seventy
    assert progress.eta() == "1:10 left"
    with progress.item("a.cdg: g [N=16]", part=0.5):
        progress.drawn_at = 0
        progress("build_plans")
        assert stream.getvalue().endswith("[1/4, 1:10 left] a.cdg: g [N=16]: build_plans ...")
    assert stream.getvalue().endswith("\r\033[K") and progress.done == 1
    progress("a step between items")  # nothing under way: nothing drawn
    assert stream.getvalue().endswith("\r\033[K")


def test_a_disabled_progress_writes_nothing_and_steps_are_throttled():
    stream = io.StringIO()
    off = Progress(2, enabled=False, stream=stream)
    with off.item("x"):
        off("step")
    assert stream.getvalue() == "" and off.done == 1
    on = Progress(1, enabled=True, stream=stream)
    with on.item("x"):
        on.drawn_at = time.monotonic()
        on("too soon after the last")
    assert "too soon" not in stream.getvalue()
