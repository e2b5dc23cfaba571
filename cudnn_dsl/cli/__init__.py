"""`cudnn-dsl COMMAND ...`. One file per command (register + run); this module builds
the parser and is the only place where an exception becomes a message and an exit code."""

from __future__ import annotations

import argparse
import importlib
import sys

from cudnn_dsl.cli import common
from cudnn_dsl.cli.common import EXIT_OK, EXIT_USAGE, report

#: command -> module under cudnn_dsl.cli, in the order --help lists them
COMMANDS = {
    "check": "check",
    "fmt": "fmt",
    "run": "run",
    "emit": "emit",
    "import": "import_",
    "tune": "tune",
    "bench": "bench",
    "support": "support",
    "sweep": "sweep",
    "cache": "cache",
    "device-info": "device_info",
}


class _Version(argparse.Action):
    """--version: cudnn-dsl's, the frontend's, cuDNN's and torch's, read only when asked (torch not imported)."""

    def __call__(self, parser, namespace, values, option_string=None):
        import cudnn_dsl
        from cudnn_dsl.target.machine import versions

        print(f"cudnn-dsl {cudnn_dsl.__version__}")
        for name, version in versions().items():
            print(f"{name} {version}")
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, the other commands get their one-line help but not their flags
    (registering every command's flags is much of the start-up of a quick `check`)."""
    p = argparse.ArgumentParser(
        prog="cudnn-dsl",
        description="Write fused cuDNN graphs as small .cdg files; check, compile, run, verify, tune and bench them.",
        epilog="Exit status: 0 clean, 1 errors or mismatches, 2 usage errors, 70 internal error (a bug), "
        "130 interrupted. Docs: docs/cli.md",
    )
    p.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="print the versions of cudnn-dsl, the cuDNN Frontend, the cuDNN library it loads and torch, and exit",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        cmd = importlib.import_module(f"cudnn_dsl.cli.{module}")
        parser = sub.add_parser(name, help=cmd.HELP, description=cmd.HELP)
        if only is None or name == only:
            cmd.register(parser)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else "")
    args = parser.parse_args(argv)  # argparse itself exits 2 on a bad command line
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_USAGE
    common.remember_interrupts()
    try:
        if not common.machine_stdout(args):
            return args.run(args)
        with common.json_on_stdout():  # stdout holds the JSON or SARIF alone, the human report goes to stderr
            return args.run(args)
    except BrokenPipeError:  # `cudnn-dsl check f.cdg | head -1`
        sys.stderr.close()
        return EXIT_OK
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - the one place errors become exit codes
        return report(e)
