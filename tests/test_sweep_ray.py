"""The Ray executor on a real Ray cluster of this machine's processes, every node on 127.0.0.1, with real deviceless
units: the local executor's manifest byte for byte, a node removed mid-sweep, GPU units routed by type to the
nodes that declare it (on CPU nodes: Ray's scheduler sees resources, not devices), a type no node has, or no node
has any more, recorded unschedulable; each deviceless lane with its cuDNN; a Ray started by the command line on
loopback only."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
from sweep_util import (
    EXAMPLES,
    LOOPBACK,
    descendants,
    import_ray,
    no_temp_files,
    off_loopback,
    processes,
    recorded_once,
    support_spec,
)

from cudnn_dsl import sweep
from cudnn_dsl.sweep.on_ray import accelerator_type, task_options
from cudnn_dsl.target.library import DEVICES_DIR, Target, installed_cudnn, side_by_side


@pytest.mark.slow  # with the Ray tests: it needs the ray extra
def test_gpu_types_are_named_as_ray_names_them():
    import_ray()
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

    names = [Target.from_file(p).name for p in sorted(DEVICES_DIR.glob("*.json"))]
    names += ["NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090", "NVIDIA RTX PRO 6000"]
    ours = [accelerator_type(n) for n in names]
    assert ours == [NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(n) for n in names]
    assert ours[:5] == ["A100", "B200", "H100", "H200", "L40S"]


@pytest.mark.slow
def test_the_cluster_listens_on_loopback_only(ray_cluster):
    mine = descendants(os.getpid())
    assert len(mine) > 3 and not off_loopback(mine)


@pytest.mark.slow
def test_ray_and_local_executors_give_one_manifest_byte_for_byte(ray_cluster, fault_free, tmp_path):
    work = sweep.plan(sweep.Spec.load(support_spec(tmp_path)))
    result = sweep.run(work, sweep.RayExecutor(), staging=tmp_path / "staging")
    assert result.complete and result.counts == {"ok": 15}, result.unfinished
    recorded_once(tmp_path / "staging", work)
    store, local = tmp_path / "store", fault_free.merged
    assert result.merged.digest == local.digest
    assert (store / "manifests" / f"{local.digest}.json").read_bytes() == (
        fault_free.staging.parent / "store" / "manifests" / f"{local.digest}.json"
    ).read_bytes()
    no_temp_files(tmp_path)


@pytest.mark.slow
def test_a_node_removed_mid_sweep_has_its_units_run_elsewhere(ray_cluster, fault_free, tmp_path):
    extra = ray_cluster.add_node(**LOOPBACK, num_cpus=2)
    ray_cluster.wait_for_nodes()
    raylet = extra.all_processes["raylet"][0].process.pid
    hogs = _hold_cpus_of_all_nodes_but(extra.node_id)  # else Ray's scheduler may give every unit to the others
    removed, stop = threading.Event(), threading.Event()

    def remove_it_once_it_runs_a_unit():
        while not stop.wait(0.05):
            if set(processes(b"ray::sweep_unit")) & descendants(raylet):
                ray_cluster.remove_node(extra)
                removed.set()
                _release(hogs)
                return

    watcher = threading.Thread(target=remove_it_once_it_runs_a_unit)
    watcher.start()
    work = sweep.plan(sweep.Spec.load(support_spec(tmp_path)))
    try:
        result = sweep.run(work, sweep.RayExecutor(), staging=tmp_path / "staging")
    finally:
        stop.set()
        watcher.join()
        _release(hogs)
    assert removed.is_set(), "no unit ran on the added node"
    assert result.complete and result.merged.digest == fault_free.merged.digest, result.unfinished
    records = recorded_once(tmp_path / "staging", work)
    assert max(r.provenance["attempt"] for r in records) == 2
    no_temp_files(tmp_path)


def _hold_cpus_of_all_nodes_but(node_id: str) -> list:
    """Actors that hold every CPU of the cluster's other nodes, alive once this returns: the sweep's first units can
    run on that node alone."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote
    class Hog:
        def ready(self) -> bool:
            return True

    hogs = [
        Hog.options(
            num_cpus=n["Resources"]["CPU"],
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
        ).remote()
        for n in ray.nodes()
        if n["Alive"] and n["NodeID"] != node_id and n["Resources"].get("CPU")
    ]
    ray.get([h.ready.remote() for h in hogs], timeout=120)
    return hogs


def _release(hogs: list) -> None:
    ray = import_ray()
    while hogs:
        ray.kill(hogs.pop())


@pytest.fixture(scope="module")
def gpu_nodes(ray_cluster):
    """Two CPU nodes that declare one GPU each, of type H200 and A100 (Ray's resource accelerator_type:<T>)."""
    nodes = {
        t: ray_cluster.add_node(**LOOPBACK, num_cpus=1, num_gpus=1, resources={f"accelerator_type:{t}": 1})
        for t in ("H200", "A100")
    }
    yield nodes
    for node in nodes.values():
        if node in ray_cluster.worker_nodes:
            ray_cluster.remove_node(node)


def _tune_units(tmp_path, gpus):
    body = f'[sweep]\ngraphs = ["{EXAMPLES}/sdpa.cdg"]\nmode = "tune"\n[tune_targets]\n'
    body += "".join(f'"{g}" = 1\n' for g in gpus)
    (tmp_path / "tune.toml").write_text(body)
    work = sweep.plan(sweep.Spec.load(tmp_path / "tune.toml"))
    return work, {u.target: u for u in work.units}


@pytest.mark.slow
def test_gpu_units_land_on_their_type_and_a_type_no_node_has_is_unschedulable_at_once(gpu_nodes, tmp_path):
    ray = import_ray()

    @ray.remote
    def where():
        return ray.get_runtime_context().get_node_id()

    for gpu, t in (("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100")):
        landed = ray.get([where.options(**task_options(("gpu", gpu))).remote() for _ in range(3)])
        assert set(landed) == {gpu_nodes[t].node_id}, gpu
    work, units = _tune_units(tmp_path, ["NVIDIA B200", "NVIDIA H200"])
    got = []
    sweep.RayExecutor().run([units["NVIDIA B200"]], work.id, got.append, timeout_s=600, retries=3)
    (r,) = got
    assert r.outcome == "unschedulable" and r.key.gpu == "NVIDIA B200"
    assert (
        "no node of the Ray cluster has a GPU of type 'NVIDIA B200' (resource accelerator_type:B200"
        in (r.result["error"])
    )
    assert "its nodes' GPU types: A100, H200" in r.result["error"]
    # an H200 unit is scheduled: on this CPU its worker finds no CUDA device, and says so in its record
    got = []
    sweep.RayExecutor().run([units["NVIDIA H200"]], work.id, got.append, timeout_s=600, retries=3)
    (ran,) = got
    assert ran.outcome == "error" and "CUDA" in ran.result["error"] and ran.provenance["attempt"] == 1


@pytest.mark.slow
def test_a_unit_waiting_for_the_only_node_of_its_type_is_unschedulable_when_that_node_leaves(
    ray_cluster, gpu_nodes, tmp_path
):
    ray = import_ray()
    blocker = ray.remote(lambda: time.sleep(300)).options(**task_options(("gpu", "NVIDIA H200"))).remote()
    work, units = _tune_units(tmp_path, ["NVIDIA H200"])
    leave = threading.Timer(3.0, ray_cluster.remove_node, args=(gpu_nodes["H200"],))
    leave.start()
    got = []
    try:
        sweep.RayExecutor().run([units["NVIDIA H200"]], work.id, got.append, timeout_s=600, retries=3)
    finally:
        leave.join()
        ray.cancel(blocker, force=True)
    (r,) = got
    assert r.outcome == "unschedulable" and r.result["error"].endswith("any more"), r.result


OTHER_CUDNN = "9.20"
"""a version `cudnn-dsl support --cudnn` fetches beside the installed one"""


@pytest.mark.slow
def test_each_deviceless_lane_plans_with_its_cudnn(executor, tmp_path):
    version = OTHER_CUDNN
    if not side_by_side(version).is_dir():
        pytest.skip(f"cuDNN {version} is not here: `cudnn-dsl support --cudnn {version} --fetch FILE` installs it")
    spec = support_spec(tmp_path, targets=("h200",))
    here = ".".join(installed_cudnn()[1].split(".")[:2])
    spec.write_text(spec.read_text() + f'cudnn = ["{version}", "{here}"]\n')
    work = sweep.plan(sweep.Spec.load(spec))
    result = sweep.run(work, executor, staging=tmp_path / "staging")
    assert result.complete, result.unfinished
    lanes = {(r.unit, r.provenance["cudnn"].rsplit(".", 1)[0]) for r in recorded_once(tmp_path / "staging", work)}
    asked = {u.id: u.cudnn for u in work.units}
    assert {cudnn for _, cudnn in lanes} == {version, here} and all(asked[u] == c for u, c in lanes)


@pytest.mark.slow
def test_the_command_line_starts_a_ray_of_its_own_listening_on_loopback_only(fault_free, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["CUDNN_DSL_CACHE_DIR"] = str(tmp_path / "cache")
    cmd = [sys.executable, "-m", "cudnn_dsl", "sweep", str(support_spec(tmp_path)), "--executor", "ray"]
    err = tmp_path / "stderr"
    with open(err, "wb") as f:
        proc = subprocess.Popen(
            [*cmd, "--json", str(tmp_path / "out.json")], env=env, stdout=subprocess.DEVNULL, stderr=f
        )
    seen, outside = set(), []
    while proc.poll() is None:
        mine = descendants(proc.pid)
        seen |= {pid for pid in mine if pid != proc.pid}
        outside += off_loopback(mine)
        time.sleep(0.2)
    out = json.loads((tmp_path / "out.json").read_text())["sweep"]
    assert proc.returncode == 0 and out["manifest"] == f"sha256:{fault_free.merged.digest}", out
    assert len(seen) > 3 and not outside, outside  # Ray's processes came and went, none listening elsewhere
    assert not set(processes(b"raylet")) & seen  # and it took them down
    # Ray's start-up warnings come as one clean line each, never as Ray's stamped records (time, file:line --)
    said = err.read_text()
    assert not re.search(r"^\d{4}-\d\d-\d\d .*(WARNING|INFO|ERROR) \S+\.py:\d+ -- ", said, re.M), said
    assert all(line.startswith("cudnn-dsl: ray: ") for line in said.splitlines() if "Ray" in line), said
