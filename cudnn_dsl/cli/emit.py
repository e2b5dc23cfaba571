"""`cudnn-dsl emit FILE`: a standalone script — the graph's cuDNN Frontend calls, or its torch reference (of the
graph as written, or of its derived forward or backward: `--derived`)."""

from __future__ import annotations

from cudnn_dsl.cli import common

HELP = "print a standalone script: the cuDNN Frontend calls of a graph, or its torch reference"


def register(p) -> None:
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--format",
        choices=("cudnn", "torch", "fe-json", "cpp"),
        default="cudnn",
        help="cudnn: the frontend calls, built and run once (default; a graph cuDNN declines whole, as the "
        "graphs it splits into, run in order); torch: the reference function; fe-json: "
        "the graph as the cuDNN Frontend serializes it (for anyone with the frontend alone; needs the cuDNN library; "
        "written even when the graph gets no plan, with exit 1: cuDNN finds none, or cudnn-dsl refuses a graph a "
        "known defect of cuDNN runs wrong); cpp: a C++ project (the frontend's C++ calls, a CMake file, a main "
        "that plans for --target without a GPU or runs the graph on run's inputs; a graph cuDNN declines whole, as "
        "its parts) written to the -o directory",
    )
    p.add_argument("-o", "--output", metavar="DIR", help="cpp: the directory the C++ project is written to")
    p.add_argument("--graph", help="the graph to emit (needed when the file has several)")
    p.add_argument("--shape", action="append", metavar="DIM=VALUE", help="the value of each symbolic dim")
    p.add_argument(
        "--derived",
        choices=("forward", "backward"),
        help="emit a graph derived from the chosen shape, as `check --emit backward` prints it, in any --format: "
        "forward: the graph, also outputting the values its backward reads; backward: the backward graph, "
        "from those values and the gradients of the outputs (grad_OUTPUT) to the inputs' gradients (grad_INPUT)",
    )
    p.add_argument(
        "--wrt",
        action="append",
        metavar="INPUT",
        help="with --derived: an input whose gradient the backward computes (repeatable; default: every "
        "floating-point input)",
    )
    common.add_target_flags(
        p,
        "plan for this GPU, without one (default h200): fe-json lowers for it; cudnn asks whether its cuDNN takes "
        "the graph whole, and ejects the parts it splits the graph into when it does not",
    )
    p.add_argument(
        "--init",
        action="append",
        metavar="NAME=DIST",
        help="cudnn: how the script draws an input, over the file's init= (as `run --init`)",
    )
    common.add_option_flags(p, "seed")
    common.add_constraint_flags(p)
    common.add_log_flags(p)
    p.set_defaults(run=run)


#: the flags that shape the cuDNN script alone
_CUDNN_FLAGS = ("init", "seed", "exclude_engine", "deterministic", "no_runtime_compilation")


def run(args) -> int:
    from cudnn_dsl.interop.emit import emit_torch
    from cudnn_dsl.target.library import DEFAULT_TARGET

    common.start_logging(args)
    if args.format == "torch" and (args.target or args.device_properties):
        raise common.UsageError("--target and --device-properties go with --format cudnn or fe-json")
    for flag in _CUDNN_FLAGS:
        if args.format not in ("cudnn", "cpp") and getattr(args, flag):
            raise common.UsageError(f"--{flag.replace('_', '-')} goes with --format cudnn or cpp")
    if (args.format == "cpp") != bool(args.output):
        raise common.UsageError("--format cpp writes a directory: give it with -o DIR (and -o only with cpp)")
    if args.wrt and not args.derived:
        raise common.UsageError("--wrt goes with --derived")
    target = common.target_from(args, default=DEFAULT_TARGET) if args.format != "torch" else None
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
            f"graph '{g.name}' has more than one shape ({g.declared_shapes}); choose one with --shape"
        )
    inst = chosen[0]
    if args.derived:  # an ordinary checked graph of one shape: emitted as any other
        g = _derived(g, inst, args.derived, args.wrt)
        inst = g.instances[0]
    if args.format == "fe-json":
        return _fe_json(g, inst, target)
    if args.format == "cpp":
        return _cpp(g, inst, target, common.options_from(args, g.options), _inits(args, g), args.output, args)
    if args.format == "cudnn":
        return _cudnn(g, inst, target, common.options_from(args, g.options), _inits(args, g), args)
    print(emit_torch(g, inst), end="")
    return common.EXIT_OK


def _derived(g, inst, which: str, wrt: list[str] | None):
    """The derived forward or backward graph of this shape, with the gradients of `wrt` (default: every
    float input); an op with no VJP is a DslError at the op."""
    from dsl.autodiff import float_inputs

    floats = float_inputs(g, inst)
    for name in wrt or ():
        if name not in floats:
            what = "is not a float input" if name in {v.name for v in g.inputs} else "names no input"
            raise common.UsageError(
                f"--wrt {name}: {what} of graph '{g.name}' (the inputs with a gradient: {', '.join(floats) or 'none'})"
            )
    d = common.derive(g, inst, tuple(dict.fromkeys(wrt)) if wrt else None)
    return d.forward if which == "forward" else d.backward


def _inits(args, g) -> dict:
    """--init NAME=DIST, checked as run checks it."""
    from dsl.diagnostics import RuleError
    from dsl.inits import check_dtype

    inits = common.named_values(
        args.init,
        "--init",
        [v.name for v in g.device_inputs],
        common.init_value,
        instead=common.views_drawn_with_buffers([g]),
    )
    for name, init in inits.items():
        try:
            check_dtype(init, g.instances[0].type(name).dtype)
        except RuleError as e:
            raise common.UsageError(f"--init {name}: {e}") from None
    return inits


def _planned(g, inst, target, options, args):
    """plan_for_target, with a progress line on a terminal (a graph cuDNN declines whole is split, question by
    question)."""
    from cudnn_dsl.cli.progress import Progress
    from cudnn_dsl.run.partition import plan_for_target

    progress = Progress.of(args, total=1)
    with progress.item(f"{g.file}: {g.name} for {target.name}"):
        return plan_for_target(g, inst, options, target, progress)


def _cudnn(g, inst, target, options, inits, args) -> int:
    """The frontend script: of the graph whole when the target's cuDNN takes it (or the options say
    `split = false`), else of the parts deviceless planning splits it into. When cuDNN declines even
    that, still the whole graph's script, with the refusal on stderr and exit 1."""
    from cudnn_dsl.interop.emit import emit_cudnn
    from cudnn_dsl.target.library import BackendUnavailable
    from dsl.diagnostics import DslError

    partition, status = None, common.EXIT_OK
    if options.split:
        try:
            _, partition = _planned(g, inst, target, options, args)
        except BackendUnavailable as e:
            common.warn(f"cannot ask cuDNN whether it takes the graph whole ({e}); the script builds it whole")
        except DslError as e:
            status = common.report(e)
            common.warn(
                f"the script below builds the graph whole, which is not planned for {target.name} (the error above)"
            )
    print(emit_cudnn(g, inst, options, partition, inits), end="")
    return status


def _cpp(g, inst, target, options, inits, directory: str, args) -> int:
    """The C++ project: the graph whole, or the parts the target's cuDNN takes it in."""
    from pathlib import Path

    from cudnn_dsl.interop.emit_cpp import emit_cpp
    from cudnn_dsl.store.files import atomic_write

    partition = _planned(g, inst, target, options, args)[1] if options.split else None
    files = emit_cpp(g, inst, options, target, inits, partition)
    out = Path(directory)
    for rel, data in files.items():
        atomic_write(out / rel, data)
    build = f"cmake -S {out} -B {out}/build && cmake --build {out}/build -j2 && {out}/build/main"
    common.warn(f"wrote the C++ project of graph '{g.name}' to {out}: {build}")
    return common.EXIT_OK


def _fe_json(g, inst, target) -> int:
    """The frontend's JSON; when the graph gets no plan (cuDNN finds none, or a known defect of cuDNN has
    cudnn-dsl refuse it), still the graph's JSON (taken before planning), which is what a bug report about that
    refusal or defect needs, with the refusal on stderr and exit 1."""
    from cudnn_dsl.interop.fe_export import frontend_json
    from cudnn_dsl.target.quirks import known_defect
    from dsl.diagnostics import DslError

    try:
        print(frontend_json(g, inst, target), end="")
        return common.EXIT_OK
    except DslError as e:
        try:
            text = frontend_json(g, inst, target, plans=False)
        except DslError:
            text = ""
        if '"json_version"' not in text:  # refused before the frontend had its graph (sdpa): nothing to print
            raise e from None
        print(text, end="")
        common.report(e)
        why = "cudnn-dsl refuses to plan it" if known_defect(e.diagnostics[0].message) else "cuDNN found no plan for it"
        common.warn(f"the graph's JSON above is taken before planning, as {why}")
        return common.EXIT_FAIL
