"""The Ray executor: a sweep's units as Ray Core tasks on a cluster (the `ray` extra: pip install 'cudnn-dsl[ray]').

A deviceless unit is a task of one CPU, in a worker that loads the cuDNN version the unit plans with (its library's
directory as the worker's LD_LIBRARY_PATH); a tune unit is a task of one GPU of its type, routed by the resource
`accelerator_type:<T>` that Ray gives a node with such GPUs. A unit's shapes run in one task, so the kernel cache of
a dynamic-shape graph serves the whole group, and Ray reuses a worker for later tasks of the same kind, so the
seconds it takes to load torch and cuDNN are paid once per worker.

A task sends each record back as it is made (a generator task), and Ray does not retry it: when its worker or node
is lost, the driver submits the unit again for the shapes it has no record of, up to `retries` more times. A unit
running past its time limit is cancelled (its worker killed) and recorded as a timeout; a unit that no node of the
cluster can run is recorded as unschedulable at once, or as soon as the last node that could run it leaves.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator

import attrs

from cudnn_dsl.sweep.local import library_dir
from cudnn_dsl.sweep.records import Record
from cudnn_dsl.sweep.units import Unit
from cudnn_dsl.sweep.worker import failure, run_unit
from cudnn_dsl.target.library import BackendUnavailable

LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""'0' makes Ray's lookup of this node's address answer 127.0.0.1: without it a Ray started here listens on every
interface. Ray reads it once, when it is imported."""
LOOK_S = 2.0
"""seconds between looks at the cluster's nodes, for units that no node left can run"""
TOKEN = 0.001
"""how much of `accelerator_type:<T>` a task asks, as Ray's own `accelerator_type=` does: the node's GPUs, not this
resource, bound how many tasks run there"""

_log = logging.getLogger(__name__)

_GPU_MODEL = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")


def accelerator_type(gpu: str) -> str:
    """The GPU type as Ray names it on a node with such GPUs: the model in the name torch and nvidia-smi give
    ('NVIDIA H200' -> 'H200', 'NVIDIA A100-SXM4-80GB' -> 'A100'), else the name after the vendor, hyphenated
    ('NVIDIA GeForce RTX 4090' -> 'GeForce-RTX-4090')."""
    m = _GPU_MODEL.match(gpu)
    if m and len(m.group(1)) > 1:
        return m.group(1).replace(" ", "-")
    return re.sub(r"^NVIDIA\s+", "", gpu).strip().replace(" ", "-")


def demand(lane: tuple[str, str]) -> dict[str, float]:
    """What one task of a lane (Unit.lane) takes of a node: a CPU, or a GPU of the lane's type and a CPU."""
    kind, which = lane
    if kind == "cpu":
        return {"CPU": 1.0}
    return {"CPU": 1.0, "GPU": 1.0, f"accelerator_type:{accelerator_type(which)}": TOKEN}


def task_options(lane: tuple[str, str]) -> dict:
    """The Ray task options of a lane's units: its demand, and for a deviceless lane of a cuDNN other than the
    installed one, that library's directory as LD_LIBRARY_PATH (alone: an empty entry would be the worker's
    directory). Every node must hold that library at the same path; where one does not, the worker's own check
    records the unit's shapes as errors naming the cuDNN that answered."""
    need = dict(demand(lane))
    options = {"num_cpus": need.pop("CPU"), "num_gpus": need.pop("GPU", 0.0), "resources": need}
    lib = library_dir(lane[1]) if lane[0] == "cpu" else ""
    if lib:
        options["runtime_env"] = {"env_vars": {"LD_LIBRARY_PATH": lib}}
    return options


def sweep_unit(unit: Unit, sweep: str, attempt: int, skip: frozenset) -> Iterator[float | Record]:
    """A task's body: the time it starts (the unit's time limit counts from then, not from its submission), then
    the record of each shape not in skip as it is made."""
    yield time.time()
    yield from run_unit(unit, sweep, attempt, skip)


@attrs.define
class _Flight:
    unit: Unit
    attempt: int
    skip: set
    """the shapes recorded, over every attempt"""
    task: object = None
    """the task's stream of messages (a Ray ObjectRefGenerator)"""
    deadline: float = math.inf
    """a unit waiting for a node has no time limit yet"""


class RayExecutor:
    name = "ray"

    def __init__(self, address: str | None = None, say: Callable[[str], None] | None = None):
        self.address = address
        """None: a Ray instance started on this machine for the sweep, listening on 127.0.0.1 only; 'auto': the
        cluster this machine belongs to; 'host:port': the cluster of that head node; 'ray://host:port': through
        Ray Client. A process already connected to Ray sweeps on that connection."""
        self.say = say or _log.warning
        """where each warning Ray logs while it starts or connects goes, as one line (its first sentence) instead
        of Ray's own stamped record; by default this module's logger"""

    def run(
        self,
        units: Iterable[Unit],
        sweep: str,
        on_record: Callable[[Record], None],
        *,
        timeout_s: float,
        retries: int,
        done: dict[str, set] | None = None,
    ) -> None:
        """Runs every unit, each shape's record handed to on_record (in this thread) as it arrives."""
        ray = _import_ray(self.address)
        started_here = self._connect(ray)
        try:
            _Driver(ray, sweep, on_record, timeout_s, retries).run(units, done or {})
        finally:
            if started_here:
                ray.shutdown()

    def _connect(self, ray) -> bool:
        """Joins (or starts) the cluster unless this process is connected already; whether it did."""
        if ray.is_initialized():
            return False
        quiet = {"log_to_driver": False, "logging_level": logging.WARNING}  # worker output stays in Ray's logs
        try:
            if self.address is None and os.environ.get(LOOPBACK_ONLY) != "0":
                raise BackendUnavailable(
                    f"Ray was imported before {LOOPBACK_ONLY}=0 was set, so a Ray started here would listen on "
                    "every interface: set it before Ray is imported, or pass the address of a cluster"
                )
            with _warnings_to(self.say):
                if self.address is None:
                    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, **quiet)
                else:
                    ray.init(address=self.address, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = f"the Ray cluster at {self.address}" if self.address else "a Ray instance on this machine"
            raise BackendUnavailable(f"cannot reach {where}: {e}") from None
        return True


class _Warnings(logging.Filter):
    """Keeps the first sentence of each distinct warning a handler is given, and lets none through."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            line = re.split(r"(?<=\.)\s", record.getMessage().strip(), maxsplit=1)[0]
            if line not in self.lines:
                self.lines.append(line)
        return False


@contextlib.contextmanager
def _warnings_to(say: Callable[[str], None]) -> Iterator[None]:
    """Ray's log handlers print nothing meanwhile (they would stamp each record with a time and Ray's file:line);
    each warning they were given goes to `say` as one line, after."""
    caught = _Warnings()
    handlers = list(logging.getLogger("ray").handlers)
    for h in handlers:
        h.addFilter(caught)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(caught)
        for line in caught.lines:
            say(line)


def _import_ray(address: str | None):
    if address is None:  # a Ray started here listens on loopback only (read when ray is imported)
        os.environ.setdefault(LOOPBACK_ONLY, "0")
    try:
        import ray
    except ImportError:
        raise BackendUnavailable("the Ray executor needs Ray: pip install 'cudnn-dsl[ray]'") from None
    return ray


@functools.cache
def _remote(ray):
    # the driver retries a lost unit itself, for the shapes not yet recorded
    return ray.remote(max_retries=0)(sweep_unit)


class _Driver:
    """One sweep's tasks in flight: submitted, read as their messages arrive, retried, timed out, or found
    unschedulable."""

    def __init__(self, ray, sweep: str, on_record, timeout_s: float, retries: int):
        self.ray, self.sweep, self.on_record = ray, sweep, on_record
        self.timeout_s, self.retries = timeout_s, retries
        self.flights: dict[int, _Flight] = {}
        """by the id of the flight's task"""
        self.options: dict[tuple[str, str], dict] = {}
        self.nodes = self._alive_nodes()

    def run(self, units: Iterable[Unit], done: dict[str, set]) -> None:
        for u in units:
            self._submit(_Flight(u, 1, set(done.get(u.id, ()))))
        looked = time.monotonic()
        while self.flights:
            soonest = min(f.deadline for f in self.flights.values())
            wait = max(0.0, min(LOOK_S, soonest - time.monotonic()))
            ready, _ = self.ray.wait([f.task for f in self.flights.values()], num_returns=1, timeout=wait)
            now = time.monotonic()
            for f in [f for f in self.flights.values() if f.deadline <= now]:  # first: a record read late is late
                self._drop(f, "timeout", f"past the unit time limit of {self.timeout_s:g} s")
            for task in ready:
                if id(task) in self.flights:
                    self._next(self.flights[id(task)])
            if now - looked >= LOOK_S:
                looked = now
                self._look()

    def _submit(self, f: _Flight) -> None:
        if all(b in f.skip for b in f.unit.bindings):
            return
        lane = f.unit.lane
        if not self._runs_somewhere(lane):
            self._fail(f, "unschedulable", self._nowhere(lane))
            return
        if lane not in self.options:
            self.options[lane] = task_options(lane)
        f.task = (
            _remote(self.ray).options(**self.options[lane]).remote(f.unit, self.sweep, f.attempt, frozenset(f.skip))
        )
        self.flights[id(f.task)] = f

    def _next(self, f: _Flight) -> None:
        """Takes the task's next message: its start, a record, its end, or how it was lost."""
        exceptions = self.ray.exceptions
        try:
            msg = self.ray.get(next(f.task))
        except StopIteration:
            del self.flights[id(f.task)]
            return
        except (exceptions.RayTaskError, exceptions.RuntimeEnvSetupError) as e:  # it would fail alike again
            del self.flights[id(f.task)]
            self._fail(f, "error", _first_line(e))
            return
        except exceptions.RayError as e:  # its worker or node was lost: the shapes without a record run again
            del self.flights[id(f.task)]
            self._retry(f, _first_line(e))
            return
        if not isinstance(msg, Record):  # its start: the limit counts from then, so a driver reading late adds nothing
            read_after = min(max(time.time() - msg, 0.0), LOOK_S)  # bounded: a node's clock may disagree with ours
            f.deadline = time.monotonic() - read_after + self.timeout_s
            return
        f.skip.add(tuple(sorted(msg.binding.items())))
        self.on_record(msg)

    def _retry(self, f: _Flight, why: str) -> None:
        if f.attempt <= self.retries:
            self._submit(_Flight(f.unit, f.attempt + 1, f.skip))
        else:
            self._fail(f, "error", f"{why} (attempt {f.attempt}, no retries left)")

    def _drop(self, f: _Flight, outcome: str, why: str) -> None:
        """Cancels a flight's task (killing its worker) and records its shapes without a record."""
        del self.flights[id(f.task)]
        self.ray.cancel(f.task, force=True)
        self._fail(f, outcome, why)

    def _fail(self, f: _Flight, outcome: str, why: str) -> None:
        for b in f.unit.bindings:
            if b not in f.skip:
                self.on_record(failure(f.unit, b, outcome, why, self.sweep, f.attempt))

    def _look(self) -> None:
        """Drops the units still waiting for a node that no node left can run (a task that is running on a node
        that leaves fails, and is retried)."""
        self.nodes = self._alive_nodes()
        for f in list(self.flights.values()):
            if f.deadline == math.inf and not self._runs_somewhere(f.unit.lane):
                self._drop(f, "unschedulable", self._nowhere(f.unit.lane) + " any more")

    def _alive_nodes(self) -> list[dict[str, float]]:
        return [n["Resources"] for n in self.ray.nodes() if n["Alive"]]

    def _runs_somewhere(self, lane: tuple[str, str]) -> bool:
        need = demand(lane)
        return any(all(node.get(r, 0.0) >= amount for r, amount in need.items()) for node in self.nodes)

    def _nowhere(self, lane: tuple[str, str]) -> str:
        kind, which = lane
        if kind == "cpu":
            return "no node of the Ray cluster has a CPU"
        types = sorted({r.partition(":")[2] for node in self.nodes for r in node if r.startswith("accelerator_type:")})
        return (
            f"no node of the Ray cluster has a GPU of type {which!r} (resource accelerator_type:"
            f"{accelerator_type(which)}; its nodes' GPU types: {', '.join(types) or 'none'})"
        )


def _first_line(e: BaseException) -> str:
    """What went wrong, in a line: for an exception the task raised, that exception (not Ray's traceback)."""
    cause = getattr(e, "cause", None)
    e = cause if isinstance(cause, BaseException) else e
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
