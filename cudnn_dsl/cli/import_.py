"""`cudnn-dsl import FILE`: a cuDNN Frontend graph (its JSON, or a frontend log) as a .cdg file; `--from-torch`:
a traced PyTorch function or module."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from cudnn_dsl.cli import common
from dsl import files

HELP = "turn a cuDNN Frontend graph (its JSON, version 1.0 or 2.0, or a frontend log) into a .cdg file"
EPILOG = (
    "FILE is the JSON the frontend serializes (`repr(graph)`, `cudnn-dsl emit --format fe-json`, "
    "json_version 1.0 or 2.0), or a frontend log written with CUDNN_FRONTEND_LOG_INFO=1 "
    "CUDNN_FRONTEND_LOG_FILE=F, or any text holding the JSON (a bug report); every graph it holds becomes one "
    "graph of the .cdg file. Every tensor keeps its "
    "dims, strides, dtype and UID, virtual tensors become named intermediates, pass-by-value tensors become "
    "scalars with their values. The .cdg file is checked and compared with the JSON before it is written, in "
    "canonical form (`fmt --check` clean). A node or setting the language cannot express is an error naming the "
    "node and its place in FILE (exit 1, nothing written). -o never replaces an existing file unless --force; "
    "the write is atomic. Round trip: `cudnn-dsl emit G.cdg --format fe-json > G.json && cudnn-dsl import G.json` "
    "gives the same cuDNN graph; the JSON does not carry the file's options, its nesting, buffers and views, "
    "in-place outputs, init=, or bias/scale (the frontend's ADD and MUL: they come back as + and *); a graph with "
    "symbolic or range dims is one JSON per shape; rank 1 and 2 tensors come back rank 3 (as cuDNN gets them)."
)
_MAX_BYTES = 256 << 20  # a frontend log of many graphs is large, but not this large


def register(p) -> None:
    p.epilog = EPILOG
    p.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        help="frontend graph JSON, a frontend log, or text holding the JSON ('-': standard input)",
    )
    p.add_argument(
        "--from-torch",
        metavar="FILE.py:NAME",
        help="instead of FILE: the function, nn.Module (instance, or class made with no arguments, put in eval "
        "mode) NAME of a Python file, traced by torch.export on --example inputs; the file is imported (its code "
        "runs, as pytest runs a test file)",
    )
    p.add_argument(
        "--example",
        action="append",
        metavar="TYPE",
        help="with --from-torch, one per argument in order: DTYPE[DIMS] [LAYOUT], as a .cdg input declares it "
        "('half[2, 64, 56, 56] nhwc'); drawn from a seeded normal distribution",
    )
    p.add_argument("-o", "--output", metavar="OUT.cdg", help="write the .cdg file here (default: print it)")
    p.add_argument("--force", action="store_true", help="with -o: replace OUT.cdg if it exists")
    p.add_argument(
        "--scalar",
        action="append",
        metavar="NAME=VALUE",
        help="the value of a pass-by-value tensor that FILE leaves out (the frontend does not record values bound "
        "at launch); NAME as in FILE or in the .cdg file",
    )
    p.add_argument("--name", default=None, help="the graph's name when FILE gives none (default: FILE's stem)")
    p.set_defaults(run=run)


def _scalars(items) -> dict[str, str]:
    from dsl.values import number

    out = {}
    for item in items or ():
        name, _, value = item.partition("=")
        try:
            number(value)
        except ValueError:
            raise common.UsageError(f"--scalar takes NAME=NUMBER, got '{item}'") from None
        if not name:
            raise common.UsageError(f"--scalar takes NAME=NUMBER, got '{item}'")
        out[name] = value.strip()
    return out


def _read(path: str) -> str:
    if path == "-":
        data = sys.stdin.buffer.read(_MAX_BYTES + 1) if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        return _text(data, "standard input")
    return _text(files.read_regular(path, _MAX_BYTES), path)  # a FIFO or a directory: refused, unread


def _text(data: bytes, what: str) -> str:
    if len(data) > _MAX_BYTES:
        raise common.UsageError(f"{what}: larger than {_MAX_BYTES >> 20} MiB")
    text = data.decode("utf-8", errors="replace")  # a log may hold stray bytes; JSON's own are checked
    return text.removeprefix("\ufeff")


def run(args) -> int:
    from cudnn_dsl.interop.fe_import import in_json, to_cdg, verify
    from dsl.diagnostics import DslError
    from dsl.pipeline import load

    if args.force and not args.output:
        raise common.UsageError("--force goes with -o")
    out = Path(args.output) if args.output else None
    if out is not None and out.exists() and not common.is_stream(out) and not args.force:
        raise common.UsageError(f"{out} exists; pass --force to replace it")
    if args.from_torch or args.example:
        return _from_torch(args, out)
    if args.file is None:
        raise common.UsageError("import takes FILE, or --from-torch FILE.py:NAME")
    text = _read(args.file)
    common.SOURCES[args.file] = text
    name = args.name or ("stdin" if args.file == "-" else Path(args.file).name.split(".")[0])
    scalars = _scalars(args.scalar)
    cdg, graphs = to_cdg(text, args.file, name=name, scalars=scalars)
    known = {n for g in graphs for t in g.tensors if t.by_value for n in (t.name, t.json.get("name"))}
    unknown = sorted(set(scalars) - known)
    if unknown:
        raise common.UsageError(f"--scalar {', '.join(unknown)}: {args.file} has no pass-by-value tensor of that name")
    result = load(text=cdg, file=str(out or "<imported>"))
    common.SOURCES[result.file] = cdg
    said = in_json(result.diagnostics, cdg, graphs)  # the checker's warnings too (an input not channels-last)
    if said:
        common.report(DslError(said))
    if not result.ok:
        common.warn(f"error: the graph imported from {args.file} does not check (above); nothing written")
        return common.EXIT_FAIL
    try:
        verify(result.program, graphs)
    except DslError as e:
        common.report(e)
        common.warn(f"error: the imported graph is not the one {args.file} describes (above); nothing written")
        return common.EXIT_FAIL
    if out is None:
        sys.stdout.write(cdg)
        return common.EXIT_OK
    common.write_file(out, cdg)
    print(f"{out}: {len(graphs)} graph{'s' if len(graphs) != 1 else ''} imported from {args.file}", file=sys.stderr)
    return common.EXIT_OK


def _from_torch(args, out: Path | None) -> int:
    """`--from-torch FILE.py:NAME --example TYPE ...`: a traced PyTorch function or module as a .cdg file."""
    from cudnn_dsl.interop.from_torch import example_tensor, from_torch, load_callable
    from dsl.diagnostics import DslError

    if not args.from_torch or args.file is not None or args.scalar:
        raise common.UsageError("--from-torch FILE.py:NAME takes --example inputs, and no FILE or --scalar")
    path = args.from_torch.rpartition(":")[0]
    if path.endswith(".py"):
        with files.open_regular(path, _MAX_BYTES, "--from-torch"):
            pass  # Python's import reads it, and would block on a FIFO
    try:
        fn = load_callable(args.from_torch)
        examples = [example_tensor(t, seed=i) for i, t in enumerate(args.example or ())]
    except ValueError as e:
        raise common.UsageError(str(e)) from None
    if hasattr(fn, "eval"):  # an imported graph is an inference graph (BatchNorm's running statistics)
        fn.eval()
    try:
        imported = from_torch(fn, examples, name=args.name)
    except DslError as e:
        for d in e.diagnostics:  # so that the message quotes the user's line
            if d.loc.file.endswith(".py") and d.loc.file not in common.SOURCES:
                with contextlib.suppress(files.Unreadable):
                    text = files.read_regular(d.loc.file, _MAX_BYTES).decode("utf-8", errors="replace")
                    common.SOURCES[d.loc.file] = text
        raise
    if out is None:
        sys.stdout.write(imported.text)
        return common.EXIT_OK
    common.write_file(out, imported.text)
    print(f"{out}: imported from {args.from_torch}", file=sys.stderr)
    return common.EXIT_OK
