"""Running the command line in-process (torch is imported once), as a subprocess would see it."""

import contextlib
import io
import subprocess
import sys

from cudnn_dsl.cli import main


def run_cli(*args) -> subprocess.CompletedProcess:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse's own usage errors
            code = e.code
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "cudnn_dsl", *map(str, args)], code, out.getvalue(), err.getvalue()
    )
