"""`cudnn-dsl emit FILE`: a standalone script — the graph's cuDNN Frontend calls, or its torch reference."""

from __future__ import annotations

from cudnn_dsl.cli import common

HELP = "print a standalone script: the cuDNN Frontend calls of a graph, or its torch reference"


def register(p) -> None:
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--format",
        choices=("cudnn", "torch", "fe-json"),
        default="cudnn",
        help="cudnn: the frontend calls, built and run once (default); torch: the reference function; fe-json: "
        "the graph as the cuDNN Frontend serializes it (for anyone with the frontend alone; needs the cuDNN library)",
    )
    p.add_argument("--graph", help="the graph to emit (needed when the file has several)")
    p.add_argument("--shape", action="append", metavar="DIM=VALUE", help="the value of each symbolic dim")
    common.add_target_flags(p, "fe-json: lower for this GPU, without one (default h200)")
    common.add_log_flags(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from cudnn_dsl.backend import DEFAULT_TARGET
    from cudnn_dsl.emit import emit_cudnn, emit_torch

    common.start_logging(args)
    if args.format != "fe-json" and (args.target or args.device_properties):
        raise common.UsageError("--target and --device-properties go with --format fe-json")
    target = common.target_from(args, default=DEFAULT_TARGET) if args.format == "fe-json" else None
    result = common.load_file(args.file)
    if not result.ok:
        return common.EXIT_FAIL
    graphs = common.select_graphs(result.program, args.graph)
    if len(graphs) > 1:
        names = ", ".join(g.name for g in graphs)
        raise common.UsageError(f"{args.file} holds {len(graphs)} graphs ({names}); choose one with --graph")
    g = graphs[0]
    chosen = common.select_instances(g, args.shape)
    if len(chosen) > 1:
        raise common.UsageError(
            f"graph '{g.name}' has {len(chosen)} shapes ({g.declared_shapes}); choose one with --shape"
        )
    if args.format == "fe-json":
        from cudnn_dsl.build import frontend_json

        print(frontend_json(g, chosen[0], target), end="")
    else:
        print((emit_cudnn if args.format == "cudnn" else emit_torch)(g, chosen[0]), end="")
    return common.EXIT_OK
