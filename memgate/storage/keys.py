"""Per-subject data keys: crypto-shredding for what leaves the live stores (SPEC §5.4).

Backups and eval-dataset exports hold each personal field only sealed (AES-256-GCM) under the
data key of the subject it is about (tenant + subject id). The keys live in the live data
directory, `DIR/keys/keys.json`, and never in a backup or an export. Erasing a subject's key
makes every copy sealed under it unreadable, wherever that copy went.

The key file is the one thing that must be truly rewritten on erasure: every change writes a new
file beside it, fsyncs it, renames it over the old one and fsyncs the directory, so after
`erase()` no file under `DIR` holds the erased key's bytes (in any encoding).
(`tests/unit/test_keys.py` scans every byte of `DIR` for it.)

A record about several subjects (a conversation event with two participants) is sealed under a
key derived from all of their keys (HKDF-SHA256): erasing any one of them makes it unreadable.
The associated data binds the tenant, the subjects and the record id, so a sealed field cannot
be moved to another record or subject and still open.

One writer per directory: the keys actor while memgate runs, the command line on a stopped
directory. Readers (`restore --keys-from`, `export read`) may read the file at any time: it is
replaced atomically.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memgate.cluster import replication

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # GCM's standard nonce; random per seal (2^-32 collision bound is far away)
FILE = "keys.json"
FORMAT = 1
_MULTI_INFO = b"memgate/keys/multi-subject/v1"


class KeyErasedError(Exception):
    """A sealed value's subject key is gone (erased), or never existed here."""


class SealBrokenError(Exception):
    """The sealed value does not open under its key: altered, or moved to another record."""


@dataclass(frozen=True)
class Sealed:
    """A value sealed under its subjects' keys; its JSON form is what backups and exports hold."""

    tenant: str
    subjects: tuple[str, ...]
    record: str
    nonce: bytes
    ciphertext: bytes

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "subjects": list(self.subjects), "record": self.record,
                "nonce": _b64(self.nonce), "ct": _b64(self.ciphertext)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Sealed:
        return cls(str(value["tenant"]), tuple(str(s) for s in value["subjects"]),
                   str(value["record"]), base64.b64decode(value["nonce"]),
                   base64.b64decode(value["ct"]))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _aad(tenant: str, subjects: Sequence[str], record: str) -> bytes:
    return json.dumps([tenant, list(subjects), record], separators=(",", ":"),
                      ensure_ascii=False).encode()


def _name(tenant: str, subject: str) -> str:
    return json.dumps([tenant, subject], separators=(",", ":"), ensure_ascii=False)


class KeyStore:
    """The data keys of one data directory (`root` = `DIR/keys`)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._path = root / FILE
        self._lock = threading.Lock()
        self._keys: dict[tuple[str, str], bytes] = self._load()

    @property
    def path(self) -> Path:
        return self._path

    def _load(self) -> dict[tuple[str, str], bytes]:
        if not self._path.exists():
            return {}
        data = json.loads(self._path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"unknown key file format {data.get('format')!r}")
        keys: dict[tuple[str, str], bytes] = {}
        for name, value in data["keys"].items():
            tenant, subject = json.loads(name)
            keys[(tenant, subject)] = base64.b64decode(value)
        return keys

    def _save(self, keys: dict[tuple[str, str], bytes]) -> None:
        """`keys` become the keys: the whole file written anew and renamed over the old one (no
        old bytes survive in any file: an erased key is in no file under the directory
        afterwards), then held. A write refused or failed changes nothing."""
        self._root.mkdir(parents=True, exist_ok=True)
        replication.writing()  # refused here, before a byte, without a quorum of copies
        data = {"format": FORMAT,
                "keys": {_name(t, s): _b64(k) for (t, s), k in sorted(keys.items())}}
        tmp = self._root / f".{FILE}.tmp"
        content = json.dumps(data, indent=0).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._path)
        replication.wrote(self._path, content)  # the standbys' copies too
        dir_fd = os.open(self._root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._keys = keys

    # --- keys ---

    def key_for(self, tenant: str, subject: str, create: bool = True) -> bytes | None:
        """The subject's data key; made (and saved) on first use if `create`."""
        with self._lock:
            key = self._keys.get((tenant, subject))
            if key is None and create:
                key = secrets.token_bytes(KEY_BYTES)
                self._save({**self._keys, (tenant, subject): key})
            return key

    def ensure(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Make the keys of these (tenant, subject) pairs that are missing, in one save;
        how many were made."""
        with self._lock:
            missing = {pair for pair in pairs if pair not in self._keys}
            if missing:
                self._save({**self._keys,
                            **{pair: secrets.token_bytes(KEY_BYTES) for pair in missing}})
            return len(missing)

    def adopt(self, keys: dict[tuple[str, str], bytes]) -> None:
        """Take these keys as they are (a restore carries the surviving subjects' keys over to
        the new directory, so erasing one there still shreds the older backups)."""
        with self._lock:
            if any(self._keys.get(pair) != key for pair, key in keys.items()):
                self._save({**self._keys, **keys})

    def has(self, tenant: str, subject: str) -> bool:
        return (tenant, subject) in self._keys

    def subjects(self, tenant: str, prefix: str = "") -> list[str]:
        """The subjects of `tenant` that have a key (those starting with `prefix`)."""
        return sorted(s for t, s in list(self._keys) if t == tenant and s.startswith(prefix))

    def erase(self, tenant: str, subject: str) -> bool:
        """Destroy the subject's key: every value sealed under it is unreadable from now on.
        True if there was a key."""
        with self._lock:
            if (tenant, subject) not in self._keys:
                return False
            self._save({pair: key for pair, key in self._keys.items()
                        if pair != (tenant, subject)})
            return True

    # --- sealing ---

    def _key(self, tenant: str, subjects: Sequence[str], create: bool) -> bytes:
        keys = []
        for subject in subjects:
            key = self.key_for(tenant, subject, create=create)
            if key is None:
                raise KeyErasedError("a subject key of this record is gone")
            keys.append(key)
        if len(keys) == 1:
            return keys[0]
        return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None,
                    info=_MULTI_INFO).derive(b"".join(keys))

    def encrypt(self, tenant: str, subjects: str | Sequence[str], record: str,
                plaintext: bytes, *, create: bool = True) -> Sealed:
        """Seal `plaintext` of record `record` under the key of `subjects` (one or several)."""
        names = (subjects,) if isinstance(subjects, str) else tuple(sorted(set(subjects)))
        if not names:
            raise ValueError("a sealed value needs at least one subject")
        nonce = secrets.token_bytes(NONCE_BYTES)
        ciphertext = AESGCM(self._key(tenant, names, create)).encrypt(
            nonce, plaintext, _aad(tenant, names, record))
        return Sealed(tenant, names, record, nonce, ciphertext)

    def decrypt(self, sealed: Sealed) -> bytes:
        """The plaintext; `KeyErasedError` if a subject's key is gone, `SealBrokenError` if the
        value was altered or moved."""
        key = self._key(sealed.tenant, sealed.subjects, create=False)
        try:
            return AESGCM(key).decrypt(sealed.nonce, sealed.ciphertext,
                                       _aad(sealed.tenant, sealed.subjects, sealed.record))
        except InvalidTag:
            raise SealBrokenError("the sealed value does not open under its key") from None


__all__ = ["FILE", "KEY_BYTES", "KeyErasedError", "KeyStore", "SealBrokenError", "Sealed"]
