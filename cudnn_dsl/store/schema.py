"""The store's field schema: exact types (no bool for int, no float for int), bounded ranges and lengths,
checked on every entry, search, partition choice and bundle read from disk."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from cudnn_dsl.store.kernels import KERNEL_CACHE_LIMIT, KERNEL_CACHE_NAME
from cudnn_dsl.store.keys import DIGEST, FORMAT

_MAX_CREATED = 1e11
"""seconds since 1970 (the year 5138): beyond it, time.localtime fails"""

_STR_LIMIT = 1024

_PARTITION_NAME = re.compile(r"whole|[1-9][0-9]{0,6}(,[1-9][0-9]{0,6}){0,255}")

MAX_WORKSPACE = 1 << 40
"""bytes; the runtime allocates a stored plan's workspace on every load, so an absurd one is damage"""


_Fields = dict[str, tuple[Callable[[object], bool], str]]
"""field name -> (check of its value, what the value should be)"""


def _int(lo: int, hi: int) -> Callable[[object], bool]:
    return lambda v: type(v) is int and lo <= v <= hi


def _str(v: object) -> bool:
    return type(v) is str and len(v) <= _STR_LIMIT


def _number(v: object) -> bool:
    return (type(v) is int and abs(v) < 2**63) or (type(v) is float and math.isfinite(v))


def _dict_of(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: type(v) is dict and len(v) <= 256 and all(_str(k) and check(x) for k, x in v.items())


_KEY_FIELDS: _Fields = {
    "digest": (lambda v: type(v) is str and bool(DIGEST.fullmatch(v)), "64 hex digits"),
    "gpu": (_str, "a string"),
    "compute_capability": (_str, "a string"),
    "cudnn_backend": (_int(0, 2**31 - 1), "a cuDNN version number"),
    "cudnn_frontend": (_str, "a string"),
}
_KEY_OPTIONAL: _Fields = {"constraints": (_str, "a string")}


_ENTRY_FIELDS: _Fields = {
    "format": (lambda v: type(v) is int and v == FORMAT, f"format {FORMAT}"),
    "key": (
        lambda v: check_key(v) is None,
        "a plan key",
    ),  # raises naming the bad key field
    "graph": (_str, "a string"),
    "plan_name": (_str, "a string"),
    "engine_id": (_int(0, 2**31 - 1), "an engine id"),
    "knobs": (_dict_of(_int(-(2**63), 2**63 - 1)), "a map of knob names to integers"),
    "blob": (lambda v: type(v) is str, "base64 text"),
    "blob_sha256": (lambda v: type(v) is str and bool(DIGEST.fullmatch(v)), "a sha256"),
    "workspace": (_int(0, MAX_WORKSPACE), f"a byte count up to {MAX_WORKSPACE}"),
    "tuned": (lambda v: type(v) is bool, "true or false"),
}


_OPTIONAL_FIELDS: _Fields = {
    "timing": (_dict_of(_number), "a map of names to numbers"),
    "created": (lambda v: _number(v) and 0 <= v <= _MAX_CREATED, "a time"),
    "imported": (lambda v: type(v) is bool, "true or false"),
}


_TRIED_FIELDS: _Fields = {
    "engine": (_int(0, 2**31 - 1), "an engine id"),
    "knobs": (_dict_of(_int(-(2**63), 2**63 - 1)), "a map of knob names to integers"),
    "source": (lambda v: v in ("heuristics", "search"), "heuristics or search"),
    "status": (lambda v: v in ("timed", "unsupported", "failed", "excluded"), "timed, unsupported, failed or excluded"),
}


_TRIED_OPTIONAL: _Fields = {
    "name": (_str, "a string"),
    "median_us": (lambda v: _number(v) and v >= 0, "a time in µs"),
    "workspace": (_int(0, MAX_WORKSPACE), "a byte count"),
    "error": (_str, "a string"),
}


SEARCH_FIELDS: _Fields = {
    "format": (lambda v: type(v) is int and v == FORMAT, f"format {FORMAT}"),
    "key": (lambda v: check_key(v) is None, "a plan key"),
    "graph": (_str, "a string"),
    "tried": (
        lambda v: type(v) is list and all(check_fields(t, _TRIED_FIELDS, "tried", _TRIED_OPTIONAL) is None for t in v),
        "a list",
    ),
}


PARTITION_FIELDS: _Fields = {
    "format": (lambda v: type(v) is int and v == FORMAT, f"format {FORMAT}"),
    "key": (lambda v: check_key(v) is None, "a plan key"),
    "graph": (_str, "a string"),
    "cuts": (
        lambda v: type(v) is list and all(type(c) is int and 0 < c < 1 << 20 for c in v) and v == sorted(set(v)),
        "increasing node indices",
    ),
    "times_us": (
        lambda v: _dict_of(lambda t: _number(t) and t >= 0)(v) and all(_PARTITION_NAME.fullmatch(k) for k in v),
        "a map of partitions ('whole', '1,3') to times in µs",
    ),
}


BUNDLE_FIELDS: _Fields = {
    "format": (lambda v: type(v) is int, "a number"),
    "entries": (lambda v: type(v) is list, "a list"),
}


KERNEL_CACHE_FIELDS: _Fields = {
    "name": (lambda v: type(v) is str and bool(KERNEL_CACHE_NAME.fullmatch(v)), "a kernel cache file name"),
    "text": (lambda v: type(v) is str and len(v) <= KERNEL_CACHE_LIMIT, "text within the size limit"),
}


def brief(v: object) -> str:
    if isinstance(v, (dict, list)):
        return f"a JSON {'object' if isinstance(v, dict) else 'array'}"
    return repr(v[:40] if isinstance(v, str) else v)[:60]


def check_fields(d: object, fields: _Fields, what: str, optional: _Fields | None = None) -> None:
    """ValueError naming the first missing, unknown or wrong field of d."""
    if type(d) is not dict:
        raise ValueError(f"{what} is {brief(d)}, not a JSON object")
    optional = optional or {}
    for name, (ok, want) in {**fields, **optional}.items():
        if name not in d:
            if name in optional:
                continue
            raise ValueError(f"{what} has no field '{name}'")
        if not ok(d[name]):
            raise ValueError(f"{what} field '{name}' is {brief(d[name])}, not {want}")
    extra = sorted(set(d) - set(fields) - set(optional))
    if extra:
        raise ValueError(f"{what} has an unknown field {extra[0]!r:.60}")


def check_key(d: object, what: str = "key") -> None:
    """ValueError naming the first missing, unknown or wrong field of a plan key's JSON (store.keys.PlanKey)."""
    check_fields(d, _KEY_FIELDS, what, _KEY_OPTIONAL)


def check_entry(d: object) -> None:
    """Every field but the blob's content; the format first, so that a newer entry says so."""
    if type(d) is dict and "format" in d and not _ENTRY_FIELDS["format"][0](d["format"]):
        raise ValueError(f"entry format {brief(d['format'])} is not {FORMAT}")
    check_fields(d, _ENTRY_FIELDS, "entry", _OPTIONAL_FIELDS)
