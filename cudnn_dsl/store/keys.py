"""What a stored plan is keyed by: the graph's canonical content at one shape, the GPU, the cuDNN backend and
frontend versions, and the store's directory."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import attrs

from dsl.ir import Graph, Instance

FORMAT = 1
"""of an entry, and of an export bundle (whose kernel_caches list is optional)"""


_ENTRY_ID = re.compile(r"[0-9a-f]{32}")


DIGEST = re.compile(r"[0-9a-f]{64}")


def is_entry_id(text: str) -> bool:
    """Whether text is an entry id (32 lowercase hex digits): the only names `cache show` accepts."""
    return bool(_ENTRY_ID.fullmatch(text))


def cache_dir() -> Path:
    """$CUDNN_DSL_CACHE_DIR, else $XDG_CACHE_HOME/cudnn-dsl, else ~/.cache/cudnn-dsl."""
    env = os.environ.get("CUDNN_DSL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cudnn-dsl"


def graph_digest(graph: Graph, inst: Instance) -> str:
    """A hash of what the plan depends on: ops, canonical attributes, tensor types, by uid. Names and the values
    of scalars and constants are left out (cuDNN reads those at launch), so two spellings of one graph share it.
    Where tensors share memory (views of a buffer, outputs in place) that is part of it too."""
    uid = {v.name: v.uid for v in graph.values}
    canon = {
        "types": [graph.io, graph.intermediate, graph.compute],
        "values": [[v.kind, v.uid, v.dtype] for v in graph.values],
        "nodes": [
            [
                n.op,
                [uid.get(i) for i in n.inputs],
                [uid[o] for o in n.outputs],
                [list(a) for a in inst.node_attrs[k]],
                n.compute,
            ]
            for k, n in enumerate(graph.nodes)
        ],
        "instance": sorted([uid[k], t.dtype, list(t.shape), list(t.strides)] for k, t in inst.types if k in uid),
    }
    if graph.buffers or graph.in_place or any(n.uids for n in graph.nodes):  # absent otherwise: older keys hold
        canon["memory"] = {
            "buffers": [[inst.type(b.name).dtype, list(inst.type(b.name).shape)] for b in graph.buffers],
            "views": sorted([v.uid, [b.name for b in graph.buffers].index(v.view[0]), v.view[1]] for v in graph.views),
            "in_place": sorted([v.uid, uid[v.into]] for v in graph.in_place),
            "attr_uids": [list(n.uids) for n in graph.nodes],
        }
    return hashlib.sha256(json.dumps(canon, sort_keys=True, default=str).encode()).hexdigest()


@attrs.frozen
class PlanKey:
    digest: str
    gpu: str
    compute_capability: str
    cudnn_backend: int
    cudnn_frontend: str
    constraints: str = ""
    """the plan constraints the plan was chosen under ('' for none: such keys keep the ids they had before)"""

    def to_json(self) -> dict:
        return attrs.asdict(self, filter=lambda a, v: a.name != "constraints" or bool(v))

    @property
    def id(self) -> str:
        raw = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:32]
