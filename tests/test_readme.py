"""The README's torch-op snippet runs as written, on the CPU (where the op's kernel is the graph's reference)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _block(heading: str) -> str:
    """The first ```python block of the README section under `## heading`."""
    section = re.split(r"^## ", (ROOT / "README.md").read_text(), flags=re.M)
    (text,) = [s for s in section if s.startswith(heading + "\n")]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_the_torch_op_snippet_runs_as_written_and_trains_w():
    check = "assert y.shape == (32, 256, 56, 56) and w.grad is not None and w.grad.shape == w.shape\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run(
        [sys.executable, "-c", _block("As a torch op") + check], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-3000:]
