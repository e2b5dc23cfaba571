"""SARIF 2.1.0 logs of what `check` and `support` find (`--format sarif`), so that a CI job annotates a pull
request at the line: one result per diagnostic, with its rule, level, message and place."""

from __future__ import annotations

import json
from pathlib import Path, PurePath
from urllib.parse import quote

from cudnn_dsl.cli import common

VERSION = "2.1.0"
SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"

RULES = {
    "check": "the language's checks: a .cdg file that does not parse or check, and its warnings",
    "plan": "cuDNN (asked without a GPU) plans no graph for the target, or cannot be asked",
    "split": "cuDNN declines the graph whole for the target; it runs as the parts the note names",
}
"""rule id -> what its results are about (the SARIF log's tool.driver.rules)"""

LEVELS = {"error": "error", "warning": "warning", "note": "note"}
"""a diagnostic's severity -> the SARIF level"""


def add_flags(p) -> None:
    p.add_argument(
        "--format",
        choices=("text", "sarif"),
        default="text",
        help="sarif: also write every diagnostic as a SARIF 2.1.0 log (for pull-request annotations), on stdout "
        "(the human report then goes to stderr) or in --output",
    )
    p.add_argument("--output", metavar="FILE", help="with --format sarif: the file the SARIF log goes to")


def check_flags(args) -> None:
    """--output only with --format sarif; and not two reports on stdout."""
    if args.output and args.format != "sarif":
        raise common.UsageError("--output goes with --format sarif")
    if args.format == "sarif" and not args.output and args.json == "-":
        raise common.UsageError("--format sarif and --json - both want stdout: give --output FILE or --json FILE")
    common.check_writable(args.output, "--output")


def result(rule: str, d) -> dict:
    """One SARIF result of a dsl.diagnostics.Diagnostic (one with no line is put at its file, when it names one)."""
    from dsl.diagnostics import UNKNOWN

    notes = [text for text, loc in d.notes if loc is None]
    r = {
        "ruleId": rule,
        "ruleIndex": list(RULES).index(rule),
        "level": LEVELS[d.severity],
        "message": {"text": "\n".join([d.message, *notes])},
    }
    if d.loc.line >= 1 or d.loc.file != UNKNOWN.file:
        r["locations"] = [_location(d.loc.file, d.loc if d.loc.line >= 1 else None)]
    related = [
        {**_location(loc.file, loc), "id": i, "message": {"text": text}}
        for i, (text, loc) in enumerate(d.notes)
        if loc is not None and loc.line >= 1
    ]
    if related:
        r["relatedLocations"] = related
    return r


def write(path: str | None, results: list[dict]) -> None:
    """The SARIF log of these results to `path`, or to stdout (None)."""
    common.write_text(path or "-", json.dumps(log(results), indent=1))


def log(results: list[dict]) -> dict:
    import cudnn_dsl
    from cudnn_dsl.target.machine import environment

    driver = {
        "name": "cudnn-dsl",
        "version": cudnn_dsl.__version__,
        "rules": [{"id": k, "shortDescription": {"text": v}} for k, v in RULES.items()],
    }
    return {
        "$schema": SCHEMA,
        "version": VERSION,
        "runs": [
            {
                "tool": {"driver": driver},
                "columnKind": "unicodeCodePoints",  # the parser counts columns in characters
                "results": results,
                "properties": {"environment": environment()},
            }
        ],
    }


def _location(file: str, loc=None) -> dict:
    physical: dict = {"artifactLocation": {"uri": _uri(file)}}
    if loc is not None:
        region = {"startLine": loc.line, "startColumn": max(1, loc.col)}
        if loc.end_line >= loc.line:
            region["endLine"] = loc.end_line
            end = loc.end_col if loc.end_line > loc.line or loc.end_col > region["startColumn"] else None
            if end is not None:
                region["endColumn"] = end
        physical["region"] = region
    return {"physicalLocation": physical}


def _uri(file: str) -> str:
    """A file as a URI reference: relative paths stay relative (to the repository root, where CI runs), absolute
    ones become file: URIs."""
    p = PurePath(file)
    return Path(p).as_uri() if p.is_absolute() else quote(p.as_posix())
