"""`cudnn-dsl sweep SPEC.toml` and `cudnn-dsl sweep merge DIR... --into STORE`: a fleet's plans and support answers
in one store (docs/fleet.md)."""

from __future__ import annotations

import sys

from cudnn_dsl.cli import common
from cudnn_dsl.cli.progress import Progress, add_quiet_flag

HELP = "plan, tune or support-check many graphs, shapes and GPUs on workers (here, or Ray), merged into one store"

EXECUTORS = ("local", "ray")
SPEC_FLAGS = ("dry_run", "address", "workers", "resume", "store", "no_merge", "retune", "staging")
"""the flags of running a sweep, which `sweep merge` refuses rather than ignores"""


def register(p) -> None:
    p.description = (
        f"{HELP}. `sweep SPEC.toml` plans the spec's work on this CPU, runs it and merges its records into the spec's "
        "store; `sweep merge DIR... --into STORE` merges staging directories or stores (set union: any order gives "
        "one manifest) and prints the manifest's digest."
    )
    p.add_argument("spec", nargs="?", metavar="SPEC.toml|merge", help="the sweep spec, or `merge`")
    p.add_argument("sources", nargs="*", metavar="DIR", help="merge: staging directories or stores to merge")
    p.add_argument("--into", metavar="STORE", help="merge: the store to merge into")
    p.add_argument("--dry-run", action="store_true", help="print the work (after planning on the CPU) and stop")
    p.add_argument("--executor", choices=EXECUTORS, default="local", help="who runs the units (default local)")
    p.add_argument("--address", metavar="ADDR", help="ray: the cluster to join (default: start one on this machine)")
    p.add_argument(
        "--workers",
        type=common.count,
        metavar="N",
        help="local: worker processes for deviceless units (default: one per core)",
    )
    p.add_argument("--resume", metavar="ID", help="run what sweep ID has no record of yet (the spec is not reread)")
    p.add_argument("--store", metavar="STORE", help="merge into STORE instead of the spec's store")
    p.add_argument("--no-merge", action="store_true", help="leave the records in the staging directory")
    p.add_argument(
        "--retune",
        action="store_true",
        help="run every shape anew, in a staging directory of its own: those the store already answers, and those "
        "an earlier run of this sweep recorded",
    )
    p.add_argument("--staging", metavar="DIR", help="the staging directory (default: in the cache directory)")
    p.add_argument("--json", metavar="FILE", help="write the work, or the sweep's outcome, as JSON ('-' for stdout)")
    add_quiet_flag(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from cudnn_dsl import sweep
    from cudnn_dsl.target.machine import environment

    common.check_writable(args.json, "--json")
    if args.spec == "merge":
        return _merge(args)
    if args.sources or args.into:
        raise common.UsageError("DIR... and --into go with `sweep merge`")
    if args.address and args.executor != "ray":
        raise common.UsageError("--address goes with --executor ray")
    if args.workers and args.executor != "local":
        raise common.UsageError("--workers goes with --executor local")
    if args.resume and (args.spec or args.dry_run or args.retune):
        raise common.UsageError("--resume ID runs a planned sweep: no spec, --dry-run or --retune with it")
    if not args.resume and not args.spec:
        raise common.UsageError("sweep takes a spec (SPEC.toml), `merge DIR... --into STORE`, or --resume ID")
    progress = Progress.of(args, total=0)
    store = "" if args.no_merge else args.store
    if args.resume:
        try:
            result = sweep.resume(
                args.resume, _executor(args, {}), staging=args.staging, store=store, progress=progress
            )
        except sweep.NotResumable as e:
            raise common.UsageError(f"--resume: {e}") from None
        return _report(args, result, environment())
    try:
        spec = sweep.Spec.load(args.spec)
        work = sweep.plan(spec, retune=args.retune, progress=progress)
    except sweep.SpecError as e:
        raise common.UsageError(str(e)) from None
    print(work.summary())
    if args.dry_run:
        common.write_json(args.json, {"work": work.to_json()}, environment())
        return common.EXIT_OK
    again = f"--resume {work.id}" + (f" --staging {args.staging}" if args.staging else "")
    print(f"staging: {args.staging or _staging(work.id)}  (resume with {again})")
    executor = _executor(args, dict(spec.tune_targets))
    try:
        result = sweep.run(work, executor, staging=args.staging, store=store, progress=progress)
    except sweep.NotResumable as e:
        raise common.UsageError(f"--staging: {e}: name another directory") from None
    return _report(args, result, environment())


def _staging(sweep_id: str) -> str:
    from cudnn_dsl.sweep.run import staging_of

    return str(staging_of(sweep_id))


def _executor(args, gpus: dict[str, int]):
    """The executor --executor names; `gpus`: how many GPUs of each type the spec lets a local sweep use."""
    from cudnn_dsl import sweep

    if args.executor == "ray":
        from cudnn_dsl.sweep.on_ray import RayExecutor

        return RayExecutor(address=args.address, say=lambda line: common.warn(f"ray: {line}"))
    return sweep.LocalExecutor(workers=args.workers, gpus=gpus)


def _report(args, result, env) -> int:
    progress_done = ", ".join(f"{n} {k}" for k, n in result.counts.items()) or "nothing"
    print(f"sweep {result.id}: {progress_done} in {result.seconds:.1f} s")
    for line in result.unfinished:
        print(f"  unfinished: {line}", file=sys.stderr)
    if result.merged:
        _print_merged(result.merged)
    common.write_json(args.json, {"sweep": result.to_json()}, env)
    damaged = bool(result.merged and result.merged.damaged)
    return common.EXIT_OK if result.complete and not damaged else common.EXIT_FAIL


def _print_merged(m) -> None:
    man = m.manifest
    print(
        f"manifest sha256:{m.digest}: {len(man['plans'])} plans, {len(man['support'])} support answers, "
        f"{m.added} new records"
    )
    for c in man["conflicts"]:
        print(f"  conflict: key {c['key']}: records disagree: {c['answers']}", file=sys.stderr)
    for f in man["flags"]:
        print(
            f"  flagged: key {f['key']}: plan {f['plan']} measured {f['median_us_by_host']} µs by host", file=sys.stderr
        )
    for d in m.damaged:
        print(f"  damaged: {d.path}: {d.why}", file=sys.stderr)


def _merge(args) -> int:
    from pathlib import Path

    import attrs

    from cudnn_dsl import sweep
    from cudnn_dsl.target.machine import environment

    if not args.sources or not args.into:
        raise common.UsageError("sweep merge takes the directories to merge and --into STORE")
    spec_only = [f"--{k.replace('_', '-')}" for k in SPEC_FLAGS if getattr(args, k)]
    if spec_only or args.executor != "local":
        raise common.UsageError(f"{(spec_only or ['--executor'])[0]} goes with `sweep SPEC.toml`, not `sweep merge`")
    for src in args.sources:
        if "://" not in src and not Path(src).is_dir():
            raise common.UsageError(f"sweep merge: {src} is not a directory")
    m = sweep.merge(args.sources, args.into)
    _print_merged(m)
    common.write_json(
        args.json,
        {
            "merge": {
                "manifest": f"sha256:{m.digest}",
                "added": m.added,
                "conflicts": m.manifest["conflicts"],
                "flags": m.manifest["flags"],
                "damaged": [attrs.asdict(d) for d in m.damaged],
            }
        },
        environment(),
    )
    return common.EXIT_FAIL if m.damaged else common.EXIT_OK
