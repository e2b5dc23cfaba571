"""The command line's one error boundary: exit codes as the README promises, usage errors that
name what is valid, no traceback on any input, and a fast front door that imports no torch."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_util import run_cli

from cudnn_dsl.cli import main

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
MM = EX / "plan_serialization.cdg"  # inputs a, b; output c


def cli(*args):
    return run_cli(*args)


@pytest.mark.parametrize(
    "args,words",
    [
        (("run", MM, "--graph", "nosuch"), "has no graph 'nosuch'"),
        (("emit", EX / "layernorm.cdg"), "holds 2 graphs"),
        (("run", EX / "dynamic_shapes.cdg", "--shape", "N=12"), "selects none"),
        (("run", EX / "dynamic_shapes.cdg", "--shape", "Q=8"), "has no symbolic dim Q (its dims: N)"),
        (("run", MM, "--target", "nosuch"), "unknown target 'nosuch'"),
        (("check", "--target", "nosuch", MM), "unknown target 'nosuch'"),
        (
            ("check", "--device-properties", "/nonexistent.json", MM),
            "device descriptor /nonexistent.json: no such file",
        ),
        (("run", MM, "--atol", "cc=0.1"), "--atol cc=0.1: no 'cc' here; the names are c"),
        (("run", MM, "--rtol", "a=0.1"), "no 'a' here; the names are c"),
        (("run", MM, "--input", "zz=x.pt"), "no 'zz' here; the names are a, b"),
        (("run", MM, "--init", "q=randn"), "no 'q' here; the names are a, b"),
        (("run", MM, "--init", "a=uniform(3, 1)"), "lo (3) is greater than hi (1)"),
        (("run", MM, "--init", "a=randn(0,"), "is not DIST or DIST(NUMBER, ...)"),
        (("run", MM, "--init", "a=__import__(1)"), "unknown distribution '__import__'"),
        (("run", MM, "--no-compare", "a"), "--no-compare a: no 'a' here; the outputs are c"),
        (("run", MM, "--scalar", "s=1"), "the names are none"),
        (("run", MM, "--iterations", "0"), "--iterations: must be >= 1"),
        (("run", MM, "--iterations", "-3"), "--iterations: must be >= 1"),
        (("run", MM, "--seed", "99999999999999999999999"), "--seed: has a value out of range"),
        (("run", MM, "--heuristics", "Z"), "--heuristics: must be one of A, B, FALLBACK"),
        (("run", MM, "--json", "examples"), "--json examples: is a directory"),
        (("run", MM, "--save-outputs", "README.md"), "not a directory"),
        (("check", "examples"), "examples is not a regular file (a directory)"),
        (("check", "no/such/file.cdg"), "no such file"),
        (("bench", MM, "--plot", "x.png", "--against", "nothing"), "--against takes"),
    ],
)
def test_usage_errors_exit_2_and_say_what_is_valid(args, words):
    p = cli(*args)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert words in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_version_and_help_answer():
    p = cli("--version")
    assert p.returncode == 0 and p.stdout.startswith("cudnn-dsl ")
    for cmd in ("check", "fmt", "run", "emit", "tune", "bench", "cache", "device-info"):
        assert cli(cmd, "--help").returncode == 0


def test_check_fmt_and_help_import_neither_torch_nor_cudnn():
    for args in (
        ["check", str(EX / "sdpa.cdg")],
        ["fmt", "--check", str(EX / "sdpa.cdg")],
        ["--help"],
        ["run", "--help"],
        ["check", "--emit", "ir", str(EX / "sdpa.cdg")],
    ):
        code = (
            "import sys\nfrom cudnn_dsl.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'cudnn', 'numpy'})\n"
            "print('HEAVY', heavy, file=sys.stderr)\n"
        )
        p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)
        assert "HEAVY []" in p.stderr, (args, p.stderr[-500:])


def test_check_json_carries_the_errors_in_one_schema(tmp_path):
    bad = tmp_path / "bad.cdg"
    bad.write_text("graph g {\n  input x : half[4]\n  output y = relu(q)\n}\n")
    p = cli("check", "--json", "-", bad, EX / "sdpa.cdg")
    data = json.loads(p.stdout)
    assert p.returncode == 1 and [f["file"] for f in data["files"]] == [str(bad), str(EX / "sdpa.cdg")]
    assert data["files"][0]["diagnostics"][0]["message"].startswith("unknown name 'q'")
    assert data["files"][1]["graphs"][0]["name"] == "sdpa_causal"
    one = json.loads(cli("check", "--json", "-", EX / "sdpa.cdg").stdout)
    assert list(one) == ["schema_version", "environment", "files"]  # one file or several: the same shape


def test_check_json_and_emit_are_exclusive(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli("check", "--json", "-", "--emit", "ir", MM).returncode == 2


def test_emit_renders_located_errors(tmp_path):
    bad = tmp_path / "bad.cdg"
    bad.write_text("graph g {\n  input x : half[4]\n  output y = relu(q)\n}\n")
    p = cli("emit", bad)
    assert p.returncode == 1 and f"{bad}:3:19: error: unknown name 'q'" in p.stderr


def test_fmt_stdout_prints_a_canonical_file_too():
    p = cli("fmt", "--stdout", MM)
    assert p.returncode == 0 and p.stdout == MM.read_text()


def test_bench_plot_without_matplotlib_is_a_usage_error_before_any_work():
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib is installed here")
    p = cli("bench", MM, "--plot", "x.png")
    assert p.returncode == 2 and "needs matplotlib" in p.stderr


def test_a_bug_says_it_is_a_bug(monkeypatch, capsys):
    from cudnn_dsl.cli import check

    def broken(args):
        return {}["a key a bug forgot"]

    monkeypatch.setattr(check, "run", broken)
    assert main(["check", str(MM)]) == 70
    err = capsys.readouterr().err
    assert "internal error: KeyError" in err and "This is a bug in cudnn-dsl" in err and "Traceback" in err


def test_diagnostics_follow_a_redirected_stderr():
    # the loader once bound sys.stderr when imported, so a later redirect missed them (D31)
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        assert main(["check", str(ROOT / "tests" / "golden" / "errors" / "unknown_name.cdg")]) == 1
    assert "error: unknown name" in buf.getvalue()


def test_ctrl_c_is_a_message_and_exit_130():
    # An interrupt that lands where the interpreter drops it (the run then ends normally, exit 0) is tried again,
    # three times at most: the exit code and message of an interrupt that arrives are what is checked.
    for _ in range(3):
        p = subprocess.Popen(
            [sys.executable, "-m", "cudnn_dsl", "run", str(EX / "conv_bias_relu.cdg")],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        first = p.stderr.readline()  # the "no CUDA GPU here" note: the command is at work
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        assert "no CUDA GPU here" in first
        if p.returncode != 0:
            break
    # -SIGINT: after the message the interpreter may end by the signal itself, which a shell reports as 130 too
    assert p.returncode in (130, -signal.SIGINT) and "cudnn-dsl: interrupted" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda d: d.joinpath("e.pt").write_bytes(b""), "not a readable tensor file"),
        (lambda d: d.joinpath("e.pt").write_bytes(os.urandom(300)), "not a readable tensor file"),
        (lambda d: __import__("torch").save({"a": 1}, d / "e.pt"), "holds a dict, not a tensor"),
        (
            lambda d: __import__("torch").save(
                __import__("torch").ones(8, 256, 512, dtype=__import__("torch").complex64), d / "e.pt"
            ),
            "complex",
        ),
        (
            lambda d: __import__("torch").save(__import__("torch").randn(8, 256, 512), d / "e.pt"),
            "float values that bf16 cannot hold exactly",
        ),
    ],
)
def test_bad_input_files_are_refused_before_planning(tmp_path, make, words):
    make(tmp_path)
    p = cli("run", MM, "--input", f"a={tmp_path / 'e.pt'}")
    assert p.returncode == 1 and words in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "plan " not in p.stdout  # refused before cuDNN was asked anything


def test_an_exact_input_file_is_used_and_a_lossy_one_only_when_asked(tmp_path):
    import torch

    torch.save(torch.randn(8, 256, 512).bfloat16().float(), tmp_path / "exact.pt")
    assert cli("run", MM, "--input", f"a={tmp_path / 'exact.pt'}").returncode == 0
    torch.save(torch.randn(8, 256, 512), tmp_path / "lossy.pt")
    assert cli("run", MM, "--input", f"a={tmp_path / 'lossy.pt'}", "--cast-inputs").returncode == 0


def test_run_without_a_gpu_saves_the_reference_outputs(tmp_path):
    p = cli("run", MM, "--save-outputs", tmp_path / "out", "--json", tmp_path / "r.json")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / "plan_serialization.c.reference.pt").is_file()
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["files"][0]["graphs"][0]["skipped"]["execution"] == "no CUDA GPU here"


def test_run_takes_scalar_values(tmp_path):
    g = tmp_path / "s.cdg"
    g.write_text(
        "graph g {\n  input a : half[1, 8, 8]\n  input b : half[1, 8, 8]\n  scalar s : float = 1\n"
        "  output y = matmul(a, b) * s\n}\n"
    )
    one = cli("run", g, "--init", "a=full(1)", "--init", "b=full(1)")
    two = cli("run", g, "--init", "a=full(1)", "--init", "b=full(1)", "--scalar", "s=2.5")
    assert "mean 8," in one.stdout and "mean 20," in two.stdout, one.stdout + one.stderr
    assert "out of range for half" in cli("run", g.parent / _half(g), "--scalar", "s=1e9").stderr


def _half(g: Path) -> str:
    h = g.parent / "h.cdg"
    h.write_text("graph g {\n  input x : half[4]\n  scalar s : half = 1\n  output y = x * s\n}\n")
    return h.name


def test_a_reference_too_big_for_this_machine_is_skipped_with_a_note(tmp_path):
    g = tmp_path / "big.cdg"
    g.write_text("graph g {\n  input a : bf16[1, 1048576, 1048576]\n  output y = relu(a)\n}\n")
    p = cli("run", g, "--target", "h200")
    assert p.returncode == 0, p.stderr
    assert "skipped    the PyTorch reference: it would hold about" in p.stdout
    assert "skipped    the PyTorch reference: --no-reference" in cli("run", MM, "--no-reference").stdout


# ---- files that are not what they seem ------------------------------------------------------------------


def test_a_device_is_refused_unread_and_a_huge_file_is_located(tmp_path):
    p = cli("check", "/dev/zero")
    assert p.returncode == 2 and "/dev/zero is not a regular file (a character device)" in p.stderr
    huge = tmp_path / "huge.cdg"
    with open(huge, "wb") as f:
        f.truncate(4_194_305)  # sparse: one byte over the limit
    p = cli("check", huge)
    assert p.returncode == 1 and "huge.cdg:1:1: error: file is larger than 4,194,304 bytes" in p.stderr


def test_a_report_path_below_a_file_is_a_usage_error_and_an_unwritable_one_no_traceback(tmp_path):
    p = cli("check", MM, "--json", f"{MM}/sub/r.json")
    assert p.returncode == 2 and "is not a directory" in p.stderr
    p = cli("run", MM, "--save-outputs", f"{MM}/sub")
    assert p.returncode in (1, 2) and "Traceback" not in p.stderr and "internal error" not in p.stderr


def test_several_files_are_all_checked_when_one_is_missing(tmp_path):
    p = cli("check", MM, tmp_path / "missing.cdg", EX / "sdpa.cdg", "--json", tmp_path / "r.json")
    assert p.returncode == 2 and "missing.cdg: no such file" in p.stderr
    assert [f["file"] for f in json.loads((tmp_path / "r.json").read_text())["files"]] == [
        str(MM),
        str(EX / "sdpa.cdg"),
    ]


def test_a_descriptor_cudnn_refuses_fails_run_when_it_was_asked_for(tmp_path):
    desc = tmp_path / "dp.json"
    desc.write_text('{"deviceVer": 900}')
    p = cli("run", MM, "--device-properties", desc)
    assert p.returncode == 1 and str(desc) in p.stderr and "skipped    cuDNN planning" not in p.stdout


def test_cache_actions_refuse_arguments_they_do_not_take(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path))
    assert cli("cache", "clear", "0123456789abcdef0123456789abcdef").returncode == 2
    assert cli("cache", "ls", "--force").returncode == 2


def test_per_name_flags_take_the_names_of_every_graph_of_the_file():
    # layernorm.cdg holds a layer norm (with beta) and an RMS norm (without): --init beta is for the first
    p = cli("run", EX / "layernorm.cdg", "--init", "beta=uniform(0, 1)", "--no-reference")
    assert p.returncode == 0, p.stderr


def test_flags_that_mean_nothing_without_a_gpu_are_said_to_be_ignored():
    p = cli("run", MM, "--iterations", "3", "--cuda-graph", "--no-reference")
    assert p.returncode == 0 and "--cuda-graph, --iterations ignored: no CUDA GPU here" in p.stderr


# ---- repro: run --dump, run --inputs-from ------------------------------------------------------------


def test_a_dump_reproduces_the_run_and_refuses_another_graph(tmp_path):
    d = tmp_path / "dump"
    p = cli("run", MM, "--dump", d, "--seed", "7")
    assert p.returncode == 0, p.stderr
    names = {f.name for f in d.iterdir()}
    assert {
        "plan_serialization.cdg",
        "plan_serialization.inputs.pt",
        "plan_serialization.reference.pt",
        "plan_serialization.cudnn.py",
        "plan_serialization.torch.py",
        "plan_serialization.fe.json",
        "plan_serialization.manifest.json",
        "environment.json",
    } <= names
    again = cli("run", MM, "--inputs-from", d)
    assert again.returncode == 0 and "repro      reference identical to the dump's, bit for bit" in again.stdout
    other = tmp_path / "other.cdg"
    other.write_text(
        MM.read_text()
        .replace("bf16[8, 256, 512]", "bf16[8, 256, 256]")
        .replace("bf16[8, 512, 256]", "bf16[8, 256, 256]")
    )
    p = cli("run", other, "--inputs-from", d)
    assert p.returncode == 1 and "the dump is of another graph" in p.stderr
    assert cli("run", MM, "--inputs-from", d, "--seed", "1").returncode == 2


def test_an_interrupt_that_surfaces_as_another_error_is_still_an_interrupt(monkeypatch, capsys):
    """Ctrl-C inside an extension module's import (numpy's, under torch's lazy import) can surface as an ImportError
    ("cannot load module more than once per process" on the next import): still exit 130, not an internal error."""
    import threading

    from cudnn_dsl.cli import common

    monkeypatch.setattr(common, "_interrupted", threading.Event())
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        common.remember_interrupts()
        try:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler raises here
            except KeyboardInterrupt:
                raise ImportError("cannot load module more than once per process") from None
        except ImportError as e:
            code = common.report(e)
    finally:
        signal.signal(signal.SIGINT, before)
    assert code == 130, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "interrupted" in err and "internal error" not in err


# A FIFO opened for reading blocks until a writer comes: each reader refuses it by name instead. The subprocess's
# timeout is one only a hang reaches.


def _cli_process(*args, env=()) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "cudnn_dsl", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path, **dict(env)},
    )


@pytest.mark.parametrize("command", [("check",), ("fmt",), ("emit", "--format", "cudnn")])
def test_a_fifo_as_the_cdg_file_is_refused_by_name_not_waited_on(tmp_path, command):
    fifo = tmp_path / "f.cdg"
    os.mkfifo(fifo)
    p = _cli_process(*command, fifo)
    assert p.returncode == 2 and f"{fifo} is not a regular file (a FIFO)" in p.stderr, p.stderr


def test_a_fifo_for_every_other_file_the_cli_reads_is_refused_by_name(tmp_path):
    fifo, fifo_py, dump = tmp_path / "named", tmp_path / "model.py", tmp_path / "dump"
    os.mkfifo(fifo)
    os.mkfifo(fifo_py)
    dump.mkdir()
    os.mkfifo(dump / "plan_serialization.manifest.json")
    for args, words in [
        (("import", fifo), f"{fifo} is not a regular file (a FIFO)"),
        (("import", "--from-torch", f"{fifo_py}:f", "--example", "float[2]"), f"{fifo_py} is not a regular file"),
        (("sweep", fifo, "--dry-run"), f"sweep spec {fifo} is not a regular file (a FIFO)"),
        (("run", MM, "--inputs-from", fifo), f"--inputs-from {fifo} is not a directory (a FIFO)"),
        (("cache", "import", fifo), f"bundle {fifo} is not a regular file (a FIFO)"),
    ]:
        p = _cli_process(*args, env={"CUDNN_DSL_CACHE_DIR": str(tmp_path / "cache")})
        assert p.returncode == 2 and words in p.stderr, (args, p.stderr)
    # a dump's own file is the dump's problem, as a damaged one is (exit 1), named all the same
    p = _cli_process("run", MM, "--inputs-from", dump)
    assert p.returncode == 1 and "plan_serialization.manifest.json is not a regular file (a FIFO)" in p.stderr, p.stderr
