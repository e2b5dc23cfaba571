"""`cudnn-dsl fmt FILE...`: rewrite in canonical form, comments kept."""

from __future__ import annotations

import sys
from pathlib import Path

from cudnn_dsl.cli import common

HELP = "rewrite .cdg files in canonical form (comments kept)"


def register(p) -> None:
    p.add_argument("files", nargs="+", metavar="FILE")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is not canonical")
    how.add_argument("--stdout", action="store_true", help="print the canonical text instead of rewriting")
    p.set_defaults(run=run)


def run(args) -> int:
    from dsl.syntax.printer import fmt_module

    status = common.EXIT_OK
    for path in args.files:
        result = common.load_each(path, stop="ast")
        if result is None:
            status = max(status, common.EXIT_USAGE)
            continue
        if not result.ok:
            status = max(status, common.EXIT_FAIL)
            continue
        new = fmt_module(result.module)
        if args.stdout:
            sys.stdout.write(new)
        elif new == result.text:
            continue
        elif args.check:
            print(f"{path}: would reformat", file=sys.stderr)
            status = max(status, common.EXIT_FAIL)
        else:
            from cudnn_dsl.store.files import atomic_write

            try:
                atomic_write(Path(path), new)
            except OSError as e:  # a read-only file or directory: said, and the other files still formatted
                status = max(status, common.report(e))
                continue
            print(f"{path}: reformatted", file=sys.stderr)
    return status
