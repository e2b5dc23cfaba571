"""`cudnn-dsl bench FILE...`: the compiled graph against hand-written cuDNN, torch eager and
torch.compile in its three modes, on the same buffers, in one process."""

from __future__ import annotations

from cudnn_dsl.cli import common
from cudnn_dsl.cli.progress import Progress, add_quiet_flag

HELP = (
    "time the graph against hand-written cuDNN, torch eager and torch.compile (default, max-autotune, reduce-overhead)"
)


def register(p) -> None:
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--graph", help="only this graph of each file")
    p.add_argument(
        "--shape",
        action="append",
        metavar="DIM=VALUE",
        help="only these values of a symbolic dim: N=8,16 or repeated; default: every declared value",
    )
    p.add_argument(
        "--against",
        help="comma-separated baselines: cudnn (the ejected script), torch (eager), compile (torch.compile), "
        "max-autotune and reduce-overhead (torch.compile in those modes; max-autotune can take minutes to "
        "compile); default: all",
    )
    p.add_argument(
        "--cold-l2",
        action="store_true",
        help="time single calls, each after a write that evicts the GPU's L2 (default: back-to-back calls, warm L2)",
    )
    p.add_argument("--rounds", type=common.count, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--samples", type=common.count, default=20, help="timed samples per round (default 20)")
    p.add_argument("--no-peak", action="store_true", help="skip measuring the GPU's bf16 matmul peak")
    p.add_argument("--json", metavar="FILE", help="write every figure as JSON ('-' for stdout)")
    p.add_argument("--plot", metavar="FILE.png", help="draw a chart (needs matplotlib)")
    common.add_constraint_flags(p)
    common.add_require_gpu_flag(
        p, "bench fails so anyway, and takes the flag so that one CI line fits run, tune and bench"
    )
    common.add_log_flags(p)
    add_quiet_flag(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from cudnn_dsl.tune.contenders import BASELINES

    common.start_logging(args)
    against = tuple(x.strip() for x in args.against.split(",") if x.strip()) if args.against else BASELINES
    bad = set(against) - set(BASELINES)
    if bad or not against:
        raise common.UsageError(f"--against takes {', '.join(BASELINES)}; got {args.against!r}")
    if args.rounds < 1 or args.samples < 1:
        raise common.UsageError("--rounds and --samples must be at least 1")
    common.check_reports(args)
    common.require_gpu("bench measures on a GPU", args.json)
    from cudnn_dsl.target.machine import environment
    from cudnn_dsl.tune.bench import bench_graph, peak_tflops_bf16, plot, table

    results, work = [], []
    files, status = common.clean_files(args.files)
    for path, result in files:  # every file, graph and shape checked before anything is timed
        for g in common.select_graphs(result.program, args.graph):
            opts = common.options_from(args, g.options)
            work += [(path, g, inst, opts) for inst in common.select_instances(g, args.shape)]
    peak = None if args.no_peak else peak_tflops_bf16()
    env = {**environment(), "peak_bf16_tflops_measured": peak}
    print(
        f"{env['gpu']}, driver {env['driver']}, cuDNN {env['cudnn_backend']}, frontend {env['cudnn_frontend']}, "
        f"torch {env['torch']}" + (f"; measured bf16 matmul peak {peak:.0f} TFLOP/s" if peak else "")
    )
    progress = Progress.of(args, total=len(work))
    for path, g, inst, opts in work:
        try:
            with progress.item(f"{path}: {common.label(g, inst)}"):
                res = bench_graph(g, inst, against, args.rounds, args.samples, opts, cold_l2=args.cold_l2)
        except Exception as e:  # noqa: BLE001 - a graph cuDNN declines is reported; the others still run
            status = max(status, common.report(e))
            continue
        res["file"] = path
        results.append(res)
        print(table(res, peak))
        if any(r.get("check") not in ("ok", "") for r in res["rows"]):
            status = max(status, common.EXIT_FAIL)
    common.write_json(args.json, {"results": results}, env)
    if args.plot and results:
        plot(results, args.plot)
    return status
