"""`cudnn-dsl support FILE... --target h200,a100`: per graph and target GPU, whether cuDNN fuses it
whole, or where it splits and why — asked of the real cuDNN library, with no GPU."""

from __future__ import annotations

from cudnn_dsl.cli import common, sarif
from cudnn_dsl.cli.progress import Progress, add_quiet_flag

HELP = "say, per target GPU, whether cuDNN fuses each graph whole or where it splits it, and why (no GPU needed)"


def register(p) -> None:
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--graph", help="only this graph of each file")
    p.add_argument("--shape", action="append", metavar="DIM=VALUE", help="only these values of a symbolic dim")
    p.add_argument(
        "--target",
        metavar="GPU[,GPU...]",
        help="the GPUs to ask about, from cudnn_dsl/target/devices/ (default: every bundled one; those made from "
        "published figures are marked unverified)",
    )
    p.add_argument("--device-properties", metavar="JSON", help="a descriptor `cudnn-dsl device-info` printed on a GPU")
    p.add_argument("--no-fallback", action="store_true", help="an op no engine runs is an error, not a torch fallback")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON ('-' for stdout)")
    sarif.add_flags(p)
    p.add_argument(
        "--cudnn",
        metavar="VERSION[,VERSION...]",
        help="answer once per cuDNN version (e.g. 9.20,9.28), each planned in a process of its own against that "
        "version's library: the installed one where it matches, else one installed beside it in the cache "
        "directory (see --fetch)",
    )
    p.add_argument(
        "--fetch",
        action="store_true",
        help="with --cudnn: install a version not here yet with pip (its wheel, without dependencies) into the "
        "cache directory",
    )
    common.add_log_flags(p)
    add_quiet_flag(p)
    p.set_defaults(run=run)


def _targets(args) -> list:
    from cudnn_dsl.target.library import DEVICES_DIR, Target

    if args.device_properties:
        if args.target:
            raise common.UsageError("give --target or --device-properties, not both")
        return [Target.from_file(args.device_properties)]
    names = [n.strip() for n in args.target.split(",") if n.strip()] if args.target is not None else None
    if names == []:
        raise common.UsageError(f"--target {args.target!r} names no GPU")
    return [Target.named(n) for n in names or sorted(p.stem for p in DEVICES_DIR.glob("*.json"))]


def _library_dirs(args) -> list[tuple[str, str | None]]:
    """(the version asked for, the directory of its libcudnn.so.9; None: the installed one) per --cudnn version."""
    from cudnn_dsl.target import library

    asked = [v.strip() for v in args.cudnn.split(",") if v.strip()]
    if not asked:
        raise common.UsageError(f"--cudnn {args.cudnn!r} names no version")
    package, here = library.installed_cudnn()
    out = []
    for v in asked:
        try:
            home = library.side_by_side(v)
        except ValueError as e:
            raise common.UsageError(f"--cudnn: {e}") from None
        if here and library.matches(here, v):
            out.append((v, None))
        elif home.is_dir():
            out.append((v, str(library.side_by_side_library(home))))
        elif args.fetch:
            print(f"fetching {package}=={v}.* into {home}", flush=True)
            out.append((v, str(library.side_by_side_library(library.fetch(v)))))
        else:
            raise library.BackendUnavailable(  # the machine lacks it, as it may lack a GPU: not a usage error
                f"cuDNN {v} is not here ({package} {here or 'is not installed'}; nothing in {home}): "
                f"pass --fetch to install {package}=={v}.* there with pip"
            )
    return out


def _per_version(args) -> int:
    """Runs this command once per --cudnn version, each in a process whose frontend loads that version's library
    (the directory first on $LD_LIBRARY_PATH, where the frontend looks first)."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from cudnn_dsl.target.library import BackendUnavailable, matches

    common.check_writable(args.json, "--json")
    _targets(args)  # an unknown target is a usage error before any fetch
    flags = [("--graph", args.graph), ("--target", args.target), ("--device-properties", args.device_properties)]
    base = [*args.files, *(x for flag, v in flags if v is not None for x in (flag, v))]
    base += [x for s in args.shape or () for x in ("--shape", s)] + (["--no-fallback"] if args.no_fallback else [])
    status, records = common.EXIT_OK, []
    for asked, lib_dir in _library_dirs(args):
        env = dict(os.environ)
        if lib_dir is not None:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, (lib_dir, env.get("LD_LIBRARY_PATH"))))
        print(f"== cuDNN {asked}", flush=True)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "support.json")
            cmd = [sys.executable, "-m", "cudnn_dsl", "support", *base, "--json", out]
            proc = subprocess.run(cmd, env=env, check=False)
            status = max(status, proc.returncode)
            got = json.loads(Path(out).read_text())["support"] if os.path.exists(out) else []
        for r in got:
            r["cudnn_asked"] = asked
            if "cudnn" in r and not matches(r["cudnn"]["version"], asked):
                raise BackendUnavailable(f"asked for cuDNN {asked}, but cuDNN {r['cudnn']['version']} answered")
        records += got
    common.write_json(args.json, {"support": records})
    return status


def run(args) -> int:
    from cudnn_dsl.run.partition import declined_whole, plan_for_target
    from cudnn_dsl.target.library import answering
    from dsl.diagnostics import DslError

    common.start_logging(args)
    if args.cudnn is not None:
        return _per_version(args)
    if args.fetch:
        raise common.UsageError("--fetch installs the versions --cudnn names: give --cudnn too")
    common.check_writable(args.json, "--json")
    sarif.check_flags(args)
    targets = _targets(args)  # an unknown name is a usage error before any work
    records, checked = [], []
    files, status = common.clean_files(args.files, checked)
    findings = [sarif.result("check", d) for d in checked]
    library = None
    work = [  # every graph and shape chosen before any is planned
        (path, g, inst)
        for path, result in files
        for g in common.select_graphs(result.program, args.graph)
        for inst in common.select_instances(g, args.shape)
    ]
    progress = Progress.of(args, total=len(work) * len(targets))
    for path, g, inst in work:
        options = g.options.with_values({"fallback": False}) if args.no_fallback else g.options
        print(f"{path}: graph {common.label(g, inst)}")
        for target in targets:
            mark = ", unverified descriptor" if target.unverified else ""
            where = f"{target.name} (sm_{target.sm_version}{mark})"
            record = {"file": path, "graph": g.name, "binding": dict(inst.binding), "target": target.name}
            records.append(record)
            try:
                with progress.item(f"{path}: {common.label(g, inst)} on {target.name}"):
                    low, partition = plan_for_target(g, inst, options, target, progress)
            except DslError as e:
                status = max(status, common.report(e))
                record["error"] = [d.to_json() for d in e.diagnostics]
                findings += [sarif.result("plan", d) for d in e.diagnostics]
                continue
            if library is None:
                library = answering()
                print(f"  answered by {library}")
            record["cudnn"] = library.to_json()
            if partition is None:
                record.update(fuses=True, plans=low.plan_count)
                print(f"  {where}: fuses — one cuDNN {library.version} graph, {low.plan_count} candidate plans")
                continue
            record.update(fuses=False, declined=partition.declined, **common.parts_record(g, partition))
            findings.append(sarif.result("split", common.split_note(g, inst, target, partition)))
            print(f"  {where}: {partition.how} — {declined_whole(partition.declined)}")
            print("".join(f"    {line}\n" for line in record["parts"]), end="")
            print(f"    {partition.counts.text}")
    common.write_json(args.json, {"support": records})
    if args.format == "sarif":
        sarif.write(args.output, findings)
    return status
