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
    common.add_target_flags(
        p, "with --from-torch: the GPU whose cuDNN plans the imported graph, without a GPU (default: h200)"
    )
    p.add_argument(
        "--require-whole",
        action="store_true",
        help="with --from-torch: exit 1, writing nothing, unless cuDNN for --target takes the graph whole (one cuDNN "
        "graph, nothing left to torch)",
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
    if args.target or args.device_properties or args.require_whole:
        raise common.UsageError("--target, --device-properties and --require-whole go with --from-torch")
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
    """`--from-torch FILE.py:NAME --example TYPE ...`: a traced PyTorch function or module as a .cdg file, and how
    cuDNN for --target runs it (one graph, or the parts it splits into)."""
    from cudnn_dsl.interop.from_torch import from_torch
    from dsl.diagnostics import DslError

    if not args.from_torch or args.file is not None or args.scalar:
        raise common.UsageError("--from-torch FILE.py:NAME takes --example inputs, and no FILE or --scalar")
    target = common.target_from(args, default="h200")  # an unknown GPU is a usage error before any work
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
        _quote(e.diagnostics)
        raise
    if imported.notes:
        _quote(imported.notes)
        common.report(DslError(list(imported.notes)))
    split = _split(imported.program, target)
    if args.require_whole and split:
        why = "; ".join(split)
        common.warn(f"error: not one cuDNN graph for {target.name} (--require-whole): {why}; nothing written")
        return common.EXIT_FAIL
    if out is None:
        sys.stdout.write(imported.text)
        return common.EXIT_OK
    common.write_file(out, imported.text)
    print(f"{out}: imported from {args.from_torch}", file=sys.stderr)
    return common.EXIT_OK


def _quote(diagnostics) -> None:
    """Keeps the user's Python files whose lines the diagnostics quote, so that they show the line."""
    for d in diagnostics:
        if d.loc.file.endswith(".py") and d.loc.file not in common.SOURCES:
            with contextlib.suppress(files.Unreadable):
                text = files.read_regular(d.loc.file, _MAX_BYTES).decode("utf-8", errors="replace")
                common.SOURCES[d.loc.file] = text


def _split(program, target) -> list[str]:
    """Says on stderr how cuDNN for `target` runs each shape of each graph, planned without a GPU: one cuDNN graph,
    or the parts it splits into (and the ops it leaves to torch). Returns, for each shape not one cuDNN graph, why."""
    from cudnn_dsl.run.partition import declined_whole, plan_for_target
    from cudnn_dsl.target.library import BackendUnavailable
    from dsl.diagnostics import DslError

    split = []
    for g in program.graphs:
        for inst in g.instances:
            name = common.label(g, inst)
            try:
                low, partition = plan_for_target(g, inst, g.options, target)
            except (DslError, BackendUnavailable) as e:
                common.warn(f"graph {name}: not planned for {target.name}:")
                common.report(e)
                split.append(f"graph {name} is not planned")
                continue
            if partition is None:
                plans = f"{low.plan_count} candidate plans"
                print(f"graph {name}: one cuDNN graph for {target.name} ({plans})", file=sys.stderr)
                continue
            how = f"{partition.how} for {target.name}, {partition.counts.text}"
            split.append(f"graph {name} {partition.how}")
            lines = "".join(f"  {line}\n" for line in partition.lines(g))
            print(f"graph {name}: {how} — {declined_whole(partition.declined)}:\n{lines}", end="", file=sys.stderr)
    return split


def load_callable(spec: str):
    """`path/to/module.py:NAME` -> the object NAME of that file, imported as Python imports it: the user's own
    code runs, as pytest runs a test file. A class is instantiated with no arguments."""
    import importlib.util
    import os

    path, sep, attr = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not attr.isidentifier():
        raise ValueError(f"--from-torch takes FILE.py:NAME, got '{spec}'")
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    module_name = os.path.splitext(os.path.basename(path))[0]
    loader = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # the file's own imports of its neighbours
    try:
        loader.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    obj = getattr(module, attr, None)
    if obj is None:
        raise ValueError(f"{path} has no '{attr}'")
    if not isinstance(obj, type):
        return obj
    try:
        return obj()
    except TypeError as e:  # a class whose constructor wants arguments
        raise ValueError(
            f"{path}: '{attr}' is not made with no arguments ({e}): name an instance or a function"
        ) from None


def example_tensor(text: str, seed: int = 0):
    """`float[2, 4, 8, 8] nhwc` (a .cdg tensor type and an optional layout name) -> a tensor of that dtype,
    shape and memory order, drawn from a seeded normal distribution (integers: 0 to 9; bool: coin flips)."""
    import re

    import torch

    from cudnn_dsl.target.dtypes import torch_dtype
    from dsl.diagnostics import RuleError
    from dsl.types import LAYOUTS, canonical_dtype, dense_strides, layout_order

    m = re.fullmatch(r"\s*(\w+)\s*\[([\d,\s]+)\]\s*(\w+)?\s*", text)
    dtype = canonical_dtype(m.group(1)) if m else None
    layout = (m.group(3) or "row_major") if m else None
    if dtype is None or layout not in LAYOUTS:
        raise ValueError(f"--example takes DTYPE[DIMS] [LAYOUT] (as a .cdg input declares it), got '{text}'")
    shape = tuple(int(d) for d in m.group(2).split(",") if d.strip())
    try:
        strides = dense_strides(shape, layout_order(layout, len(shape)))
    except RuleError as e:
        raise ValueError(f"--example '{text}': {e}") from None
    g = torch.Generator().manual_seed(seed)
    t = torch.empty_strided(shape, strides, dtype=torch_dtype(dtype))
    if t.is_floating_point():
        return t.copy_(torch.randn(shape, generator=g))
    return t.copy_(torch.randint(0, 2 if dtype == "bool" else 10, shape, generator=g))
