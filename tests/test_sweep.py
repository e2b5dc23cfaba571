"""Sweeps on this CPU: specs and their located errors, planning (content dedupe, store skip, pre-filter, longest
first), the local executor running real deviceless units, the winner rules of the merge, the command line."""

import json
import os
from pathlib import Path

import pytest
from cli_util import run_cli
from sweep_util import tune_record

from cudnn_dsl import sweep
from cudnn_dsl.run.partition import plan_for_target
from cudnn_dsl.store.keys import PlanKey
from cudnn_dsl.store.plans import Entry
from cudnn_dsl.sweep.merge import build_manifest
from cudnn_dsl.sweep.records import Record, canonical
from cudnn_dsl.target.library import Target
from dsl.pipeline import load

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _spec(tmp_path, body: str, name="sweep.toml") -> Path:
    p = tmp_path / name
    p.write_text(body)
    return p


def _support_spec(tmp_path, extra="") -> Path:
    return _spec(
        tmp_path,
        f"""
[sweep]
name = "t"
graphs = ["{EXAMPLES}/conv_bias_relu.cdg", "{EXAMPLES}/dynamic_shapes.cdg", "{EXAMPLES}/sdpa.cdg"]
store = "store"
[plan_targets]
targets = ["h200", "a100"]
[shapes.dynamic_conv]
N = [8, 32]
{extra}""",
    )


@pytest.mark.parametrize(
    "body, words",
    [
        ("[sweep]\ngraphs = 3", "[sweep] graphs: is 3, not a list"),
        ('[sweep]\ngraphs = ["*.nothing"]', "matches no file"),
        ('[sweep]\ngraphs = ["{ex}/sdpa.cdg"]\nmode = "fast"', "[sweep] mode: is 'fast', not one of"),
        ('[sweep]\ngraphs = ["{ex}/sdpa.cdg"]\ncolour = 1', "[sweep] colour: unknown key"),
        ('[sweep]\ngraphs = ["{ex}/sdpa.cdg"]\n[tune_targets]\n"NVIDIA H200" = 1', "mode support plans without a GPU"),
        ('[sweep]\ngraphs = ["{ex}/sdpa.cdg"]\nmode = "tune"', "name at least one GPU type"),
        (
            '[sweep]\ngraphs = ["{ex}/sdpa.cdg"]\nmode = "tune"\n[tune_targets]\n"NVIDIA H200" = 1\n[plan_targets]\n'
            'targets = ["h200"]',
            "[plan_targets]: is for mode support",
        ),
        ('[sweep]\ngraphs = ["{ex}/sdpa.cdg"]\ntimeout_s = -1', "not a positive number of seconds"),
        ('[sweep]\ngraphs = ["{ex}/sdpa.cdg"]\n[shapes.sdpa_causal]\nT = [0]', "must be a list of positive integers"),
        ('[sweep]\ngraphs = ["{ex}/sdpa.cdg"]\nretries = -1', "[sweep] retries: is -1, not a number of retries"),
        ('[sweep]\ngraphs = ["{ex}/sdpa.cdg"]\n[plan_targets]\ncudnn = ["abc"]', "cudnn: 'abc' is not a cuDNN version"),
        ("[sweep\n", "not TOML"),
        ("", "[sweep]: missing"),
        ("[other]\n", "[other]: unknown table"),
    ],
)
def test_a_bad_spec_says_where(tmp_path, body, words):
    p = _spec(tmp_path, body.replace("{ex}", str(EXAMPLES)))
    with pytest.raises(sweep.SpecError) as e:
        sweep.Spec.load(p)
    assert str(e.value).startswith(f"{p}: ") and words in str(e.value)


def test_a_shapes_table_must_name_a_graph_of_the_sweep(tmp_path):
    spec = sweep.Spec.load(_support_spec(tmp_path).parent / "sweep.toml")
    bad = sweep.Spec.load(_spec(tmp_path, _support_spec(tmp_path).read_text().replace("dynamic_conv]", "dynamic]")))
    assert spec.shapes_of(str(EXAMPLES / "dynamic_shapes.cdg"), "dynamic_conv") == {"N": (8, 32)}
    with pytest.raises(sweep.SpecError, match=r"\[shapes.'dynamic'\]: no graph of the sweep is called that"):
        sweep.plan(bad)
    outside = sweep.Spec.load(_spec(tmp_path, _support_spec(tmp_path).read_text().replace("[8, 32]", "[8, 9]")))
    with pytest.raises(sweep.SpecError, match="has no shape {'N': 9}"):
        sweep.plan(outside)


def test_planning_dedupes_by_content_and_puts_the_longest_first(tmp_path):
    work = sweep.plan(sweep.Spec.load(_support_spec(tmp_path)))
    # conv_bias_relu.cdg is dynamic_shapes.cdg at N=32: one of the two is planned, per target
    same = [s for s in work.skipped if "the same graph, shape and options" in s.why]
    assert sorted(s.label.split(" on ")[1] for s in same) == ["NVIDIA A100-SXM4-80GB", "NVIDIA H200"]
    assert all("dynamic_conv N=32" in s.label for s in same)
    assert work.shapes == 3 * 2 and len(work.units) == 3 * 2
    estimates = [u.estimate_s for u in work.units]
    assert estimates == sorted(estimates, reverse=True)
    again = sweep.plan(sweep.Spec.load(_support_spec(tmp_path)))
    assert [u.id for u in again.units] == [u.id for u in work.units] and again.id == work.id
    u = work.units[0]
    assert sweep.Unit.from_json(json.loads(json.dumps(u.to_json()))).id == u.id


def test_a_local_sweep_plans_every_unit_as_the_library_does_then_resumes_to_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    spec = sweep.Spec.load(_support_spec(tmp_path))
    work = sweep.plan(spec)
    result = sweep.run(work, sweep.LocalExecutor(workers=2))
    assert result.complete and result.counts == {"ok": 6}, result.unfinished
    manifest = result.merged.manifest
    assert len(manifest["support"]) == 6 and not manifest["conflicts"] and not manifest["plans"]
    # each answer is what cuDNN says in this process for the same graph and target
    g = load(EXAMPLES / "sdpa.cdg").program.graph("sdpa_causal")
    low, partition = plan_for_target(g, g.instances[0], g.options, Target.named("h200"))
    store = Path(spec.store)
    answers = [
        json.loads((store / "entries" / f"{row['sha256']}.json").read_text()) for row in manifest["support"].values()
    ]
    sdpa = [
        a
        for a, row in zip(answers, manifest["support"].values())
        if row["graph"] == "sdpa_causal" and row["gpu"] == "NVIDIA H200"
    ]
    assert partition is None and sdpa[0]["result"] == {"fuses": True, "plans": low.plan_count}
    # the store answers it all now; a resume finds every shape recorded
    assert {s.why for s in sweep.plan(spec).skipped} >= {"already in the store"} and not sweep.plan(spec).units
    before = sorted(p.name for p in result.staging.rglob("*.json"))
    keydir = next((result.staging / "measurements").iterdir())
    (keydir / f".{'0' * 64}.json.deadbeef.tmp").write_text('{"half a rec')  # a driver killed mid-write
    again = sweep.resume(work.id, sweep.LocalExecutor(workers=2))
    assert again.merged.digest == result.merged.digest and again.counts == result.counts
    assert not again.merged.damaged and not list(keydir.glob("*.tmp"))
    assert sorted(p.name for p in result.staging.rglob("*.json")) == before
    assert not [p for p in tmp_path.rglob("*.tmp")]


def _tune_record(engine: int, p50: float, host: str, passed=True, knobs=None) -> Record:
    key = PlanKey("a" * 64, "NVIDIA H200", "9.0", 91900, "1.32.0")
    return tune_record(key, "g", {}, b"plan-%d" % engine, engine, p50, host, passed, knobs)


def test_the_winner_is_the_fastest_checked_plan_medians_within_one_percent_tie_on_the_engine():
    slow, fast, close, wrong = (
        _tune_record(5, 20.0, "a"),
        _tune_record(9, 10.0, "a"),
        _tune_record(3, 10.05, "b"),
        _tune_record(1, 1.0, "b", passed=False),
    )
    manifest, entries = build_manifest([slow, fast, close, wrong])
    (row,) = manifest["plans"].values()
    entry = Entry.from_json(json.loads(next(e for e in entries if json.loads(e)["engine_id"] == 3)))
    assert row["sha256"] == __import__("hashlib").sha256(canonical(json.loads(entries[0]))).hexdigest()
    assert entry.engine_id == 3 and entry.imported and entry.tuned  # 10.05 ranks with 10.0: the lower engine id wins
    assert len(entries) == 1
    # any order, any repetition: one manifest
    assert build_manifest([wrong, close, fast, slow, fast])[0] == manifest
    # the same plan measured 2x apart on two hosts is flagged, and still ranked by its best median
    flagged, _ = build_manifest([_tune_record(9, 10.0, "a"), _tune_record(9, 25.0, "b")])
    assert flagged["flags"][0]["median_us_by_host"] == {"GPU-a": 10.0, "GPU-b": 25.0}
    assert not build_manifest([wrong])[0]["plans"]


def test_a_tune_sweep_without_a_gpu_of_its_type_is_unschedulable_not_hung(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    p = _spec(
        tmp_path,
        f'[sweep]\ngraphs = ["{EXAMPLES}/conv_bias_relu.cdg"]\nmode = "tune"\nstore = "store"\n'
        '[tune_targets]\n"NVIDIA H200" = 1\n',
    )
    r = run_cli("sweep", p, "--dry-run", "--json", tmp_path / "work.json")
    assert r.returncode == 0, r.stderr
    (unit,) = json.loads((tmp_path / "work.json").read_text())["work"]["units"]
    assert unit["target"] == "NVIDIA H200" and unit["estimate_s"] > 1  # the candidate count cuDNN gave, deviceless
    r = run_cli("sweep", p, "--json", tmp_path / "out.json")
    out = json.loads((tmp_path / "out.json").read_text())
    assert r.returncode == 1 and out["sweep"]["outcomes"] == {"unschedulable": 1}
    assert "no GPU of type 'NVIDIA H200' on this machine" in r.stderr
    assert out["sweep"]["complete"] is False and out["schema_version"]


def test_sweep_merge_of_a_staging_directory_gives_the_stores_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    p = _spec(
        tmp_path, f'[sweep]\ngraphs = ["{EXAMPLES}/sdpa.cdg"]\nstore = "store"\n[plan_targets]\ntargets = ["h200"]\n'
    )
    r = run_cli("sweep", p, "--json", tmp_path / "out.json")
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.json").read_text())["sweep"]
    r = run_cli("sweep", "merge", out["staging"], tmp_path / "store", "--into", tmp_path / "other")
    assert r.returncode == 0 and out["manifest"] in r.stdout
    assert (tmp_path / "other" / "LATEST").read_text().strip() == out["manifest"]
    assert run_cli("sweep", "merge", tmp_path / "nowhere", "--into", tmp_path / "x").returncode == 2
    assert run_cli("sweep", p, "--into", tmp_path / "x").returncode == 2
    assert os.listdir(tmp_path / "other" / "manifests") == [out["manifest"].removeprefix("sha256:") + ".json"]
    # a resume merges where it is told, or nowhere; a merge takes none of a sweep's flags
    r = run_cli("sweep", "--resume", out["sweep"], "--store", tmp_path / "third", "--json", tmp_path / "again.json")
    assert (
        r.returncode == 0 and json.loads((tmp_path / "again.json").read_text())["sweep"]["manifest"] == out["manifest"]
    )
    assert (tmp_path / "third" / "LATEST").read_text().strip() == out["manifest"]
    assert run_cli("sweep", "--resume", out["sweep"], "--store", tmp_path / "fourth", "--no-merge").returncode == 0
    for flags in (["--dry-run"], ["--no-merge"], ["--executor", "ray"], ["--resume", out["sweep"]]):
        r = run_cli("sweep", "merge", out["staging"], "--into", tmp_path / "fifth", *flags)
        assert r.returncode == 2 and "not `sweep merge`" in r.stderr
    assert not (tmp_path / "fourth").exists() and not (tmp_path / "fifth").exists()


@pytest.mark.parametrize(
    "make, words",
    [
        (None, "is not a sweep id"),
        ("", "no sweep 0123456789abcdef to resume"),
        ('{"units": [{"mode": "support"}]}', "no sweep 0123456789abcdef to resume"),
        ('{"id": "fedcba9876543210", "units": []}', "holds sweep 'fedcba9876543210', not 0123456789abcdef"),
    ],
)
def test_a_resume_of_no_sweep_says_so(tmp_path, monkeypatch, make, words):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    staging = tmp_path / "cache" / "sweeps" / "0123456789abcdef"
    if make:
        staging.mkdir(parents=True)
        (staging / "work.json").write_text(make)
    r = run_cli("sweep", "--resume", "../../x" if make is None else "0123456789abcdef")
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert not (tmp_path / "x").exists()


def test_a_sweep_naming_a_cudnn_not_here_is_the_machines_lack_not_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    p = _spec(
        tmp_path,
        f'[sweep]\ngraphs = ["{EXAMPLES}/sdpa.cdg"]\nstore = "store"\n[plan_targets]\ntargets = ["h200"]\n'
        'cudnn = ["9.99"]\n',
    )
    r = run_cli("sweep", p)
    assert r.returncode == 1 and "cuDNN 9.99 is not here" in r.stderr and "--fetch" in r.stderr, r.stderr


def test_retune_runs_every_shape_again_instead_of_resuming_the_old_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    p = _spec(
        tmp_path, f'[sweep]\ngraphs = ["{EXAMPLES}/sdpa.cdg"]\nstore = "store"\n[plan_targets]\ntargets = ["h200"]\n'
    )
    first = tmp_path / "first.json"
    assert run_cli("sweep", p, "--json", first).returncode == 0
    first = json.loads(first.read_text())["sweep"]
    assert first["outcomes"] == {"ok": 1}
    assert "already in the store" in run_cli("sweep", p, "--dry-run").stdout  # a plain rerun skips it
    again = tmp_path / "again.json"
    r = run_cli("sweep", p, "--retune", "--json", again)
    again = json.loads(again.read_text())["sweep"]
    assert r.returncode == 0 and again["outcomes"] == {"ok": 1} and again["sweep"] != first["sweep"], r.stderr
    staged = [Path(again["staging"]) / "measurements", Path(first["staging"]) / "measurements"]
    assert [len(list(d.rglob("*.json"))) for d in staged] == [1, 1]  # run anew, in a staging directory of its own
    # a named staging directory that holds another sweep is refused, not counted as this one's records
    r = run_cli("sweep", p, "--retune", "--staging", first["staging"])
    assert r.returncode == 2 and f"holds sweep '{first['sweep']}'" in r.stderr, r.stderr


def test_the_laptop_sweep_example_runs_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    r = run_cli("sweep", EXAMPLES / "laptop_sweep.toml", "--store", tmp_path / "store", "--json", tmp_path / "out.json")
    out = json.loads((tmp_path / "out.json").read_text())["sweep"]
    assert r.returncode == 0 and out["complete"] and out["outcomes"] == {"ok": 8}, r.stderr
    manifest = json.loads(
        (tmp_path / "store" / "manifests" / f"{out['manifest'].removeprefix('sha256:')}.json").read_text()
    )
    assert sorted({row["gpu"] for row in manifest["support"].values()}) == ["NVIDIA H200", "NVIDIA L40S"]
    assert len(manifest["support"]) == 8 and not (EXAMPLES / "laptop-store").exists()
