"""`run --dump DIR` writes what reproduces a run elsewhere; `run --inputs-from DIR` reads it back.

A dump holds, per shape of a graph: the .cdg file, the frontend's JSON of the graph, the plan (engine id,
knobs, serialized plan), the inputs, the outputs (on a GPU), the reference outputs, the ejected cuDNN and
torch scripts, and the environment. The inputs are loaded as tensors only (no pickled code runs), and a
dump of another graph is refused.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import torch

from cudnn_dsl.run.buffers import BindingError
from cudnn_dsl.store.files import atomic_write
from cudnn_dsl.store.keys import graph_digest
from dsl.ir import Graph, Instance

FORMAT = 1


def stem(graph: Graph, inst: Instance) -> str:
    """The file-name stem of one shape of a graph: 'g' or 'g.N8'."""
    return graph.name + "".join(f".{k}{v}" for k, v in inst.binding)


def _save(tensors: dict, path: Path) -> None:
    torch.save(
        {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else torch.tensor(v)) for k, v in tensors.items()}, path
    )


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
) -> list[Path]:
    """Writes one shape's dump into `directory` (made when missing); returns the files written. The ejected
    cuDNN script follows `options`, draws its inputs as `inits` say and, given the `partition` of a graph
    cuDNN declines whole, builds its parts."""
    from cudnn_dsl.interop.emit import emit_cudnn, emit_torch

    s = stem(graph, inst)
    texts = {  # first: may raise
        f"{s}.cudnn.py": emit_cudnn(graph, inst, options, partition, inits),
        f"{s}.torch.py": emit_torch(graph, inst),
    }
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    cdg = directory / source.name
    if not cdg.exists() or cdg.read_bytes() != source.read_bytes():
        shutil.copyfile(source, cdg)
    written.append(cdg)
    _save(inputs, directory / f"{s}.inputs.pt")
    written.append(directory / f"{s}.inputs.pt")
    for name, tensors in (("reference", reference), ("outputs", outputs)):
        if tensors is not None:
            _save(tensors, directory / f"{s}.{name}.pt")
            written.append(directory / f"{s}.{name}.pt")
    if fe_json is not None:
        texts[f"{s}.fe.json"] = fe_json
    if plan is not None:
        texts[f"{s}.plan.json"] = json.dumps({**plan, "blob": base64.b64encode(plan["blob"]).decode()}, indent=1)
    if environment is not None:
        texts["environment.json"] = json.dumps(environment, indent=1, default=str)
    manifest = {
        "format": FORMAT,
        "file": source.name,
        "graph": graph.name,
        "binding": dict(inst.binding),
        "digest": graph_digest(graph, inst),
        "files": sorted({p.name for p in written} | set(texts)),
    }
    texts[f"{s}.manifest.json"] = json.dumps(manifest, indent=1)
    for name, text in texts.items():
        atomic_write(directory / name, text)
        written.append(directory / name)
    return written


def _manifest(directory: Path, graph: Graph, inst: Instance) -> dict:
    path = directory / f"{stem(graph, inst)}.manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise BindingError(
            f"--inputs-from {directory}: no dump of graph '{graph.name}' {dict(inst.binding) or ''} "
            f"({path.name} is missing)"
        ) from None
    except (OSError, ValueError) as e:
        raise BindingError(f"--inputs-from {directory}: {path.name} is not readable ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("digest") != graph_digest(graph, inst):
        raise BindingError(
            f"--inputs-from {directory}: the dump is of another graph than '{graph.name}' here "
            f"(its ops, types or shapes differ)"
        )
    return manifest


def read_tensors(directory: Path, graph: Graph, inst: Instance, what: str) -> dict[str, torch.Tensor] | None:
    """The dumped inputs, outputs or reference of one shape (None when the dump has none of `what`)."""
    _manifest(directory, graph, inst)
    path = directory / f"{stem(graph, inst)}.{what}.pt"
    if not path.is_file():
        if what != "inputs":
            return None
        raise BindingError(f"--inputs-from {directory}: {path.name} is missing")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)  # tensors only: no pickled code runs
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file, in any of torch's ways
        why = " ".join(str(e).split())[:200]
        raise BindingError(f"--inputs-from {directory}: {path.name} is not readable ({why})") from None
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise BindingError(f"--inputs-from {directory}: {path.name} does not hold tensors by name")
    return data


def read_plan(directory: Path, graph: Graph, inst: Instance) -> dict | None:
    """The dumped plan (gpu, plan_name, engine_id, knobs), None when the dump has none."""
    path = directory / f"{stem(graph, inst)}.plan.json"
    if not path.exists():
        return None
    try:
        plan = json.loads(path.read_text())
        return {
            "gpu": str(plan["gpu"]),
            "plan_name": str(plan["plan_name"]),
            "engine_id": int(plan["engine_id"]),
            "knobs": {str(k): int(v) for k, v in dict(plan["knobs"]).items()},
        }
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BindingError(f"--inputs-from {directory}: {path.name} is not a plan ({e})") from None


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
