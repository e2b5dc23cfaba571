"""Loading the real cuDNN Frontend, with or without a GPU, and device targets.

Without a GPU, cuDNN can still plan for a described device ("deviceless"): the frontend gets a
serialized device descriptor and an SM version, and a no-device libcuda.so.1 (target.driver) stands
in for the CUDA driver so that the library loads. The cuDNN library is looked for where the
frontend looks (the directories of $LD_LIBRARY_PATH, then the installed package), so the one checked
and loaded here is the one that answers; `answering()` names it.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import attrs

from cudnn_dsl.target.driver import StandInUnavailable, load_stand_in
from dsl import files

DEVICES_DIR = Path(__file__).parent / "devices"
_MAX_DESCRIPTOR = 1 << 20


DEFAULT_TARGET = "h200"
"""the GPU to plan for without one, unless told otherwise (its descriptor ships in devices/)"""


class BackendUnavailable(Exception):
    """cuDNN cannot be loaded or used here; the message says why and what to install or fix."""


class UnknownTarget(ValueError):
    """A target name with no bundled descriptor (a usage error); the message lists the known ones."""


class DescriptorFileError(ValueError):
    """A device descriptor file that cannot be read, or is not a JSON descriptor at all (a usage error)."""


@attrs.frozen
class Target:
    """A device to plan for without having it: a descriptor and its SM version."""

    name: str
    descriptor: str
    sm_version: int
    source: str = ""  # the descriptor's file, for messages
    unverified: str = ""
    """why the descriptor may not match a real GPU (bundled ones made from published figures say so)"""

    @classmethod
    def from_file(cls, path: str | Path) -> Target:
        """Raises DescriptorFileError when the file cannot be read or holds no JSON object with an integer
        deviceVer. Whether cuDNN accepts the rest shows in device_properties."""
        try:
            text = files.read_text(path, _MAX_DESCRIPTOR, "device descriptor")
        except files.Unreadable as e:
            raise DescriptorFileError(str(e)) from None
        try:
            d = json.loads(text)
        except ValueError as e:
            raise DescriptorFileError(f"{path}: the device descriptor is not JSON: {e}") from None
        if not isinstance(d, dict) or type(d.get("deviceVer")) is not int:
            raise DescriptorFileError(
                f"{path}: not a cuDNN device descriptor (no integer deviceVer); "
                "make one with `cudnn-dsl device-info` on the GPU you target"
            )
        name = str(d.get("deviceName") or Path(path).stem)
        return cls(name, text, d["deviceVer"] // 10, str(path), str(d.get("unverified") or ""))

    @classmethod
    def named(cls, name: str) -> Target:
        """A bundled descriptor, by name (case-insensitive). Raises UnknownTarget for any other name."""
        known = {p.stem: p for p in DEVICES_DIR.glob("*.json")}
        if name.lower() not in known:  # a lookup, not a path join: no name reaches outside DEVICES_DIR
            raise UnknownTarget(
                f"unknown target '{name}' (known: {', '.join(sorted(known))}); or pass --device-properties FILE.json"
            )
        return cls.from_file(known[name.lower()])


def gpu_available() -> bool:
    """Whether torch sees a CUDA GPU; without a CUDA driver to load there is none, and torch (seconds to import)
    is not asked."""
    if not _driver_loads():
        return False
    import torch

    return torch.cuda.is_available()


# ---- loading cuDNN ----------------------------------------------------------------------------------------------

FRONTEND_RELEASE = (1, 32)
"""the cuDNN Frontend release cudnn-dsl runs on, any patch of it (pyproject.toml requires the same, a test holds
the two together): the runtime reads the internals below, and the release before lowers rmsnorm otherwise"""

FRONTEND_INTERNALS = {
    "pygraph": ("_normalize", "_uid_to_data", "_lowered_graph", "_materialize_backend_plan", "_plan_index", "_plans"),
    "_pybind_module.backend_graph": ("_execute_with_raw_ptrs",),
}
"""the frontend's private names the runtime reads (run.launch.raw_pointers, build.steps.selected_index), on a
new pygraph and on the C++ graph's class: checked when the frontend is imported"""

CUDNN_LIB = "libcudnn.so.9"
CUDNN_PACKAGES = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")
"""the cuDNN wheels, one per CUDA major (cudnn-dsl's extras deviceless-cu13 and deviceless-cu12)"""

# Loaded before libcudnn so that it finds them, where installed; each with the package to reinstall when damaged.
_NEEDED = (
    ("nvidia/cu13/lib/libcublasLt.so.13", "nvidia-cublas"),
    ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia-cuda-nvrtc"),
    ("nvidia/cublas/lib/libcublasLt.so.12", "nvidia-cublas-cu12"),
    ("nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia-cuda-nvrtc-cu12"),
)
_INSTALL = "pip install 'cudnn-dsl[deviceless-cu13]' (or [deviceless-cu12] beside a CUDA 12 torch)"
_LOCK = threading.Lock()


def frontend_requirement() -> str:
    """The frontend versions cudnn-dsl supports, as a pip requirement."""
    major, minor = FRONTEND_RELEASE
    return f"nvidia-cudnn-frontend>={major}.{minor},<{major}.{minor + 1}"


def frontend_refusal(version: str, missing: list[str]) -> str | None:
    """Why cudnn-dsl cannot run on the frontend of this version lacking these internals; None when it can."""
    try:
        release = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        release = ()
    if release == FRONTEND_RELEASE and not missing:
        return None
    lacks = f", which lacks {', '.join(missing)}" if missing else ""
    return (
        f"the cuDNN Frontend installed is {version}{lacks}; cudnn-dsl supports {frontend_requirement()}: "
        f"pip install '{frontend_requirement()}'"
    )


def _missing_internals(cudnn) -> list[str]:
    graph = cudnn.pygraph()
    owners = {"pygraph": graph, "_pybind_module.backend_graph": cudnn._pybind_module.backend_graph}
    return [
        f"{where}.{n}" for where, names in FRONTEND_INTERNALS.items() for n in names if not hasattr(owners[where], n)
    ]


def _site_dirs() -> list[Path]:
    dirs = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *sys.path]
    return [Path(d) for d in dict.fromkeys(dirs) if d and Path(d).is_dir()]


def _find_lib(rel: str) -> Path | None:
    for d in _site_dirs():
        p = d / rel
        if p.exists():
            return p
    return None


def cudnn_library() -> Path | None:
    """The libcudnn.so.9 the frontend loads: the first in a directory of $LD_LIBRARY_PATH, else the installed
    package's (nvidia/cudnn/lib)."""
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if d and (p := Path(d) / CUDNN_LIB).exists():
            return p
    return _find_lib(f"nvidia/cudnn/lib/{CUDNN_LIB}")


def _driver_loads() -> bool:
    # Also true once the stand-in is loaded: the loader matches "libcuda.so.1" to its soname.
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        return True
    except OSError:
        return False


def _check_elf(lib: Path, package: str) -> None:
    try:
        with open(lib, "rb") as f:
            head = f.read(4)
    except OSError:
        head = b""
    if head != b"\x7fELF":
        raise BackendUnavailable(
            f"{lib} is damaged (not a shared library); reinstall it: pip install --force-reinstall {package}"
        )


@functools.cache
def load_cudnn():
    """Imports the cuDNN Frontend, first loading the cuDNN libraries and, without a GPU driver, the stand-in libcuda.

    Every failure is a BackendUnavailable that says what to install or fix. The files are checked before anything
    is loaded, so a damaged install leaves nothing half loaded; a failed call may be retried."""
    with _LOCK:
        return _load_cudnn()


def _load_cudnn():
    try:
        if importlib.util.find_spec("cudnn") is None:
            raise ImportError
    except (ImportError, ValueError):
        raise BackendUnavailable(
            f"the cuDNN Frontend is not installed: pip install '{frontend_requirement()}'"
        ) from None
    cudnn_lib = cudnn_library()
    package = "the cuDNN package (nvidia-cudnn-cu13 or -cu12)"
    libs = [(p, pkg) for rel, pkg in _NEEDED if (p := _find_lib(rel)) is not None]
    libs += [(cudnn_lib, package)] if cudnn_lib is not None else []
    need_stand_in = not _driver_loads()
    if need_stand_in and cudnn_lib is None:
        raise BackendUnavailable(f"the cuDNN library is not installed: {_INSTALL}")
    for lib, pkg in libs:
        _check_elf(lib, pkg)
    if need_stand_in:
        try:
            load_stand_in(cudnn_lib.parent)
        except StandInUnavailable as e:
            raise BackendUnavailable(f"planning without a GPU needs a no-device libcuda.so.1: {e}") from None
    for lib, pkg in libs:
        try:
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise BackendUnavailable(
                f"cannot load {lib}: {e}; reinstall it: pip install --force-reinstall {pkg}"
            ) from None
    try:
        import cudnn
    except Exception as e:  # noqa: BLE001 - a broken install fails in many ways; all mean the same to the user
        raise BackendUnavailable(
            f"the cuDNN Frontend failed to load: {e}; reinstall it: pip install --force-reinstall nvidia-cudnn-frontend"
        ) from None
    if why := frontend_refusal(cudnn.__version__, _missing_internals(cudnn)):
        raise BackendUnavailable(why)
    try:
        cudnn.backend_version()
    except Exception as e:  # noqa: BLE001 - the library reports "not found" in several ways
        raise BackendUnavailable(f"the cuDNN library was not found by the frontend: {e}; {_INSTALL}") from None
    return cudnn


def version_text(version: int) -> str:
    """cuDNN's version number as words: 92801 -> '9.28.1'."""
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


@attrs.frozen
class Library:
    """The cuDNN library that answers in this process."""

    version: str
    """as version_text gives it: '9.28.1'"""
    path: str
    """the file it was loaded from (two, joined by ' and ', would be two copies in one process: a broken install)"""

    def __str__(self) -> str:
        return f"cuDNN {self.version} ({self.path})"

    def to_json(self) -> dict:
        return {"version": self.version, "path": self.path}


def answering() -> Library:
    """The cuDNN library the frontend plans and runs with here, as the process has it mapped."""
    cudnn = load_cudnn()
    try:
        with open("/proc/self/maps") as f:
            mapped = [line.split(maxsplit=5)[-1].strip() for line in f if line.rstrip().endswith("/" + CUDNN_LIB)]
    except OSError:
        mapped = []
    path = " and ".join(dict.fromkeys(mapped)) or str(cudnn_library())
    return Library(version_text(cudnn.backend_version()), path)


def versions() -> dict:
    cudnn = load_cudnn()
    return {"cudnn_backend": cudnn.backend_version(), "cudnn_frontend": cudnn.__version__}


@functools.cache
def device_properties(target: Target):
    """cuDNN's device properties for the target. Raises BackendUnavailable, naming the file, when cuDNN refuses the
    descriptor (a key missing, or one from another cuDNN version)."""
    cudnn = load_cudnn()
    try:
        return cudnn.create_device_properties(target.descriptor)
    except (RuntimeError, ValueError) as e:
        raise BackendUnavailable(
            f"{target.source or target.name}: cuDNN {cudnn.backend_version()} refuses this device "
            f"descriptor: {e}; make it again with `cudnn-dsl device-info` on the GPU"
        ) from None


# The cached properties are the frontend's (nanobind) objects: freed before the interpreter tears the frontend
# down, which reports each one still alive then as leaked.
atexit.register(device_properties.cache_clear)


def local_device_info() -> str:
    """The serialized cuDNN descriptor of this machine's GPU (`cudnn-dsl device-info`)."""
    cudnn = load_cudnn()
    if not gpu_available():
        raise BackendUnavailable("no CUDA GPU is visible here; run device-info on the machine you target")
    return cudnn.create_device_properties(0).serialize()


# ---- other versions of cuDNN, side by side -----------------------------------------------------------------------

_VERSION = re.compile(r"[0-9]+(\.[0-9]+){1,3}")


def installed_cudnn() -> tuple[str, str]:
    """(package, version) of the cuDNN wheel installed here, CUDA 13's first; its version is '' when none is."""
    for package in CUDNN_PACKAGES:
        try:
            return package, importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return CUDNN_PACKAGES[0], ""


def matches(version: str, asked: str) -> bool:
    """Whether a library's version is the one asked for: '9.20' is every 9.20.x."""
    return version.split(".")[: len(asked.split("."))] == asked.split(".")


def check_version(asked: str) -> None:
    """ValueError unless `asked` is a cuDNN version as --cudnn and a sweep spec take it."""
    if not _VERSION.fullmatch(asked):
        raise ValueError(f"{asked!r} is not a cuDNN version (e.g. 9.20 or 9.20.0)")


def side_by_side(asked: str) -> Path:
    """Where `support --cudnn` keeps the cuDNN of version `asked` (pip's --target), under cache_dir()."""
    from cudnn_dsl.store.keys import cache_dir

    check_version(asked)
    return cache_dir() / "cudnn" / f"{installed_cudnn()[0]}-{asked}"


def side_by_side_library(home: Path) -> Path:
    """The directory of libcudnn.so.9 in a side-by-side install, once it is checked to be this user's alone: its
    libraries are loaded, so nobody else may have been able to write them."""
    lib_dir = home / "nvidia" / "cudnn" / "lib"
    if not (lib_dir / CUDNN_LIB).is_file():
        raise BackendUnavailable(f"{home} holds no {CUDNN_LIB}; remove it and fetch again")
    uid = os.getuid()
    for p in home.parents:
        st = os.stat(p)
        if st.st_uid not in (0, uid) or st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise BackendUnavailable(f"{p} could be changed by other users: cuDNN is not loaded from below it")
    for p in (home, *home.rglob("*")):
        st = os.lstat(p)
        if st.st_uid != uid or st.st_mode & 0o022 or stat.S_ISLNK(st.st_mode):
            raise BackendUnavailable(f"{p} is not this user's alone (or is a link): cuDNN is not loaded from {home}")
    return lib_dir


def fetch(asked: str) -> Path:
    """Installs the cuDNN wheel of version `asked` (its latest patch) with pip into side_by_side(asked), without its
    dependencies (it uses the installed CUDA libraries). A failed install leaves nothing there."""
    home = side_by_side(asked)
    package = installed_cudnn()[0]
    home.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = home.with_name(home.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(partial)]
    proc = subprocess.run([*cmd, f"{package}=={asked}.*"], capture_output=True, text=True, check=False)
    if proc.returncode:
        shutil.rmtree(partial, ignore_errors=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise BackendUnavailable(f"pip could not install {package}=={asked}.*: {tail[0]}")
    partial.chmod(0o700)
    os.replace(partial, home)
    return home
