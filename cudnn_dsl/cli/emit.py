"""`cudnn-dsl emit FILE`: a standalone script — the graph's cuDNN Frontend calls, or its torch reference."""

from __future__ import annotations

from cudnn_dsl.cli import common

HELP = "print a standalone script: the cuDNN Frontend calls of a graph, or its torch reference"


def register(p) -> None:
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--format",
        choices=("cudnn", "torch"),
        default="cudnn",
        help="cudnn: the frontend calls, built and run once (default); torch: the reference function",
    )
    p.add_argument("--graph", help="the graph to emit (needed when the file has several)")
    p.add_argument("--shape", action="append", metavar="DIM=VALUE", help="the value of each symbolic dim")
    p.set_defaults(run=run)


def run(args) -> int:
    from cudnn_dsl.emit import emit_cudnn, emit_torch

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
    print(emit_cudnn(g, chosen[0]) if args.format == "cudnn" else emit_torch(g, chosen[0]), end="")
    return common.EXIT_OK
