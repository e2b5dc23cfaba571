"""`cudnn-dsl cache ls|show|clear|export|import|path|verify|pull|sign`: the plan store, the kernel caches, and the
fleet stores a deployment pins."""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

from cudnn_dsl.cli import common

HELP = "list, inspect, clear, export or import the plan store; verify, pull from or sign a fleet store"

LOCAL = ("ls", "show", "clear", "export", "import", "path")
FLEET = ("verify", "pull", "sign")
FLAGS = {
    "force": ("import", "pull"),
    "with_kernels": ("import",),
    "trusted_keys": ("verify", "pull"),
    "key": ("sign",),
    "gpu": ("pull", "verify"),
    "graphs": ("pull",),
    "coverage": ("verify",),
}
"""which actions each flag goes with"""


def register(p) -> None:
    p.add_argument("action", choices=LOCAL + FLEET)
    p.add_argument(
        "arg",
        nargs="?",
        help="entry id (show), bundle file (export, import), or fleet store STORE[@sha256:DIGEST] (verify, pull and "
        "sign take a pinned one; STORE: a path, file://, http(s):// or any fsspec URL)",
    )
    p.add_argument("--force", action="store_true", help="import, pull: replace plans tuned here, too")
    p.add_argument(
        "--with-kernels",
        action="store_true",
        help="import: also take the bundle's kernel caches (compiled code: only from a bundle you trust)",
    )
    p.add_argument(
        "--trusted-keys",
        metavar="FILE",
        help="verify, pull: 'ssh-ed25519 AAAA... name' lines of the keys whose signatures you trust (default "
        "$CUDNN_DSL_TRUSTED_KEYS); pull keeps a trusted manifest's serialized plans loadable as they are",
    )
    p.add_argument("--key", metavar="FILE", help="sign: an unencrypted Ed25519 private key (ssh-keygen -t ed25519)")
    p.add_argument(
        "--gpu",
        metavar="auto|NAME",
        help="pull: the GPU type whose plans to copy, as nvidia-smi names it ('NVIDIA H200'); auto: this machine's; "
        "verify --coverage: the GPU type to report (default: every GPU type of the manifest)",
    )
    p.add_argument("--graphs", nargs="+", metavar="GLOB", help="pull: only the plans of the graphs of these .cdg files")
    p.add_argument(
        "--coverage",
        nargs="+",
        metavar="FILE",
        help="verify: list which (graph, shape, GPU) of these .cdg files the manifest has a tuned plan for; a "
        "missing one fails the command",
    )
    p.add_argument("--json", metavar="FILE", help="write what the action found or did as JSON ('-' for stdout)")
    p.set_defaults(run=run)


def run(args) -> int:
    from cudnn_dsl.store import plans as store

    common.check_writable(args.json, "--json")
    if args.arg is not None and args.action not in ("show", "export", "import", *FLEET):
        raise common.UsageError(f"cache {args.action} takes no argument (got {args.arg!r})")
    for flag, actions in FLAGS.items():
        if getattr(args, flag) and args.action not in actions:
            name = "--" + flag.replace("_", "-")
            raise common.UsageError(f"{name} goes with cache {' and cache '.join(actions)}")
    s = store.PlanStore()
    report: dict = {"action": args.action, "store": str(s.root)}
    status = {"verify": _verify, "pull": _pull, "sign": _sign}.get(args.action, _local)(args, s, report)
    common.write_json(args.json, report)
    return status


def _local(args, s, report: dict) -> int:
    import attrs

    from cudnn_dsl.store import plans as store

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
        if not args.arg:
            raise common.UsageError("cache import takes a bundle file")
        r = s.import_(Path(args.arg), force=args.force, kernels=args.with_kernels)
        report["imported"] = attrs.asdict(r)
        print(f"imported {r.imported} entries and {r.kernel_caches} kernel caches into {s.root}")
        if r.kernel_caches_left:
            print(f"left {r.kernel_caches_left} kernel caches out: compiled code (--with-kernels takes them)")
        if r.kept:
            print(f"kept {r.kept} entries tuned here (--force replaces them)")
        if r.skipped:
            print(f"{r.skipped} entries were already here")
    return common.EXIT_OK


def _where(args, pinned: bool) -> tuple[str, str | None]:
    """(URL, digest) of the fleet store argument; a usage error when it is missing or (pinned) has no digest."""
    from cudnn_dsl.store.files import StoreProblem
    from cudnn_dsl.store.fleet import parse_where

    form = "STORE@sha256:DIGEST" if pinned else "STORE[@sha256:DIGEST]"
    if not args.arg:
        raise common.UsageError(f"cache {args.action} takes a fleet store, {form}")
    try:
        url, digest = parse_where(args.arg, f"cache {args.action}:")
    except StoreProblem as e:
        raise common.UsageError(str(e)) from None
    if pinned and digest is None:
        raise common.UsageError(f"cache {args.action} takes a pinned manifest, {form} (sweep merge prints it)")
    return url, digest


def _trusted(args) -> str | None:
    from cudnn_dsl.store.signing import trusted_keys_file

    path = args.trusted_keys or trusted_keys_file()
    if args.trusted_keys and not Path(path).is_file():
        raise common.UsageError(f"--trusted-keys {path}: no such file")
    return path


def _verify(args, s, report: dict) -> int:
    import attrs

    from cudnn_dsl.sweep.audit import coverage, verify

    url, digest = _where(args, pinned=False)
    v = verify(url, digest, _trusted(args))
    m = v.manifest
    print(f"manifest sha256:{v.digest} of {v.url}: {len(m['plans'])} plans, {len(m['support'])} support answers")
    print(f"  entries       {v.entries} checked whole")
    print(f"  measurements  {'not checked' if v.measurements is None else f'{v.measurements} checked whole'}")
    print(f"  signature     {v.signature.text}")
    for line in v.notes:
        print(f"  note          {line}")
    for line in v.problems:
        print(f"  damaged       {line}", file=sys.stderr)
    report["verify"] = {
        "manifest": f"sha256:{v.digest}",
        "url": v.url,
        **{k: getattr(v, k) for k in ("entries", "measurements", "problems", "notes")},
        "signature": attrs.asdict(v.signature),
    }
    missing = 0
    if args.coverage:
        graphs = _graphs(args.coverage)
        rows = coverage(m, graphs, sorted(_gpus(args.gpu)) if args.gpu else None)
        for row in rows:
            print(f"  {row.line()}")
        missing = sum(not row.cudnn for row in rows)
        print(f"coverage: {len(rows) - missing} of {len(rows)} (graph, shape, GPU) have a tuned plan")
        report["coverage"] = [attrs.asdict(row) for row in rows]
    return common.EXIT_FAIL if v.damaged or missing else common.EXIT_OK


def _graphs(patterns: list[str]) -> list[tuple[str, object]]:
    """(file, graph) of every graph of the files the globs match; a usage error for one that matches none or does
    not check."""
    out = []
    for pattern in patterns:
        files = sorted(glob.glob(pattern, recursive=True)) or ([pattern] if Path(pattern).is_file() else [])
        if not files:
            raise common.UsageError(f"{pattern}: matches no file")
        for file in files:
            result = common.load_file(file)
            if not result.ok:
                raise common.UsageError(f"{file} does not check (the errors are above)")
            out += [(file, g) for g in result.program.graphs]
    return out


def _pull(args, s, report: dict) -> int:
    import attrs

    from cudnn_dsl.store.fleet import Pin, pull
    from cudnn_dsl.store.keys import graph_digest

    url, digest = _where(args, pinned=True)
    if not args.gpu:
        raise common.UsageError("cache pull takes --gpu auto, or the GPU type ('NVIDIA H200')")
    gpus = _gpus(args.gpu)
    digests = {graph_digest(g, i) for _, g in _graphs(args.graphs) for i in g.instances} if args.graphs else None
    r = pull(Pin(url, digest), gpus, digests, s, _trusted(args), args.force)
    report["pulled"] = {**attrs.asdict(r), "gpus": sorted(gpus)}
    how = f"loadable as they are (signed by {r.signer})" if r.signer else "rebuilt from engine id + knobs on first use"
    print(f"pulled {r.written} plans for {', '.join(sorted(gpus))} into {s.root}: {how}")
    if r.same:
        print(f"{r.same} were already here")
    if r.kept:
        print(f"kept {r.kept} plans tuned here (--force replaces them)")
    print(f"left {r.left} plans of other GPUs{' or graphs' if digests is not None else ''}")
    return common.EXIT_OK


def _gpus(gpu: str) -> set[str]:
    """--gpu NAME, or auto: the GPU types nvidia-smi lists (a usage error when it lists none)."""
    from cudnn_dsl.sweep.local import local_gpus

    if gpu != "auto":
        return {gpu}
    names = {g.name for g in local_gpus()}
    if not names:
        raise common.UsageError(
            "--gpu auto: nvidia-smi lists no GPU on this machine; name the GPU type, --gpu 'NVIDIA H200'"
        )
    return names


def _sign(args, s, report: dict) -> int:
    from cudnn_dsl.store import signing
    from cudnn_dsl.store.fleet import read_manifest
    from cudnn_dsl.store.remote import open_tree

    url, digest = _where(args, pinned=True)
    if not args.key:
        raise common.UsageError("cache sign takes --key FILE, an Ed25519 private key")
    tree = open_tree(url)
    read_manifest(tree, digest)  # a signature vouches for a manifest that is there and matches its digest
    line = signing.sign(tree, digest, args.key)
    report["signed"] = {"manifest": f"sha256:{digest}", "key": line, "fingerprint": signing.fingerprint(line)}
    print(
        f"signed manifest sha256:{digest} with {signing.fingerprint(line)}: {tree.join(signing.signature_name(digest))}"
    )
    return common.EXIT_OK
