"""Running one unit: a record per shape, in the process of whichever executor runs it.

`run_unit` yields the records as it goes, so an executor keeps the shapes done when a worker dies mid-unit. As a
program (`python -m cudnn_dsl.sweep.worker`), it is the local executor's worker: a unit per line of JSON on stdin,
a line per record and one per finished unit on stdout, until stdin closes. Everything else it would print goes to
stderr, so the protocol's lines are the only ones on stdout.
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator

from cudnn_dsl.build.planner import plan_key
from cudnn_dsl.store.keys import PlanKey, graph_digest
from cudnn_dsl.sweep.records import Record
from cudnn_dsl.sweep.units import Unit


def run_unit(unit: Unit, sweep: str, attempt: int = 1, skip: frozenset = frozenset()) -> Iterator[Record]:
    """A record per shape of the unit but those in skip (sorted (dim, value) tuples already recorded)."""
    from cudnn_dsl.store.fleet import ENV

    os.environ.pop(ENV, None)  # a worker measures: a pinned fleet store must not answer for it
    graph = graph_of(unit)
    for binding in unit.bindings:
        if binding in skip:
            continue
        inst = graph.instance(dict(binding))
        try:
            yield (_support if unit.mode == "support" else _tune)(unit, graph, inst, sweep, attempt)
        except Exception as e:  # noqa: BLE001 - a failure of this shape is its result; a retry would fail alike
            yield failure(unit, binding, "error", f"{type(e).__name__}: {e}", sweep, attempt)


@functools.lru_cache(maxsize=64)
def graph_of(unit: Unit):
    """The unit's checked graph; kept, since a driver recording why a unit's shapes failed asks once per shape."""
    from dsl.pipeline import load

    return load(text=unit.source, file=unit.file).program.graph(unit.graph)


def _version(metadata) -> str:
    try:
        return metadata.version("cudnn-dsl")
    except metadata.PackageNotFoundError:  # a checkout on the path, never installed
        return "unknown"


def provenance(sweep: str, attempt: int, device=None) -> dict:
    """Where and on what a record was made."""
    from importlib import metadata

    from cudnn_dsl.target.library import answering
    from cudnn_dsl.target.machine import environment

    env = environment(device)
    library = answering()
    out = {
        "host": socket.gethostname(),
        "cudnn": library.version,
        "cudnn_frontend": env["cudnn_frontend"],
        "cudnn_dsl": _version(metadata),
        "torch": env["torch"],
        "gpu": env["gpu"],
        "driver": env["driver"],
        "sweep": sweep,
        "attempt": attempt,
        "time": round(time.time(), 3),
        "worker": os.getpid(),
    }
    torch = sys.modules.get("torch")
    if device is not None and torch is not None:
        out["gpu_uuid"] = str(torch.cuda.get_device_properties(device).uuid)
        out["cuda"] = torch.version.cuda
    return out


def _key(graph, inst, gpu: str, cc: str) -> PlanKey:
    from cudnn_dsl.target.library import versions

    v = versions()
    return PlanKey(
        graph_digest(graph, inst), gpu, cc, v["cudnn_backend"], v["cudnn_frontend"], graph.options.constraints
    )


def _support(unit: Unit, graph, inst, sweep: str, attempt: int) -> Record:
    from cudnn_dsl.run.partition import plan_for_target
    from cudnn_dsl.target.library import BackendUnavailable, Target, answering, matches
    from dsl.diagnostics import DslError

    library = answering()
    if unit.cudnn and not matches(library.version, unit.cudnn):  # a node without that version's library
        raise BackendUnavailable(f"asked for cuDNN {unit.cudnn}, but {library} answers in this worker")
    d = json.loads(unit.descriptor)
    target = Target(unit.target, unit.descriptor, d["deviceVer"] // 10)
    key = plan_key(graph, inst, graph.options, target.name, f"{target.sm_version // 10}.{target.sm_version % 10}")
    try:
        low, partition = plan_for_target(graph, inst, graph.options, target)
    except DslError as e:
        outcome, result = "declined", {"fuses": False, "error": [x.message for x in e.diagnostics]}
    else:
        if partition is None:
            outcome, result = "ok", {"fuses": True, "plans": low.plan_count}
        else:
            outcome = "declined"
            result = {
                "fuses": False,
                "declined": partition.declined,
                "how": partition.how,
                "parts": partition.lines(graph),
            }
    return Record("support", key, graph.name, dict(inst.binding), unit.id, outcome, result, provenance(sweep, attempt))


def _tune(unit: Unit, graph, inst, sweep: str, attempt: int) -> Record:
    """Times every candidate (or searches every engine and knob) on this process's GPU, in a store of its own: the
    worker changes no store; its record is what merges."""
    import base64

    import torch

    from cudnn_dsl.run.compiled import CompiledGraph
    from cudnn_dsl.store.plans import PlanStore
    from cudnn_dsl.tune.heuristics import exhaustive, tune

    device = torch.cuda.current_device()
    gpu = torch.cuda.get_device_name(device)
    major, minor = torch.cuda.get_device_capability(device)
    key = plan_key(graph, inst, graph.options, gpu, f"{major}.{minor}")
    with tempfile.TemporaryDirectory(prefix="cudnn-dsl-sweep-") as d:
        store = PlanStore(os.path.join(d, "plans"))
        cg = CompiledGraph(graph, graph.options, device, store=store)
        try:
            if unit.mode == "exhaustive":
                r = exhaustive(cg, inst, budget_s=unit.budget_s)
                times = [r.winner.median_us] if r.winner and r.winner.median_us else []  # a search keeps medians
            else:
                r = tune(cg, inst)
                times = r.winner.times_us if r.winner else []
            check = r.check
        except torch.cuda.OutOfMemoryError as e:
            return _failed(unit, key, graph, inst, "oom", str(e), sweep, attempt, device)
        if not times:
            outcome = "mismatch" if check else "declined"
            return _failed(unit, key, graph, inst, outcome, check or "no plan built and ran", sweep, attempt, device)
        entry = store.get(key)
        if entry is None:
            return _failed(unit, key, graph, inst, "error", "the winner was not stored", sweep, attempt, device)
    result = {
        "plan_name": entry.plan_name,
        "engine_id": entry.engine_id,
        "knobs": entry.knobs,
        "workspace": entry.workspace,
        "blob": base64.b64encode(entry.blob).decode(),
        "blob_sha256": entry.to_json()["blob_sha256"],
        "samples_us": [round(t, 3) for t in times],
        "p50_us": round(statistics.median(times), 3),
        "p90_us": round(_quantile(times, 0.9), 3),
        "check": {"passed": True, "text": check},
    }
    return Record(
        unit.mode, key, graph.name, dict(inst.binding), unit.id, "ok", result, provenance(sweep, attempt, device)
    )


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(q * len(s)) - 1)]


def _failed(unit, key, graph, inst, outcome, why, sweep, attempt, device=None) -> Record:
    return Record(
        unit.mode,
        key,
        graph.name,
        dict(inst.binding),
        unit.id,
        outcome,
        {"error": str(why)[:2000]},
        provenance(sweep, attempt, device),
    )


def failure(unit: Unit, binding: tuple, outcome: str, why: str, sweep: str, attempt: int) -> Record:
    """The record of a shape the executor could not get a record for (timeout, error, unschedulable): keyed by the
    graph's digest and the unit's GPU type or target, the versions left unknown (0, '')."""
    graph = graph_of(unit)
    inst = graph.instance(dict(binding))
    key = PlanKey(graph_digest(graph, inst), unit.target, "", 0, "", graph.options.constraints)
    prov = {"host": socket.gethostname(), "sweep": sweep, "attempt": attempt, "time": round(time.time(), 3)}
    return Record(unit.mode, key, graph.name, dict(binding), unit.id, outcome, {"error": why[:2000]}, prov)


def main() -> None:
    """The local executor's worker loop (see the module's docstring)."""
    # The protocol gets a descriptor of its own; fd 1 becomes stderr, so that what cuDNN's C code, torch or a
    # warning prints (at the C level too) never lands among the protocol's lines.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        job = json.loads(line)
        unit = Unit.from_json(job["unit"])
        skip = frozenset(tuple(sorted((k, int(v)) for k, v in b.items())) for b in job.get("skip", []))
        for record in run_unit(unit, job["sweep"], job["attempt"], skip):
            out.write(json.dumps({"record": record.to_json()}) + "\n")
            out.flush()
        out.write(json.dumps({"done": unit.id}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
