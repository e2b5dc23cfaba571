"""Checking a fleet store as a deployment pins it (`cache verify`): the manifest against its digest, every entry it
names present and matching its hash, every measurement's name its hash, the signature's status; and its coverage,
which (graph, shape, GPU) of some .cdg files it has a tuned plan for."""

from __future__ import annotations

import attrs

from cudnn_dsl.store import signing
from cudnn_dsl.store.files import StoreProblem
from cudnn_dsl.store.fleet import latest_digest, plan_entry, read_entry, read_manifest
from cudnn_dsl.store.keys import graph_digest
from cudnn_dsl.store.remote import open_tree
from cudnn_dsl.sweep import records as rec


@attrs.frozen
class Verified:
    url: str
    digest: str
    manifest: dict
    entries: int
    """entries checked whole"""
    measurements: int | None
    """records read whole; None where the store cannot be listed (http)"""
    problems: list[str]
    """what is missing or damaged"""
    signature: signing.Status
    notes: list[str]

    @property
    def damaged(self) -> bool:
        return bool(self.problems) or self.signature.bad


def verify(url: str, digest: str | None, trusted_keys: str | None) -> Verified:
    """Checks the manifest of this digest (LATEST's without one) and all it names; StoreProblem when the manifest
    itself is missing or does not match."""
    tree = open_tree(url)
    digest = digest or latest_digest(tree)
    if digest is None:
        raise StoreProblem(f"fleet store {url} has no LATEST: name a manifest, STORE@sha256:DIGEST")
    manifest = read_manifest(tree, digest)
    problems, notes, checked = [], [], 0
    for pool in ("plans", "support"):
        for keyid, row in sorted(manifest[pool].items()):
            try:
                plan_entry(tree, keyid, row) if pool == "plans" else read_entry(tree, row["sha256"])
                checked += 1
            except (StoreProblem, KeyError, TypeError) as e:
                problems.append(f"{pool} key {keyid}: {e}")
    try:
        records, damaged = rec.read_all(tree)
        measurements = len(records)
        problems += [f"measurement {d.path}: {d.why}" for d in damaged]
    except StoreProblem as e:
        measurements = None
        notes.append(f"measurements not checked: {e}")
    return Verified(
        tree.url, digest, manifest, checked, measurements, problems, _signature(tree, digest, trusted_keys), notes
    )


def _signature(tree, digest: str, trusted_keys: str | None) -> signing.Status:
    if trusted_keys:
        return signing.check(tree, digest, trusted_keys)
    try:
        n = len(signing.read_signatures(tree, digest))
    except StoreProblem as e:
        return signing.Status("", str(e), bad=True)
    return signing.Status("", f"signed by {n} key(s), none checked (--trusted-keys)" if n else "unsigned")


@attrs.frozen
class Covered:
    file: str
    graph: str
    shape: str
    gpu: str
    cudnn: tuple[int, ...]
    """the cuDNN versions the manifest has a plan of this shape for (none: not covered)"""

    def line(self) -> str:
        where = f"{self.file}:{self.graph} {self.shape or '(one shape)'} on {self.gpu or 'any GPU'}"
        if not self.cudnn:
            return f"missing  {where}"
        return f"covered  {where} (cuDNN {', '.join(map(str, self.cudnn))})"


def coverage(manifest: dict, graphs, gpus: list[str] | None = None) -> list[Covered]:
    """For each (file, Graph) of `graphs`, each declared shape and each GPU type (the manifest's, unless given; ''
    when it has none):
    the cuDNN versions the manifest holds a plan of it for, matched by graph content and plan constraints."""
    rows = list(manifest["plans"].values())
    gpus = gpus or sorted({str(r.get("gpu")) for r in rows}) or [""]  # no GPU type: every shape is missing
    out = []
    for file, g in graphs:
        for inst in g.instances:
            digest = graph_digest(g, inst)
            for gpu in gpus:
                versions = {
                    int(r.get("cudnn_backend", 0))
                    for r in rows
                    if r.get("digest") == digest
                    and r.get("gpu") == gpu
                    and r.get("constraints", "") == g.options.constraints
                }
                out.append(Covered(file, g.name, inst.label, gpu, tuple(sorted(versions))))
    return out
