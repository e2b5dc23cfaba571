"""`cudnn-dsl tune FILE...`: build and time every candidate plan on the GPU; keep the fastest."""

from __future__ import annotations

from cudnn_dsl.cli import common

HELP = "build and time every candidate plan on the GPU; keep the fastest in the plan store"


def register(p) -> None:
    p.add_argument("files", nargs="+", metavar="FILE")
    common.add_build_flags(p, "each file")
    p.add_argument("--plot", metavar="FILE.png", help="draw the time of every plan (needs matplotlib)")
    p.add_argument("--json", metavar="FILE", help="write every plan's timings as JSON ('-' for stdout)")
    p.add_argument("--no-cache", action="store_true", help="do not save the winner in the plan store")
    common.add_log_flags(p)
    p.set_defaults(run=run)


def run(args) -> int:
    common.start_logging(args)
    common.check_reports(args)
    common.require_gpu("tune times plans on a GPU")
    import attrs

    from cudnn_dsl.runtime import CompiledGraph
    from cudnn_dsl.timing import environment
    from cudnn_dsl.tune import plot, report, tune

    results, files, status, work = [], [], common.EXIT_OK, []
    for path in args.files:  # every file, graph, option and shape checked before anything is timed
        result = common.load_each(path)
        if result is None:
            status = max(status, common.EXIT_USAGE)
            continue
        files.append({"file": result.file, "diagnostics": [d.to_json() for d in result.diagnostics], "graphs": []})
        if not result.ok:
            status = max(status, common.EXIT_FAIL)
            continue
        for g in common.select_graphs(result.program, args.graph):
            work.append((files[-1], g, common.options_from(args, g.options), common.select_instances(g, args.shape)))
    for entry, g, opts, instances in work:
        cg = CompiledGraph(g, opts, args.device, use_store=not args.no_cache)
        for inst in instances:
            progress = common.Progress(common.label(g, inst))
            cg.planner.progress = progress
            try:
                r = tune(cg, inst, progress)
            except Exception as e:  # noqa: BLE001 - one graph's failure is reported; the others still run
                status = max(status, common.report(e))
                continue
            finally:
                progress.done()
            results.append(r)
            entry["graphs"].append(attrs.asdict(r))
            print(report(r))
            if r.winner is None:
                status = max(status, common.EXIT_FAIL)
            elif not args.no_cache:
                print(f"  stored in {cg.planner.store.root}")
    if args.plot and results:
        plot(results, args.plot)
    common.write_json(args.json, {"files": files, "environment": environment(args.device)})
    return status
