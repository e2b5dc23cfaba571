"""`run --dump DIR` writes what reproduces a run elsewhere; `run --inputs-from DIR` reads it back.

A dump holds, per shape of a graph: the .cdg file, the frontend's JSON of the graph, the plan (engine id,
knobs, serialized plan), the inputs, the outputs (on a GPU), the reference outputs, the ejected cuDNN and
torch scripts, and the environment. The inputs are loaded as tensors only (no pickled code runs), and a
dump of another graph is refused.
"""

from __future__ import annotations

import base64
import io
import json
import os
import stat
from pathlib import Path

import torch

from cudnn_dsl.run.buffers import BindingError
from cudnn_dsl.store.files import StoreProblem, atomic_write, loads, read_regular
from cudnn_dsl.store.keys import graph_digest
from dsl import files as dsl_files
from dsl.ir import Graph, Instance
from dsl.syntax.parser import MAX_SOURCE_BYTES

FORMAT = 1


def stem(graph: Graph, inst: Instance) -> str:
    """The file-name stem of one shape of a graph: 'g' or 'g.N8'."""
    return graph.name + "".join(f".{k}{v}" for k, v in inst.binding)


#: the largest manifest read back; one holds a few names and numbers
MANIFEST_LIMIT = 1 << 20
#: the largest plan read back; a serialized plan is a few hundred KiB
PLAN_LIMIT = 64 << 20
#: torch's framing of a .pt file, beyond the tensors it holds
PT_OVERHEAD = 1 << 20


class Refused(Exception):
    """A directory that would be written through a link, or that already holds what a write would replace."""


def _saved(tensors: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(
        {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else torch.tensor(v)) for k, v in tensors.items()}, buf
    )
    return buf.getvalue()


def check_new(directory: Path, names, flag: str, replace: bool, marker: tuple[str, str] | None = None) -> None:
    """Refused when write_new could not write these names into directory (a link or special file among them, or,
    unless `replace`, what the write would replace already there); a command checks before any work."""
    for name in names:
        try:
            st = os.lstat(directory / name)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise Refused(f"{flag} {directory}: {name} is {kind}; {flag} writes only regular files of its own")
    there = [marker] if marker else [(name, name) for name in names]
    for name, what in there:
        if not replace and (directory / name).exists():
            raise Refused(
                f"{flag} {directory}: it already holds {what}"
                + (f" ({name})" if what != name else "")
                + "; remove it, choose another directory, or pass --force to replace it"
            )


KINDS = ("cudnn.py", "torch.py", "inputs.pt", "reference.pt", "outputs.pt", "fe.json", "plan.json", "manifest.json")
"""the files of one shape's dump, after its stem"""


def dump_names(source: Path, graph: Graph, inst: Instance) -> list[str]:
    """Every file a dump of this shape may hold."""
    return [source.name, "environment.json", *(f"{stem(graph, inst)}.{k}" for k in KINDS)]


def check_dump(directory: Path, source: Path, graph: Graph, inst: Instance, replace: bool) -> None:
    """Refused when write could not write this shape's dump into directory."""
    marker = (f"{stem(graph, inst)}.manifest.json", "a dump of this graph")
    check_new(directory, dump_names(source, graph, inst), "--dump", replace, marker)


def write_new(
    directory: Path, files: dict[str, str | bytes], flag: str, replace: bool, marker: tuple[str, str] | None = None
) -> list[Path]:
    """Writes `files` (name -> text or bytes) into `directory` (made when missing) and returns their paths: each
    a new regular file in place of its name, so that a link planted there never redirects a write. Refused,
    with nothing written, when a name is a link or not a regular file (whoever planted it would choose what is
    replaced), and, unless `replace`, when what this write replaces is there: `marker`, (the name that says
    so, what it is), else any of the names."""
    check_new(directory, files, flag, replace, marker)
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        atomic_write(directory / name, data, follow_symlinks=False)  # a link planted since the check is replaced
    return [directory / name for name in files]


def write(
    directory: Path,
    source: Path,
    graph: Graph,
    inst: Instance,
    inputs: dict,
    reference: dict | None,
    outputs: dict | None = None,
    plan: dict | None = None,
    fe_json: str | None = None,
    environment: dict | None = None,
    *,
    options=None,
    inits=None,
    partition=None,
    replace: bool = False,
) -> list[Path]:
    """Writes one shape's dump into `directory` (made when missing); returns the files written. The ejected
    cuDNN script follows `options`, draws its inputs as `inits` say and, given the `partition` of a graph
    cuDNN declines whole, builds its parts. Every file is new, in place of a regular file at most (Refused
    otherwise, and nothing is written); `replace` lets it replace a dump of this shape already there."""
    from cudnn_dsl.interop.emit import emit_cudnn, emit_torch

    s = stem(graph, inst)
    files: dict[str, str | bytes] = {  # first: may raise
        f"{s}.cudnn.py": emit_cudnn(graph, inst, options, partition, inits),
        f"{s}.torch.py": emit_torch(graph, inst),
        source.name: dsl_files.read_regular(source, MAX_SOURCE_BYTES),
        f"{s}.inputs.pt": _saved(inputs),
    }
    for name, tensors in (("reference", reference), ("outputs", outputs)):
        if tensors is not None:
            files[f"{s}.{name}.pt"] = _saved(tensors)
    if fe_json is not None:
        files[f"{s}.fe.json"] = fe_json
    if plan is not None:
        files[f"{s}.plan.json"] = json.dumps({**plan, "blob": base64.b64encode(plan["blob"]).decode()}, indent=1)
    if environment is not None:
        files["environment.json"] = json.dumps(environment, indent=1, default=str)
    manifest = {
        "format": FORMAT,
        "file": source.name,
        "graph": graph.name,
        "binding": dict(inst.binding),
        "digest": graph_digest(graph, inst),
        "files": sorted(files),
    }
    files[f"{s}.manifest.json"] = json.dumps(manifest, indent=1)  # last: a dump is whole once its manifest is there
    check_dump(directory, source, graph, inst, replace)
    written = write_new(directory, files, "--dump", replace, (f"{s}.manifest.json", "a dump of this graph"))
    for name in set(dump_names(source, graph, inst)) - set(files):  # a replaced dump's files this one has not
        (directory / name).unlink(missing_ok=True)  # check_dump saw each is a regular file, if there
    return written


def _read(directory: Path, name: str, limit: int) -> bytes | None:
    """A dump's file, regular and at most `limit` bytes; None when missing."""
    try:
        return read_regular(directory / name, limit, "the dump's file", follow_symlinks=True)
    except StoreProblem as e:
        raise BindingError(f"--inputs-from {directory}: {e}") from None


def _manifest(directory: Path, graph: Graph, inst: Instance) -> dict:
    name = f"{stem(graph, inst)}.manifest.json"
    data = _read(directory, name, MANIFEST_LIMIT)
    if data is None:
        raise BindingError(
            f"--inputs-from {directory}: no dump of graph '{graph.name}' {dict(inst.binding) or ''} ({name} is missing)"
        )
    try:
        manifest = loads(data)
    except ValueError as e:
        raise BindingError(f"--inputs-from {directory}: {name} is not readable ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("digest") != graph_digest(graph, inst):
        raise BindingError(
            f"--inputs-from {directory}: the dump is of another graph than '{graph.name}' here "
            f"(its ops, types or shapes differ)"
        )
    return manifest


def read_tensors(directory: Path, graph: Graph, inst: Instance, what: str) -> dict[str, torch.Tensor] | None:
    """The dumped inputs, outputs or reference of one shape (None when the dump has none of `what`). A file
    holds at most what the reference holds at once, and torch's framing."""
    from cudnn_dsl.run.compare import reference_bytes

    _manifest(directory, graph, inst)
    name = f"{stem(graph, inst)}.{what}.pt"
    data = _read(directory, name, reference_bytes(graph, inst) + PT_OVERHEAD)
    if data is None:
        if what != "inputs":
            return None
        raise BindingError(f"--inputs-from {directory}: {name} is missing")
    try:
        tensors = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)  # tensors only: no code runs
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file, in any of torch's ways
        why = " ".join(str(e).split())[:200]
        raise BindingError(f"--inputs-from {directory}: {name} is not readable ({why})") from None
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise BindingError(f"--inputs-from {directory}: {name} does not hold tensors by name")
    return tensors


def read_plan(directory: Path, graph: Graph, inst: Instance) -> dict | None:
    """The dumped plan (gpu, plan_name, engine_id, knobs), None when the dump has none."""
    name = f"{stem(graph, inst)}.plan.json"
    data = _read(directory, name, PLAN_LIMIT)
    if data is None:
        return None
    try:
        plan = loads(data)
        return {
            "gpu": str(plan["gpu"]),
            "plan_name": str(plan["plan_name"]),
            "engine_id": int(plan["engine_id"]),
            "knobs": {str(k): int(v) for k, v in dict(plan["knobs"]).items()},
        }
    except (ValueError, KeyError, TypeError) as e:
        raise BindingError(f"--inputs-from {directory}: {name} is not a plan ({e})") from None


def identical(got: dict, want: dict) -> list[str]:
    """The names of the outputs that differ bit for bit."""
    return [n for n in want if n not in got or not torch.equal(got[n].detach().cpu(), want[n])]


def environment(extra: dict) -> dict:
    """What the run ran on: `extra` (GPU, driver, versions) and the cuDNN Frontend's own environment report."""
    try:
        from cudnn.collect_env import collect_env_info

        return {**extra, "collect_env": collect_env_info()}
    except Exception as e:  # noqa: BLE001 - the report is a help, not a requirement of the dump
        return {**extra, "collect_env": f"not collected: {e}"}
