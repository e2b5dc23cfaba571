"""A fleet store's files wherever it lives: a local directory (a path or file://), any fsspec URL (s3://, gs://,
memory://, ...), or http(s):// read-only.

Reads are bounded. Writes are whole or not at all where the backend allows: a local file is replaced by a rename
(store.files.atomic_write) and an object is put whole; a content-named file is written once, so a repeated upload
is the same object, and only a pointer (LATEST, a signature) is ever rewritten. Locally no link is read or written
through. Every failure is a StoreProblem naming the URL.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from cudnn_dsl.store.files import READ_CHUNK, StoreProblem, atomic_write, locked_dir, read_regular, scan_dir

HTTP_TIMEOUT_S = 20.0
"""seconds an HTTP store has to answer one request, and to send each part of a file"""
HTTP_FILE_S = 300.0
"""seconds an HTTP store has to send one file whole: a server that trickles bytes would hold a reader forever"""


class Tree:
    """The files under one store root, named by '/'-separated paths relative to it."""

    url: str
    writable: bool = True

    def join(self, rel: str) -> str:
        """The URL (or path) of a file, for messages."""
        return f"{self.url.rstrip('/')}/{rel}"

    def read(self, rel: str, limit: int, what: str) -> bytes | None:
        """The file's bytes, None when there is none; StoreProblem when it is over limit or cannot be read."""
        raise NotImplementedError

    def write(self, rel: str, data: bytes) -> None:
        """Writes the file whole (a reader sees the old bytes or the new ones)."""
        raise NotImplementedError

    def exists(self, rel: str) -> bool:
        raise NotImplementedError

    def listing(self, rel: str) -> list[tuple[str, bool]]:
        """(name, is a directory) of what a directory holds, by name; none when it does not exist."""
        raise NotImplementedError

    def write_once(self, rel: str, data: bytes) -> bool:
        """Writes a content-named file unless it is there (then it is the same bytes, or damage verify reports);
        whether it wrote."""
        if self.exists(rel):
            return False
        self.write(rel, data)
        return True

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One writer of the store's pointer at a time, where the backend has locks (an object store has none:
        two mergers there each leave a whole manifest, and LATEST names one of them; merging again unites them)."""
        yield


class LocalTree(Tree):
    def __init__(self, root: Path):
        self.root = Path(root)
        self.url = str(self.root)

    def join(self, rel: str) -> str:
        return str(self.root / rel)

    def read(self, rel: str, limit: int, what: str) -> bytes | None:
        return read_regular(self.root / rel, limit, what)

    def write(self, rel: str, data: bytes) -> None:
        try:
            atomic_write(self.root / rel, data, follow_symlinks=False)
        except OSError as e:
            raise StoreProblem(f"cannot write {self.join(rel)}: {e.strerror or e}") from None

    def exists(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def listing(self, rel: str) -> list[tuple[str, bool]]:
        return [(e.name, e.is_dir(follow_symlinks=False)) for e in scan_dir(self.root / rel)]

    def lock(self):
        """A lock on the directory itself (no lock file to leave behind)."""
        return locked_dir(self.root, "the fleet store")


class FsspecTree(Tree):
    """Any filesystem fsspec has a driver for (fsspec comes with torch; s3:// needs s3fs, gs:// gcsfs)."""

    def __init__(self, url: str):
        import fsspec

        self.url = url.rstrip("/")
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url)
        except (ImportError, ValueError) as e:
            raise StoreProblem(f"fleet store {url}: no filesystem for it ({e})") from None

    def _path(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}"

    def _problem(self, doing: str, rel: str, e: Exception) -> StoreProblem:
        return StoreProblem(f"cannot {doing} {self.join(rel)}: {type(e).__name__}: {e}")

    def read(self, rel: str, limit: int, what: str) -> bytes | None:
        path = self._path(rel)
        try:
            info = self.fs.info(path)
            if info.get("type") != "file":
                raise StoreProblem(f"{what} {self.join(rel)} is not a file ({info.get('type')})")
            if (info.get("size") or 0) > limit:
                raise StoreProblem(f"{what} {self.join(rel)} is {info['size']} bytes, over the {limit} byte limit")
            with self.fs.open(path, "rb") as f:
                data = f.read(limit + 1)
        except FileNotFoundError:
            return None
        except StoreProblem:
            raise
        except Exception as e:  # noqa: BLE001 - every backend fails in its own exceptions
            raise self._problem("read", rel, e) from None
        if len(data) > limit:
            raise StoreProblem(f"{what} {self.join(rel)} is over the {limit} byte limit")
        return data

    def write(self, rel: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(self._path(rel), data)
        except Exception as e:  # noqa: BLE001
            raise self._problem("write", rel, e) from None

    def exists(self, rel: str) -> bool:
        try:
            return bool(self.fs.isfile(self._path(rel)))
        except Exception as e:  # noqa: BLE001
            raise self._problem("read", rel, e) from None

    def listing(self, rel: str) -> list[tuple[str, bool]]:
        path = self._path(rel).rstrip("/")
        try:
            found = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        except Exception as e:  # noqa: BLE001
            raise self._problem("list", rel, e) from None
        inside = [d for d in found if str(d["name"]).rstrip("/") != path]  # a file lists as itself
        return sorted((str(d["name"]).rstrip("/").rsplit("/", 1)[-1], d.get("type") == "directory") for d in inside)


class HttpTree(Tree):
    """A store served over HTTP(S), read-only, through the standard library (fsspec's HTTP needs aiohttp). It
    cannot be listed: what is read is what a manifest names."""

    writable = False

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def read(self, rel: str, limit: int, what: str) -> bytes | None:
        url = self.join(urllib.parse.quote(rel))
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as r:
                size = r.headers.get("Content-Length")
                if size is not None and size.isdigit() and int(size) > limit:
                    raise StoreProblem(f"{what} {url} is {size} bytes, over the {limit} byte limit")
                data = _read_within(r, limit + 1, time.monotonic() + HTTP_FILE_S)
        except _TooSlow:
            raise StoreProblem(f"cannot read {what} {url}: not sent whole within {HTTP_FILE_S:g} s") from None
        except urllib.error.HTTPError as e:
            if e.code in (404, 410):
                return None
            raise StoreProblem(f"cannot read {what} {url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            why = getattr(e, "reason", None) or e
            raise StoreProblem(f"cannot read {what} {url}: {why}") from None
        if len(data) > limit:
            raise StoreProblem(f"{what} {url} is over the {limit} byte limit")
        return data

    def write(self, rel: str, data: bytes) -> None:
        raise StoreProblem(f"cannot write {self.join(rel)}: an http(s) store is read-only")

    def exists(self, rel: str) -> bool:
        url = self.join(urllib.parse.quote(rel))
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=HTTP_TIMEOUT_S):
                return True
        except urllib.error.HTTPError as e:
            if e.code in (404, 410):
                return False
            raise StoreProblem(f"cannot read {url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise StoreProblem(f"cannot read {url}: {getattr(e, 'reason', None) or e}") from None

    def listing(self, rel: str) -> list[tuple[str, bool]]:
        raise StoreProblem(f"cannot list {self.join(rel)}: an http(s) store cannot be listed")


class _TooSlow(Exception):
    """A file not sent whole by its deadline (a socket's own timeout is a TimeoutError: one part not sent)."""


def _read_within(response, size: int, deadline: float) -> bytes:
    """Up to size bytes of the response; _TooSlow once the deadline passes."""
    data = bytearray()
    while len(data) < size:
        if time.monotonic() > deadline:
            raise _TooSlow
        chunk = response.read1(min(READ_CHUNK, size - len(data)))  # what has arrived, so the deadline is seen
        if not chunk:
            break
        data += chunk
    return bytes(data)


def open_tree(where: str | os.PathLike | Tree) -> Tree:
    """The store at a path, a file:// URL, an http(s):// URL (read-only) or any other fsspec URL."""
    if isinstance(where, Tree):
        return where
    text = os.fspath(where)
    scheme = urllib.parse.urlsplit(text).scheme if "://" in text else ""
    if not scheme:
        return LocalTree(Path(text))
    if scheme == "file":
        return LocalTree(Path(urllib.parse.unquote(urllib.parse.urlsplit(text).path)))
    if scheme in ("http", "https"):
        return HttpTree(text)
    return FsspecTree(text)
