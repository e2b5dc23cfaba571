"""What the commands share — loading files, choosing graphs and shapes, options and
targets from flags, JSON reports, and the one function that turns an exception into
a message and an exit code.

Nothing here imports torch, cuDNN or even the language at module level: `check`, `fmt` and `--help`
must start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import stat
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the language is imported when a command needs it: `--help` stays quick
    from dsl.ir import Graph, Instance, Program
    from dsl.options import Options
    from dsl.pipeline import Result

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_BUG, EXIT_INTERRUPTED = 0, 1, 2, 70, 130

SOURCES: dict[str, str] = {}
"""file -> text of every file loaded in this process, so that any later error can quote its line"""


class UsageError(Exception):
    """The command line asks for something that cannot be (exit 2)."""


def warn(message: str) -> None:
    print(f"cudnn-dsl: {message}", file=sys.stderr)


# ---- exceptions -> messages and exit codes (main() and per-item loops share this) ----------

_interrupted = threading.Event()


def remember_interrupts() -> None:
    """Ctrl-C raises KeyboardInterrupt as Python's own handler does, and is remembered: one that lands inside an
    extension module's import (numpy's, under torch's) surfaces as an ImportError instead, which is still the
    user's interrupt, not a bug."""
    if threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, _on_interrupt)


def _on_interrupt(signum, frame) -> None:
    _interrupted.set()
    raise KeyboardInterrupt


def report(e: BaseException) -> int:
    """Prints what went wrong, in the user's terms; returns the exit code it deserves."""
    from cudnn_dsl.store.files import StoreProblem
    from cudnn_dsl.target.library import BackendUnavailable, DescriptorFileError, UnknownTarget
    from dsl.diagnostics import Diagnostic, DslError
    from dsl.files import Unreadable
    from dsl.ir import NotFound

    if isinstance(e, DslError):
        print(e.render(SOURCES), file=sys.stderr)
        return EXIT_FAIL
    if isinstance(e, (UsageError, NotFound, Unreadable, UnknownTarget, DescriptorFileError)):
        warn(f"error: {e}")
        return EXIT_USAGE
    if isinstance(e, (BackendUnavailable, StoreProblem)):
        warn(f"error: {e}")
        return EXIT_FAIL
    if _is_binding_error(e):
        if getattr(e, "loc", None) is not None:
            print(Diagnostic("error", str(e), e.loc).render(SOURCES), file=sys.stderr)
        else:
            warn(f"error: {e}")
        return EXIT_FAIL
    if isinstance(e, OSError):  # a report or output that cannot be written, a full disk: the machine's, not ours
        warn(f"error: {e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}")
        return EXIT_FAIL
    if isinstance(e, KeyboardInterrupt) or _interrupted.is_set():
        warn("interrupted")
        return EXIT_INTERRUPTED
    traceback.print_exception(e)
    warn(
        f"internal error: {type(e).__name__}: {e}\nThis is a bug in cudnn-dsl; please report it with the "
        f"command line and the traceback above."
    )
    return EXIT_BUG


def _is_binding_error(e: BaseException) -> bool:
    mod = sys.modules.get("cudnn_dsl.run.buffers")  # never imported just to answer no
    return mod is not None and isinstance(e, mod.BindingError)


# ---- files, graphs, shapes -----------------------------------------------------------------


def load_each(path: str, stop: str = "ir") -> Result | None:
    """load_file for commands that take several files: an unreadable one is reported (a usage error) and
    None returned, so that the others are still checked."""
    from dsl.files import Unreadable

    try:
        return load_file(path, stop)
    except Unreadable as e:
        report(e)
        return None


def clean_files(paths, diagnostics: list | None = None) -> tuple[list[tuple[str, Result]], int]:
    """Every file loaded and checked (its diagnostics printed, and added to `diagnostics`) before any work: the
    ones that checked clean, and the exit status the others earn (2 for a file that cannot be read, 1 for errors)."""
    clean, status = [], EXIT_OK
    for path in paths:
        result = load_each(path)
        if result is not None and diagnostics is not None:
            diagnostics += result.diagnostics
        if result is None or not result.ok:
            status = max(status, EXIT_USAGE if result is None else EXIT_FAIL)
        else:
            clean.append((path, result))
    return clean, status


def load_file(path: str, stop: str = "ir") -> Result:
    """Parses (and checks) one file, printing its diagnostics to stderr; Unreadable when
    there is no file to read."""
    from dsl.pipeline import load

    result = load(path, stop=stop)
    SOURCES[result.file] = result.text
    if result.diagnostics:
        print(result.render(), file=sys.stderr)
    return result


def select_graphs(program: Program, name: str | None) -> list[Graph]:
    """The graph --graph names, or every graph of the file."""
    from dsl.ir import NotFound

    try:
        return [program.graph(name)] if name else list(program.graphs)
    except NotFound as e:
        raise UsageError(str(e)) from None


def _parse_shapes(items) -> dict[str, set[int]]:
    """--shape N=8 --shape N=16 --shape M=4 (or N=8,16) -> {"N": {8, 16}, "M": {4}}"""
    from dsl.values import natural

    out: dict[str, set[int]] = {}
    for item in items or ():
        name, _, values = item.partition("=")
        try:
            sizes = {natural(p) for p in values.split(",")}
        except ValueError as e:
            raise UsageError(f"--shape takes NAME=VALUE[,VALUE...], got '{item}': {e}") from None
        if not name:
            raise UsageError(f"--shape takes NAME=VALUE[,VALUE...], got '{item}'")
        out.setdefault(name, set()).update(sizes)
    return out


def select_instances(graph: Graph, items) -> list[Instance]:
    """The graph's shapes that --shape selects (every declared one when it selects none)."""
    wanted = _parse_shapes(items)
    bad = set(wanted) - {s.name for s in graph.symbols}
    if bad:
        dims = ", ".join(s.name for s in graph.symbols) or "none"
        raise UsageError(f"graph '{graph.name}' has no symbolic dim {', '.join(sorted(bad))} (its dims: {dims})")
    if graph.typer is not None:  # a range takes values that were not typed when checking
        import itertools

        from dsl.ir import NotFound

        names = [k for k, _ in graph.instances[0].binding]
        per = [sorted(wanted.get(n) or {dict(i.binding)[n] for i in graph.instances}) for n in names]
        try:
            return [graph.instance(dict(zip(names, combo))) for combo in itertools.product(*per)]
        except NotFound as e:
            raise UsageError(f"--shape: {e}") from None
    chosen = [i for i in graph.instances if all(dict(i.binding)[k] in v for k, v in wanted.items())]
    if not chosen:
        raise UsageError(f"--shape selects none of graph '{graph.name}'s shapes ({graph.declared_shapes})")
    return chosen


def plan_record(graph: Graph, inst: Instance, target, low) -> dict:
    """One deviceless planning, as `check --json` and `run --json` both report it."""
    from cudnn_dsl.build.steps import first_plan_name

    return {
        "graph": graph.name,
        "binding": dict(inst.binding),
        "target": target.name,
        "plans": low.plan_count,
        "first_plan": first_plan_name(low),
        "build_s": low.timings,
        "skipped": dict(low.skipped),
    }


def parts_record(graph: Graph, partition) -> dict:
    """The parts of a shape run in parts, as `check`, `support` and `run --json` report them: a line per part,
    and what they launch (run.partition.Counts)."""
    import attrs

    return {"parts": partition.lines(graph), "counts": attrs.asdict(partition.counts)}


def split_note(graph: Graph, inst: Instance, target, partition):
    """A shape cuDNN declines whole for the target, as a note at the graph (the SARIF result `check` and `support`
    give a split)."""
    from dsl.diagnostics import Diagnostic

    return Diagnostic(
        "note",
        f"cuDNN for {target.name} declines graph {label(graph, inst)} whole ({partition.declined}); it runs as "
        f"{partition.counts.text}",
        graph.loc,
    )


def label(graph: Graph, inst: Instance) -> str:
    """'g' or 'g [N=8]': how reports name one shape of a graph."""
    return graph.name + (f" [{inst.label}]" if inst.binding else "")


def derive(graph: Graph, inst: Instance, wrt: tuple[str, ...] | None = None):
    """The derived forward and backward of one shape (dsl.autodiff.derive; by default the gradients of
    every float input), named as `check --emit backward` and `emit --derived` name them: `<graph>_backward`,
    `<graph>_backward_N4` for the shape N=4 of a graph with several."""
    from cudnn_dsl.target.quirks import backward_avoid
    from dsl.autodiff import derive

    # printed text asks no library (check stays free of cuDNN): every row of the quirks table is in force
    suffix = "_" + "_".join(f"{k}{v}" for k, v in inst.binding) if inst.binding else ""
    return derive(graph, inst, wrt, suffix, avoid=backward_avoid(None))


# ---- flags ------------------------------------------------------------------------------------

OPTION_FLAGS = ("heuristics", "build_policy", "workspace_limit", "seed", "warmup", "iterations")
"""options that have a flag of the same name (--build-policy for build_policy)"""


def add_build_flags(p, files: str = "the file") -> None:
    """What `run` and `tune` share: which graphs and shapes, the build options, the device."""
    p.add_argument("--graph", help=f"only this graph of {files}")
    p.add_argument(
        "--shape",
        action="append",
        metavar="DIM=VALUE",
        help="only these values of a symbolic dim: N=8,16 or repeated; default: every declared value",
    )
    add_option_flags(p, *OPTION_FLAGS)
    add_constraint_flags(p)
    p.add_argument("--device", type=count, help="CUDA device index (default: the current one, 0)")


def add_plan_flag(p) -> None:
    p.add_argument(
        "--plan",
        metavar="NAME",
        help="build exactly this plan: its name as cuDNN prints it (eng4_k24=43_k17=1, or a python engine's), or "
        "ENGINE[:KNOB=V,...] (4:KERNEL_CFG=43); not stored in the plan store",
    )


def add_constraint_flags(p) -> None:
    """The plan constraints, as flags (the options exclude_engines, deterministic, no_runtime_compilation)."""
    p.add_argument(
        "--exclude-engine",
        action="append",
        metavar="N",
        help="never use a plan of cuDNN engine N (the N of engN_...); repeat or give N,M (replaces the file's "
        "'option exclude_engines')",
    )
    p.add_argument("--deterministic", action="store_true", help="only plans cuDNN does not mark NONDETERMINISTIC")
    p.add_argument(
        "--no-runtime-compilation",
        action="store_true",
        help="only plans cuDNN does not mark RUNTIME_COMPILATION (no kernel compiled while building)",
    )


def add_option_flags(p, *names: str) -> None:
    from dsl.options import OPTIONS

    for name in names:
        a = OPTIONS[name]
        metavar = {"int": "N", "enums": ",".join(a.choices), "enum": "|".join(a.choices)}.get(a.kind)
        p.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            metavar=metavar,
            help=f"{a.doc} (overrides the file's 'option {name}')",
        )


def options_from(args, base: Options) -> Options:
    """The file's options with the command line's on top, converted as the file's are."""
    from dsl.diagnostics import RuleError

    given = {n: getattr(args, n) for n in OPTION_FLAGS if getattr(args, n, None) is not None}
    for flag in ("cuda_graph", "deterministic", "no_runtime_compilation"):
        if getattr(args, flag, False):
            given[flag] = "true"
    if getattr(args, "exclude_engine", None):
        given["exclude_engines"] = ",".join(args.exclude_engine)
    try:
        return base.with_values(given, source="text")
    except RuleError as e:
        flag = "exclude-engine" if e.at == "exclude_engines" else str(e.at).replace("_", "-")
        raise UsageError(f"--{flag}: {e}") from None


def plan_spec(args):
    """--plan NAME as a build.PlanSpec (None without it); a usage error when it names no plan."""
    if not getattr(args, "plan", None):
        return None
    from cudnn_dsl.build.constraints import PlanSpec

    try:
        return PlanSpec.parse(args.plan)
    except ValueError as e:
        raise UsageError(f"--plan: {e}") from None


def add_log_flags(p) -> None:
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log the cuDNN Frontend's and the cuDNN library's calls to stderr (what a cuDNN bug report asks for)",
    )
    p.add_argument(
        "--log-file", metavar="FILE", help="write the frontend's log to FILE and the library's to FILE.backend instead"
    )


def start_logging(args) -> None:
    """Points cuDNN's own logging where the flags say; before cuDNN is loaded, which reads it once."""
    import os

    if args.log_file:
        check_writable(args.log_file, "--log-file")
        # Two files: the frontend and the library each open their log themselves, and in one file they
        # overwrite each other's lines.
        frontend, library = args.log_file, args.log_file + ".backend"
    elif args.verbose:
        frontend = library = "stderr"
    else:
        return
    os.environ.update(
        CUDNN_FRONTEND_LOG_INFO="1", CUDNN_FRONTEND_LOG_FILE=frontend, CUDNN_LOGLEVEL_DBG="3", CUDNN_LOGDEST_DBG=library
    )
    if "cudnn" in sys.modules:  # a second command in one process (tests): cuDNN read its settings already
        warn("note: cuDNN was loaded before these logging flags; its logs may not follow them")
    where = "stderr" if frontend == "stderr" else f"{frontend} (frontend) and {library} (library)"
    warn(f"note: cuDNN logs go to {where}")


def add_target_flags(p, what: str) -> None:
    p.add_argument("--target", metavar="GPU", help=f"{what} (a name from cudnn_dsl/target/devices/, e.g. h200)")
    p.add_argument(
        "--device-properties",
        metavar="JSON",
        help="like --target, from a descriptor that `cudnn-dsl device-info` printed on that GPU",
    )


def target_from(args, default: str | None = None):
    """The device --target or --device-properties names (default: `default`), checked before any
    work; None when neither is given and there is no default."""
    if args.target is not None and not args.target.strip():
        raise UsageError(f"--target {args.target!r} names no GPU")
    if args.target and args.device_properties:
        raise UsageError("give --target or --device-properties, not both")
    name = args.target or default
    if not (args.device_properties or name):
        return None
    from cudnn_dsl.target.library import Target

    return Target.from_file(args.device_properties) if args.device_properties else Target.named(name)


def count(text: str) -> int:
    """An argparse type: a whole number in the language's digits (int() would take '٣', ' 3' and '1_0')."""
    from dsl.values import natural

    try:
        return natural(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def real(text: str) -> float:
    """An argparse type: a number as the language spells it (float() would take '٣', 'inf' and '1_0')."""
    from dsl.values import number

    try:
        return float(number(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def views_drawn_with_buffers(graphs) -> dict[str, str]:
    """What --init says of a view: it is drawn with its buffer, which the flag names."""
    return {
        v.name: f"'{v.name}' is a view, drawn with its buffer: name buffer '{v.view[0]}'"
        for g in graphs
        for v in g.of_kind("input")
        if v.view
    }


def named_values(
    items,
    flag: str,
    valid: list[str],
    convert: Callable[[str], Any],
    *,
    unnamed_ok: bool = False,
    instead: dict[str, str] | None = None,
) -> dict[str, Any]:
    """--flag NAME=VALUE (repeated) -> {NAME: convert(VALUE)}; with unnamed_ok, a bare VALUE is
    every name's. A name that is not valid is a usage error naming the valid ones, or saying what to name
    `instead` (a view: its buffer)."""
    out: dict[str, Any] = {}
    for item in items or ():
        name, sep, text = item.partition("=")
        if not sep:
            if not unnamed_ok:
                raise UsageError(f"{flag} takes NAME=VALUE, got '{item}'")
            name, text = "", item
        if name and name not in valid and name in (instead or {}):
            raise UsageError(f"{flag} {item}: {instead[name]}")
        if name and name not in valid:
            raise UsageError(f"{flag} {item}: no '{name}' here; the names are {', '.join(valid) or 'none'}")
        try:
            value = convert(text)
        except ValueError as e:
            raise UsageError(f"{flag} {item}: {e}") from None
        out.update({n: value for n in valid} if not name else {name: value})
    return out


def option_value(name: str) -> Callable[[str], Any]:
    """A converter of command-line text by the option's own rule (--atol x=TOL is the atol option's
    value for one output)."""

    from dsl.diagnostics import RuleError
    from dsl.options import option
    from dsl.values import convert, from_text

    row = option(name)

    def to_value(text: str):
        try:
            return convert(row, from_text(row, text))
        except RuleError as e:
            raise ValueError(str(e)) from None

    return to_value


def init_value(text: str):
    """--init NAME=DIST: a distribution, parsed (no eval) and checked as the file's init= is."""
    from dsl.diagnostics import RuleError
    from dsl.inits import parse

    try:
        return parse(text)
    except RuleError as e:
        raise ValueError(str(e)) from None


# ---- output ---------------------------------------------------------------------------------


def check_writable(path: str | None, flag: str) -> None:
    """A report path that cannot be written is a usage error before any work."""
    if path is None or path == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory")
    if is_stream(p):
        return
    if any(parent.exists() and not parent.is_dir() for parent in p.parents):
        raise UsageError(f"{flag} {path}: {next(q for q in p.parents if q.exists())} is not a directory")


_json_out: list = []
"""the stdout that `--json -` writes to, while the human report goes to stderr"""


@contextlib.contextmanager
def json_on_stdout():
    _json_out.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _json_out.pop()


SCHEMA_VERSION = 1
"""the layout of every --json report (docs/cli.md, JSON reports): raised when a field changes meaning or goes away"""


def write_json(path: str | None, data: dict, env: dict | None = None) -> None:
    """A --json report to a file (atomically) or to stdout ('-'): `schema_version`, the `environment` block (`env`,
    by default target.machine.environment()), then `data`."""
    if path is None:
        return
    from cudnn_dsl.target.machine import environment

    report = {"schema_version": SCHEMA_VERSION, "environment": env if env is not None else environment(), **data}
    write_text(path, json.dumps(report, indent=1, default=str))


def write_text(path: str, text: str) -> None:
    """A machine-read report to a file (atomically) or to stdout ('-', which then holds it alone)."""
    if path == "-":
        print(text, file=_json_out[-1] if _json_out else sys.stdout)
        return
    write_file(Path(path), text + "\n")


def is_stream(path: Path) -> bool:
    """Whether path, its links followed, names something there that is neither a regular file nor a directory: a
    device, FIFO or socket, /dev/stdout or /proc/self/fd/N."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def write_file(path: Path, text: str) -> None:
    """An output file written atomically; a stream (is_stream) is written into where it is, since replacing it
    with a regular file would take the device, FIFO or pipe away from whoever reads it."""
    if not is_stream(path):
        from cudnn_dsl.store.files import atomic_write

        atomic_write(path, text)
        return
    sys.stdout.flush()  # what is already printed comes first where the path is stdout
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def machine_stdout(args) -> bool:
    """Whether stdout holds a machine-read report alone (`--json -`, SARIF without --output): the human report
    then goes to stderr."""
    return getattr(args, "json", None) == "-" or (getattr(args, "format", None) == "sarif" and not args.output)


def check_reports(args) -> None:
    """--json FILE and --plot FILE.png of a measuring command: writable, and matplotlib there for a plot,
    before any time is spent measuring."""
    check_writable(args.json, "--json")
    check_writable(args.plot, "--plot")
    if args.plot is not None:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise UsageError("--plot needs matplotlib: pip install matplotlib")


def add_require_gpu_flag(p, otherwise: str) -> None:
    p.add_argument(
        "--require-gpu",
        action="store_true",
        help="where no GPU is usable, fail at once (exit 1), saying why: a torch without CUDA, no device, the "
        f"driver's error; {otherwise}",
    )


def require_gpu(what: str, json_path: str | None = None) -> None:
    """A BackendUnavailable (exit 1) that says why, where no CUDA GPU is usable; the --json report at `json_path`
    says it too (a CI job reading the report finds why it holds no figures)."""
    from cudnn_dsl.target.library import BackendUnavailable
    from cudnn_dsl.target.machine import gpu_problem

    why = gpu_problem()
    if why:
        message = f"{what}, and no CUDA GPU is usable here: {why}"
        write_json(json_path, {"error": message})
        raise BackendUnavailable(f"{message}; `cudnn-dsl check --target h200 FILE` plans without one")
