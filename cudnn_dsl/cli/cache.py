"""`cudnn-dsl cache ls|show|clear|export|import|path`: the plan store and the kernel caches."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cudnn_dsl.cli import common

HELP = "list, inspect, clear, export or import the plan store"


def register(p) -> None:
    p.add_argument("action", choices=("ls", "show", "clear", "export", "import", "path"))
    p.add_argument("arg", nargs="?", help="entry id (show), or bundle file (export, import)")
    p.add_argument("--force", action="store_true", help="import: replace plans tuned here, too")
    p.add_argument(
        "--with-kernels",
        action="store_true",
        help="import: also take the bundle's kernel caches (compiled code: only from a bundle you trust)",
    )
    p.add_argument("--json", metavar="FILE", help="write what the action found or did as JSON ('-' for stdout)")
    p.set_defaults(run=run)


def run(args) -> int:
    import attrs

    from cudnn_dsl.store import plans as store

    common.check_writable(args.json, "--json")
    if args.arg is not None and args.action not in ("show", "export", "import"):
        raise common.UsageError(f"cache {args.action} takes no argument (got {args.arg!r})")
    if (args.force or args.with_kernels) and args.action != "import":
        raise common.UsageError("--force and --with-kernels go with cache import")
    s = store.PlanStore()
    report: dict = {"action": args.action, "store": str(s.root)}
    if args.action == "path":
        print(s.root)
    elif args.action == "ls":
        rows = s.listing()
        report["entries"] = [attrs.asdict(row) for row in rows]
        for row in rows:
            print(row.line())
        if not rows:
            print(f"plan store {store.clean(str(s.root))}: empty")
    elif args.action == "show":
        if not args.arg or not store.is_entry_id(args.arg):
            raise common.UsageError("cache show takes an entry id, 32 lowercase hex digits (see `cudnn-dsl cache ls`)")
        shown = s.show(args.arg)
        if shown is None:
            raise common.UsageError(f"no entry {args.arg} in {s.root}")
        print(json.dumps(shown, indent=2))
        report["entry"] = shown
    elif args.action == "clear":
        r = s.clear()
        report["removed"] = attrs.asdict(r)
        print(
            f"removed {r.entries} entries, {r.temp_files} temporary files, {r.kernel_caches} kernel caches, "
            f"{r.searches} search records and {r.partitions} partition records from {s.root.parent}"
        )
        if r.left:
            print(f"left alone (not regular files): {', '.join(r.left)}", file=sys.stderr)
    elif args.action == "export":
        if not args.arg:
            raise common.UsageError("cache export takes a bundle file to write")
        r = s.export(Path(args.arg))
        report["exported"] = attrs.asdict(r)
        for why in r.skipped:
            print(f"skipped {why}", file=sys.stderr)
        print(f"exported {r.entries} entries and {r.kernel_caches} kernel caches to {args.arg}")
    elif args.action == "import":
        if not args.arg or not Path(args.arg).exists():
            raise common.UsageError("cache import takes an existing bundle file")
        r = s.import_(Path(args.arg), force=args.force, kernels=args.with_kernels)
        report["imported"] = attrs.asdict(r)
        print(f"imported {r.imported} entries and {r.kernel_caches} kernel caches into {s.root}")
        if r.kernel_caches_left:
            print(f"left {r.kernel_caches_left} kernel caches out: compiled code (--with-kernels takes them)")
        if r.kept:
            print(f"kept {r.kept} entries tuned here (--force replaces them)")
        if r.skipped:
            print(f"{r.skipped} entries were already here")
    common.write_json(args.json, report)
    return common.EXIT_OK
