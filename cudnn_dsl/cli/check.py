"""`cudnn-dsl check FILE...`: parse and check; print every inferred type, a stage of either half, or the errors."""

from __future__ import annotations

import attrs

from cudnn_dsl.cli import common, sarif
from cudnn_dsl.cli.progress import Progress, add_quiet_flag

HELP = "parse and check .cdg files; print every inferred shape, or the errors"


def register(p) -> None:
    p.add_argument("files", nargs="+", metavar="FILE")
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--emit",
        choices=("ast", "ir", "backward", "lowering", "plans"),
        help="print a stage instead of the summary; backward: the derived forward (with the values the backward "
        "reads as outputs) and backward graphs, as .cdg text; lowering: each shape's cuDNN Frontend calls, as the "
        "script `emit --format cudnn` ejects for the graph whole (no cuDNN needed); plans: the names of the plans "
        "cuDNN offers --target for each shape, in the heuristics' order, the chosen one marked *",
    )
    out.add_argument("--json", metavar="FILE", help="write the report as JSON ('-' for stdout)")
    common.add_target_flags(p, "also ask cuDNN for this GPU's plans, without a GPU")
    common.add_constraint_flags(p)
    common.add_plan_flag(p)
    sarif.add_flags(p)
    common.add_log_flags(p)
    add_quiet_flag(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from dsl.syntax.printer import dump_ast, dump_ir, summary, to_json

    common.start_logging(args)
    common.check_writable(args.json, "--json")
    sarif.check_flags(args)
    if args.format == "sarif" and args.emit:
        raise common.UsageError("--format sarif reports the diagnostics; --emit prints a stage instead")
    target = common.target_from(args)  # an unknown one is a usage error before any work
    pin = common.plan_spec(args)
    from dsl.options import Options

    common.options_from(args, Options())  # the flags' values checked before any work
    if target is None and (pin or args.exclude_engine or args.deterministic or args.no_runtime_compilation):
        raise common.UsageError("--plan and the plan constraints apply to cuDNN's plans: give --target too")
    if target is not None and args.emit == "ast":
        raise common.UsageError("--emit ast stops before the graph is checked; --target plans the checked graph")
    if target is None and args.emit == "plans":
        raise common.UsageError("--emit plans lists cuDNN's plans for a GPU: give --target (e.g. --target h200)")
    status = common.EXIT_OK
    files, findings = [], []
    progress = Progress.of(args, total=len(args.files))  # a file is a unit: its shapes are known once it is read
    for path in args.files:
        result = common.load_each(path, stop="ast" if args.emit == "ast" else "ir")
        if result is None:
            status = max(status, common.EXIT_USAGE)
            progress.skip()
            continue
        diagnostics = [d.to_json() for d in result.diagnostics]
        entry = {"file": result.file, "diagnostics": diagnostics, "graphs": [], "plans": [], "shape_modes": []}
        files.append(entry)
        findings += [sarif.result("check", d) for d in result.diagnostics]
        if not result.ok:
            status = max(status, common.EXIT_FAIL)
            progress.skip()
            continue
        if args.emit == "ast":
            print(dump_ast(result.module.graphs))
            continue
        planned = result.program
        if args.emit == "backward":
            derived, failed = _backward(result.program)
            status = max(status, failed)
            planned = attrs.evolve(result.program, graphs=derived)  # --target plans the derived graphs
        elif args.emit == "ir":
            print(dump_ir(result.program))
        elif args.emit == "lowering":
            _lowering(result.program, args)
        elif args.emit == "plans":
            status = max(status, _plans(result.program, target, args, pin, progress))
            continue  # the plans stand instead of --target's report
        elif args.json:
            entry["graphs"] = to_json(result.program)["graphs"]
        else:
            print(summary(result.program))
        if target is not None:
            status = max(status, _plan(planned, target, entry, findings, args, pin, progress))
    common.write_json(args.json, {"files": files})
    if args.format == "sarif":
        sarif.write(args.output, findings)
    return status


def _backward(program) -> tuple[tuple, int]:
    """Prints the derived graphs of every shape of every graph, as one .cdg text; an op with no VJP is
    reported at the op. Returns (the derived graphs, the exit status)."""
    from dsl.diagnostics import DslError

    status, graphs = common.EXIT_OK, []
    for g in program.graphs:
        for inst in g.instances:
            try:
                d = common.derive(g, inst)
            except DslError as e:
                status = max(status, common.report(e))
                continue
            print(f"# {common.label(g, inst)}: the forward, saving what the backward reads; then the backward")
            print("".join(f"# {line}\n" for line in d.choices), end="")
            print(d.forward_text + "\n" + d.backward_text)
            graphs += [d.forward, d.backward]
    return tuple(graphs), status


def _lowering(program, args) -> None:
    """Prints every shape of every graph as the frontend calls that build it whole (the pipeline's lowered stage,
    run against emit's recorder)."""
    from cudnn_dsl.interop.emit import emit_cudnn

    for g in program.graphs:
        options = common.options_from(args, g.options)
        for inst in g.instances:
            print(emit_cudnn(g, inst, options), end="")


def _plans(program, target, args, pin, progress) -> int:
    """Prints the name of every plan cuDNN offers the target for every shape of every graph, whole (the pipeline's
    planned stage): the chosen one marked *, those the constraints or --plan leave out marked -. A graph cuDNN
    declines whole is reported as the error it is."""
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import BackendUnavailable
    from dsl.diagnostics import DslError

    status, part = common.EXIT_OK, _share(program, progress)
    for g in program.graphs:
        options = common.options_from(args, g.options)
        for inst in g.instances:
            name = common.label(g, inst)
            try:
                with progress.item(f"{g.file}: {name}", part):
                    low = compile_shape(g, inst, options, target, progress=progress, pin=pin)
            except (DslError, BackendUnavailable) as e:  # said, and the other graphs and shapes still planned
                status = max(status, common.report(e))
                continue
            left = "" if low.allowed is None else "; - left out by the plan constraints or --plan"
            print(
                f"# {name}: {low.plan_count} plans for {target.name} (sm_{target.sm_version}); * the chosen one{left}"
            )
            for i in range(low.plan_count):
                mark = "*" if i == low.selected else "-" if low.allowed is not None and i not in low.allowed else " "
                print(f"{mark} {low.g.get_plan_name_at_index(i)}")
            for step, why in low.skipped.items():
                print(f"# {step} skipped: {why}")
    return status


def _share(program, progress) -> float:
    """The part of its file's unit of progress each shape of the program is (a file of no shape is done now)."""
    shapes = sum(len(g.instances) for g in program.graphs)
    if not shapes:
        progress.skip()
    return 1 / max(shapes, 1)


def _plan(program, target, entry: dict, findings: list, args, pin, progress) -> int:
    """Asks the real cuDNN library for the target's plans for every shape of every graph (into entry's
    "plans"), and says the shape mode of each graph with symbolic dims (into its "shape_modes"); its refusals and
    splits go into `findings` too, as SARIF results."""
    from cudnn_dsl.build.steps import timings_text
    from cudnn_dsl.run.partition import declined_whole, plan_for_target
    from cudnn_dsl.target.library import BackendUnavailable, answering
    from dsl.diagnostics import DslError

    status, records, quiet, library = common.EXIT_OK, entry["plans"], bool(args.json), None
    part = _share(program, progress)
    for g in program.graphs:
        if g.symbols:
            status = max(status, _shape_mode(g, target, entry["shape_modes"], findings, args))
        for inst in g.instances:
            name = common.label(g, inst)
            options = common.options_from(args, g.options)
            try:
                with progress.item(f"{g.file}: {name}", part):
                    low, partition = plan_for_target(g, inst, options, target, progress, pin)
            except (DslError, BackendUnavailable) as e:  # said, and the other graphs and files still planned
                status = max(status, common.report(e))
                findings += [sarif.result("plan", d) for d in _diagnostics(e, g, target)]
                why = [d.to_json() for d in e.diagnostics] if isinstance(e, DslError) else str(e)
                records.append({"graph": g.name, "binding": dict(inst.binding), "target": target.name, "error": why})
                continue
            if library is None:
                library = answering()
                if not quiet:
                    print(f"  answered by {library}")
            if partition is not None:
                parts = common.parts_record(g, partition)
                records.append(
                    {"graph": g.name, "binding": dict(inst.binding), "target": target.name, **parts}
                    | {"cudnn": library.to_json()}
                )
                findings.append(sarif.result("split", common.split_note(g, inst, target, partition)))
                if not quiet:
                    print(f"  {declined_whole(partition.declined, f'graph {name}', target.name)}; it runs as:")
                    print("".join(f"    {line}\n" for line in parts["parts"]), end="")
                    print(f"    {partition.counts.text}")
                continue
            record = common.plan_record(g, inst, target, low) | {"cudnn": library.to_json()}
            records.append(record)
            if not quiet:
                skipped = "".join(f"\n    {k} skipped: {why}" for k, why in low.skipped.items())
                print(
                    f"  cuDNN {library.version} plans for {target.name} (sm_{target.sm_version}), graph {name}: "
                    f"{low.plan_count} candidates, first {record['first_plan']}\n"
                    f"    {timings_text(low.timings)}{skipped}"
                )
    return status


def _shape_mode(g, target, records: list, findings: list, args) -> int:
    """The shape mode a run of this graph would use; in override-shape mode, its one plan, planned deviceless."""
    from cudnn_dsl.target.library import BackendUnavailable
    from dsl.diagnostics import DslError

    options = common.options_from(args, g.options)
    try:
        line, low = _shape_mode_line(g, options, target)
    except (DslError, BackendUnavailable) as e:  # the constraints leave no plan: said, like any other refusal
        findings += [sarif.result("plan", d) for d in _diagnostics(e, g, target)]
        return common.report(e)
    record = {"graph": g.name, "target": target.name, "shape_mode": options.shape_mode, "says": line}
    if low is not None:
        record.update(binding=dict(low.instance.binding), candidates=low.plan_count, override_shapes=True)
    records.append(record)
    if not args.json:
        print(f"  {line}")
    return common.EXIT_OK


def _shape_mode_line(graph, options, target):
    """What `check --target` says of the shapes of a graph with symbolic dims: the mode a run would use, and in
    override-shape mode how its one plan fares with this library for the target; and that planned graph, if any."""
    from cudnn_dsl.build.override import OVERRIDE_MIN_CUDNN, OverrideDeclined
    from cudnn_dsl.build.pipeline import compile_override
    from cudnn_dsl.build.steps import first_plan_name
    from cudnn_dsl.target.library import load_cudnn
    from cudnn_dsl.target.quirks import version_text

    count = 1
    for s in graph.symbols:
        count *= s.count
    mode = options.shape_mode
    if mode != "override":
        how = {
            "static": "a static plan per shape",
            "dynamic": "a plan per shape in dynamic-shape mode, one shared kernel cache",
            "auto": "a plan per shape: static while it compiles nothing at run time, then dynamic-shape mode",
        }[mode]
        return f"shape mode {mode}: {how} ({count} shapes)", None
    version = version_text(load_cudnn().backend_version())
    try:
        low = compile_override(graph, options, target)
    except OverrideDeclined as e:
        return f"shape mode override: per-value plans as under auto instead ({count} shapes): {e}", None
    return (
        f"shape mode override: one plan for all {count} shapes, built at {low.instance.label} and run at each "
        f"through execute-time shape overrides; cuDNN {version} here offers {low.plan_count} plans for "
        f"{target.name}, first {first_plan_name(low)}{' (not built: no GPU)' if low.skipped else ''}; cuDNN "
        f"below {version_text(OVERRIDE_MIN_CUDNN)} falls back to a plan per shape",
        low,
    )


def _diagnostics(e, graph, target) -> list:
    """A planning failure as diagnostics: cuDNN's located refusal, or the library's failure at the graph."""
    from dsl.diagnostics import Diagnostic, DslError

    if isinstance(e, DslError):
        return e.diagnostics
    return [Diagnostic("error", f"cuDNN for {target.name}: {e}", graph.loc)]
