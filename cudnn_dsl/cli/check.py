"""`cudnn-dsl check FILE...`: parse and check; print every inferred type, a stage, or the errors."""

from __future__ import annotations

from cudnn_dsl.cli import common

HELP = "parse and check .cdg files; print every inferred shape, or the errors"


def register(p) -> None:
    p.add_argument("files", nargs="+", metavar="FILE")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--emit", choices=("ast", "ir"), help="print a stage instead of the summary")
    out.add_argument("--json", metavar="FILE", help="write the report as JSON ('-' for stdout)")
    common.add_target_flags(p, "also ask cuDNN for this GPU's plans, without a GPU")
    p.set_defaults(run=run)


def run(args) -> int:
    from dsl.printer import dump_ast, dump_ir, summary, to_json

    common.check_writable(args.json, "--json")
    target = common.target_from(args)  # an unknown one is a usage error before any work
    status = common.EXIT_OK
    files = []
    for path in args.files:
        result = common.load_file(path, stop="ast" if args.emit == "ast" else "ir")
        entry = {
            "file": result.file,
            "diagnostics": [d.to_json() for d in result.diagnostics],
            "graphs": [],
            "plans": [],
        }
        files.append(entry)
        if not result.ok:
            status = common.EXIT_FAIL
            continue
        if args.emit == "ast":
            print(dump_ast(result.module.graphs))
            continue
        if args.emit == "ir":
            print(dump_ir(result.program))
        elif args.json:
            entry["graphs"] = to_json(result.program)["graphs"]
        else:
            print(summary(result.program))
        if target is not None:
            status = max(status, _plan(result.program, target, entry["plans"], quiet=bool(args.json)))
    common.write_json(args.json, {"files": files})
    return status


def _plan(program, target, records: list, quiet: bool) -> int:
    """Asks the real cuDNN library for the target's plans for every shape of every graph."""
    from cudnn_dsl.build import first_plan_name, plan_deviceless, timings_text
    from dsl.diagnostics import DslError

    status = common.EXIT_OK
    for g in program.graphs:
        for inst in g.instances:
            name = common.label(g, inst)
            progress = common.Progress(name)
            try:
                low = plan_deviceless(g, inst, g.options, target, progress)
            except DslError as e:
                status = common.report(e)
                records.append(
                    {
                        "graph": g.name,
                        "binding": dict(inst.binding),
                        "target": target.name,
                        "error": [d.to_json() for d in e.diagnostics],
                    }
                )
                continue
            finally:
                progress.done()
            first = first_plan_name(low)
            records.append(
                {
                    "graph": g.name,
                    "binding": dict(inst.binding),
                    "target": target.name,
                    "plans": low.plan_count,
                    "first_plan": first,
                    "timings_s": low.timings,
                    "skipped": low.skipped,
                }
            )
            if not quiet:
                skipped = "".join(f"\n    {k} skipped: {why}" for k, why in low.skipped.items())
                print(
                    f"  cuDNN plans for {target.name} (sm_{target.sm_version}), graph {name}: {low.plan_count} "
                    f"candidates, first {first}\n    {timings_text(low.timings)}{skipped}"
                )
    return status
