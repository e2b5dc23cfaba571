"""Layering and registry invariants."""

import subprocess
import sys

from cudnn_dsl.ops import IMPLS
from dsl.ops import OPS


def test_dsl_imports_neither_torch_nor_cudnn():
    code = (
        "import sys; import dsl.parser, dsl.check, dsl.printer, dsl.ops, dsl.ir, dsl.types, dsl.pipeline; "
        "from dsl.pipeline import program; program(text='graph g {\\n input x : half[2]\\n output y = relu(x)\\n}\\n'); "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'cudnn', 'cudnn_dsl', 'numpy')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_op_has_exactly_one_backend_entry():
    assert set(OPS) == set(IMPLS)


def test_every_op_is_documented():
    assert all(sig.doc for sig in OPS.values())


def test_language_reference_names_every_op():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "language.md").read_text()
    missing = [op for op in OPS if f"`{op}`" not in text]
    assert not missing, f"docs/language.md does not mention {missing}"
