"""`cudnn-dsl tune FILE...`: build and time every candidate plan on the GPU; keep the fastest."""

from __future__ import annotations

from cudnn_dsl.cli import common
from cudnn_dsl.cli.progress import Progress, add_quiet_flag

HELP = "build and time every candidate plan on the GPU (or every engine and knob: --exhaustive); keep the fastest"


def register(p) -> None:
    p.add_argument("files", nargs="+", metavar="FILE")
    common.add_build_flags(p, "each file")
    p.add_argument("--plot", metavar="FILE.png", help="draw the time of every plan (needs matplotlib)")
    p.add_argument("--json", metavar="FILE", help="write every plan's timings as JSON ('-' for stdout)")
    p.add_argument("--no-cache", action="store_true", help="do not save the winner in the plan store")
    x = p.add_argument_group("exhaustive search")
    x.add_argument(
        "--exhaustive",
        action="store_true",
        help="after the heuristics' plans, every engine and knob combination cuDNN enumerates; on a GPU, resumes "
        "where the last search of this graph on this GPU stopped; without one, only asks cuDNN which it supports "
        "for --target, from the first configuration each time (nothing timed, nothing recorded)",
    )
    x.add_argument("--max-configs", type=common.count, metavar="N", help="try at most N configurations (default 1000)")
    x.add_argument("--budget", type=common.real, metavar="SECONDS", help="stop after SECONDS of searching")
    x.add_argument("--top-k", type=common.count, default=10, metavar="K", help="report the K fastest (default 10)")
    x.add_argument("--restart", action="store_true", help="forget what earlier searches on this GPU tried")
    common.add_target_flags(p, "with --exhaustive and no GPU here: the GPU to ask cuDNN about (default h200)")
    common.add_require_gpu_flag(
        p,
        "for GPU runners in CI; without it, tune lists what it would time (exit 1), and --exhaustive asks "
        "cuDNN which configurations it supports (exit 0)",
    )
    common.add_log_flags(p)
    add_quiet_flag(p)
    p.set_defaults(run=run)


def run(args) -> int:
    common.start_logging(args)
    common.check_reports(args)
    _check_search_flags(args)
    if args.require_gpu:
        common.require_gpu("--require-gpu asks for a GPU", args.json)
    from cudnn_dsl.target.library import DEFAULT_TARGET, gpu_available

    if not gpu_available():
        if args.exhaustive:
            return _explore(args, common.target_from(args, DEFAULT_TARGET))
        _alternatives(args, common.target_from(args, DEFAULT_TARGET))  # then the error: nothing was timed
    common.require_gpu("tune times plans on a GPU", args.json)
    if args.target or args.device_properties:
        common.warn("note: --target and --device-properties ignored: this machine has a GPU, and tune times on it")
    import attrs

    from cudnn_dsl.run.compiled import CompiledGraph
    from cudnn_dsl.target.machine import environment
    from cudnn_dsl.tune.exhaustive import report as search_report
    from cudnn_dsl.tune.heuristics import exhaustive, partition_report, plot, report

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
    progress = Progress.of(args, total=sum(len(instances) for *_, instances in work))
    for entry, g, opts, instances in work:
        cg = CompiledGraph(g, opts, args.device, use_store=not args.no_cache)
        cg.planner.progress = progress
        for inst in instances:
            try:
                with progress.item(common.label(g, inst)):
                    if args.exhaustive:
                        r = exhaustive(cg, inst, **_limits(args), restart=args.restart, progress=progress)
                    else:
                        r, parts = _tune(cg, inst, progress)
            except Exception as e:  # noqa: BLE001 - one graph's failure is reported; the others still run
                status = max(status, common.report(e))
                continue
            if args.exhaustive:
                entry["graphs"].append(attrs.asdict(r))
                print(search_report(r, args.top_k))
                failed = r.winner is None
            else:
                record = attrs.asdict(r) if r else {"graph": g.name, "binding": dict(inst.binding)}
                entry["graphs"].append({**record, "partitions": attrs.asdict(parts) if parts else None})
                results += [r] if r else []
                if r:
                    print(report(r))
                if parts:
                    print(partition_report(parts))
                failed = (r is not None and r.winner is None) or (parts is not None and parts.kept is None)
            if failed:
                status = max(status, common.EXIT_FAIL)
            elif not args.no_cache:
                print(f"  stored in {cg.planner.store.root}")
    if args.plot and results:
        plot(results, args.plot)
    common.write_json(args.json, {"files": files}, environment(args.device))
    return status


def _tune(cg, inst, progress):
    """The whole graph's plans tuned (unless cuDNN declines it whole), then its partitions where it has several:
    (TuneResult or None, PartitionTune or None)."""
    from cudnn_dsl.build.constraints import NotAllowed
    from cudnn_dsl.run.partition import short
    from cudnn_dsl.tune.heuristics import tune, tune_partitions
    from dsl.diagnostics import DslError

    whole, declined = None, ""
    try:
        whole = tune(cg, inst, progress)
    except DslError as e:
        if isinstance(e, NotAllowed) or not cg.options.split:
            raise
        declined = short(e.diagnostics[0].message)
    if not cg.options.split or (len(cg.graph.nodes) < 2 and not declined):
        return whole, None
    return whole, tune_partitions(cg, inst, whole, declined, progress)


def _alternatives(args, target) -> None:
    """Without a GPU: the partitions tune would time, as the target's cuDNN plans them (nothing is timed)."""
    from cudnn_dsl.run.partition import deviceless_alternatives

    common.warn(f"note: no CUDA GPU here: the partitions tune would time, as cuDNN plans them for {target.name}")
    clean, _ = common.clean_files(args.files)
    work = _deviceless_work(args, clean)
    progress = Progress.of(args, total=len(work))
    for _, g, inst, opts in work:
        try:
            with progress.item(common.label(g, inst)):
                rows = deviceless_alternatives(g, inst, opts, target)
        except Exception as e:  # noqa: BLE001 - one graph's failure is reported; the others still listed
            common.report(e)
            continue
        print(f"graph {common.label(g, inst)}: partitions tune would time")
        for label, how in rows:
            print(f"  {label:52} {how}")


def _deviceless_work(args, clean) -> list:
    """(the file's index in `clean`, graph, shape, options) of every shape chosen, before any is planned."""
    return [
        (k, g, inst, common.options_from(args, g.options))
        for k, (_, result) in enumerate(clean)
        for g in common.select_graphs(result.program, args.graph)
        for inst in common.select_instances(g, args.shape)
    ]


def _check_search_flags(args) -> None:
    given = [f for f in ("max_configs", "budget", "restart") if getattr(args, f) not in (None, False)]
    if given and not args.exhaustive:
        raise common.UsageError(f"--{given[0].replace('_', '-')} goes with --exhaustive")
    if args.exhaustive and args.plot:
        raise common.UsageError("--plot draws tune's normal list; --exhaustive reports its --top-k as text")
    for flag, value in (("--max-configs", args.max_configs), ("--top-k", args.top_k)):
        if value is not None and value < 1:
            raise common.UsageError(f"{flag} must be at least 1")
    if args.budget is not None and not args.budget > 0:
        raise common.UsageError("--budget must be a positive number of seconds")


def _limits(args) -> dict:
    from cudnn_dsl.tune.exhaustive import MAX_CONFIGS

    return {"cap": args.max_configs or MAX_CONFIGS, "budget_s": args.budget}


def _explore(args, target) -> int:
    """--exhaustive without a GPU: which configurations cuDNN supports for the target (nothing built or timed)."""
    import attrs

    from cudnn_dsl.tune.exhaustive import report, search_deviceless

    common.warn(
        f"note: no CUDA GPU here: asking cuDNN which configurations it supports for {target.name}; none is timed and "
        f"nothing is recorded, so each search without a GPU starts at the first configuration"
        + ("" if not args.restart else " (--restart changes nothing)")
    )
    clean, status = common.clean_files(args.files)
    files = [{"file": result.file, "graphs": []} for _, result in clean]
    work = _deviceless_work(args, clean)
    progress = Progress.of(args, total=len(work))
    for k, g, inst, opts in work:
        try:
            with progress.item(common.label(g, inst)):
                r = search_deviceless(g, inst, opts, target, **_limits(args), progress=progress)
        except Exception as e:  # noqa: BLE001 - one graph's failure is reported; the others still run
            status = max(status, common.report(e))
            continue
        files[k]["graphs"].append(attrs.asdict(r))
        print(report(r, args.top_k))
    common.write_json(args.json, {"files": files, "target": target.name})
    return status
