"""The local executor: worker processes on this machine, with no dependency beyond the project.

Deviceless units run in one worker per core (per cuDNN version asked, each version's workers loading its library);
tune units in one worker per GPU of the unit's type (CUDA_VISIBLE_DEVICES), so two timings never share a GPU. A
worker is `python -m cudnn_dsl.sweep.worker`, started once and reused, so the seconds it takes to load torch and
cuDNN are paid once per worker, not per unit. A worker that dies mid-unit is replaced and the unit retried for the
shapes it had not recorded; a unit past its time limit has its worker killed and is recorded as a timeout.
"""

from __future__ import annotations

import json
import os
import queue
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from cudnn_dsl.sweep.records import Record
from cudnn_dsl.sweep.units import Unit
from cudnn_dsl.sweep.worker import failure


@attrs.frozen
class Gpu:
    index: int
    name: str
    uuid: str


def local_gpus() -> list[Gpu]:
    """The GPUs nvidia-smi lists (none without the driver); torch is not imported for it."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            gpus.append(Gpu(int(parts[0]), parts[1], parts[2]))
    return gpus


def library_dir(cudnn: str) -> str:
    """The directory of the cuDNN library of version `cudnn` that a worker planning with it puts first on
    LD_LIBRARY_PATH, where the frontend looks first (as `support --cudnn` runs each version); '' for the installed
    one. BackendUnavailable when that version is not here."""
    from cudnn_dsl.target import library

    _, here = library.installed_cudnn()
    if not cudnn or (here and library.matches(here, cudnn)):
        return ""
    home = library.side_by_side(cudnn)
    if not home.is_dir():
        raise library.BackendUnavailable(
            f"cuDNN {cudnn} is not here (nothing in {home}): `cudnn-dsl support --cudnn {cudnn} --fetch FILE` "
            "installs it there"
        )
    return str(library.side_by_side_library(home))


def library_env(cudnn: str) -> dict[str, str]:
    """The environment of a local worker that plans with cuDNN `cudnn` ('' : the installed one)."""
    env = dict(os.environ)
    lib = library_dir(cudnn)
    if lib:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, (lib, env.get("LD_LIBRARY_PATH"))))
    return env


@attrs.define
class _Job:
    unit: Unit
    attempt: int
    skip: set


class LocalExecutor:
    name = "local"

    def __init__(self, workers: int | None = None, gpus: dict[str, int] | None = None, log_dir: Path | None = None):
        self.workers = workers or os.cpu_count() or 1
        """worker processes per cuDNN version for deviceless units"""
        self.gpus = gpus or {}
        """GPU type -> how many of this machine's GPUs of that type to use (0 or absent: all)"""
        self.log_dir = log_dir

    def run(
        self,
        units,
        sweep: str,
        on_record: Callable[[Record], None],
        *,
        timeout_s: float,
        retries: int,
        done: dict[str, set] | None = None,
    ) -> None:
        """Runs every unit, each shape's record handed to on_record (from several threads, one at a time)."""
        lock = threading.Lock()

        def record(r: Record) -> None:
            with lock:
                on_record(r)

        lanes: dict[tuple[str, str], list[Unit]] = {}
        for u in units:
            lanes.setdefault(u.lane, []).append(u)
        gpus = local_gpus()
        threads = []
        for (kind, which), lane in sorted(lanes.items()):
            jobs: queue.Queue = queue.Queue()
            for u in lane:
                jobs.put(_Job(u, 1, set((done or {}).get(u.id, ()))))
            if kind == "gpu":
                mine = [g for g in gpus if g.name == which][: self.gpus.get(which) or None]
                if not mine:
                    for u in lane:
                        for b in u.bindings:
                            record(
                                failure(
                                    u,
                                    b,
                                    "unschedulable",
                                    f"no GPU of type {which!r} on this machine "
                                    f"(it has: {', '.join(sorted({g.name for g in gpus})) or 'none'})",
                                    sweep,
                                    1,
                                )
                            )
                    continue
                envs = [{**os.environ, "CUDA_VISIBLE_DEVICES": g.uuid} for g in mine]
            else:
                envs = [library_env(which)] * min(self.workers, len(lane))
            slots = [
                _Slot(env, self.log_dir, f"{kind}-{which or 'installed'}-{i}".replace(" ", "_").replace("/", "_"))
                for i, env in enumerate(envs)
            ]
            for slot in slots:
                t = threading.Thread(target=slot.serve, args=(jobs, sweep, record, timeout_s, retries), daemon=True)
                t.start()
                threads.append(t)
            if kind == "cpu":  # one cuDNN version's workers at a time: the cores are the limit
                for t in threads:
                    t.join()
        for t in threads:
            t.join()


class _Slot:
    """One worker process, restarted when it dies, serving jobs from a lane's queue."""

    def __init__(self, env: dict, log_dir: Path | None, name: str):
        self.env, self.name = env, name
        self.log = (log_dir / f"{name}.log") if log_dir else None
        self.proc: subprocess.Popen | None = None
        self.buf = b""

    def serve(self, jobs: queue.Queue, sweep: str, record, timeout_s: float, retries: int) -> None:
        try:
            while True:
                try:
                    job = jobs.get_nowait()
                except queue.Empty:
                    return
                self._one(job, jobs, sweep, record, timeout_s, retries)
        finally:
            self._stop()

    def _one(self, job: _Job, jobs: queue.Queue, sweep: str, record, timeout_s: float, retries: int) -> None:
        unit = job.unit
        left = [b for b in unit.bindings if b not in job.skip]
        if not left:
            return
        self._start()
        line = {"unit": unit.to_json(), "sweep": sweep, "attempt": job.attempt, "skip": [dict(b) for b in job.skip]}
        deadline = time.monotonic() + timeout_s
        try:
            self.proc.stdin.write((json.dumps(line) + "\n").encode())
            self.proc.stdin.flush()
            while True:
                msg = self._read(deadline)
                if "done" in msg:
                    return
                r = Record.from_json(msg["record"])
                job.skip.add(tuple(sorted(r.binding.items())))
                record(r)
        except TimeoutError:
            self._stop(kill=True)
            for b in unit.bindings:
                if b not in job.skip:
                    record(
                        failure(unit, b, "timeout", f"past the unit time limit of {timeout_s:g} s", sweep, job.attempt)
                    )
        except (EOFError, BrokenPipeError, ValueError) as e:
            why = self._died(e)
            if job.attempt <= retries:
                jobs.put(_Job(unit, job.attempt + 1, job.skip))
                return
            for b in unit.bindings:
                if b not in job.skip:
                    record(
                        failure(unit, b, "error", f"{why} (attempt {job.attempt}, no retries left)", sweep, job.attempt)
                    )

    def _start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        err = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 - the worker holds it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cudnn_dsl.sweep.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=self.env,
            close_fds=True,
        )
        if err is not subprocess.DEVNULL:
            err.close()
        self.buf = b""

    def _read(self, deadline: float) -> dict:
        """The worker's next line as JSON; TimeoutError past the deadline, EOFError when the worker is gone."""
        while b"\n" not in self.buf:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError
            with selectors.DefaultSelector() as sel:
                sel.register(self.proc.stdout, selectors.EVENT_READ)
                if not sel.select(min(wait, 1.0)):
                    continue
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def _died(self, e: Exception) -> str:
        code = self.proc.wait() if self.proc else None
        self.proc = None
        if isinstance(e, ValueError):
            return f"the worker wrote something that is not a record ({e})"
        return f"the worker died (exit status {code})" + (f"; its log: {self.log}" if self.log else "")

    def _stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
