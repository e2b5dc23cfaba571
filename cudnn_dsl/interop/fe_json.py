"""The cuDNN Frontend's graph JSON as text — where each object starts (for located
errors), the graph lines of a frontend log, and how the frontend encodes a pass-by-value value.

Pure Python: read by `cudnn-dsl import` (fe_import) and written by `emit --format fe-json` (fe_export).
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import struct

import attrs

from dsl.diagnostics import Diagnostic, DslError, Loc

# ---- pass-by-value values, as the frontend encodes them (its std::variant: index, value) -----------------

#: variant index -> the dtype it holds (int64, int32, half, float, double, bf16, in the frontend's order)
_VARIANT = {0: "int64", 1: "int32", 2: "half", 3: "float", 4: "double", 5: "bf16"}


def f32_from_json(v) -> float:
    """A float the frontend wrote: its float32 bits as 8 hex digits ('3F000000'), or a plain number."""
    if isinstance(v, str):
        return struct.unpack(">f", bytes.fromhex(v))[0]
    return float(v)


def by_value_json(value: float, dtype: str) -> dict:
    """A pass-by-value tensor's value as the frontend writes it when the value is part of the graph (a dtype its
    variant lacks, such as int8, travels as a float32)."""
    index = {d: i for i, d in _VARIANT.items()}.get(dtype, 3)
    if index == 3:
        return {"index": 3, "value": struct.pack(">f", value).hex().upper()}
    return {"index": index, "value": int(value) if index in (0, 1) else float(value)}


def value_from_json(pbv) -> float | int | None:
    """The value of a pass-by-value tensor's JSON, None when the frontend did not record one."""
    if not isinstance(pbv, dict) or "value" not in pbv:
        return None
    index, v = pbv.get("index"), pbv["value"]
    if index == 3:
        return f32_from_json(v)
    return int(v) if index in (0, 1) else float(v)


# ---- the JSON, with where each object starts ------------------------------------------------------------


class Located(dict):
    """A JSON object that remembers its offset in the text (for located errors)."""

    pos = 0


def _decoder() -> json.JSONDecoder:
    """A decoder whose objects are Located (the pure-Python scanner: the C one takes no hooks)."""
    dec = json.JSONDecoder()

    def parse_object(s_and_end, *args):
        obj, end = json.decoder.JSONObject(s_and_end, *args)
        located = Located(obj)
        located.pos = s_and_end[1] - 1
        return located, end

    dec.parse_object = parse_object
    dec.scan_once = json.scanner.py_make_scanner(dec)
    return dec


@attrs.frozen
class Source:
    file: str
    text: str

    def loc(self, pos: int) -> Loc:
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return Loc(self.file, line, col, line, col + 1)

    def error(self, message: str, pos: int = 0) -> DslError:
        return DslError(Diagnostic("error", message, self.loc(pos)))


def find_graphs(src: Source) -> list[Located]:
    """The graph JSON objects in a file: the file itself when it is JSON, else every graph line of a
    frontend log (CUDNN_FRONTEND_LOG_INFO=1 writes each graph on one line when it is validated)."""
    dec = _decoder()
    text = src.text
    start = len(text) - len(text.lstrip())
    if text[start : start + 1] == "{":
        return [_decode(src, dec, start, len(text), "the file")[0]]
    graphs, seen, offset, skip_to = [], set(), 0, 0
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        start, offset = offset, offset + len(line)
        if start < skip_to:  # inside a graph read already
            continue
        at = line.find('{"context"')  # the frontend writes keys sorted: a graph opens with its context
        if at < 0 and line.lstrip().startswith("{") and '"json_version"' in line:
            at = line.index("{")
        if at >= 0:
            obj, skip_to = _decode(src, dec, start + at, start + len(line.rstrip()), "this log line")
        elif line.strip() == "{" and i + 1 < len(lines) and lines[i + 1].lstrip().startswith('"context"'):
            # a graph printed with indentation (`print(graph)`), pasted among other text
            obj, skip_to = _decode(src, dec, start + line.index("{"), len(text), "the graph", trailing=True)
        else:
            continue
        key = json.dumps(obj, sort_keys=True)
        if key not in seen:  # a graph validated twice is one graph
            seen.add(key)
            graphs.append(obj)
    if not graphs:
        raise src.error(
            "no cuDNN Frontend graph found: neither graph JSON nor a frontend log holding one (the frontend "
            "writes each graph's JSON to its log with CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=F)"
        )
    return graphs


def _decode(
    src: Source, dec: json.JSONDecoder, start: int, end: int, what: str, trailing: bool = False
) -> tuple[Located, int]:
    """The JSON object at `start`, which ends by `end`, and where it stops; `trailing` allows text after it."""
    try:
        obj, stop = dec.raw_decode(src.text, start)
    except json.JSONDecodeError as e:
        if e.pos >= end or e.msg.startswith("Unterminated string"):  # the text stops inside a string, or after
            raise src.error(f"{what} ends before its JSON is complete (is it truncated?)", e.pos) from None
        raise src.error(f"not valid JSON: {e.msg}", e.pos) from None
    rest = src.text[stop:end]
    if rest.strip() and not trailing:
        raise src.error(
            "not valid JSON: more text after the graph's closing brace", stop + len(rest) - len(rest.lstrip())
        )
    return obj, stop
