"""Loading the real cuDNN Frontend, with or without a GPU, and device targets.

Without a GPU, cuDNN can still plan for a described device ("deviceless"): the frontend gets a
serialized device descriptor and an SM version. One cuDNN sublibrary links against the CUDA
driver, so on a machine without one we build a small stand-in ``libcuda.so.1`` whose every ``cu*``
function answers CUDA_ERROR_NO_DEVICE (100), just so the library loads; nothing is faked at the
cuDNN level.

The stand-in is code that gets run, so it is never taken from the cache directory (which other
users, or a restored CI cache, may have written): each process builds it in a new private
temporary directory (~0.1 s), checks it, loads it and deletes the directory. Only the list of
``cu*`` names, which takes ~1 s to scan out of cuDNN, is cached, and each name is checked before
it reaches the compiler.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import json
import mmap
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import attrs

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
            with open(path, "rb") as f:
                data = f.read(_MAX_DESCRIPTOR + 1)  # bounded: `--device-properties /dev/zero` must not eat memory
            if len(data) > _MAX_DESCRIPTOR:
                raise ValueError(f"over {_MAX_DESCRIPTOR} bytes, too large for a device descriptor")
            text = data.decode("utf-8")
        except (OSError, ValueError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else e
            raise DescriptorFileError(f"{path}: cannot read the device descriptor: {why}") from None
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


def _site_dirs() -> list[Path]:
    dirs = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *sys.path]
    return [Path(d) for d in dict.fromkeys(dirs) if d and Path(d).is_dir()]


def _find_lib(rel: str) -> Path | None:
    for d in _site_dirs():
        p = d / rel
        if p.exists():
            return p
    return None


def _driver_loads() -> bool:
    # Also true once the stand-in is loaded: the loader matches "libcuda.so.1" to its soname.
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        return True
    except OSError:
        return False


def _note(text: str) -> None:
    print(f"cudnn-dsl: note: {text}", file=sys.stderr)


# ---- the stand-in libcuda.so.1 ----------------------------------------------------------------------------------

_CU_NAME = re.compile(r"cu[A-Z][A-Za-z0-9_]{2,}")
_SYMBOLS_FORMAT = 1


def _digest(names: list[str]) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


def read_regular(path: Path, limit: int = 1 << 22) -> bytes:
    # O_NONBLOCK and the type check: a FIFO planted at this path must not hang us; O_NOFOLLOW: nor a link lead away.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        return f.read(limit)


def _driver_symbols(lib_dir: Path) -> list[str]:
    """The cu* names cuDNN's libraries mention, cached under cache_dir(), keyed by the libraries' sizes and times.

    The list is data, never code: a cached list is used only when every entry is a plain cu* identifier and its
    checksum matches. A damaged list is scanned again, and a cache that cannot be written is skipped; either is
    said in one line on stderr."""
    from cudnn_dsl.store.files import atomic_write
    from cudnn_dsl.store.keys import cache_dir

    libs = sorted(lib_dir.glob("libcudnn*.so*"))
    signature = [_SYMBOLS_FORMAT, str(lib_dir), [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in libs]]
    path = cache_dir() / "no-device-driver" / f"{hashlib.sha256(json.dumps(signature).encode()).hexdigest()[:16]}.json"
    damaged = None
    try:
        d = json.loads(read_regular(path))
        names = d["names"]
        if (
            isinstance(names, list)
            and names
            and all(isinstance(n, str) and _CU_NAME.fullmatch(n) for n in names)
            and d["sha256"] == _digest(names)
        ):
            return names
        damaged = "not a list of cu* names with their checksum"
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        pass  # no cache yet, or none possible: the write below says which
    except (OSError, ValueError, KeyError, TypeError) as e:
        damaged = str(e) or type(e).__name__

    pattern = re.compile(_CU_NAME.pattern.encode())
    found: set[bytes] = set()
    try:
        for lib in libs:  # ~1 GB: map it rather than read it
            with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                found.update(pattern.findall(m))
    except (OSError, ValueError) as e:
        raise BackendUnavailable(
            f"cannot read the cuDNN libraries in {lib_dir} ({e}); "
            "reinstall them: pip install --force-reinstall nvidia-cudnn-cu13"
        ) from None
    names = sorted(n.decode() for n in found)
    if not names:
        raise BackendUnavailable(
            f"the cuDNN libraries in {lib_dir} name no CUDA driver functions; "
            "reinstall them: pip install --force-reinstall nvidia-cudnn-cu13"
        )
    try:
        atomic_write(path, json.dumps({"names": names, "sha256": _digest(names)}))
    except OSError as e:
        _note(
            f"cannot write the cache directory {cache_dir()} ({e.strerror or e}); cuDNN's driver symbols are not "
            "cached, so every deviceless run scans cuDNN again (~1 s)"
        )
        return names
    if damaged:
        _note(f"{path} was damaged ({damaged}); scanned cuDNN again and rewrote it")
    return names


def _private_base() -> str | None:
    """$XDG_RUNTIME_DIR when it is this user's own (mode 0700), else None: the system temporary directory."""
    d = os.environ.get("XDG_RUNTIME_DIR")
    try:
        st = os.stat(d) if d else None
    except OSError:
        return None
    return d if st and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077 else None


def _check_private(lib: Path) -> None:
    """Refuses the library unless it is this user's and only this user (or root) could have written any
    directory above it, so that nobody else can have changed it between building and loading. A world-writable
    directory is allowed only with the sticky bit (like /tmp), which stops others from renaming what we own
    inside it."""
    uid = os.getuid()
    for p in (lib, *lib.parents):
        st = os.lstat(p)
        owners = (uid,) if p == lib else (0, uid)
        writable_by_others = st.st_mode & 0o022 and not (p != lib and st.st_mode & stat.S_ISVTX)
        if st.st_uid not in owners or writable_by_others:
            raise BackendUnavailable(
                f"{p} could be changed by other users, so the no-device libcuda built below it "
                "might not be ours when it loads; set TMPDIR to a directory only you can write"
            )


def _load_stand_in_driver(lib_dir: Path) -> None:
    """Builds the stand-in libcuda.so.1 in a new private directory, checks it, loads it, and removes the directory."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise BackendUnavailable(
            "planning without a GPU needs a C compiler to build a no-device libcuda.so.1: "
            "install gcc (e.g. apt-get install gcc), or run where the NVIDIA driver is installed"
        )
    names = _driver_symbols(lib_dir)
    try:
        where = Path(tempfile.mkdtemp(prefix="cudnn-dsl-", dir=_private_base())).resolve()  # mode 0700
    except OSError as e:
        raise BackendUnavailable(
            f"cannot make a private temporary directory ({e}); set TMPDIR to a directory you can write"
        ) from None
    try:
        src, lib = where / "nodevice.c", where / "libcuda.so.1"
        # One function answering CUDA_ERROR_NO_DEVICE, exported under every name: it compiles in ~0.1 s.
        src.write_text(
            "int cudnn_dsl_no_device(void) { return 100; }\n"
            + "".join(f'int {n}(void) __attribute__((alias("cudnn_dsl_no_device")));\n' for n in names)
        )
        cmd = [cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise BackendUnavailable(
                f"building the no-device libcuda.so.1 with {cc} failed: {proc.stderr.strip()[:500]}"
            )
        lib.chmod(0o500)
        _check_private(lib)
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise BackendUnavailable(f"cannot build or load the no-device libcuda.so.1 in {where}: {e}") from None
    finally:
        shutil.rmtree(where, ignore_errors=True)  # a loaded library stays mapped; nothing is left to tamper with


# ---- loading cuDNN ----------------------------------------------------------------------------------------------

# Loaded before libcudnn so that it finds them; each with the package to reinstall when it is damaged.
_NEEDED = (
    ("nvidia/cu13/lib/libcublasLt.so.13", "nvidia-cublas"),
    ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia-cuda-nvrtc"),
    ("nvidia/cudnn/lib/libcudnn.so.9", "nvidia-cudnn-cu13"),
)
_LOCK = threading.Lock()


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
        raise BackendUnavailable("the cuDNN Frontend is not installed: pip install nvidia-cudnn-frontend") from None
    libs = [(p, package) for rel, package in _NEEDED if (p := _find_lib(rel)) is not None]
    cudnn_lib = _find_lib(_NEEDED[-1][0])
    need_stand_in = not _driver_loads()
    if need_stand_in and cudnn_lib is None:
        raise BackendUnavailable(
            "the cuDNN library is not installed: pip install nvidia-cudnn-cu13 (or pip install 'cudnn-dsl[deviceless]')"
        )
    for lib, package in libs:
        _check_elf(lib, package)
    if need_stand_in:
        _load_stand_in_driver(cudnn_lib.parent)
    for lib, package in libs:
        try:
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise BackendUnavailable(
                f"cannot load {lib}: {e}; reinstall it: pip install --force-reinstall {package}"
            ) from None
    try:
        import cudnn
    except Exception as e:  # noqa: BLE001 - a broken install fails in many ways; all mean the same to the user
        raise BackendUnavailable(
            f"the cuDNN Frontend failed to load: {e}; reinstall it: pip install --force-reinstall nvidia-cudnn-frontend"
        ) from None
    try:
        cudnn.backend_version()
    except Exception as e:  # noqa: BLE001 - the library reports "not found" in several ways
        raise BackendUnavailable(
            f"the cuDNN library was not found by the frontend: {e}; pip install nvidia-cudnn-cu13"
        ) from None
    return cudnn


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


def local_device_info() -> str:
    """The serialized cuDNN descriptor of this machine's GPU (`cudnn-dsl device-info`)."""
    cudnn = load_cudnn()
    if not gpu_available():
        raise BackendUnavailable("no CUDA GPU is visible here; run device-info on the machine you target")
    return cudnn.create_device_properties(0).serialize()
