"""Reading a file someone names: regular files only, and bounded, so that no path can block or exhaust the reader.

Every file the tool reads goes through here: a .cdg source, a JSON descriptor, a sweep spec, a tensor file, a
dump, a stored plan. A FIFO opened for reading blocks until a writer comes, a device such as /dev/zero never
ends, and a directory is no file: each is refused by name before a byte is read.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO


class Unreadable(Exception):
    """A file that cannot be read as one: missing, not a regular file, over its size limit, or refused by the
    system. The message names the file."""


class TooLarge(Unreadable):
    """A regular file over the reader's limit."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind(mode: int) -> str:
    """What a file of this st_mode is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def _where(path: os.PathLike | str, what: str) -> str:
    return f"{what} {path}" if what else str(path)


@contextlib.contextmanager
def open_regular(
    path: os.PathLike | str, limit: int, what: str = "", *, follow_symlinks: bool = True, missing_ok: bool = False
) -> Iterator[BinaryIO | None]:
    """The file, open for binary reading, when it is a regular file of at most `limit` bytes; None when it does
    not exist and missing_ok. `what` names it in messages ("sweep spec"). Unreadable otherwise; follow_symlinks=False
    refuses a link too (a store never reads outside itself)."""
    where = _where(path, what)
    try:
        st = os.stat(path) if follow_symlinks else os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{where} is not a regular file ({kind(st.st_mode)})")
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
        fd = os.open(path, flags)  # O_NONBLOCK: it may have been swapped for a FIFO since the stat
    except (FileNotFoundError, NotADirectoryError):  # NotADirectoryError: a path through a file
        fd = None
    except OSError as e:
        raise Unreadable(f"cannot read {where}: {e.strerror or e}") from None
    if fd is None:
        if not missing_ok:
            raise Unreadable(f"{where}: no such file")
        yield None
        return
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{where} is not a regular file ({kind(st.st_mode)})")
        if st.st_size > limit:
            raise TooLarge(f"{where} is {st.st_size} bytes, over the {limit} byte limit")
        yield f


def read_regular(
    path: os.PathLike | str, limit: int, what: str = "", *, follow_symlinks: bool = True, missing_ok: bool = False
) -> bytes | None:
    """The bytes of open_regular's file (None when it is missing and missing_ok); at most `limit` of them, though
    the file grows while it is read."""
    with open_regular(path, limit, what, follow_symlinks=follow_symlinks, missing_ok=missing_ok) as f:
        if f is None:
            return None
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise Unreadable(f"cannot read {_where(path, what)}: {e.strerror or e}") from None
    if len(data) > limit:
        raise TooLarge(f"{_where(path, what)} grew over the {limit} byte limit")
    return data


def read_text(path: os.PathLike | str, limit: int, what: str = "") -> str:
    """A regular file's UTF-8 text (a byte-order mark dropped); Unreadable when it is not text."""
    data = read_regular(path, limit, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise Unreadable(
            f"{_where(path, what)} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None
