"""Every --json report is valid under its published JSON Schema (docs/schemas/): the reports of real runs of each
command on this CPU, and the GPU reports under docs/results/ that bench, tune and sweep wrote on the H200."""

import argparse
import importlib
import json
from pathlib import Path

import pytest
from cli_util import run_cli

from cudnn_dsl.cli import COMMANDS, common
from cudnn_dsl.store.keys import PlanKey
from cudnn_dsl.store.plans import Entry, PlanStore

jsonschema = pytest.importorskip("jsonschema", reason="the test extra's jsonschema validates the reports")
referencing = pytest.importorskip("referencing", reason="jsonschema brings it")

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "docs" / "schemas"
EX = ROOT / "examples"
MM = EX / "plan_serialization.cdg"


def _schemas() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(SCHEMAS.glob("*.json"))}


def _validator(command: str) -> jsonschema.Draft202012Validator:
    schemas = _schemas()
    registry = referencing.Registry().with_resources(
        (name, referencing.Resource.from_contents(s)) for name, s in schemas.items()
    )
    schema = schemas[f"{command}.json"]
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _valid(command: str, report: dict) -> None:
    errors = sorted(_validator(command).iter_errors(report), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message[:300]}" for e in errors[:5])


def _report(tmp_path, *args, codes=(0,)) -> dict:
    out = tmp_path / f"r{len(list(tmp_path.glob('r*.json')))}.json"
    p = run_cli(*args, "--json", out)
    assert p.returncode in codes, p.stderr
    return json.loads(out.read_text())


def test_every_command_with_a_json_report_has_a_schema_and_the_version_is_the_reports():
    with_json = []
    for name, module in COMMANDS.items():
        parser = argparse.ArgumentParser()
        importlib.import_module(f"cudnn_dsl.cli.{module}").register(parser)
        with_json += [name] if "--json" in parser.format_usage() else []
    assert sorted(with_json) == sorted(p.stem for p in SCHEMAS.glob("*.json") if p.stem != "common")
    version = _schemas()["common.json"]["$defs"]["header"]["properties"]["schema_version"]["const"]
    assert version == common.SCHEMA_VERSION


def test_check_run_support_tune_and_bench_reports_on_this_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad.cdg"
    bad.write_text("graph g {\n  input a : float[2, 3]\n  output o = relu(a, 3)\n}\n")
    _valid("check", _report(tmp_path, "check", MM, EX / "dynamic_shapes.cdg"))
    _valid("check", _report(tmp_path, "check", "--target", "h200", MM, EX / "sdpa.cdg"))
    _valid("check", _report(tmp_path, "check", bad, codes=(1,)))
    _valid("run", _report(tmp_path, "run", MM))
    _valid("run", _report(tmp_path, "run", bad, codes=(1,)))
    _valid("support", _report(tmp_path, "support", "--target", "h200,a100", EX / "sdpa.cdg", EX / "residual_block.cdg"))
    _valid("tune", _report(tmp_path, "tune", "--exhaustive", MM))
    for command in ("tune", "bench"):  # no GPU here: the report says why it holds no figures
        report = _report(tmp_path, command, MM, codes=(1,))
        assert "no CUDA GPU is usable here" in report["error"]
        _valid(command, report)
    with pytest.raises(AssertionError):  # the schemas can fail: a report that lost its files
        _valid("run", {k: v for k, v in _report(tmp_path, "run", MM).items() if k != "files"})


def test_sweep_and_cache_reports(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    spec = tmp_path / "s.toml"
    spec.write_text(f'[sweep]\ngraphs = ["{EX}/sdpa.cdg"]\nstore = "store"\n[plan_targets]\ntargets = ["h200"]\n')
    _valid("sweep", _report(tmp_path, "sweep", spec, "--dry-run"))
    swept = _report(tmp_path, "sweep", spec)
    _valid("sweep", swept)
    _valid("sweep", _report(tmp_path, "sweep", "merge", swept["sweep"]["staging"], "--into", tmp_path / "other"))
    _valid("cache", _report(tmp_path, "cache", "verify", tmp_path / "store", "--coverage", EX / "sdpa.cdg", codes=(1,)))
    _valid("cache", _report(tmp_path, "cache", "ls"))
    key = PlanKey("d" * 64, "NVIDIA H200", "9.0", 92801, "1.32.0")
    store = PlanStore()
    store.put(Entry(key, "g", "eng4_k24=3", 4, {"TILE_SIZE": 3}, b"plan" * 8, 1024, True, {"median_us": 12.5}, 1.0))
    listed = _report(tmp_path, "cache", "ls")
    assert len(listed["entries"]) == 1
    _valid("cache", listed)
    _valid("cache", _report(tmp_path, "cache", "show", listed["entries"][0]["id"]))
    _valid("cache", _report(tmp_path, "cache", "export", tmp_path / "bundle.json"))
    _valid("cache", _report(tmp_path, "cache", "clear"))
    _valid("cache", _report(tmp_path, "cache", "import", tmp_path / "bundle.json"))
    _valid("cache", _report(tmp_path, "cache", "path"))


@pytest.mark.parametrize(
    "command, name",
    [("bench", "bench-h200"), ("bench", "bench-cold-h200"), ("tune", "tune-h200"), ("sweep", "gpu-sweep-h200")],
)
def test_the_gpu_reports_in_docs_results(command, name):
    _valid(command, json.loads((ROOT / "docs" / "results" / f"{name}.json").read_text()))
