"""Signed manifests: an Ed25519 signature of a manifest's digest by a key the user trusts lets a deployment load
that manifest's serialized plans directly (the warm start) instead of rebuilding each from its engine and knobs.

The keys are OpenSSH's: `ssh-keygen -t ed25519 -N '' -f fleet` makes a pair, `cudnn-dsl cache sign STORE@sha256:D
--key fleet` adds a signature to manifests/D.sig, and a deployment trusts the public keys of a file of
`ssh-ed25519 AAAA... name` lines (as authorized_keys holds them) named by CUDNN_DSL_TRUSTED_KEYS (or --trusted-keys).
Signing and checking take the `cryptography` package (the `fleet` extra); without it a signed manifest is treated as
unsigned, and said so. A signature covers the digest only, so it holds for every copy of the manifest, wherever
it is served from.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re

import attrs

from cudnn_dsl.store.files import StoreProblem, clean, loads, read_regular
from cudnn_dsl.store.remote import Tree

TRUST_ENV = "CUDNN_DSL_TRUSTED_KEYS"
SIG_FORMAT = 1
SIG_LIMIT = 1 << 20
KEYS_LIMIT = 1 << 20
NO_LIBRARY = "signatures need the cryptography package (pip install 'cudnn-dsl[fleet]')"
_B64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def signature_name(digest: str) -> str:
    return f"manifests/{digest}.sig"


def message(digest: str) -> bytes:
    """What is signed: the digest, under words no other signature of the key's owner is made over."""
    return f"cudnn-dsl fleet manifest sha256:{digest}\n".encode()


def trusted_keys_file(environ=None) -> str | None:
    return (os.environ if environ is None else environ).get(TRUST_ENV) or None


def _crypto():
    """cryptography's modules, or None where it is not installed."""
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        return None
    return serialization, ed25519, InvalidSignature


def fingerprint(line: str) -> str:
    """OpenSSH's fingerprint of a public key line (SHA256:..., as `ssh-keygen -l` prints it)."""
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@attrs.frozen
class TrustedKey:
    line: str
    """`ssh-ed25519 AAAA...` (no comment)"""
    name: str
    """the comment of its line, else its fingerprint"""


def load_trusted(path: str) -> list[TrustedKey]:
    """The Ed25519 keys of a trusted-keys file; StoreProblem naming the line of anything else."""
    data = read_regular(path, KEYS_LIMIT, "trusted keys file", follow_symlinks=True)
    if data is None:
        raise StoreProblem(f"trusted keys file {path}: no such file")
    keys = []
    for n, text in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        fields = text.split(None, 2)
        if not fields or fields[0].startswith("#"):
            continue
        if fields[0] != "ssh-ed25519" or len(fields) < 2 or not _B64.fullmatch(fields[1]):
            raise StoreProblem(f"{path}:{n}: not an 'ssh-ed25519 AAAA... name' public key line")
        line = f"{fields[0]} {fields[1]}"
        keys.append(TrustedKey(line, clean(fields[2].strip()) if len(fields) > 2 else fingerprint(line)))
    return keys


def read_signatures(tree: Tree, digest: str) -> list[dict]:
    """The signatures of a manifest ([] when unsigned): {"key": public key line, "signature": base64}."""
    data = tree.read(signature_name(digest), SIG_LIMIT, "signature file")
    if data is None:
        return []
    where = tree.join(signature_name(digest))
    try:
        d = loads(data)
    except ValueError as e:
        raise StoreProblem(f"{where}: {e}") from None
    ok = (
        isinstance(d, dict)
        and d.get("format") == SIG_FORMAT
        and d.get("manifest") == f"sha256:{digest}"
        and isinstance(d.get("signatures"), list)
        and all(isinstance(s, dict) and isinstance(s.get("key"), str) for s in d["signatures"])
        and all(isinstance(s.get("signature"), str) for s in d["signatures"])
    )
    if not ok:
        raise StoreProblem(f"{where} is not a signature file of manifest sha256:{digest}")
    return d["signatures"]


def sign(tree: Tree, digest: str, key_path: str) -> str:
    """Adds the key's signature of the digest to the manifest's signature file (replacing an older one by the
    same key); the public key line. StoreProblem without cryptography, or for a key that is not Ed25519."""
    crypto = _crypto()
    if crypto is None:
        raise StoreProblem(NO_LIBRARY)
    serialization, ed25519, _ = crypto
    data = read_regular(key_path, KEYS_LIMIT, "private key", follow_symlinks=True)
    if data is None:
        raise StoreProblem(f"private key {key_path}: no such file")
    try:
        load = (
            serialization.load_ssh_private_key if b"OPENSSH PRIVATE KEY" in data else serialization.load_pem_private_key
        )
        key = load(data, password=None)
    except (ValueError, TypeError) as e:
        raise StoreProblem(
            f"private key {key_path}: {e} (an unencrypted Ed25519 key: ssh-keygen -t ed25519 -N '')"
        ) from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise StoreProblem(f"private key {key_path} is not an Ed25519 key (ssh-keygen -t ed25519)")
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    line = public.decode()
    signature = base64.b64encode(key.sign(message(digest))).decode()
    others = [s for s in read_signatures(tree, digest) if s["key"] != line]
    doc = {
        "format": SIG_FORMAT,
        "manifest": f"sha256:{digest}",
        "signatures": [*others, {"key": line, "signature": signature}],
    }
    tree.write(signature_name(digest), json.dumps(doc, indent=1, sort_keys=True).encode())
    return line


@attrs.frozen
class Status:
    signer: str
    """the name of a trusted key whose signature verifies ('' : none)"""
    text: str
    """what `cache verify` and the notes say"""
    bad: bool = False
    """a trusted key's signature that does not verify: the signature file was changed"""


def check(tree: Tree, digest: str, trusted_path: str | None) -> Status:
    """Whether a key of the trusted-keys file signed this manifest."""
    try:
        signatures = read_signatures(tree, digest)
    except StoreProblem as e:
        return Status("", str(e), bad=True)
    if not signatures:
        return Status("", "unsigned")
    if not trusted_path:
        return Status("", f"signed by {len(signatures)} key(s); no trusted keys given ({TRUST_ENV} or --trusted-keys)")
    crypto = _crypto()
    if crypto is None:
        return Status("", f"{NO_LIBRARY}: the manifest is treated as unsigned")
    try:
        trusted = {k.line: k for k in load_trusted(trusted_path)}
    except StoreProblem as e:
        return Status("", f"{e}: the manifest is treated as unsigned")
    serialization, _, invalid = crypto
    bad = []
    for s in signatures:
        key = trusted.get(" ".join(s["key"].split()[:2]))
        if key is None:
            continue
        try:
            serialization.load_ssh_public_key(key.line.encode()).verify(
                base64.b64decode(s["signature"]), message(digest)
            )
        except (invalid, ValueError):
            bad.append(key.name)
            continue
        return Status(key.name, f"signed by trusted key {key.name}")
    if bad:
        return Status("", f"the signature of trusted key {', '.join(bad)} does not verify", bad=True)
    return Status("", f"signed by {len(signatures)} key(s), none of them trusted here")
