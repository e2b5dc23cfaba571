"""Backend layer: loading the real cuDNN Frontend, with or without a GPU, and device targets.

Without a GPU, cuDNN can still plan for a described device ("deviceless"): the frontend gets a
serialized device descriptor and an SM version. One cuDNN sublibrary links against the CUDA
driver, so on a machine without one we build a small ``libcuda.so.1`` whose every ``cu*``
function answers CUDA_ERROR_NO_DEVICE (100), just so the library loads; nothing is faked at the
cuDNN level.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import attrs

DEVICES_DIR = Path(__file__).parent / "devices"


class BackendUnavailable(Exception):
    """cuDNN cannot be loaded here; the message says why and what to install."""


class UnknownTarget(ValueError):
    """--target names no known device (a usage error)."""


class DescriptorFileError(ValueError):
    """A --device-properties file that cannot be read (a usage error)."""


@attrs.frozen
class Target:
    """A device to plan for without having it: a descriptor and its SM version."""

    name: str
    descriptor: str
    sm_version: int

    @classmethod
    def from_file(cls, path: str | Path) -> "Target":
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise DescriptorFileError(f"{path}: cannot read the device descriptor ({e})") from None
        try:
            d = json.loads(text)
            ver = int(d["deviceVer"])
        except (ValueError, KeyError, TypeError) as e:
            raise BackendUnavailable(f"{path}: not a cuDNN device descriptor ({e}); make one with `cudnn-dsl device-info`")
        return cls(d.get("deviceName", Path(path).stem), text, ver // 10)

    @classmethod
    def named(cls, name: str) -> "Target":
        path = DEVICES_DIR / f"{name.lower()}.json"
        if not path.exists():
            known = ", ".join(p.stem for p in sorted(DEVICES_DIR.glob("*.json")))
            raise UnknownTarget(f"unknown target '{name}' (known: {known}); or pass --device-properties FILE.json")
        return cls.from_file(path)


def cache_dir() -> Path:
    """$CUDNN_DSL_CACHE_DIR, else $XDG_CACHE_HOME/cudnn-dsl, else ~/.cache/cudnn-dsl."""
    env = os.environ.get("CUDNN_DSL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cudnn-dsl"


def gpu_available() -> bool:
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
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        return True
    except OSError:
        return False


def _no_device_driver(cudnn_lib_dir: Path) -> Path:
    """Builds (once, cached) the libcuda.so.1 that lets cuDNN load on a machine without a driver."""
    libs = sorted(cudnn_lib_dir.glob("libcudnn*.so*"))
    names: set[str] = set()
    pattern = re.compile(rb"cu[A-Z][A-Za-z0-9_]{2,}")
    for lib in libs:
        names.update(m.decode() for m in pattern.findall(lib.read_bytes()))
    key = hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]
    out = cache_dir() / "no-device-driver" / key / "libcuda.so.1"
    if out.exists():
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise BackendUnavailable("planning without a GPU needs a C compiler (cc/gcc) to build a no-device libcuda")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "nodevice.c"
        src.write_text("".join(f"int {n}(void) {{ return 100; }}\n" for n in sorted(names)))
        tmp_out = Path(tmp) / "libcuda.so.1"
        proc = subprocess.run([cc, "-shared", "-fPIC", "-O0", "-Wl,-soname,libcuda.so.1", "-o", str(tmp_out), str(src)],
                              capture_output=True, text=True)
        if proc.returncode:
            raise BackendUnavailable(f"building the no-device libcuda failed: {proc.stderr.strip()[:500]}")
        os.replace(tmp_out, out)  # atomic: a concurrent builder leaves one whole file
    return out


@functools.lru_cache(maxsize=None)
def load_cudnn():
    """Imports the cuDNN Frontend, preparing the loader path first when there is no GPU driver."""
    try:
        import importlib.util

        if importlib.util.find_spec("cudnn") is None:
            raise ImportError
    except ImportError:
        raise BackendUnavailable("the cuDNN Frontend is not installed: pip install nvidia-cudnn-frontend") from None
    cudnn_lib = _find_lib("nvidia/cudnn/lib/libcudnn.so.9")
    if not _driver_loads():
        if cudnn_lib is None:
            raise BackendUnavailable("the cuDNN library is not installed: pip install nvidia-cudnn-cu13")
        ctypes.CDLL(str(_no_device_driver(cudnn_lib.parent)), mode=ctypes.RTLD_GLOBAL)
    for rel in ("nvidia/cu13/lib/libcublasLt.so.13", "nvidia/cu13/lib/libnvrtc.so.13"):
        if (p := _find_lib(rel)) is not None:
            ctypes.CDLL(str(p), mode=ctypes.RTLD_GLOBAL)
    if cudnn_lib is not None:
        ctypes.CDLL(str(cudnn_lib), mode=ctypes.RTLD_GLOBAL)
    try:
        import cudnn
    except (ImportError, OSError) as e:
        raise BackendUnavailable(f"the cuDNN Frontend failed to load: {e}") from None
    try:
        cudnn.backend_version()
    except Exception as e:  # noqa: BLE001 - the library reports "not found" in several ways
        raise BackendUnavailable(f"the cuDNN library was not found by the frontend: {e}") from None
    return cudnn


def versions() -> dict:
    cudnn = load_cudnn()
    return {"cudnn_backend": cudnn.backend_version(), "cudnn_frontend": cudnn.__version__}


@functools.lru_cache(maxsize=None)
def device_properties(target: Target):
    cudnn = load_cudnn()
    return cudnn.create_device_properties(target.descriptor)


def local_device_info() -> str:
    """The serialized cuDNN descriptor of this machine's GPU (`cudnn-dsl device-info`)."""
    cudnn = load_cudnn()
    if not gpu_available():
        raise BackendUnavailable("no CUDA GPU is visible here; run device-info on the machine you target")
    return cudnn.create_device_properties(0).serialize()
