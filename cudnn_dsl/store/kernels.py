"""Kernel caches: one per dynamic-shape graph, shared by every process that builds its shapes, merged on write."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cudnn_dsl.store.files import StoreProblem, atomic_write, loads, locked, read_regular

KERNEL_CACHE_LIMIT = 64 << 20


KERNEL_CACHE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}-[0-9a-f]{24}\.cache")


def load_kernel_cache_text(path: Path) -> str | None:
    """The serialized kernel cache at path; None when there is none; StoreProblem when it cannot be read."""
    data = read_regular(Path(path), KERNEL_CACHE_LIMIT, "kernel cache")
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise StoreProblem(f"kernel cache {path} is not text") from None


def save_kernel_cache_text(path: Path, text: str) -> None:
    """Saves a serialized kernel cache, merged with what another process saved there since we loaded it (under a
    lock on a sibling .lock file), atomically. StoreProblem when it cannot be written."""
    path = Path(path)
    with locked(path.with_name(path.name + ".lock"), "kernel cache"):
        try:
            disk = load_kernel_cache_text(path)
        except StoreProblem:
            disk = None  # unreadable: replaced
        try:
            atomic_write(path, merge_kernel_caches(text, disk), follow_symlinks=False)
        except OSError as e:
            raise StoreProblem(f"cannot save kernel cache {path}: {e.strerror or e}") from None


_KC_SAME = ("cudnnVersion", "schemaVersion", "operationGraph")


def merge_kernel_caches(ours: str, theirs: str | None) -> str:
    """ours plus the kernels of theirs that ours lacks, when both are cuDNN kernel caches ({"cudnnVersion",
    "schemaVersion", "operationGraph", "kernel_cache": [...]}) of one version and operation graph; else ours."""

    def doc(text: str | None) -> dict | None:
        try:
            d = loads(text) if text is not None else None
        except ValueError:
            return None
        ok = type(d) is dict and all(k in d for k in _KC_SAME) and type(d.get("kernel_cache")) is list
        return d if ok else None

    a, b = doc(ours), doc(theirs)
    if a is None or b is None or any(a[k] != b[k] for k in _KC_SAME):
        return ours
    seen = {json.dumps(e, sort_keys=True) for e in a["kernel_cache"]}
    extra = []
    for e in b["kernel_cache"]:
        canon = json.dumps(e, sort_keys=True)
        if canon not in seen:
            seen.add(canon)
            extra.append(e)
    return json.dumps({**a, "kernel_cache": a["kernel_cache"] + extra}) if extra else ours
