"""What an install brings and says: the frontend release the runtime supports, the license, numpy, a clean exit, the
no-device libcuda made without a compiler, and `support --cudnn` against versions of cuDNN installed side by side.

The tests marked `network` install from the package index with pip: they run only under `pytest -m network`, and are
skipped when the index cannot be reached.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cudnn_dsl.target import library
from cudnn_dsl.target.driver import CUDA_ERROR_NO_DEVICE, StandInUnavailable, elf_image

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def _dependencies() -> list[str]:
    block = re.search(r"^dependencies = \[(.*?)^\]", PYPROJECT, re.S | re.M).group(1)
    return re.findall(r'^\s*"([^"]+)"', block, re.M)


def test_pyproject_requires_the_frontend_release_the_loader_checks():
    assert library.frontend_requirement() in _dependencies()


def test_a_frontend_of_another_release_is_refused_naming_both_versions():
    why = library.frontend_refusal("1.31.0", [])
    assert "1.31.0" in why and library.frontend_requirement() in why
    assert "lacks pygraph._plans" in library.frontend_refusal("1.32.9", ["pygraph._plans"])
    cudnn = library.load_cudnn()
    assert library.frontend_refusal(cudnn.__version__, []) is None


def test_numpy_is_a_dependency():
    assert "numpy" in _dependencies()  # torch warns on import without it


def test_the_license_is_the_apache_2_text_the_metadata_names():
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in text
    assert 'license = "Apache-2.0"' in PYPROJECT and 'license-files = ["LICENSE"]' in PYPROJECT


def _cli(*argv, env=None, timeout=600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "cudnn_dsl", *argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_a_deviceless_run_exits_without_leak_reports():
    """The frontend's nanobind objects are gone before it is torn down (its leak report would name them)."""
    proc = _cli("check", "--target", "h200", "examples/conv_bias_relu.cdg")
    assert proc.returncode == 0, proc.stderr
    assert "leaked" not in proc.stderr and "NumPy" not in proc.stderr, proc.stderr


def test_the_stand_in_answers_no_device_from_every_name(tmp_path):
    """The ELF image made without a compiler loads, and each cu* name returns CUDA_ERROR_NO_DEVICE."""
    names = ["cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuGetProcAddress_v2"]
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(elf_image(names))
    code = f"import ctypes; lib = ctypes.CDLL({str(lib)!r}); print([getattr(lib, n)() for n in {names!r}])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.stdout.strip() == str([CUDA_ERROR_NO_DEVICE] * len(names)), proc.stderr


def test_the_stand_in_is_made_for_arm_too():
    image = elf_image(["cuInit"], machine="aarch64")
    assert image[:4] == b"\x7fELF" and int.from_bytes(image[18:20], "little") == 183  # EM_AARCH64
    with pytest.raises(StandInUnavailable):
        elf_image(["cuInit"], machine="sparc64")


def test_support_names_the_library_that_answered():
    proc = _cli("support", "--target", "h200", "examples/conv_bias_relu.cdg")
    assert proc.returncode == 0, proc.stderr
    here = library.answering()
    assert f"answered by cuDNN {here.version} ({here.path})" in proc.stdout, proc.stdout
    assert f"fuses — one cuDNN {here.version} graph" in proc.stdout, proc.stdout


def test_support_cudnn_without_fetch_says_how_to_get_a_missing_version(tmp_path):
    """A version not here is the machine's lack, as a missing GPU is (exit 1), not a usage error (exit 2)."""
    proc = _cli("support", "--cudnn", "9.99", "examples/conv_bias_relu.cdg", env={"CUDNN_DSL_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 1 and "cuDNN 9.99 is not here" in proc.stderr and "pass --fetch" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir()), "nothing is fetched without --fetch"
    empty = _cli("support", "--cudnn", "", "examples/conv_bias_relu.cdg", env={"CUDNN_DSL_CACHE_DIR": str(tmp_path)})
    assert empty.returncode == 2 and "--cudnn '' names no version" in empty.stderr, empty.stderr


#: the cuDNN that torch 2.13's CUDA build pins: what a plain `pip install torch` plans with
OTHER_CUDNN = "9.20"


@pytest.mark.network
def test_support_cudnn_answers_per_version_each_from_its_own_library(tmp_path):
    """One version fetched into the cache directory, one installed: each answers in its own process, and says so.
    The default cache directory keeps the fetched one for the next run."""
    here, other = ".".join(library.installed_cudnn()[1].split(".")[:2]), OTHER_CUDNN
    fetched = library.side_by_side(other).is_dir()
    out = tmp_path / "support.json"
    proc = _cli(
        "support",
        "--target",
        "h200",
        "--cudnn",
        f"{other},{here}",
        "--fetch",
        "--json",
        str(out),
        "examples/conv_bias_relu.cdg",
        timeout=1800,
    )
    if proc.returncode and not fetched and "pip could not install" in proc.stderr:
        pytest.skip(f"the package index cannot be reached: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads(out.read_text())["support"]
    assert [(r["cudnn_asked"], library.matches(r["cudnn"]["version"], r["cudnn_asked"])) for r in records] == [
        (other, True),
        (here, True),
    ]
    assert records[0]["cudnn"]["path"].startswith(str(library.side_by_side(other)))
    assert f"answered by cuDNN {records[0]['cudnn']['version']} ({records[0]['cudnn']['path']})" in proc.stdout


@pytest.mark.network
def test_an_older_frontend_is_refused_at_import_naming_both_versions(tmp_path):
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tmp_path / "fe")]
    major, minor = library.FRONTEND_RELEASE
    got = subprocess.run([*pip, f"nvidia-cudnn-frontend=={major}.{minor - 1}.*"], capture_output=True, text=True)
    if got.returncode:
        pytest.skip(f"the package index cannot be reached: {got.stderr.strip().splitlines()[-1:]}")
    code = textwrap.dedent("""
        from cudnn_dsl.target.library import BackendUnavailable, load_cudnn
        try:
            load_cudnn()
        except BackendUnavailable as e:
            print(e)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path / "fe"), str(ROOT)))}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert f"installed is {major}.{minor - 1}." in proc.stdout and library.frontend_requirement() in proc.stdout, (
        proc.stdout + proc.stderr
    )
