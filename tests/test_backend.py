"""Loading the real cuDNN library without a GPU: where the no-device libcuda comes from, what happens when the cache
cannot be written or holds something planted or damaged, and how bad targets and descriptor files are reported.

Loading cuDNN changes a process for good (load_cudnn is cached and a shared library stays loaded), so every case that
needs a fresh load runs in a subprocess. Nothing is mocked: each run loads the real cuDNN library.
"""

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from cudnn_dsl.target.library import BackendUnavailable, Target

ROOT = Path(__file__).resolve().parents[1]
PLANTED = '#include <stdlib.h>\n__attribute__((constructor)) static void planted(void) {{ system("touch {}"); }}\n'


def _env(cache, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "CUDNN_DSL_CACHE_DIR")}
    env.update(CUDNN_DSL_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), **extra)
    return env


def check_fields(env, python=sys.executable, **kw) -> subprocess.CompletedProcess:
    """`cudnn-dsl check --target h200` on the SDPA example: cuDNN plans it with its runtime-compiled engine."""
    cmd = [str(python), "-m", "cudnn_dsl", "check", "--target", "h200", "examples/sdpa.cdg"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False, **kw)


def _load(env, code="") -> subprocess.CompletedProcess:
    """load_cudnn() and the H200 descriptor in a fresh process, then `code`; lighter than a whole `check`."""
    prelude = (
        "from cudnn_dsl.target.library import BackendUnavailable, Target, device_properties, load_cudnn\n"
        "try:\n    device_properties(Target.named('h200'))\n    print('loaded')\n"
        "except BackendUnavailable as e:\n    print('unavailable:', e)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _planned(proc) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "candidates, first eng" in proc.stdout


def _notes(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("cudnn-dsl:")]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A cache directory after one deviceless run, to copy and tamper with."""
    cache = tmp_path_factory.mktemp("warm") / "cache"
    _planned(check_fields(_env(cache)))
    return cache


def _copy(warm_cache, tmp_path) -> Path:
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    return cache


# ---- D11: the cache never holds code that is run ----------------------------------------------------------------


def test_a_library_planted_in_the_cache_is_never_run(warm_cache, tmp_path):
    cache = _copy(warm_cache, tmp_path)
    if shutil.which("cc") is None:
        pytest.skip("making the planted library needs a C compiler")
    marker = tmp_path / "PLANTED"
    src = tmp_path / "planted.c"
    src.write_text(PLANTED.format(marker))
    lib = tmp_path / "planted.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    # Every libcuda.so.1 the cache holds, and one in every directory of it: wherever a loader might look.
    spots = set(cache.rglob("libcuda.so.1")) | {d / "libcuda.so.1" for d in [cache, *cache.rglob("*")] if d.is_dir()}
    for spot in spots:
        shutil.copy(lib, spot)
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    proc = check_fields(_env(cache, TMPDIR=str(tmp)))
    assert not marker.exists(), "the planted library ran"
    _planned(proc)
    assert list(tmp.iterdir()) == [], "a file was left in the temporary directory"


def test_damaged_cache_files_are_rebuilt_and_said_once(warm_cache, tmp_path):
    cache = _copy(warm_cache, tmp_path)
    damaged = [p for p in cache.rglob("*") if p.is_file()]
    assert damaged
    for p in damaged:
        p.write_bytes(b"")
    proc = check_fields(_env(cache))
    _planned(proc)
    assert len(_notes(proc)) == 1 and "damaged" in _notes(proc)[0], proc.stderr
    again = check_fields(_env(cache))
    _planned(again)
    assert _notes(again) == [], again.stderr


def test_a_symbol_list_that_is_not_plain_names_is_refused(warm_cache, tmp_path):
    cache = _copy(warm_cache, tmp_path)
    lists = list(cache.rglob("*.json"))
    assert lists, "the cache should hold cuDNN's driver symbol names (data), not a library"
    marker = tmp_path / "INJECTED"
    for p in lists:
        d = json.loads(p.read_text())
        # A consistent checksum: only the check of each name stands between this text and the stand-in.
        d["names"].append(
            f'cuX(void); __attribute__((constructor)) static void p(void) {{ system("touch {marker}"); }} int cuY'
        )
        d["sha256"] = hashlib.sha256("\n".join(d["names"]).encode()).hexdigest()
        p.write_text(json.dumps(d))
    proc = _load(_env(cache))
    assert not marker.exists(), "text from the cache reached the stand-in"
    assert "loaded" in proc.stdout.splitlines(), proc.stdout + proc.stderr
    assert len(_notes(proc)) == 1 and "damaged" in _notes(proc)[0], proc.stderr


def test_the_stand_in_is_a_library_only_this_process_holds(warm_cache, tmp_path):
    """The no-device libcuda.so.1 is made in memory (no compiler, no file): mapped from a sealed memfd."""
    code = """
        maps = [line.split(maxsplit=5)[-1].strip() for line in open("/proc/self/maps") if "libcuda.so.1" in line]
        print("mapped:", sorted(set(maps)))
    """
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    proc = _load(_env(_copy(warm_cache, tmp_path), TMPDIR=str(tmp), PATH=str(tmp_path)), code)
    assert proc.stdout.splitlines() == ["loaded", "mapped: ['/memfd:libcuda.so.1 (deleted)']"], (
        proc.stdout + proc.stderr
    )
    assert list(tmp.iterdir()) == []


# ---- D2: a cache directory that cannot be written ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["a regular file", "below a regular file"])
def test_a_cache_path_that_cannot_be_a_directory_falls_back_with_one_note(tmp_path, where):
    f = tmp_path / "file"
    f.write_text("x")
    cache = f if where == "a regular file" else f / "cudnn-dsl"
    proc = check_fields(_env(cache))
    _planned(proc)
    assert len(_notes(proc)) == 1 and str(cache) in _notes(proc)[0], proc.stderr


def test_a_read_only_cache_dir_falls_back_with_one_note(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    # Tests run as root, whom file modes do not stop; the immutable attribute does, where the filesystem has it.
    if subprocess.run(["chattr", "+i", str(cache)], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not available here")
    try:
        try:
            (cache / "probe").touch()
        except PermissionError:
            pass
        else:
            pytest.skip("chattr +i does not stop writes here")
        proc = check_fields(_env(cache))
    finally:
        subprocess.run(["chattr", "-i", str(cache)], check=True)
    _planned(proc)
    assert len(_notes(proc)) == 1 and str(cache) in _notes(proc)[0], proc.stderr


def test_an_unwritable_home_as_an_unprivileged_user_falls_back(tmp_path):
    setpriv = shutil.which("setpriv")
    as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"] if setpriv else []
    env = _env("unused", HOME="/nonexistent")
    del env["CUDNN_DSL_CACHE_DIR"]
    if (
        not setpriv
        or subprocess.run(
            [*as_nobody, sys.executable, "-c", "import cudnn, cudnn_dsl"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            check=False,
        ).returncode
    ):
        pytest.skip("cannot run this Python with cudnn and cudnn_dsl as uid 65534 here")
    proc = subprocess.run(
        [*as_nobody, sys.executable, "-m", "cudnn_dsl", "check", "--target", "h200", "examples/sdpa.cdg"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    _planned(proc)
    assert len(_notes(proc)) == 1 and "/nonexistent" in _notes(proc)[0], proc.stderr


# ---- D10 and D23: descriptor files and target names --------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        None,
        "a directory",
        "/dev/zero",
        "not json {",
        "[1, 2]",
        '{"deviceName": "x"}',
        '{"deviceVer": "nine"}',
        '{"deviceVer": true}',
        b"\xff\xfe{}",
    ],
)
def test_a_descriptor_file_that_cannot_be_read_as_one_is_a_usage_error(tmp_path, content):
    from cudnn_dsl.target.library import DescriptorFileError

    path = tmp_path / "dp.json"
    if content == "a directory":
        path.mkdir()
    elif content == "/dev/zero":  # endless: the read must be bounded
        path = Path(content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(DescriptorFileError) as e:
        Target.from_file(path)
    assert isinstance(e.value, ValueError) and str(path) in str(e.value)


def test_a_descriptor_cudnn_rejects_is_reported_with_the_file_and_cudnns_words(tmp_path):
    from cudnn_dsl.target.library import device_properties, load_cudnn

    load_cudnn()
    path = tmp_path / "dp.json"
    path.write_text('{"deviceVer": 900}')
    with pytest.raises(BackendUnavailable) as e:
        device_properties(Target.from_file(path))
    assert str(path) in str(e.value) and "maxGridSize" in str(e.value)


@pytest.mark.parametrize("name", ["nosuch", "../devices/h200", "", "h200.json"])
def test_an_unknown_target_is_a_usage_error_naming_the_known_ones(name):
    from cudnn_dsl.target.library import UnknownTarget

    with pytest.raises(UnknownTarget, match="h200") as e:
        Target.named(name)
    assert isinstance(e.value, ValueError)


def test_target_names_are_case_insensitive():
    t = Target.named("H200")
    assert t.sm_version == 90 and "H200" in t.name


# ---- load_cudnn: every failure explained, nothing half loaded ---------------------------------------------------


def _venv_with_these_packages(venv: Path) -> tuple[Path, Path]:
    """A virtual environment whose Python finds the packages this one finds, ahead of them its own site-packages
    (returned with its Python). `--system-site-packages` would give it the base interpreter's packages, not those
    of a virtual environment that the tests run in."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = [*site.getsitepackages(), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    if site.ENABLE_USER_SITE:
        ours.append(site.getusersitepackages())
    # addsitedir, not a plain path line: the .pth files there (an editable install's) act as they do here
    adds = "; ".join(f"site.addsitedir({d!r})" for d in dict.fromkeys(ours) if os.path.isdir(d))
    (Path(purelib) / "these_packages.pth").write_text(f"import site; {adds}\n")
    return python, Path(purelib)


def test_a_damaged_library_is_reported_with_advice_and_nothing_is_loaded(tmp_path):
    python, purelib = _venv_with_these_packages(tmp_path / "venv")
    # A truncated download of one library that cuDNN needs, found before the good copy.
    bad = purelib / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"")
    code = """
        from cudnn_dsl.target.library import BackendUnavailable, load_cudnn
        for attempt in range(2):
            try:
                load_cudnn()
            except BackendUnavailable as e:
                print("unavailable:", e)
        maps = open("/proc/self/maps").read()
        print("loaded:", [n for n in ("libcudnn", "libcuda", "libcublasLt", "libnvrtc") if n in maps])
    """
    proc = subprocess.run(
        [python, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=_env(tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[0] == lines[1], proc.stdout
    assert str(bad) in lines[0] and "reinstall" in lines[0], lines[0]
    assert lines[2] == "loaded: []"


def test_planning_without_a_gpu_needs_no_c_compiler(tmp_path):
    """No cc, gcc or anything else on PATH: cuDNN still plans for an H200."""
    _planned(check_fields(_env(tmp_path / "cache", PATH=str(tmp_path))))


def test_a_failed_load_can_be_retried_in_the_same_process(tmp_path):
    """A damaged libcudnn.so.9 first on $LD_LIBRARY_PATH (where the frontend looks first) is refused; once the
    path is put right, the same process loads the installed one."""
    (tmp_path / "libcudnn.so.9").write_bytes(b"")
    code = """
        import os
        del os.environ["LD_LIBRARY_PATH"]
        load_cudnn()
        print("retried")
    """
    proc = _load(_env(tmp_path / "cache", LD_LIBRARY_PATH=str(tmp_path)), code)
    first = proc.stdout.splitlines()[0]
    assert first.startswith("unavailable:") and "libcudnn.so.9 is damaged" in first, proc.stdout + proc.stderr
    assert "retried" in proc.stdout, proc.stdout + proc.stderr
