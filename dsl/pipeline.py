"""The front door of the language: source -> AST -> IR, stopping after any stage.

The command line, the Python API and the golden tests all come in here, so a file is read,
decoded and reported the same way everywhere. Nothing here raises for a bad program: every
problem is a located Diagnostic in the result.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading

import attrs

from dsl import files
from dsl.diagnostics import Diagnostic, DslError, Loc, Sink
from dsl.ir import Program
from dsl.syntax import ast

STAGES = ("ast", "ir")


@attrs.frozen
class Result:
    file: str
    text: str
    module: ast.Module | None = None
    program: Program | None = None
    diagnostics: tuple[Diagnostic, ...] = ()

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def render(self) -> str:
        """Every diagnostic with its source excerpt."""
        return "\n".join(d.render({self.file: self.text}) for d in self.diagnostics)

    def raise_if_errors(self) -> None:
        if self.errors:
            raise DslError(list(self.diagnostics))


def read_source(path: str | os.PathLike) -> tuple[str, Diagnostic | None]:
    """The text of a .cdg file, or a located error when it is not UTF-8 text (a BOM is allowed) or is over
    MAX_SOURCE_BYTES; Unreadable when there is no file to read (missing, a directory, a FIFO, a device)."""
    from dsl.syntax.parser import MAX_SOURCE_BYTES

    try:
        data = files.read_regular(path, MAX_SOURCE_BYTES)
    except files.TooLarge:
        message = f"file is larger than {MAX_SOURCE_BYTES:,} bytes, the limit (split it into several files)"
        return "", Diagnostic("error", message, Loc(str(path), 1, 1, 1, 2))
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError as e:
        good = data[: e.start].decode("utf-8", errors="replace")
        line = good.count("\n") + 1
        col = len(good) - (good.rfind("\n") + 1) + 1
        text = data.decode("utf-8", errors="replace")
        why = f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); .cdg files are UTF-8"
        return text, Diagnostic("error", why, Loc(str(path), line, col, line, col + 1))


class _Paused:
    """The loads in progress, in any thread, and whether the collector was on before the first of them."""

    lock = threading.Lock()
    loads = 0
    was_enabled = False


@contextlib.contextmanager
def no_cycle_collection():
    """Parsing and checking build a tree, an AST and an IR of a few dozen objects per op, all alive at once,
    and make next to no reference cycles (reference counting frees their garbage). Left on, the cyclic
    collector's full passes walk that whole growing heap again and again, a cost that grows faster than the
    file (over a quarter of the time at 100,000 ops). The collector is process-wide: the first of overlapping
    loads (threads) turns it off and the last one out restores it as it found it, however each ends."""
    with _Paused.lock:
        if _Paused.loads == 0:
            _Paused.was_enabled = gc.isenabled()
            gc.disable()
        _Paused.loads += 1
    try:
        yield
    finally:
        with _Paused.lock:
            _Paused.loads -= 1
            if _Paused.loads == 0 and _Paused.was_enabled:
                gc.enable()


def load(
    path: str | os.PathLike | None = None, *, text: str | None = None, file: str | None = None, stop: str = "ir"
) -> Result:
    """Parses (and, unless stop="ast", checks) a file or a text. `file` names a text in messages."""
    with no_cycle_collection():
        return _load(path, text, file, stop)


def _load(path, text: str | None, file: str | None, stop: str) -> Result:
    from dsl.check import check
    from dsl.syntax.parser import parse

    if stop not in STAGES:
        raise ValueError(f"stop must be one of {STAGES}")
    if text is None:
        if path is None:
            raise ValueError("give a path or a text")
        file = file or str(path)
        text, problem = read_source(path)
        if problem is not None:
            return Result(file, text, diagnostics=(problem,))
    file = file or "<string>"
    try:
        module = parse(text, file)
    except DslError as e:
        return Result(file, text, diagnostics=tuple(e.diagnostics))
    if stop == "ast":
        return Result(file, text, module)
    sink = Sink()
    try:
        program = check(module, sink)
    except DslError:
        return Result(file, text, module, diagnostics=tuple(sink.diagnostics()))
    return Result(file, text, module, program, tuple(sink.diagnostics()))


def program(path: str | os.PathLike | None = None, *, text: str | None = None, file: str | None = None) -> Program:
    """The checked program of a file or a text; DslError carries every diagnostic when it has errors."""
    result = load(path, text=text, file=file)
    result.raise_if_errors()
    return result.program
