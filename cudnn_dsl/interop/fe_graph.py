"""A cuDNN Frontend graph as read from its JSON: its tensors and nodes, located in the source, with the
frontend's values turned into the language's spellings."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import attrs

from cudnn_dsl.interop.fe_json import Source, f32_from_json, value_from_json
from cudnn_dsl.target.dtypes import cudnn_name
from dsl.diagnostics import DslError
from dsl.types import DTYPES as LANGUAGE_DTYPES

VERSIONS = ("1.0", "2.0")
"""the frontend's graph JSON versions read: 1.0 (frontends 1.6 to 1.2x: tensors keyed by name, or by uid when
the user set it) and 2.0 (a list of tensors, referred to by uid); before 1.6 its JSON had no version"""


#: cuDNN data_type name -> language dtype
DTYPES = {cudnn_name(d): d for d in LANGUAGE_DTYPES}


def language_dtype(name) -> str | None:
    """The language dtype of a cuDNN data_type name; None for NOT_SET, null, and what the language lacks."""
    return DTYPES.get(name) if isinstance(name, str) else None


def f32_text(x: float) -> str:
    """The shortest decimal that is the same float32 (a value the frontend keeps as float32)."""
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"the value {x} has no spelling in the language (it has no non-finite numbers)")
    try:
        bits = struct.pack(">f", x)
    except OverflowError:
        raise ValueError(f"the value {x:g} is out of range of a float32") from None
    texts = (f"{x:.{digits}g}" for digits in range(1, 10))  # 9 significant digits always suffice for float32
    return next(t for t in texts if struct.pack(">f", float(t)) == bits)


@attrs.define
class Tensor:
    key: str
    name: str
    """the name in the .cdg file (the frontend's, made an identifier)"""
    json: dict
    producer: int | None = None
    consumers: int = 0

    @property
    def virtual(self) -> bool:
        return bool(self.json.get("is_virtual"))

    @property
    def by_value(self) -> bool:
        return bool(self.json.get("is_pass_by_value"))

    @property
    def dtype(self) -> str | None:
        return language_dtype(self.json.get("data_type"))

    @property
    def dims(self) -> list[int]:
        return list(self.json.get("dim") or [])

    @property
    def strides(self) -> list[int]:
        return list(self.json.get("stride") or [])

    def value(self, scalars: dict[str, str]):
        """A pass-by-value tensor's value: given with --scalar (by its .cdg or frontend name), else the JSON's
        (None when the frontend did not record it: a value bound at launch)."""
        given = scalars.get(self.name, scalars.get(self.json.get("name") or ""))
        return value_from_json(self.json.get("pass_by_value")) if given is None else given

    @property
    def uid(self) -> int | None:
        uid = self.json.get("uid")
        assigned = self.json.get("uid_assigned", True)  # 1.0 says whether the uid is the user's
        return uid if isinstance(uid, int) and assigned else None


@attrs.define
class Node:
    """One frontend node being read: its rows read fields through it, so unread ones can be checked."""

    src: Source
    j: dict
    index: int
    tensors: dict[str, Tensor]
    scalars: dict[str, str]
    read: set = attrs.Factory(lambda: {"tag", "name", "inputs", "outputs", "compute_data_type"})

    @property
    def tag(self) -> str:
        return self.j.get("tag")

    def where(self) -> str:
        return f"node '{self.j.get('name', '')}' ({self.tag}, nodes[{self.index}])"

    def fail(self, message: str, field: str | None = None) -> DslError:
        """An error about this node, at its `field` when given (a node's only nested objects are its
        ports, whose keys are port names, so the first such key after the node's start is the field)."""
        pos = self.src.field(self.j, field) if field else getattr(self.j, "pos", 0)
        return self.src.error(f"{self.where()}: {message}", pos)

    def get(self, field: str, default=None):
        self.read.add(field)
        v = self.j.get(field)
        return default if v is None else v

    def f32(self, field: str, default: float | None = None) -> str:
        """A float32 field (its bits in hex, or a number) as the language spells it; refused at the field when it
        is no float32."""
        try:
            return f32_text(f32_from_json(self.get(field, default)))
        except ValueError as e:
            raise self.fail(f"{field}: {e}", field) from None

    def integers(self, field: str) -> list[int]:
        """An integer list field (a stride), [] where absent; refused at the field where it holds anything else."""
        v = self.get(field, [])
        if not isinstance(v, list):
            raise self.fail(f"{field} {json.dumps(v)} is not a list of integers", field)
        for x in v:
            self._refuse_non_integer(field, x, f"{field} {json.dumps(v)}: {json.dumps(x)}")
        return v

    def integer(self, field: str, *, required: bool = False) -> int | None:
        """An integer field (a bound), None where absent; refused at the field where it is anything else."""
        v = self.get(field)
        if v is None and required:
            raise self.fail(f"has no {field}")
        if v is not None:
            self._refuse_non_integer(field, v, f"{field} {json.dumps(v)}")
        return v

    def _refuse_non_integer(self, field: str, x, said: str) -> None:
        # JSON's true and 1.0 are no integers: int() would take them, and 1.7, silently
        if not isinstance(x, int) or isinstance(x, bool):
            raise self.fail(f"{said} is not an integer", field)

    def tensor(self, port: str, side: str = "inputs") -> Tensor | None:
        ref = (self.j.get(side) or {}).get(port)
        return None if ref is None else self.tensors[str(ref)]

    def port(self, port: str, *, optional: bool = False) -> str | None:
        t = self.tensor(port)
        if t is None and not optional:
            raise self.fail(f"has no {port} input")
        return None if t is None else t.name

    def value_of(self, port: str) -> float:
        """The value of a pass-by-value input that the language spells as an attribute (an epsilon)."""
        t = self.tensor(port)
        if t is None or not t.by_value:
            raise self.fail(f"its {port} is not a pass-by-value scalar, which the language needs")
        v = t.value(self.scalars)
        if v is None:
            raise self.fail(
                f"the JSON does not hold the value of its {port} (tensor '{t.json.get('name', t.key)}', bound at "
                f"launch): give it with --scalar {t.name}=VALUE"
            )
        return float(v)


@attrs.frozen
class Call:
    """What a node becomes: the language op, its arguments and attributes, and which output ports it fills."""

    op: str
    args: tuple[str | None, ...]
    attrs: tuple[tuple[str, str], ...] = ()
    outputs: tuple[str, ...] = ()
    unused: tuple[str, ...] = ()
    """output ports the language does not give: each must be virtual and read by no node"""


@attrs.frozen
class NodeRow:
    """How one frontend node type becomes a language op, and the ops it can become."""

    convert: Callable[[Node], Call]
    ops: tuple[str, ...]


#: what a field of the wrong type raises on its way to text: a malformed JSON, reported at its place
MALFORMED = (TypeError, ValueError, KeyError, IndexError, AttributeError)


def number_text(x) -> str:
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        raise ValueError(f"the value {x} has no spelling in the language (it has no non-finite numbers)")
    return repr(x)


def ints_text(v) -> str:
    return "[" + ", ".join(str(int(x)) for x in v) + "]"


def bool_text(v) -> str:
    return "true" if v else "false"
