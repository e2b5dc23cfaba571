"""`cudnn-dsl cache ls|show|clear|export|import|path`: the plan store."""

from __future__ import annotations

import json
import time
from pathlib import Path

from cudnn_dsl.cli import common

HELP = "list, inspect, clear, export or import the plan store"


def register(p) -> None:
    p.add_argument("action", choices=("ls", "show", "clear", "export", "import", "path"))
    p.add_argument("arg", nargs="?", help="entry id (show), or bundle file (export, import)")
    p.set_defaults(run=run)


def run(args) -> int:
    from cudnn_dsl.store import PlanStore

    store = PlanStore()
    if args.action == "path":
        print(store.root)
    elif args.action == "ls":
        rows = store.entries()
        if not rows:
            print(f"plan store {store.root}: empty")
        for p, d in rows:
            if d is None:
                print(f"{p.stem}  (unreadable: will be rebuilt on use)")
                continue
            k = d.get("key", {})
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(d.get("created", 0)))
            print(
                f"{p.stem}  {d.get('graph', '?'):20} {d.get('plan_name', '?')[:40]:40} "
                f"{'tuned' if d.get('tuned') else 'heuristic':9} {k.get('gpu', '?')} cuDNN {k.get('cudnn_backend', '?')} {when}"
            )
    elif args.action == "show":
        if not args.arg:
            raise common.UsageError("cache show takes an entry id (see `cudnn-dsl cache ls`)")
        p = store.root / f"{args.arg}.json"
        if not p.exists():
            raise common.UsageError(f"no entry {args.arg} in {store.root}")
        d = json.loads(p.read_text())
        d["blob"] = f"<{len(d.get('blob', '')) * 3 // 4} bytes>"
        print(json.dumps(d, indent=2))
    elif args.action == "clear":
        print(f"removed {store.clear()} entries from {store.root}")
    elif args.action == "export":
        if not args.arg:
            raise common.UsageError("cache export takes a bundle file to write")
        print(f"exported {store.export(Path(args.arg))} entries to {args.arg}")
    elif args.action == "import":
        if not args.arg or not Path(args.arg).is_file():
            raise common.UsageError("cache import takes an existing bundle file")
        print(f"imported {store.import_(Path(args.arg))} entries into {store.root}")
    return common.EXIT_OK
