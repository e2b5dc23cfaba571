"""Source locations, located errors and their rendering with a caret."""

from __future__ import annotations

import functools

import attrs


@attrs.frozen
class Loc:
    """A span in a source file; renders as ``file:line:col``."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


UNKNOWN = Loc("<unknown>", 0, 0, 0, 0)


@attrs.frozen
class Diagnostic:
    """One message about one place in a source file."""

    severity: str
    """"error", "warning" or "note"."""
    message: str
    loc: Loc
    notes: tuple[tuple[str, Loc | None], ...] = ()

    def render(self, sources: dict[str, str]) -> str:
        lines = [f"{self.loc}: {self.severity}: {self.message}"]
        lines += _excerpt(self.loc, sources)
        for text, loc in self.notes:
            if loc is None:
                lines.append(f"  note: {text}")
            else:
                lines.append(f"{loc}: note: {text}")
                lines += _excerpt(loc, sources)
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "severity": self.severity,
            "message": self.message,
            "file": self.loc.file,
            "line": self.loc.line,
            "col": self.loc.col,
            "end_line": self.loc.end_line,
            "end_col": self.loc.end_col,
            "notes": [{"message": text, "loc": str(loc) if loc else None} for text, loc in self.notes],
        }


@functools.lru_cache(maxsize=4)
def _lines(text: str) -> list[str]:
    """A source's lines as the parser counts them (at \\n only), split once however many diagnostics quote it."""
    return text.split("\n")


EXCERPT_WIDTH = 120
"""the widest source excerpt shown; a longer line is clipped around the caret"""


def _excerpt(loc: Loc, sources: dict[str, str]) -> list[str]:
    text = sources.get(loc.file)
    if text is None or loc.line < 1:
        return []
    src_lines = _lines(text)
    if loc.line > len(src_lines):
        return []
    line = src_lines[loc.line - 1].rstrip().expandtabs(1)
    col = loc.col
    end = loc.end_col if loc.end_line == loc.line and loc.end_col > col else col + 1
    end = min(end, max(len(line) + 1, col + 1))
    if len(line) > EXCERPT_WIDTH:  # a generated one-line file must not echo megabytes
        start = max(0, min(col - 1 - EXCERPT_WIDTH // 3, len(line) - EXCERPT_WIDTH))
        line = ("..." if start else "") + line[start : start + EXCERPT_WIDTH] + "..."
        shift = start - (3 if start else 0)
        col, end = col - shift, min(end - shift, EXCERPT_WIDTH + 4)
    return ["  " + line, "  " + " " * (col - 1) + "^" * max(1, end - col)]


class DslError(Exception):
    """Raised with one or more diagnostics; the CLI renders them, never a traceback."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics = list(diagnostics)
        super().__init__("\n".join(f"{d.loc}: {d.severity}: {d.message}" for d in self.diagnostics))

    def render(self, sources: dict[str, str]) -> str:
        return "\n".join(d.render(sources) for d in self.diagnostics)


class RuleError(Exception):
    """A language rule was broken. Raised by rules that do not know where they are (shape rules,
    value converters); ``at`` names the culprit (an input index or an attribute name) and the
    caller turns the error into a located Diagnostic."""

    def __init__(self, message: str, at: int | str | None = None):
        super().__init__(message)
        self.at = at


MAX_ERRORS = 100
"""errors (and, apart, warnings and notes) kept per run; past it they are counted, not rendered (and errors no
longer get suggestions)"""


class Sink:
    """Collects diagnostics so that a pass can report every independent error in one run."""

    def __init__(self) -> None:
        self.items: list[Diagnostic] = []
        self.n_errors = 0
        self.n_warnings = 0
        self.dropped = 0
        self.dropped_warnings = 0
        self.n_notes = 0
        self.dropped_notes = 0

    def error(self, message: str, loc: Loc, notes=()) -> None:
        self.n_errors += 1
        if self.n_errors > MAX_ERRORS:
            self.dropped += 1
            return
        self.items.append(Diagnostic("error", message, loc, tuple(notes)))

    def warning(self, message: str, loc: Loc, notes=()) -> None:
        self.n_warnings += 1
        if self.n_warnings > MAX_ERRORS:
            self.dropped_warnings += 1
            return
        self.items.append(Diagnostic("warning", message, loc, tuple(notes)))

    def note(self, message: str, loc: Loc, notes=()) -> None:
        """What the compiler did for the file that the file did not say (a retyped value, inferred groups)."""
        self.n_notes += 1
        if self.n_notes > MAX_ERRORS:
            self.dropped_notes += 1
            return
        self.items.append(Diagnostic("note", message, loc, tuple(notes)))

    def add(self, d: Diagnostic) -> None:
        {"error": self.error, "warning": self.warning, "note": self.note}[d.severity](d.message, d.loc, d.notes)

    def hint(self, word: str, candidates) -> str:
        """did_you_mean, while errors are few: with thousands of unknown names, matching each
        against every known name would make checking quadratic."""
        return did_you_mean(word, candidates) if self.n_errors < MAX_ERRORS else ""

    def diagnostics(self) -> list[Diagnostic]:
        """Everything collected, and a last line counting what was not kept."""
        parts = [
            f"{n} more {what}"
            for n, what in (
                (self.dropped, "errors"),
                (self.dropped_warnings, "warnings"),
                (self.dropped_notes, "notes"),
            )
            if n
        ]
        if not parts:
            return list(self.items)
        last = self.items[-1].loc if self.items else UNKNOWN
        return self.items + [Diagnostic("note", " and ".join(parts) + " not shown", last)]

    def raise_if_errors(self) -> None:
        if self.n_errors:
            raise DslError(self.diagnostics())


def did_you_mean(word: str, candidates) -> str:
    """A ' (did you mean X?)' suffix, or '' when nothing is close."""
    import difflib

    close = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
