"""Sweeps that meet faults, on both executors, with real deviceless units: a worker killed mid-unit, a driver killed
and resumed, a unit past its time limit; and merges of real records in any order, with duplicates, tampered,
truncated and disagreeing records."""

import json
import os
import shutil
import signal

import attrs
import pytest
from sweep_util import Hooked, descendants, kill_driver_after, no_temp_files, processes, recorded_once, support_spec

from cudnn_dsl import sweep
from cudnn_dsl.sweep import records as rec
from cudnn_dsl.sweep.merge import merge
from cudnn_dsl.sweep.run import staging_of
from cudnn_dsl.sweep.worker import run_unit


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Real support records of four units (dynamic_conv at N=8 and 16, and sdpa, on h200 and a100), made in this
    process, the first two units' in staging directory A and the others' in B."""
    d = tmp_path_factory.mktemp("made")
    spec = support_spec(d, targets=("h200", "a100"))
    spec.write_text(spec.read_text() + "[shapes.dynamic_conv]\nN = [8, 16]\n")
    work = sweep.plan(sweep.Spec.load(spec))
    assert len(work.units) == 4 and work.shapes == 6
    for name, units in (("A", work.units[:2]), ("B", work.units[2:])):
        for u in units:
            for r in run_unit(u, work.id):
                assert r.outcome == "ok", r.result
                rec.write(d / name, r)
    return d


def _digest_and_bytes(store):
    found = (store / "LATEST").read_text().strip().removeprefix("sha256:")
    return found, (store / "manifests" / f"{found}.json").read_bytes()


def test_merges_in_any_order_and_repeated_give_one_manifest(made, tmp_path):
    a, b = made / "A", made / "B"
    one = merge([a, b], tmp_path / "ab")
    assert len(one.manifest["support"]) == 6 and one.added == 6 and not one.damaged and not one.manifest["conflicts"]
    for name, steps in {
        "ba": [[b, a]],
        "aab": [[a, a, b]],
        "a_then_b_then_both": [[a], [b], [a, b]],
        "store_into_store": [[tmp_path / "ab"]],
    }.items():
        for sources in steps:
            last = merge(sources, tmp_path / name)
        assert last.digest == one.digest, name
        assert _digest_and_bytes(tmp_path / name) == _digest_and_bytes(tmp_path / "ab"), name
    assert merge([a, b], tmp_path / "ab").added == 0
    no_temp_files(tmp_path)


def _one_record(folder):
    return sorted((folder / "measurements").rglob("*.json"))[0]


def test_a_tampered_or_truncated_record_is_reported_damaged_and_never_chosen(made, tmp_path):
    clean = merge([made / "A", made / "B"], tmp_path / "clean")
    shutil.copytree(made / "A", tmp_path / "A")
    tampered, truncated = sorted((tmp_path / "A" / "measurements").rglob("*.json"))[:2]
    d = json.loads(tampered.read_bytes())
    d["result"]["plans"] += 100  # content changed, name kept
    tampered.write_bytes(rec.canonical(d))
    truncated.write_bytes(truncated.read_bytes()[:40])
    got = merge([tmp_path / "A", made / "B"], tmp_path / "store")
    assert sorted((x.path, x.why) for x in got.damaged) == sorted(
        [(str(tampered), "its content does not match its name: changed since it was written")]
        + [(str(truncated), "its content does not match its name: changed since it was written")]
    )
    # their keys have no answer rather than the changed one; nothing of either entered the store
    assert len(got.manifest["support"]) == len(clean.manifest["support"]) - 2
    answers = [json.loads(p.read_bytes())["result"] for p in (tmp_path / "store" / "entries").glob("*.json")]
    assert d["result"] not in answers
    assert not (tmp_path / "store" / "measurements" / tampered.parent.name / tampered.name).exists()
    # with a sound copy of each beside them, the damaged files change nothing
    assert merge([tmp_path / "A", made / "B", made / "A"], tmp_path / "healed").digest == clean.digest


def test_records_that_disagree_on_a_support_answer_are_a_conflict_with_no_winner(made, tmp_path):
    path = _one_record(made / "A")
    r = rec.Record.from_json(json.loads(path.read_bytes()))
    other = attrs.evolve(r, result={**r.result, "plans": r.result["plans"] + 1}, provenance={"host": "elsewhere"})
    rec.write(tmp_path / "C", other)
    got = merge([made / "A", tmp_path / "C"], tmp_path / "store")
    (conflict,) = got.manifest["conflicts"]
    assert conflict["key"] == r.key.id and sorted(sum(conflict["answers"], [])) == sorted([r.id, other.id])
    assert r.key.id not in got.manifest["support"] and len(got.manifest["support"]) == 3
    assert merge([tmp_path / "C", made / "A"], tmp_path / "other").digest == got.digest
    # the same answer from another host is agreement, not a conflict
    rec.write(tmp_path / "D", attrs.evolve(r, provenance={"host": "elsewhere"}))
    agreed = merge([made / "A", tmp_path / "D"], tmp_path / "agreed")
    assert not agreed.manifest["conflicts"] and r.key.id in agreed.manifest["support"]


def test_a_worker_whose_cudnn_is_not_its_units_records_errors(made):
    work = sweep.plan(sweep.Spec.load(made / "sweep.toml"))
    unit = attrs.evolve(work.units[0], cudnn="9.19")
    got = list(run_unit(unit, work.id))
    assert len(got) == len(unit.bindings) and {r.outcome for r in got} == {"error"}
    assert "asked for cuDNN 9.19, but cuDNN 9.28" in got[0].result["error"]


# ---- faults while a sweep runs, on each executor ---------------------------------------------------------------


def _kill_a_worker(executor):
    marker = b"ray::sweep_unit" if isinstance(executor, sweep.RayExecutor) else b"cudnn_dsl.sweep.worker"

    def act() -> bool:
        pids = [p for p in processes(marker) if p in descendants(os.getpid())]
        if pids:
            os.kill(pids[0], signal.SIGKILL)
        return bool(pids)

    return act


@pytest.mark.slow
def test_a_worker_killed_mid_unit_is_replaced_and_its_unit_retried_for_the_shapes_left(executor, fault_free, tmp_path):
    work = sweep.plan(sweep.Spec.load(support_spec(tmp_path)))
    hooked = Hooked(executor, 2, _kill_a_worker(executor))
    result = sweep.run(work, hooked, staging=tmp_path / "staging")
    assert hooked.acted_at is not None and result.complete, result.unfinished
    records = recorded_once(tmp_path / "staging", work)
    assert max(r.provenance["attempt"] for r in records) == 2  # the killed worker's unit ran again
    assert result.merged.digest == fault_free.merged.digest
    no_temp_files(tmp_path)


@pytest.mark.slow
def test_a_killed_driver_resumes_running_only_the_shapes_without_a_record(executor, fault_free, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    spec = support_spec(tmp_path)
    work = sweep.plan(sweep.Spec.load(spec))
    staging = staging_of(work.id)
    address = "local" if isinstance(executor, sweep.LocalExecutor) else executor_address()
    before = kill_driver_after(spec, address, staging, 5, dict(os.environ))
    assert len(before) == 5
    result = sweep.resume(work.id, executor)
    assert result.complete and result.merged.digest == fault_free.merged.digest, result.unfinished
    records = recorded_once(staging, work)  # so the resume ran exactly the shapes that had no record
    assert {r.id + ".json" for r in records} >= before and len(records) - len(before) == work.shapes - len(before)
    units_split = {r.unit for r in records if r.id + ".json" in before} & {
        r.unit for r in records if r.id + ".json" not in before
    }
    assert units_split  # the kill came mid-unit: the resumed unit ran only its shapes without a record
    no_temp_files(tmp_path)


def executor_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


@pytest.mark.slow
def test_a_unit_past_its_time_limit_is_recorded_as_a_timeout_and_not_retried(executor, tmp_path):
    # a limit no unit can meet: a warm worker can answer a support query within 0.01 s
    work = sweep.plan(sweep.Spec.load(support_spec(tmp_path, extra="timeout_s = 1e-6")))
    result = sweep.run(work, executor, staging=tmp_path / "staging")
    assert result.counts == {"timeout": work.shapes} and not result.complete
    records = recorded_once(tmp_path / "staging", work)
    assert {r.provenance["attempt"] for r in records} == {1}
    assert "past the unit time limit of 1e-06 s" in records[0].result["error"]
    no_temp_files(tmp_path)
