"""The cuDNN Frontend's graph JSON as text — where each object starts (for located
errors), the graph lines of a frontend log, and how the frontend encodes a pass-by-value value.

Pure Python: read by `cudnn-dsl import` (fe_import) and written by `emit --format fe-json` (fe_export).
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import math
import re
import struct

import attrs

from dsl.diagnostics import Diagnostic, DslError, Loc

# ---- pass-by-value values, as the frontend encodes them (its std::variant: index, value) -----------------

#: variant index -> the dtype it holds (int64, int32, half, float, double, bf16, in the frontend's order)
_VARIANT = {0: "int64", 1: "int32", 2: "half", 3: "float", 4: "double", 5: "bf16"}


def f32_from_json(v) -> float:
    """A float the frontend wrote: its float32 bits as 8 hex digits ('3F000000'), or a plain number."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    try:
        return struct.unpack(">f", bytes.fromhex(v))[0]
    except (TypeError, ValueError, struct.error):
        raise ValueError(
            f"{json.dumps(v)[:24]} must be a number or the value's bytes as hex, 8 digits for float"
        ) from None


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
        try:
            return f32_from_json(v)
        except ValueError as e:
            raise ValueError(f"pass_by_value.value {e}") from None
    integer = index in (0, 1)
    if not isinstance(v, int if integer else (int, float)) or isinstance(v, bool):
        dtype = _VARIANT.get(index, f"index {index}")
        raise ValueError(
            f"pass_by_value.value {json.dumps(v)[:24]} must be {'an integer' if integer else 'a number'}, for {dtype}"
        )
    return v if integer else float(v)


# ---- the JSON, with where each object starts ------------------------------------------------------------


class Located(dict):
    """A JSON object that remembers its offset in the text (for located errors)."""

    pos = 0


#: deeper than any graph the frontend writes (its objects nest 4 deep), and far below Python's recursion limit
MAX_DEPTH = 64

#: the frontend's integers are int64s
_INT64 = (-(2**63), 2**63 - 1)


class Refused(ValueError):
    """A JSON value the frontend never writes, at `pos` in the text (set where the value starts)."""

    def __init__(self, message: str, pos: int | None = None):
        super().__init__(message)
        self.pos = pos


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or not _INT64[0] <= int(text) <= _INT64[1]:  # length first: int() of 5000 digits
        raise Refused(f"the integer {text[:24]}{'...' if len(text) > 24 else ''} is out of range of int64")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise Refused(f"the number {text[:24]} is out of range of a 64-bit float")
    return value


def _constant(text: str):
    raise Refused(f"{text} is not JSON (the frontend writes finite numbers only)")


def _decoder() -> json.JSONDecoder:
    """A decoder whose objects are Located (the pure-Python scanner: the C one takes no hooks), that refuses
    what the frontend never writes — non-finite numbers, integers beyond int64, nesting deeper than MAX_DEPTH —
    as a Refused at the value."""
    dec = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant)
    depth = 0

    def located(scan_once):
        def scan(string, idx):
            try:
                return scan_once(string, idx)
            except Refused as e:
                if e.pos is None:  # the innermost value: where the refused number starts
                    e.pos = idx
                raise

        return scan

    def nested(s_and_end):
        nonlocal depth
        if depth >= MAX_DEPTH:
            raise Refused(
                f"the JSON nests deeper than {MAX_DEPTH} levels, which no frontend graph does", s_and_end[1] - 1
            )
        depth += 1

    def parse_object(s_and_end, strict, scan_once, *rest):
        nonlocal depth
        nested(s_and_end)
        try:
            obj, end = json.decoder.JSONObject(s_and_end, strict, located(scan_once), *rest)
        finally:
            depth -= 1
        obj = Located(obj)
        obj.pos = s_and_end[1] - 1
        return obj, end

    def parse_array(s_and_end, scan_once):
        nonlocal depth
        nested(s_and_end)
        try:
            return json.decoder.JSONArray(s_and_end, located(scan_once))
        finally:
            depth -= 1

    dec.parse_object, dec.parse_array = parse_object, parse_array
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

    def field(self, obj: Located, field: str) -> int:
        """Where `obj`'s `field` is written (the first such key after the object's start: the frontend's tensors
        and nodes nest no object holding their own keys); the object's start when it has none."""
        pos = getattr(obj, "pos", 0)
        found = re.compile(rf'"{re.escape(field)}"\s*:').search(self.text, pos)
        return found.start() if found else pos


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
    except Refused as e:
        pos = start if e.pos is None else e.pos
        raise src.error(_field_of(src.text, pos) + str(e), pos) from None
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


#: the key whose value (or an item of whose list) starts where the pattern's search ends
_KEY_BEFORE = re.compile(r'"([^"\\]{1,100})"\s*:\s*(?:\[[^\[\]{}"]*)?$')


def _field_of(text: str, pos: int) -> str:
    """'field: ' for the JSON value at `pos`, when it is a field's value or an item of a field's list."""
    m = _KEY_BEFORE.search(text, max(0, pos - 2000), pos)
    return f"{m.group(1)}: " if m else ""
