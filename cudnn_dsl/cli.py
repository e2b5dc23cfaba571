"""CLI layer: `cudnn-dsl check | fmt | run | emit | device-info | tune | cache | bench`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cudnn_dsl.store import atomic_write
from dsl.diagnostics import DslError, Sink

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def _read(path: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        return p.read_text()
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file") from None


def load_programs(paths, out=sys.stderr):
    """Parses and checks each file; prints diagnostics; returns [(path, program or None)]."""
    from dsl.check import check
    from dsl.parser import parse

    results = []
    for path in paths:
        text = _read(path)
        sink = Sink()
        program = None
        try:
            program = check(parse(text, path), sink)
        except DslError as e:
            if not sink.items:  # a syntax error raises before the checker runs
                sink.items.extend(e.diagnostics)
        for d in sink.items:
            print(d.render({path: text}), file=out)
        results.append((path, program))
    return results


def selected_graphs(program, args) -> list:
    """The graph --graph names, or every graph of the file."""
    return [program.graph(args.graph)] if getattr(args, "graph", None) else list(program.graphs)


def load_graphs(args) -> tuple[list, int]:
    """(path, graph) for each graph selected from args.files, and EXIT_FAIL if a file had errors."""
    graphs, status = [], EXIT_OK
    for path, program in load_programs(args.files):
        if program is None:
            status = EXIT_FAIL
            continue
        graphs += [(path, g) for g in selected_graphs(program, args)]
    return graphs, status


class Progress:
    """One self-erasing status line on a terminal; silent when stderr is not one."""

    def __init__(self, label: str):
        self.label = label
        self.tty = sys.stderr.isatty()

    def __call__(self, step: str) -> None:
        if self.tty:
            print(f"\r\033[K  {self.label}: {step} ...", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


# ---- check / fmt ----------------------------------------------------------------------


def cmd_check(args) -> int:
    from dsl.parser import parse
    from dsl.printer import dump_ast, dump_ir, summary, to_json

    status = EXIT_OK
    reports = []
    for path, program in load_programs(args.files):
        if program is None:
            status = EXIT_FAIL
            continue
        if args.emit == "ast":
            print(dump_ast(parse(_read(path), path).graphs))
        elif args.emit == "ir":
            print(dump_ir(program))
        elif args.json:
            reports.append(to_json(program))
        else:
            print(summary(program))
        if args.target or args.device_properties:
            status = max(status, _plan_deviceless(program, args, reports if args.json else None))
    if args.json:
        print(json.dumps(reports if len(reports) != 1 else reports[0], indent=2, default=str))
    return status


def _target(args):
    from cudnn_dsl.backend import Target

    if args.device_properties:
        return Target.from_file(args.device_properties)
    return Target.named(args.target or "h200")


def plan_without_device(graph, inst, options, target, label: str):
    """Lowers one shape and asks the real cuDNN library for the target's plans, with no GPU."""
    from cudnn_dsl.lower import lower, plan

    progress = Progress(label)
    try:
        return plan(lower(graph, inst, target=target), options.modes(), options.build_policy,
                    options.workspace_limit, target.name, progress, deviceless=True)
    finally:
        progress.done()


def _plan_deviceless(program, args, reports) -> int:
    """Lowers every instance and asks the real cuDNN library for plans for the target."""
    from cudnn_dsl.lower import first_plan_name, timings_text

    target = _target(args)
    status = EXIT_OK
    for g in program.graphs:
        for inst in g.instances:
            label = g.name + (f" [{inst.label}]" if inst.binding else "")
            try:
                low = plan_without_device(g, inst, g.options, target, label)
            except DslError as e:
                print(e.render({program.file: _read(program.file)}), file=sys.stderr)
                status = EXIT_FAIL
                continue
            first = first_plan_name(low)
            steps = timings_text(low.timings)
            skipped = "".join(f"\n    {k} skipped: {why}" for k, why in low.skipped.items())
            line = (f"  cuDNN plans for {target.name} (sm_{target.sm_version}), graph {label}: {low.plan_count} "
                    f"candidates, first {first}\n    {steps}{skipped}")
            if reports is not None:
                reports.append({"graph": g.name, "binding": dict(inst.binding), "target": target.name,
                                "plans": low.plan_count, "first_plan": first, "timings_s": low.timings,
                                "skipped": low.skipped})
            else:
                print(line)
    return status


def cmd_fmt(args) -> int:
    from dsl.parser import parse
    from dsl.printer import fmt_module

    status = EXIT_OK
    for path in args.files:
        text = _read(path)
        try:
            module = parse(text, path)
        except DslError as e:
            print(e.render({path: text}), file=sys.stderr)
            status = EXIT_FAIL
            continue
        new = fmt_module(module)
        if new == text:
            continue
        if args.check:
            print(f"{path}: would reformat", file=sys.stderr)
            status = EXIT_FAIL
        elif args.stdout:
            sys.stdout.write(new)
        else:
            atomic_write(Path(path), new)
            print(f"{path}: reformatted", file=sys.stderr)
    return status


# ---- run / emit / device-info ------------------------------------------------------------


def cmd_run(args) -> int:
    from cudnn_dsl.run import run_file

    return run_file(args)


def cmd_emit(args) -> int:
    from cudnn_dsl.emit import emit_cudnn, emit_torch

    [(path, program)] = load_programs([args.file])
    if program is None:
        return EXIT_FAIL
    g = program.graph(args.graph)
    chosen = select_instances(g, args.shape)
    if len(chosen) > 1:
        raise UsageError(f"graph '{g.name}' has {len(chosen)} shapes; choose one with --shape")
    inst = chosen[0]
    print(emit_cudnn(g, inst) if args.target == "cudnn" else emit_torch(g, inst), end="")
    return EXIT_OK


def cmd_bench(args) -> int:
    from cudnn_dsl.bench import cmd_bench as bench

    return bench(args)


def cmd_device_info(args) -> int:
    from cudnn_dsl.backend import local_device_info

    print(local_device_info())
    return EXIT_OK


def cmd_tune(args) -> int:
    from cudnn_dsl import backend
    from cudnn_dsl.run import build_options
    from cudnn_dsl.runtime import CompiledGraph
    from cudnn_dsl.tune import plot, report, tune

    if not backend.gpu_available():
        print("cudnn-dsl: error: tune times plans on a GPU, and no CUDA GPU is visible here; "
              "`cudnn-dsl check --target h200 FILE` plans without one", file=sys.stderr)
        return EXIT_FAIL
    results = []
    graphs, status = load_graphs(args)
    for path, g in graphs:
        cg = CompiledGraph(g, build_options(g.options, args), args.device, use_store=not args.no_cache)
        for inst in select_instances(g, args.shape):
            try:
                r = tune(cg, inst, args.max_workspace)
            except DslError as e:
                print(e.render({path: _read(path)}), file=sys.stderr)
                status = EXIT_FAIL
                continue
            results.append(r)
            print(report(r))
            if r.winner is None:
                status = EXIT_FAIL
            elif not args.no_cache:
                print(f"  stored in {cg.store.root}")
    if args.plot and results:
        plot(results, args.plot)
    if args.json:
        import attrs

        atomic_write(Path(args.json), json.dumps([attrs.asdict(r) for r in results], indent=1, default=str))
    return status


def cmd_cache(args) -> int:
    from cudnn_dsl import store

    s = store.PlanStore()
    if args.action == "path":
        print(s.root)
    elif args.action == "ls":
        rows = s.listing()
        for row in rows:
            print(row.line())
        if not rows:
            print(f"plan store {store.clean(str(s.root))}: empty")
    elif args.action == "show":
        if not args.arg or not store.is_entry_id(args.arg):
            raise UsageError("cache show takes an entry id, 32 lowercase hex digits (see `cudnn-dsl cache ls`)")
        shown = s.show(args.arg)
        if shown is None:
            raise UsageError(f"no entry {args.arg} in {s.root}")
        print(json.dumps(shown, indent=2))
    elif args.action == "clear":
        r = s.clear()
        print(f"removed {r.entries} entries, {r.temp_files} temporary files and {r.kernel_caches} kernel caches "
              f"from {s.root.parent}")
        if r.left:
            print(f"left alone (not regular files): {', '.join(r.left)}", file=sys.stderr)
    elif args.action == "export":
        if not args.arg:
            raise UsageError("cache export takes a bundle file to write")
        r = s.export(Path(args.arg))
        for why in r.skipped:
            print(f"skipped {why}", file=sys.stderr)
        print(f"exported {r.entries} entries and {r.kernel_caches} kernel caches to {args.arg}")
    elif args.action == "import":
        if not args.arg or not Path(args.arg).exists():
            raise UsageError("cache import takes an existing bundle file")
        r = s.import_(Path(args.arg), force=getattr(args, "force", False))
        print(f"imported {r.imported} entries and {r.kernel_caches} kernel caches into {s.root}")
        if r.kept:
            print(f"kept {r.kept} entries tuned here (--force replaces them)")
        if r.skipped:
            print(f"{r.skipped} entries were already here")
    return EXIT_OK


def _parse_shapes(items) -> dict[str, set[int]]:
    """--shape N=8 --shape N=16 --shape M=4 (or N=8,16) -> {"N": {8, 16}, "M": {4}}"""
    out: dict[str, set[int]] = {}
    for item in items or ():
        name, _, values = item.partition("=")
        parts = values.split(",")
        if not name or not all(p.strip().isdigit() for p in parts):
            raise UsageError(f"--shape takes NAME=VALUE[,VALUE...], got '{item}'")
        out.setdefault(name, set()).update(int(p) for p in parts)
    return out


def select_instances(graph, items) -> list:
    """The graph's shapes that --shape selects (every declared one when it selects none)."""
    wanted = _parse_shapes(items)
    bad = set(wanted) - {s.name for s in graph.symbols}
    if bad:
        raise UsageError(f"graph '{graph.name}' has no symbolic dim {', '.join(sorted(bad))}")
    chosen = [i for i in graph.instances if all(dict(i.binding)[k] in v for k, v in wanted.items())]
    if not chosen:
        declared = "; ".join(f"{s.name} in {{{', '.join(map(str, s.values))}}}" for s in graph.symbols)
        raise UsageError(f"--shape selects none of graph '{graph.name}'s shapes ({declared})")
    return chosen


# ---- the parser ----------------------------------------------------------------------------


def _add_build_options(p) -> None:
    p.add_argument("--graph", help="only this graph of the file")
    p.add_argument("--shape", action="append", metavar="DIM=VALUE",
                   help="only these values of a symbolic dim: N=8,16 or repeated; default: every declared value")
    p.add_argument("--heuristics", help="heuristic modes, e.g. A,B,FALLBACK (overrides the file)")
    p.add_argument("--build-policy", choices=("heuristics_choice", "all"), help="overrides the file")
    p.add_argument("--workspace-limit", type=int, metavar="BYTES", help="skip plans needing more workspace")
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    p.add_argument("--target", help="plan for this device when there is no GPU (default h200)")
    p.add_argument("--device-properties", metavar="JSON", help="plan for the device this descriptor describes")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cudnn-dsl",
        description="Write fused cuDNN graphs as small .cdg files; check, compile, run, verify, tune and bench them.",
        epilog="Exit status: 0 clean, 1 errors or mismatches, 2 usage errors. Docs: docs/language.md",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("check", help="parse and check .cdg files; print every inferred shape, or the errors")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.add_argument("--emit", choices=("ast", "ir"), help="dump a stage instead of the summary")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--target", help="also ask cuDNN for plans for this device, without a GPU (e.g. h200)")
    c.add_argument("--device-properties", metavar="JSON", help="like --target, from a descriptor file")
    c.set_defaults(fn=cmd_check)

    f = sub.add_parser("fmt", help="rewrite .cdg files in canonical form (comments kept)")
    f.add_argument("files", nargs="+", metavar="FILE")
    f.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is not canonical")
    f.add_argument("--stdout", action="store_true", help="print instead of rewriting")
    f.set_defaults(fn=cmd_fmt)

    r = sub.add_parser("run", help="compile with cuDNN, run on generated or given inputs, compare with PyTorch")
    r.add_argument("file", metavar="FILE")
    _add_build_options(r)
    r.add_argument("--input", action="append", metavar="NAME=FILE", help="load an input from .pt/.npy/.safetensors")
    r.add_argument("--seed", type=int, help="seed of the generated inputs (overrides the file)")
    r.add_argument("--range", action="append", metavar="NAME=LO:HI",
                   help="value range of a generated input (default [-1, 1]; [0.5, 1.5] where an op wants positives)")
    r.add_argument("--atol", action="append", metavar="[NAME=]TOL", help="absolute tolerance, for all or one output")
    r.add_argument("--rtol", action="append", metavar="[NAME=]TOL", help="relative tolerance, for all or one output")
    r.add_argument("--iterations", type=int, help="timed executions (default: the file's, 15)")
    r.add_argument("--save-outputs", metavar="DIR", help="write each output to DIR/GRAPH.NAME.pt")
    r.add_argument("--json", metavar="FILE", help="write the report as JSON")
    r.add_argument("--cuda-graph", action="store_true", help="capture the execution in a CUDA graph and time replays")
    r.add_argument("--no-cache", action="store_true", help="neither read nor write the plan store")
    r.add_argument("--rebuild", action="store_true", help="ignore stored plans; build and store anew")
    r.set_defaults(fn=cmd_run)

    e = sub.add_parser("emit", help="print a standalone script: the cuDNN Frontend calls, or the torch reference")
    e.add_argument("file", metavar="FILE")
    e.add_argument("--target", choices=("cudnn", "torch"), default="cudnn")
    e.add_argument("--graph", help="the graph to emit (needed when the file has several)")
    e.add_argument("--shape", action="append", metavar="DIM=VALUE", help="the value of a symbolic dim")
    e.set_defaults(fn=cmd_emit)

    d = sub.add_parser("device-info", help="print the cuDNN descriptor of the local GPU (for --device-properties)")
    d.set_defaults(fn=cmd_device_info)

    t = sub.add_parser("tune", help="build and time every candidate plan on the GPU; keep the fastest in the plan store")
    t.add_argument("files", nargs="+", metavar="FILE")
    _add_build_options(t)
    t.add_argument("--warmup", type=int, help="untimed runs per plan (default: the file's, 3)")
    t.add_argument("--iterations", type=int, help="timed runs per plan (default: the file's, 15)")
    t.add_argument("--max-workspace", type=int, metavar="BYTES", help="skip plans needing more workspace")
    t.add_argument("--plot", metavar="FILE.png", help="draw the time of every plan")
    t.add_argument("--json", metavar="FILE", help="write every plan's timings as JSON")
    t.add_argument("--no-cache", action="store_true", help="do not save the winner in the plan store")
    t.set_defaults(fn=cmd_tune)

    b = sub.add_parser("bench", help="time the graph against hand-written cuDNN, torch eager and torch.compile")
    b.add_argument("files", nargs="+", metavar="FILE")
    b.add_argument("--graph", help="only this graph")
    b.add_argument("--shape", action="append", metavar="DIM=VALUE", help="shape of a dynamic graph (default: its first)")
    b.add_argument("--against", default="cudnn,torch,compile", help="baselines: cudnn, torch, compile (default: all)")
    b.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    b.add_argument("--iterations", type=int, default=20, help="timed samples per round (default 20)")
    b.add_argument("--no-peak", action="store_true", help="skip measuring the GPU's bf16 matmul peak")
    b.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    b.add_argument("--plot", metavar="FILE.png", help="draw a chart")
    b.set_defaults(fn=cmd_bench)

    k = sub.add_parser("cache", help="list, inspect, clear, export or import the plan store")
    k.add_argument("action", choices=("ls", "show", "clear", "export", "import", "path"))
    k.add_argument("arg", nargs="?", help="entry id (show), or bundle file (export, import)")
    k.set_defaults(fn=cmd_cache)

    return p


def main(argv=None) -> int:
    from cudnn_dsl.backend import BackendUnavailable
    from cudnn_dsl.store import StoreProblem
    from cudnn_dsl.tensors import BindingError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.fn(args)
    except UsageError as e:
        print(f"cudnn-dsl: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (BackendUnavailable, BindingError, KeyError, StoreProblem) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"cudnn-dsl: error: {msg}", file=sys.stderr)
        return EXIT_FAIL
    except BrokenPipeError:
        return EXIT_OK
