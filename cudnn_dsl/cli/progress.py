"""Progress on long work: one self-rewriting line on stderr — items done of the total, the time left, the item and
its current step — on a terminal only, and never with --quiet or `--json -`.

    progress = Progress.of(args, total=len(work))
    for item in work:
        with progress.item(f"{item.name} on h200"):  # draws the line; on leaving, counts the item and erases it
            plan(item, progress=progress)  # progress("build_plans") names the step under way
        print(result)  # outside the item: the line is gone

Print nothing inside an item: the line would be left in the middle of the output.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from collections.abc import Iterator
from typing import TextIO


def add_quiet_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line on stderr")


class Progress:
    """Done/total, the estimated time left, and what is under way, redrawn in place; every call a no-op when
    disabled. Also a `progress(step)` callback, as compile_shape and tune take one."""

    MIN_REDRAW_S = 0.1
    """a step drawn sooner after the last is skipped (tune names every candidate it times)"""

    def __init__(self, total: int, *, enabled: bool, stream: TextIO | None = None):
        self.total, self.enabled = total, enabled
        self.stream = stream or sys.stderr
        self.done = 0.0
        self.label = ""
        """the item under way ('' between items: a step then is not drawn)"""
        self.started = time.monotonic()
        self.drawn_at = 0.0

    @classmethod
    def of(cls, args: argparse.Namespace, total: int) -> Progress:
        """A command's progress: on when stderr is a terminal, unless --quiet or the JSON goes to stdout."""
        quiet = getattr(args, "quiet", False) or getattr(args, "json", None) == "-"
        return cls(total, enabled=not quiet and sys.stderr.isatty())

    @contextlib.contextmanager
    def item(self, label: str, part: float = 1.0) -> Iterator[None]:
        """One item, under way while the block runs, counted done however the block ends; `part`: the share of one
        unit of the total it is (a file's total of 1 spread over its k shapes: 1/k each)."""
        self.label = label
        self._draw("", force=True)
        try:
            yield
        finally:
            self.done += part
            self.label = ""
            self._erase()

    def skip(self, units: float = 1.0) -> None:
        """Units of the total counted done without work (a file that did not check)."""
        self.done += units

    def __call__(self, step: str) -> None:
        self._draw(step)

    def eta(self) -> str:
        """The time left, as the items done so far took: '' before the first is done."""
        if not self.done or self.done >= self.total:
            return ""
        left = (time.monotonic() - self.started) / self.done * (self.total - self.done)
        return f"{int(left) // 60}:{int(left) % 60:02d} left"

    def line(self, step: str = "") -> str:
        """The status line, without the terminal's control characters."""
        eta = self.eta()
        head = f"[{min(int(self.done + 1e-9) + 1, self.total)}/{self.total}{', ' + eta if eta else ''}]"
        return f"{head} {self.label}{': ' + step if step else ''} ..."

    def _draw(self, step: str, force: bool = False) -> None:
        now = time.monotonic()
        if not (self.enabled and self.label) or (not force and now - self.drawn_at < self.MIN_REDRAW_S):
            return
        self.drawn_at = now
        width = shutil.get_terminal_size().columns - 1  # a wrapped line could not be rewritten in place
        self.stream.write("\r\033[K" + self.line(step)[:width])
        self.stream.flush()

    def _erase(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()
