"""A fleet store's files wherever it lives: a local directory (a path or file://), any fsspec URL (s3://, gs://,
memory://, ...), or http(s):// read-only.

Reads are bounded. Writes are whole or not at all where the backend allows: a local file is replaced by a rename
(store.files.atomic_write) and an object is put whole; a content-named file is written once, so a repeated upload
is the same object, and only a pointer (LATEST, a signature) is ever rewritten. Locally no link is read or written
through. Every failure is a StoreProblem naming the URL.
"""

from __future__ import annotations

import contextlib
import http.client
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
HTTP_RETRIES = 3
"""further attempts of an HTTP request that failed in a way that may pass: no connection, a connection dropped or
timed out, a 5xx or a 429 (a 4xx is the answer, never retried)"""
HTTP_BACKOFF_S = 0.25
"""seconds before the first retry, doubled before each next one (0.25 + 0.5 + 1: under 2 s in all)"""
HTTP_RETRY_AFTER_MAX_S = 10.0
"""the longest wait a server's Retry-After obtains (a 429's or a 503's): a store never holds a reader for long"""


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

        def fetch() -> bytes:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as r:
                size = r.headers.get("Content-Length")
                if size is not None and size.isdigit() and int(size) > limit:
                    raise StoreProblem(f"{what} {url} is {size} bytes, over the {limit} byte limit")
                return _read_within(r, limit + 1, time.monotonic() + HTTP_FILE_S)

        try:
            data = _retrying(fetch)
        except _TooSlow:
            raise StoreProblem(f"cannot read {what} {url}: not sent whole within {HTTP_FILE_S:g} s") from None
        except urllib.error.HTTPError as e:
            if e.code in (404, 410):
                return None
            raise StoreProblem(f"cannot read {what} {url}: HTTP {e.code} {e.reason}{_tries(e)}") from None
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
            why = getattr(e, "reason", None) or e
            raise StoreProblem(f"cannot read {what} {url}: {why}{_tries(e)}") from None
        if len(data) > limit:
            raise StoreProblem(f"{what} {url} is over the {limit} byte limit")
        return data

    def write(self, rel: str, data: bytes) -> None:
        raise StoreProblem(f"cannot write {self.join(rel)}: an http(s) store is read-only")

    def exists(self, rel: str) -> bool:
        url = self.join(urllib.parse.quote(rel))

        def head() -> bool:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=HTTP_TIMEOUT_S):
                return True

        try:
            return _retrying(head)
        except urllib.error.HTTPError as e:
            if e.code in (404, 410):
                return False
            raise StoreProblem(f"cannot read {url}: HTTP {e.code} {e.reason}{_tries(e)}") from None
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
            raise StoreProblem(f"cannot read {url}: {getattr(e, 'reason', None) or e}{_tries(e)}") from None

    def listing(self, rel: str) -> list[tuple[str, bool]]:
        raise StoreProblem(f"cannot list {self.join(rel)}: an http(s) store cannot be listed")


def _transient(e: BaseException) -> bool:
    """Whether a failed request may pass when tried again: a 5xx or a 429, no connection (refused, reset, timed
    out, name not resolved), a response cut short. A 4xx is the server's answer."""
    if isinstance(e, urllib.error.HTTPError):
        return e.code >= 500 or e.code == 429
    if isinstance(e, urllib.error.URLError):
        return isinstance(e.reason, OSError)  # not a URL the library cannot open
    return isinstance(e, (OSError, http.client.HTTPException))


def _retrying(request):
    """request(), tried again up to HTTP_RETRIES times while it fails transiently, after HTTP_BACKOFF_S doubling
    (or the server's Retry-After, up to HTTP_RETRY_AFTER_MAX_S); the last failure is raised, marked with the count."""
    attempts = 0
    while True:
        try:
            return request()
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            attempts += 1
            if not _transient(e) or attempts > HTTP_RETRIES:
                e.attempts = attempts
                raise
            time.sleep(_retry_after(e) or HTTP_BACKOFF_S * 2 ** (attempts - 1))


def _retry_after(e: BaseException) -> float | None:
    """The seconds a 429 or 503 asks to wait (Retry-After in seconds), at most HTTP_RETRY_AFTER_MAX_S."""
    headers = getattr(e, "headers", None)
    value = headers.get("Retry-After", "") if headers is not None else ""
    return min(float(value), HTTP_RETRY_AFTER_MAX_S) if value.strip().isdigit() else None


def _tries(e: BaseException) -> str:
    attempts = getattr(e, "attempts", 1)
    return f" (after {attempts} attempts)" if attempts > 1 else ""


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
