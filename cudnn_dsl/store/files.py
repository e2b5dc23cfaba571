"""Safe file I/O for everything the tool reads from or writes to a shared directory: regular files only,
bounded reads, no link followed where a file is written, atomic replacement, control characters cleaned."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from dsl import files

READ_CHUNK = 256 << 10


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """text without C0, DEL and C1 control characters, so that a stored field cannot drive the terminal."""
    return _CONTROL.sub("", text)


def scan_dir(folder: Path) -> list[os.DirEntry]:
    """The directory's entries by name; none when it does not exist; StoreProblem when it cannot be read."""
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise StoreProblem(f"cannot read {folder}: {e.strerror or e}") from None


@contextlib.contextmanager
def open_regular(path: Path, limit: int, what: str, follow_symlinks: bool = False) -> Iterator[BinaryIO | None]:
    """dsl.files.open_regular for a store: None when there is no file, no link followed unless asked, and
    StoreProblem for a file that cannot be read (a store's problem, not a usage error)."""
    try:
        with files.open_regular(path, limit, what, follow_symlinks=follow_symlinks, missing_ok=True) as f:
            yield f
    except files.Unreadable as e:
        raise StoreProblem(str(e)) from None


def read_regular(path: Path, limit: int, what: str, follow_symlinks: bool = False) -> bytes | None:
    """dsl.files.read_regular as open_regular does it for a store."""
    try:
        return files.read_regular(path, limit, what, follow_symlinks=follow_symlinks, missing_ok=True)
    except files.Unreadable as e:
        raise StoreProblem(str(e)) from None


def loads(data: bytes | str) -> object:
    """json.loads with every failure a ValueError (deep nesting is a RecursionError, bad UTF-8 a UnicodeError)."""
    try:
        return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None


def cleaned(v: object) -> object:
    if isinstance(v, str):
        return clean(v)
    if isinstance(v, list):
        return [cleaned(x) for x in v]
    if isinstance(v, dict):
        return {clean(k): cleaned(x) for k, x in v.items()}
    return v


_TEMP = re.compile(r"\..+\.tmp")


def is_temp(name: str) -> bool:
    """Whether a file name is one atomic_write gives its new text before the rename: left by a killed writer."""
    return bool(_TEMP.fullmatch(name))


def atomic_write(path: Path, text: str | bytes, *, follow_symlinks: bool = True) -> None:
    """Writes text (or bytes) so that a reader sees the old file or the new one, never a part.

    The file keeps its permission mode; a new file gets 0o666 less the umask, as open() gives. Through a symbolic
    link, the link's target is rewritten and the link stays; follow_symlinks=False replaces the link itself (the
    plan store never writes outside itself). The text goes to a new inode that replaces the name, so other hard
    links to the file keep the old text: writing in place would let a reader, or a crash, see half a file.
    """
    path = Path(os.path.realpath(path)) if follow_symlinks else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
        mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        mode = None
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"  # is_temp's form
        try:
            # O_EXCL: a name planted meanwhile, a link included, is never opened
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666 if mode is None else 0o600)
            break
        except FileExistsError:
            continue
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8") if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


LOCK_NAME = ".lock"
"""the file in a store's directory that locked_dir locks (left there: removing it would race the next locker)"""


@contextlib.contextmanager
def locked(lock_file: Path, what: str) -> Iterator[None]:
    """Holds an exclusive lock on lock_file (made when missing, with its directory; never through a link), so that
    one process at a time runs a read-then-write sequence; waits for another holder. The filelock package locks on
    every platform (flock on POSIX, LockFileEx on Windows). StoreProblem naming `what` when it cannot."""
    from filelock import FileLock

    lock = FileLock(lock_file)
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except OSError as e:  # a link planted there is refused (O_NOFOLLOW), as an unwritable directory is
        raise StoreProblem(f"cannot lock {what} {lock_file.parent}: {lock_file.name}: {e.strerror or e}") from None
    try:
        yield
    finally:
        lock.release()


def locked_dir(root: Path, what: str) -> Iterator[None]:
    """locked() on the directory's LOCK_NAME: one process at a time reads then writes the directory."""
    return locked(root / LOCK_NAME, what)


class StoreProblem(Exception):
    """The store, an entry or a bundle cannot be used as it is; the message says why (an entry is then rebuilt)."""

    def __init__(self, message: str):
        super().__init__(clean(str(message)))
