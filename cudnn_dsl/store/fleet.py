"""Fleet stores as a deployment reads them: their layout, a manifest read by its digest and checked against it,
the entries it names fetched and checked, and the pinned stores (CUDNN_DSL_STORE) the planner asks after the local
plan store.

The layout (sweep.merge writes it; every file but LATEST and the signatures is named by its sha256, so a pinned
manifest and what it names stay readable after later merges):

    measurements/<key id>/<sha256>.json   records (sweep.records)
    entries/<sha256>.json                 the chosen plan of a key (a plan store entry) or support answer
    manifests/<sha256>.json               {key id: entry} for every key, conflicts, flags
    manifests/<sha256>.sig                signatures of that manifest's digest (store.signing)
    LATEST                                sha256:<digest of the newest manifest>

A pin is `URL@sha256:DIGEST` (URL: a path, file://, http(s):// or any fsspec URL). CUDNN_DSL_STORE holds one or
more, comma-separated, asked in order. A pinned manifest whose bytes do not hash to its pin is never used, and an
entry is used only when its bytes hash to what the manifest says and it is for the key asked.
"""

from __future__ import annotations

import hashlib
import os
import re

import attrs

from cudnn_dsl.store import signing
from cudnn_dsl.store.files import StoreProblem, loads
from cudnn_dsl.store.keys import PlanKey
from cudnn_dsl.store.plans import ENTRY_LIMIT, Entry, PlanStore
from cudnn_dsl.store.remote import Tree, open_tree
from cudnn_dsl.store.schema import check_key

ENV = "CUDNN_DSL_STORE"
MANIFEST_LIMIT = 256 << 20
"""bytes; some 400 per key"""
POINTER_LIMIT = 128
LATEST = "LATEST"
_DIGEST = re.compile(r"[0-9a-f]{64}")


def manifest_name(digest: str) -> str:
    return f"manifests/{digest}.json"


def entry_name(sha: str) -> str:
    return f"entries/{sha}.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@attrs.frozen
class Pin:
    url: str
    digest: str

    @property
    def text(self) -> str:
        return f"{self.url}@sha256:{self.digest}"

    @property
    def short(self) -> str:
        """For notes: the URL and the digest's first 12 digits."""
        return f"{self.url}@sha256:{self.digest[:12]}"


def parse_where(text: str, what: str = "a fleet store") -> tuple[str, str | None]:
    """(URL, digest or None) of `STORE[@sha256:DIGEST]`; StoreProblem saying what is wrong."""
    url, sep, digest = text.strip().rpartition("@sha256:")
    if not sep:
        return text.strip(), None
    if not url or not _DIGEST.fullmatch(digest):
        raise StoreProblem(f"{what} {text!r:.200} is not STORE@sha256:<64 lowercase hex digits>")
    return url, digest


def parse_pin(text: str, what: str = "a fleet store") -> Pin:
    url, digest = parse_where(text, what)
    if digest is None:
        raise StoreProblem(f"{what} {text!r:.200} has no @sha256:DIGEST: a deployment pins one manifest")
    return Pin(url, digest)


def pins_from_env(environ=None) -> tuple[Pin, ...]:
    """The pins of CUDNN_DSL_STORE (none when unset); StoreProblem naming the variable when one is malformed."""
    text = (os.environ if environ is None else environ).get(ENV, "")
    return tuple(parse_pin(part, ENV) for part in text.split(",") if part.strip())


def latest_digest(tree: Tree) -> str | None:
    """The digest LATEST names; None for a store without one."""
    data = tree.read(LATEST, POINTER_LIMIT, "fleet store pointer")
    if data is None:
        return None
    digest = data.decode("ascii", "replace").strip().removeprefix("sha256:")
    if not _DIGEST.fullmatch(digest):
        raise StoreProblem(f"{tree.join(LATEST)} names no manifest digest")
    return digest


def read_manifest(tree: Tree, digest: str) -> dict:
    """The manifest of this digest, its bytes checked against it; StoreProblem when it is missing or does not
    match (never used then)."""
    where = tree.join(manifest_name(digest))
    manifest = _checked(
        tree, manifest_name(digest), "manifest", MANIFEST_LIMIT, digest, f"no manifest {where}", "its digest"
    )
    if not (isinstance(manifest, dict) and all(isinstance(manifest.get(p), dict) for p in ("plans", "support"))):
        raise StoreProblem(f"manifest {where} is not a fleet store manifest")
    for pool in ("plans", "support"):
        for keyid, row in manifest[pool].items():
            why = _bad_row(keyid, row)
            if why:
                raise StoreProblem(f"manifest {where} is not a fleet store manifest: {pool} key {keyid!r:.40}: {why}")
    return manifest


def _checked(tree: Tree, rel: str, what: str, limit: int, sha: str, missing: str, against: str) -> object:
    """The JSON of a content-named file (a manifest, an entry), its bytes checked against sha; StoreProblem
    (`missing` when it is not there) otherwise."""
    data = tree.read(rel, limit, what)
    if data is None:
        raise StoreProblem(missing)
    where = tree.join(rel)
    if sha256(data) != sha:
        raise StoreProblem(f"{what} {where} does not match {against} (changed since it was written)")
    try:
        return loads(data)
    except ValueError as e:
        raise StoreProblem(f"{what} {where}: {e}") from None


def _bad_row(keyid: str, row: object) -> str:
    """Why a manifest's row is not one a merge writes ('' : it is). A row names its entry by sha256 and repeats the
    key it is filed under, which coverage, pull and a sweep's skipping read: the key must be the one whose id files
    it, so that what they read is what the entry holds (plan_entry checks the entry's key against the id too)."""
    if not isinstance(row, dict):
        return "not a JSON object"
    if not _DIGEST.fullmatch(str(row.get("sha256"))):
        return "names no entry by its sha256"
    key = {k: row[k] for k in attrs.fields_dict(PlanKey) if k in row}
    try:
        check_key(key)
    except ValueError as e:
        return str(e)
    if PlanKey(**key).id != keyid:
        return f"its fields are those of key {PlanKey(**key).id}"
    return ""


def read_entry(tree: Tree, sha: str) -> dict:
    """The entry file of this sha256, checked against it (StoreProblem: missing, or not what the manifest names)."""
    where = tree.join(entry_name(sha))
    d = _checked(
        tree,
        entry_name(sha),
        "entry",
        ENTRY_LIMIT,
        sha,
        f"the manifest names {where}, which is missing",
        "the manifest's sha256",
    )
    if not isinstance(d, dict):
        raise StoreProblem(f"entry {where} is not a JSON object")
    return d


def plan_entry(tree: Tree, keyid: str, row: dict) -> Entry:
    """The plan store entry a manifest's row for key `keyid` names, checked whole."""
    where = tree.join(entry_name(row["sha256"]))
    try:
        entry = Entry.from_json(read_entry(tree, row["sha256"]))
    except ValueError as e:
        raise StoreProblem(f"entry {where}: {e}") from None
    if entry.key.id != keyid:
        raise StoreProblem(f"entry {where} was made for key {entry.key.id}, not {keyid}")
    return entry


@attrs.frozen
class Pulled:
    written: int
    kept: int
    """local tuned plans left in place (force replaces them)"""
    same: int
    """plans the local store already had"""
    left: int
    """the manifest's plans of other GPUs, or of graphs not asked for"""
    signer: str
    """the trusted key that signed the manifest ('' : its plans will be rebuilt from engine id + knobs)"""


def pull(
    pin: Pin, gpus: set[str], digests: set[str] | None, store: PlanStore, trusted_keys: str | None, force: bool = False
) -> Pulled:
    """Copies the pinned manifest's plans for these GPU types (and graph digests, unless None) into the local plan
    store, for a serving image. Every entry is fetched and checked before any is written."""
    tree = open_tree(pin.url)
    rows = read_manifest(tree, pin.digest)["plans"]
    signer = signing.check(tree, pin.digest, trusted_keys).signer if trusted_keys else ""
    chosen = {k: r for k, r in rows.items() if r.get("gpu") in gpus and (digests is None or r.get("digest") in digests)}
    entries = [attrs.evolve(plan_entry(tree, k, r), imported=not signer) for k, r in sorted(chosen.items())]
    counts = store.take(entries, force)
    return Pulled(counts["written"], counts["kept"], counts["same"], len(rows) - len(chosen), signer)


@attrs.frozen
class Hit:
    entry: Entry
    """imported (rebuilt from its engine and knobs) unless the manifest is signed by a trusted key"""
    pin: Pin
    signer: str
    """the trusted key that signed the manifest ('' : none)"""

    @property
    def source(self) -> str:
        if self.signer:
            return f"fleet store {self.pin.short} (serialized plan; manifest signed by {self.signer})"
        return f"fleet store {self.pin.short} (engine id + knobs, rebuilt here)"


_MANIFESTS: dict[Pin, dict] = {}
"""manifests read in this process: a digest fixes a manifest's content, so one read serves every graph"""


class Fleet:
    """The pinned stores asked after the local plan store, in order. A store that cannot be read, or a manifest
    that does not match its pin, is said once (in the notes of the shape that asked) and not asked again."""

    def __init__(self, pins: tuple[Pin, ...] = (), trusted_keys: str | None = None):
        self.pins = tuple(pins)
        self.trusted_keys = trusted_keys
        self._failed: dict[Pin, str] = {}
        self._signers: dict[Pin, str] = {}

    @classmethod
    def from_env(cls, environ=None) -> Fleet:
        """CUDNN_DSL_STORE's pins, trusting CUDNN_DSL_TRUSTED_KEYS's keys."""
        return cls(pins_from_env(environ), signing.trusted_keys_file(environ))

    def lookup(self, key: PlanKey, notes: list[str]) -> Hit | None:
        """The first pinned store's entry for key; None when none has one (what went wrong is added to notes)."""
        for pin in self.pins:
            if pin in self._failed:
                continue
            try:
                tree = open_tree(pin.url)
                manifest = self._manifest(tree, pin)
                row = manifest["plans"].get(key.id)
                if row is None:
                    continue
                entry = plan_entry(tree, key.id, row)
            except StoreProblem as e:
                self._failed[pin] = str(e)
                notes.append(f"fleet store {pin.short}: {e}; not used")
                continue
            signer = self._signer(tree, pin, notes)
            return Hit(attrs.evolve(entry, imported=not signer), pin, signer)
        return None

    def _manifest(self, tree: Tree, pin: Pin) -> dict:
        if pin not in _MANIFESTS:
            _MANIFESTS[pin] = read_manifest(tree, pin.digest)
        return _MANIFESTS[pin]

    def _signer(self, tree: Tree, pin: Pin, notes: list[str]) -> str:
        """The trusted key that signed the pin's manifest, '' for none; why not, once, in notes."""
        if not self.trusted_keys:
            return ""
        if pin not in self._signers:
            status = signing.check(tree, pin.digest, self.trusted_keys)
            self._signers[pin] = status.signer
            if not status.signer:
                notes.append(f"fleet store {pin.short}: {status.text}: its plans are rebuilt from engine id + knobs")
        return self._signers[pin]
