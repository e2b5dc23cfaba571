"""What the sweep fault tests share: a spec of real deviceless units, a Ray cluster on loopback, the sockets a
process tree listens on, and the checks that every shape has one record and nothing is left half-written."""

import base64
import hashlib
import ipaddress
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from cudnn_dsl.sweep import records as rec


def tune_record(
    key, graph: str, binding: dict, blob: bytes, engine: int, p50: float, host: str, passed=True, knobs=None
):
    """What a tune unit records for one shape: a checked (or failed) plan timed at p50 µs by host's GPU."""
    result = {
        "plan_name": f"eng{engine}",
        "engine_id": engine,
        "knobs": knobs or {},
        "workspace": 0,
        "blob": base64.b64encode(blob).decode(),
        "blob_sha256": hashlib.sha256(blob).hexdigest(),
        "samples_us": [p50],
        "p50_us": p50,
        "p90_us": p50,
        "check": {"passed": passed, "text": ""},
    }
    prov = {"host": host, "gpu_uuid": f"GPU-{host}", "time": 1.0}
    return rec.Record("tune", key, graph, binding, "b" * 64, "ok", result, prov)


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TARGETS = ("h200", "a100", "l40s")
LOOPBACK = {"node_ip_address": "127.0.0.1", "include_dashboard": False}
"""with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the environment before ray is imported: every socket on 127.0.0.1"""
FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
"""a removed node is seen dead in ~2 s, not Ray's ~15 s"""
DRIVER = """
import os, signal, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from cudnn_dsl import sweep
from sweep_util import Hooked
spec, executor, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
work = sweep.plan(sweep.Spec.load(spec))
real = sweep.LocalExecutor(workers=1) if executor == "local" else sweep.RayExecutor(address=executor)
sweep.run(work, Hooked(real, n, lambda: os.kill(os.getpid(), signal.SIGKILL)))
"""
"""a sweep's driver that SIGKILLs itself right after its n-th record is in staging"""


class Hooked:
    """A real executor whose records pass `act` first, from the n-th on, until it says it acted."""

    def __init__(self, executor, n: int, act):
        self.executor, self.n, self.act = executor, n, act
        self.acted_at = None

    def run(self, units, sweep_id, on_record, **kw):
        seen = 0

        def hooked(r):
            nonlocal seen
            on_record(r)
            seen += 1
            if self.acted_at is None and seen >= self.n and self.act():
                self.acted_at = seen

        self.executor.run(units, sweep_id, hooked, **kw)


def import_ray():
    """Ray, imported so that every node it starts in this process listens on 127.0.0.1 only (Ray reads
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when it is imported); the test is skipped without Ray."""
    import pytest

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return pytest.importorskip("ray")


def support_spec(tmp_path: Path, extra: str = "", targets=TARGETS) -> Path:
    """dynamic_shapes.cdg (4 shapes, one unit per target) and sdpa.cdg (1 shape), on three targets: 6 units."""
    p = tmp_path / "sweep.toml"
    p.write_text(
        f"""
[sweep]
name = "faults"
graphs = ["{EXAMPLES}/dynamic_shapes.cdg", "{EXAMPLES}/sdpa.cdg"]
store = "store"
{extra}
[plan_targets]
targets = {list(targets)!r}
""".replace("'", '"')
    )
    return p


def shapes_of(work) -> set[tuple[str, str]]:
    import json

    return {(u.id, json.dumps(dict(b), sort_keys=True)) for u in work.units for b in u.bindings}


def recorded_once(staging: Path, work) -> list[rec.Record]:
    """Every record of the staging directory, after checking that each shape of the work has exactly one."""
    records, damaged = rec.read_all(staging)
    assert not damaged, damaged
    counts = Counter((r.unit, _binding(r)) for r in records)
    assert set(counts) == shapes_of(work), set(counts) ^ shapes_of(work)
    twice = [k for k, n in counts.items() if n > 1]
    assert not twice, f"shapes recorded more than once: {twice}"
    return records


def _binding(r) -> str:
    import json

    return json.dumps(r.binding, sort_keys=True)


def no_temp_files(*roots: Path) -> None:
    """Nothing a writer left half-done: no temporary or hidden file but a store's lock file, which stays."""
    from cudnn_dsl.store.files import LOCK_NAME

    left = [
        p
        for root in roots
        for p in root.rglob("*")
        if p.name.endswith(".tmp") or (p.name.startswith(".") and p.name != LOCK_NAME)
    ]
    assert not left, left


def record_files(staging: Path) -> set[str]:
    return {p.name for p in (staging / "measurements").rglob("*.json")}


def kill_driver_after(spec: Path, executor: str, staging: Path, n: int, env: dict, limit_s: float = 240) -> set[str]:
    """Runs a sweep's driver in a process of its own, SIGKILLed right after its n-th record; the records then."""
    cmd = [sys.executable, "-c", DRIVER, __file__, str(spec), executor, str(n)]
    proc = subprocess.run(cmd, env=env, timeout=limit_s, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    return record_files(staging)


def processes(marker: bytes) -> list[int]:
    """The processes whose command line holds marker: b"ray::sweep_unit" for Ray's workers running a sweep unit
    now (Ray names a worker by the task it runs), b"cudnn_dsl.sweep.worker" for the local executor's."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo += children.get(p, [])
    return out


def listening(pids: set[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every TCP socket these processes listen on, as /proc/net gives them."""
    inodes = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A":  # LISTEN
                inodes[f[9]] = _address(f[1])
    out = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                out.append((pid, inodes[target[8:-1]]))
    return out


def _address(hex_addr: str) -> str:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    # /proc/net writes each 32-bit word of the address in the host's (little-endian) order
    host = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
    return f"{host}:{int(port, 16)}"


def off_loopback(pids: set[int]) -> list[tuple[int, str]]:
    def loopback(a: str) -> bool:
        host = ipaddress.ip_address(a.rsplit(":", 1)[0])
        return host.is_loopback or bool(getattr(host, "ipv4_mapped", None) and host.ipv4_mapped.is_loopback)

    return [(pid, a) for pid, a in listening(pids) if not loopback(a)]
