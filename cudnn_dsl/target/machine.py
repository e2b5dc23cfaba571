"""What a command runs on — the cuDNN and torch it loaded, the GPU and its driver — for every report, the
versions `--version` prints, and why no GPU is usable where a command requires one."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys

NOT_LOADED, NOT_IMPORTED, NONE = "not loaded", "not imported", "none"


def environment(device=None) -> dict:
    """The `environment` block of every JSON report (docs/cli.md, JSON reports). It says what this process loaded
    and loads nothing to say it: a command that needed neither cuDNN nor torch reports them "not loaded" and
    "not imported". The GPU is torch's `device` where torch is imported, else the first that nvidia-smi lists."""
    gpu, driver = _nvidia_smi()
    torch = sys.modules.get("torch")
    if torch is not None:
        gpu = _torch_gpu(torch, device)
    return {
        "cudnn_backend": _loaded_cudnn(),
        "cudnn_frontend": _frontend(),
        "torch": torch.__version__ if torch is not None else NOT_IMPORTED,
        "gpu": gpu,
        "driver": driver,
    }


def versions() -> dict[str, str]:
    """The versions `cudnn-dsl --version` prints after its own: the frontend and torch as installed (torch is not
    imported), and the cuDNN library the frontend loads."""
    from cudnn_dsl.target.library import BackendUnavailable, load_cudnn
    from cudnn_dsl.target.quirks import version_text

    try:
        cudnn = version_text(load_cudnn().backend_version())
    except BackendUnavailable as e:
        cudnn = f"not loadable: {e}"
    return {
        "cuDNN Frontend": _frontend(),
        "cuDNN": cudnn,
        "torch": _installed("torch"),
    }


def gpu_problem() -> str:
    """Why no CUDA GPU is usable here, in the user's terms (no torch, a torch without CUDA, no device, the
    driver's error); "" when one is."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install torch, a CUDA build)"
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a build without CUDA; install a CUDA build of torch"
    if torch.cuda.is_available():
        return ""
    try:
        torch.cuda.init()  # raises with the CUDA runtime's own reason
        why = "it sees no CUDA device"
    except Exception as e:  # noqa: BLE001 - torch words the driver's many failures differently
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    _, driver = _nvidia_smi()
    return (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU: {why}"
        + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
        + (f"; driver: {driver}" if driver != NONE else "; no nvidia-smi, so likely no NVIDIA driver")
    )


def _torch_gpu(torch, device) -> str:
    """The name of torch's `device`; "none" where torch sees no GPU."""
    if not torch.cuda.is_available():
        return NONE
    try:
        return torch.cuda.get_device_name(device)
    except (RuntimeError, AssertionError, ValueError) as e:  # a --device index that is not there
        return f"unknown: {e}"


def _loaded_cudnn() -> int | str:
    """The cuDNN library's version number (92801) where this process loaded it, else "not loaded"."""
    cudnn = sys.modules.get("cudnn")
    if cudnn is None:
        return NOT_LOADED
    try:
        return cudnn.backend_version()
    except Exception:  # noqa: BLE001 - the frontend imported but found no library: the loader said so already
        return NOT_LOADED


def _frontend() -> str:
    """The frontend's version: the loaded module's, else the installed package's."""
    cudnn = sys.modules.get("cudnn")
    return getattr(cudnn, "__version__", None) or _installed("nvidia-cudnn-frontend")


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _nvidia_smi() -> tuple[str, str]:
    """(the first GPU's name, the driver's version) as nvidia-smi lists them; ("none", "none") without
    nvidia-smi; the driver "unknown: ..." with nvidia-smi's own words when it fails (a broken driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return NONE, NONE
    try:
        p = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return NONE, f"unknown: nvidia-smi failed: {e}"
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines or "," not in lines[0]:
        said = (p.stdout + p.stderr).strip().splitlines()
        return NONE, f"unknown: nvidia-smi: {said[0] if said else f'exit status {p.returncode}'}"
    name, _, driver = lines[0].rpartition(",")
    return name.strip(), driver.strip()
