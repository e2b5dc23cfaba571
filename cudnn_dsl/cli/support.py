"""`cudnn-dsl support FILE... --target h200,a100`: per graph and target GPU, whether cuDNN fuses it
whole, or where it splits and why — asked of the real cuDNN library, with no GPU."""

from __future__ import annotations

from cudnn_dsl.cli import common
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


def run(args) -> int:
    from cudnn_dsl.run.partition import plan_for_target
    from dsl.diagnostics import DslError

    common.start_logging(args)
    common.check_writable(args.json, "--json")
    targets = _targets(args)  # an unknown name is a usage error before any work
    records = []
    files, status = common.clean_files(args.files)
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
                continue
            if partition is None:
                record.update(fuses=True, plans=low.plan_count)
                print(f"  {where}: fuses — one cuDNN graph, {low.plan_count} candidate plans")
                continue
            record.update(fuses=False, declined=partition.declined, **common.parts_record(g, partition))
            print(f"  {where}: {partition.how} — cuDNN declines it whole: {partition.declined}")
            print("".join(f"    {line}\n" for line in record["parts"]), end="")
            print(f"    {partition.counts.text}")
    common.write_json(args.json, {"support": records})
    return status
