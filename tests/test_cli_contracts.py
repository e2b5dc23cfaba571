"""What CI relies on from the command line: every --json report's schema_version and environment block,
--require-gpu, --version, SARIF from check and support, and what tune --exhaustive promises without a GPU."""

import json
import os
import re
import stat
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

import pytest
import torch

from cudnn_dsl.cli import build_parser, common
from cudnn_dsl.target.machine import environment, gpu_problem
from tests.cli_util import run_cli as cli
from tests.graphs import GENSTATS, LN_GELU

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
MATMUL = EX / "matmul_epilogue.cdg"
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without a GPU (tests/gpu has the rest)")


def in_fresh_process(*args) -> tuple[subprocess.CompletedProcess, bool]:
    """The command line in a process of its own: what it printed, and whether it imported torch."""
    code = (
        "import sys\nfrom cudnn_dsl.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('\\ntorch imported: %s\\n' % ('torch' in sys.modules))\n"
    )
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    return p, "torch imported: True" in p.stderr


# ---- schema_version and environment -------------------------------------------------------------


def json_commands(tmp_path) -> dict[str, list]:
    """Each command that writes a --json report, with arguments that make it write one on this machine."""
    return {
        "check": ["check", "--target", "h200", MATMUL],
        "run": ["run", MATMUL],
        "tune": ["tune", "--exhaustive", "--max-configs", "3", "--top-k", "1", EX / "plan_serialization.cdg"],
        "support": ["support", "--target", "h200", MATMUL],
        "cache": ["cache", "ls"],
        "bench": ["bench", MATMUL, "--against", "torch", "--rounds", "1", "--samples", "1", "--no-peak"],
        "sweep": ["sweep", _tune_spec(tmp_path), "--dry-run"],  # tune mode: planned deviceless, so cuDNN answers
    }


def _tune_spec(tmp_path) -> Path:
    spec = tmp_path / "sweep.toml"
    spec.write_text(f'[sweep]\ngraphs = ["{MATMUL}"]\nmode = "tune"\n[tune_targets]\n"NVIDIA H200" = 1\n')
    return spec


def test_the_list_below_is_every_command_with_a_json_report(tmp_path):
    sub = next(a for a in build_parser()._actions if a.dest == "command")  # noqa: SLF001 - argparse's own tree
    with_json = {name for name, p in sub.choices.items() if any(a.dest == "json" for a in p._actions)}  # noqa: SLF001
    assert with_json == set(json_commands(tmp_path))


@pytest.mark.parametrize("command", ["check", "run", "tune", "support", "cache", "bench", "sweep"])
def test_every_json_report_has_the_schema_version_and_the_one_environment_block(command, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    if command == "bench" and not torch.cuda.is_available():
        pytest.skip("bench writes its report on a GPU only (tests/gpu)")
    report = tmp_path / "report.json"
    p = cli(*json_commands(tmp_path)[command], "--json", report)
    assert p.returncode == 0, p.stderr
    data = json.loads(report.read_text())
    assert list(data)[:2] == ["schema_version", "environment"] and data["schema_version"] == common.SCHEMA_VERSION
    env = data["environment"]
    assert set(env) >= {"cudnn_backend", "cudnn_frontend", "torch", "gpu", "driver"}
    assert env["cudnn_frontend"] == metadata.version("nvidia-cudnn-frontend")
    assert env["torch"] == torch.__version__  # imported by these tests, so reported
    if not torch.cuda.is_available():
        assert env["gpu"] == "none"
    if command != "cache":  # cuDNN planned (deviceless): the library that did
        from cudnn_dsl.target.library import load_cudnn

        assert env["cudnn_backend"] == load_cudnn().backend_version()


def test_a_command_that_needs_neither_torch_nor_cudnn_says_so_and_loads_neither():
    p, imported = in_fresh_process("check", "--json", "-", MATMUL)
    env = json.loads(p.stdout)["environment"]
    assert not imported
    assert (env["torch"], env["cudnn_backend"]) == ("not imported", "not loaded")
    assert env["cudnn_frontend"] == metadata.version("nvidia-cudnn-frontend")
    assert env == {**environment(), "torch": "not imported", "cudnn_backend": "not loaded"}  # the one function's


def test_a_failed_file_still_reports_the_environment():
    p = cli("run", ROOT / "tests" / "golden" / "errors" / "conv_channels.cdg", "--json", "-")
    data = json.loads(p.stdout)
    assert p.returncode == 1 and data["schema_version"] == common.SCHEMA_VERSION and data["environment"]["gpu"]


# ---- a report into a FIFO, a device or stdout -----------------------------------------------------


def test_a_json_report_into_a_fifo_goes_through_it_and_leaves_it_a_fifo(tmp_path):
    fifo = tmp_path / "report"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    p = cli("check", "--json", fifo, MATMUL)
    reader.join(timeout=60)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and len(list(tmp_path.iterdir())) == 1  # no temporary file left
    assert json.loads(got[0])["schema_version"] == common.SCHEMA_VERSION


@pytest.mark.parametrize(
    "args",
    [["check", "--json", "/dev/stdout", MATMUL], ["check", "--format", "sarif", "--output", "/dev/stdout", MATMUL]],
)
def test_a_report_to_dev_stdout_is_written_into_the_pipe(args):
    """/dev/stdout is then a pipe (/proc/self/fd/1), which the report is written into, not put in place of."""
    p = subprocess.run([sys.executable, "-m", "cudnn_dsl", *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    start = p.stdout.index("{\n")  # after the human report, where that goes to stdout too
    report, _ = json.JSONDecoder().raw_decode(p.stdout[start:])
    assert "schema_version" in report or "runs" in report


# ---- --require-gpu ------------------------------------------------------------------------------


@NO_GPU
@pytest.mark.parametrize(
    "args",
    [
        ["run", MATMUL],
        ["tune", "--exhaustive", "--max-configs", "3", EX / "plan_serialization.cdg"],
        ["tune", MATMUL],
        ["bench", MATMUL],
    ],
)
def test_require_gpu_fails_at_once_and_says_why(args):
    why = gpu_problem()
    assert why
    if torch.version.cuda is None:
        assert f"torch {torch.__version__} is a build without CUDA" in why
    p = cli(args[0], "--require-gpu", *args[1:])
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert f"no CUDA GPU is usable here: {why}" in p.stderr
    assert p.stdout == ""  # nothing planned, listed or run first


@NO_GPU
@pytest.mark.parametrize("args", [["tune", "--require-gpu", MATMUL], ["bench", MATMUL]])
def test_a_command_that_needs_a_gpu_still_writes_its_json_report_saying_why(args):
    p = cli(*args, "--json", "-")
    assert p.returncode == 1, p.stderr
    report = json.loads(p.stdout)
    assert report["schema_version"] == common.SCHEMA_VERSION and report["environment"]["gpu"] == "none"
    assert f"no CUDA GPU is usable here: {gpu_problem()}" in report["error"]


def test_require_gpu_is_in_the_help_of_every_command_that_needs_a_gpu():
    for command in ("run", "tune", "bench"):
        text = " ".join(cli(command, "--help").stdout.split())
        assert "--require-gpu where no GPU is usable, fail at once (exit 1), saying why" in text, command


@NO_GPU
def test_without_the_flag_run_still_exits_0_and_says_what_it_skipped():
    p = cli("run", MATMUL)
    assert p.returncode == 0 and "skipped    cuDNN execution and comparison" in p.stdout


# ---- --version ----------------------------------------------------------------------------------


def test_version_names_cudnn_dsl_the_frontend_cudnn_and_torch_without_importing_torch():
    from cudnn_dsl.target.library import load_cudnn
    from cudnn_dsl.target.quirks import version_text

    p, imported = in_fresh_process("--version")
    lines = p.stdout.splitlines()
    assert lines == [
        f"cudnn-dsl {metadata.version('cudnn-dsl')}",
        f"cuDNN Frontend {metadata.version('nvidia-cudnn-frontend')}",
        f"cuDNN {version_text(load_cudnn().backend_version())}",
        f"torch {metadata.version('torch')}",
    ]
    assert not imported


# ---- SARIF --------------------------------------------------------------------------------------

LEVELS = {"none", "note", "warning", "error"}


def sarif_problems(log) -> list[str]:
    """What a SARIF 2.1.0 log breaks of the spec's required properties and constraints (sarif-v2.1.0-os: §3.13
    sarifLog, §3.14 run, §3.18 tool, §3.19 toolComponent, §3.27 result, §3.11 message, §3.28 location, §3.29
    physicalLocation, §3.4 artifactLocation, §3.30 region, §3.49 reportingDescriptor), written out by hand."""
    bad = []

    def need(cond, what):
        if not cond:
            bad.append(what)

    need(isinstance(log, dict), "the log is an object")
    need(log.get("version") == "2.1.0", "sarifLog.version is 2.1.0")
    runs = log.get("runs")
    need(isinstance(runs, list), "sarifLog.runs is an array")
    for i, run in enumerate(runs or []):
        driver = run.get("tool", {}).get("driver")
        need(isinstance(driver, dict), f"runs[{i}].tool.driver")
        need(isinstance((driver or {}).get("name"), str) and driver["name"], f"runs[{i}].tool.driver.name")
        rules = (driver or {}).get("rules", [])
        need(all(isinstance(r.get("id"), str) for r in rules), f"runs[{i}] every rule has an id")
        need(run.get("columnKind", "unicodeCodePoints") in ("unicodeCodePoints", "utf16CodeUnits"), "columnKind")
        for j, r in enumerate(run.get("results", [])):
            at = f"runs[{i}].results[{j}]"
            msg = r.get("message")
            need(isinstance(msg, dict) and (isinstance(msg.get("text"), str) or "id" in msg), f"{at}.message")
            need(r.get("level", "warning") in LEVELS, f"{at}.level")
            if "ruleIndex" in r:
                need(0 <= r["ruleIndex"] < len(rules) and rules[r["ruleIndex"]]["id"] == r.get("ruleId"), at)
            for loc in r.get("locations", []) + r.get("relatedLocations", []):
                phys = loc.get("physicalLocation")
                if phys is None:
                    continue
                need("artifactLocation" in phys or "address" in phys, f"{at}: physicalLocation names a place")
                uri = phys.get("artifactLocation", {}).get("uri")
                need(uri is None or (isinstance(uri, str) and not re.search(r"[\s\\]", uri)), f"{at}: uri {uri!r}")
                region = phys.get("region")
                if region is None:
                    continue
                need(isinstance(region.get("startLine"), int) and region["startLine"] >= 1, f"{at}.startLine")
                need(region.get("startColumn", 1) >= 1, f"{at}.startColumn")
                need(region.get("endLine", region.get("startLine")) >= region.get("startLine", 1), f"{at}.endLine")
                if region.get("endLine", region.get("startLine")) == region.get("startLine"):
                    need(region.get("endColumn", 2**31) >= region.get("startColumn", 1), f"{at}.endColumn")
    return bad


def test_the_sarif_check_can_fail():
    assert sarif_problems({"version": "2.1.0", "runs": [{"tool": {"driver": {}}}]}) == [
        "runs[0].tool.driver.name",
    ]
    region = {"startLine": 0, "startColumn": 3, "endColumn": 2}
    bad = {"physicalLocation": {"artifactLocation": {"uri": "a b.cdg"}, "region": region}}
    log = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": [{"locations": [bad]}]}]}
    assert len(sarif_problems(log)) == 4  # message, uri, startLine, endColumn


def results_of(text: str) -> list[dict]:
    log = json.loads(text)
    assert sarif_problems(log) == []
    (run,) = log["runs"]
    assert run["tool"]["driver"]["name"] == "cudnn-dsl" and set(run["properties"]["environment"]) >= {"gpu", "torch"}
    return run["results"]


def place(r: dict) -> tuple:
    p = r["locations"][0]["physicalLocation"]
    return p["artifactLocation"]["uri"], p["region"]["startLine"], p["region"]["startColumn"]


def test_check_writes_each_diagnostic_as_a_sarif_result_on_stdout(tmp_path):
    bad = ROOT / "tests" / "golden" / "errors" / "conv_channels.cdg"
    p = cli("check", "--format", "sarif", bad, MATMUL)
    assert p.returncode == 1
    (r,) = results_of(p.stdout)
    assert (r["ruleId"], r["level"]) == ("check", "error")
    assert r["message"]["text"].startswith("conv_fprop: image has 64 channels, weight expects 48")
    assert place(r) == (bad.as_uri(), 5, 28) and r["locations"][0]["physicalLocation"]["region"]["endColumn"] > 28
    assert "conv_channels.cdg:5:28: error" in p.stderr and "graph matmul_epilogue" in p.stderr  # the human report


def test_check_target_sarif_holds_cudnns_refusals_and_splits_at_the_graph(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("ln.cdg").write_text(LN_GELU)
    Path("gs.cdg").write_text(GENSTATS.replace("io half", "io half\n  option fallback = false"))
    p = cli("check", "--target", "h200", "--format", "sarif", "--output", "out.sarif", "ln.cdg", "gs.cdg")
    assert p.returncode == 1 and "declines graph ln_gelu whole" in p.stdout
    split, refused = results_of(Path("out.sarif").read_text())
    assert (split["ruleId"], split["level"], place(split)[:2]) == ("split", "note", ("ln.cdg", 1))
    assert "cuDNN for NVIDIA H200 declines graph ln_gelu whole" in split["message"]["text"]
    assert (refused["ruleId"], refused["level"]) == ("plan", "error")
    assert "no cuDNN engine runs genstats here, even alone" in refused["message"]["text"]
    assert place(refused)[0] == "gs.cdg" and place(refused)[1] > 1  # at the call, not the graph


def test_support_writes_sarif_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("ln.cdg").write_text(LN_GELU)
    Path("bad.cdg").write_text("graph g {\n  input x : half[2, 3]\n  output y = relu(x) * q\n}\n")
    p = cli("support", "--target", "h200", "--format", "sarif", "ln.cdg", "bad.cdg")
    assert p.returncode == 1
    results = results_of(p.stdout)
    assert [(r["ruleId"], place(r)) for r in results] == [("check", ("bad.cdg", 3, 24)), ("split", ("ln.cdg", 1, 1))]


@pytest.mark.parametrize(
    "args, words",
    [
        (["check", "--output", "x.sarif", MATMUL], "--output goes with --format sarif"),
        (["check", "--format", "sarif", "--json", "-", MATMUL], "both want stdout"),
        (["check", "--format", "sarif", "--emit", "ir", MATMUL], "--emit prints a stage instead"),
        (["support", "--format", "sarif", "--output", ROOT, MATMUL], "is a directory"),
    ],
)
def test_sarif_usage_errors(args, words):
    p = cli(*args)
    assert p.returncode == 2 and words in p.stderr, p.stderr


# ---- tune --exhaustive without a GPU ------------------------------------------------------------


@NO_GPU
def test_tune_exhaustive_without_a_gpu_does_what_its_help_says(tmp_path, monkeypatch):
    """Its help says a search without a GPU starts at the first configuration each time, and it does."""
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    text = " ".join(cli("tune", "--help").stdout.split())
    assert "without one, only asks cuDNN which it supports for --target, from the first configuration each time" in text
    runs = []
    for _ in range(2):
        p = cli("tune", "--exhaustive", "--max-configs", "4", "--json", "-", EX / "plan_serialization.cdg")
        assert p.returncode == 0 and "nothing is recorded" in p.stderr
        runs.append([(t["engine"], t["knobs"]) for t in json.loads(p.stdout)["files"][0]["graphs"][0]["tried"]])
    assert runs[0] == runs[1] and len(runs[0]) == 4
    assert "--restart changes nothing" in cli("tune", "--exhaustive", "--restart", "--max-configs", "1", MATMUL).stderr
