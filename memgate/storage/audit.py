"""The audit log (SPEC §5.5): append-only, hash-chained, references only.

`DIR/audit/audit.log` holds one JSON object per line. Each entry has a `seq` (1, 2, …), the
`prev` hash (the previous entry's `hash`; 64 zeros for the first) and its own `hash`: SHA-256
over the canonical JSON (sorted keys, no spaces, UTF-8) of the entry without `hash`. Editing,
deleting, reordering or inserting an entry breaks the chain at that entry, which `verify` names.

`DIR/audit/audit.head` holds the last `seq` and `hash` (rewritten atomically after each append),
so cutting entries off the end is found too, unless the head is rewritten as well: against an
attacker who controls the directory, copy the head hash that `memgate audit verify` prints
somewhere else (an external anchor) and compare.

Entries hold references only: tenant, subject_id, record ids, counts, layer, actor, action,
time. Never content, never identity (no names, no e-mail, no external user ids): `AuditEntry`
has no field for them, and the subject ↔ identity mapping lives in the directory and the
spaces' entity map, which erasure deletes, detaching the log from the person.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memgate.cluster import replication

GENESIS = "0" * 64
LOG = "audit.log"
HEAD = "audit.head"
MAX_RECORD_IDS = 10_000  # an entry larger than this is split by the caller


def canonical(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def entry_hash(entry: dict[str, Any]) -> str:
    return hashlib.sha256(canonical({k: v for k, v in entry.items() if k != "hash"})).hexdigest()


@dataclass(frozen=True)
class AuditEntry:
    """What an entry says, before the chain fields (`seq`, `prev`, `hash`, `at`) are added."""

    action: str  # e.g. memories_deleted, erasure_layer, backup, restore
    actor: str  # the actor or command that acted, e.g. storage.p0, erasure, cli
    tenant: str | None = None
    subject_id: str | None = None  # an internal id (member id, space/namespace), never identity
    layer: str | None = None  # a layer of SPEC §5.2
    record_ids: tuple[str, ...] = ()
    count: int | None = None
    source: str | None = None  # an idempotency reference (e.g. an event's digest)

    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"action": self.action, "actor": self.actor}
        for name, value in (("tenant", self.tenant), ("subjectId", self.subject_id),
                            ("layer", self.layer), ("source", self.source)):
            if value is not None:
                fields[name] = value
        if self.record_ids:
            fields["recordIds"] = list(self.record_ids)
        fields["count"] = len(self.record_ids) if self.count is None else self.count
        return fields


@dataclass(frozen=True)
class Broken:
    """Where verification failed: the line (1-based) of the first bad entry, and why."""

    line: int
    seq: int | None
    reason: str


@dataclass(frozen=True)
class Verified:
    entries: int
    head: str  # the last entry's hash (GENESIS for an empty log)
    broken: Broken | None

    @property
    def ok(self) -> bool:
        return self.broken is None


class AuditLog:
    """The log of one data directory (`root` = `DIR/audit`); one writer (the audit actor, or
    the command line on a stopped directory)."""

    def __init__(self, root: Path, *, now: Callable[[], datetime] | None = None) -> None:
        self._root = root
        self._log = root / LOG
        self._head = root / HEAD
        self._now = now or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        self._seq, self._hash = self._tail()

    @property
    def path(self) -> Path:
        return self._log

    def _tail(self) -> tuple[int, str]:
        """The last intact entry's seq and hash (a torn last line, from a crash mid-write,
        is cut off: it was never acknowledged)."""
        if not self._log.exists():
            return 0, GENESIS
        with self._log.open("rb") as f:
            data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a torn write: drop it
            with self._log.open("r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
        lines = data[:end].splitlines()
        if not lines:
            return 0, GENESIS
        last = json.loads(lines[-1])
        return int(last["seq"]), str(last["hash"])

    def append(self, *entries: AuditEntry) -> list[dict[str, Any]]:
        """Append the entries (one fsync for all); the written entries."""
        with self._lock:
            self._root.mkdir(parents=True, exist_ok=True)
            written: list[dict[str, Any]] = []
            seq, prev = self._seq, self._hash
            at = self._now().isoformat().replace("+00:00", "Z")
            for entry in entries:
                seq += 1
                full = {"seq": seq, "at": at, "prev": prev, **entry.fields()}
                full["hash"] = prev = entry_hash(full)
                written.append(full)
            lines = b"".join(canonical(e) + b"\n" for e in written)
            replication.writing()  # refused here, before a byte, without a quorum of copies
            with self._log.open("ab") as f:
                f.write(lines)
                f.flush()
                os.fsync(f.fileno())
            replication.wrote(self._log, lines, append=True)  # the standbys' copies too
            self._seq, self._hash = seq, prev
            self._write_head()
            return written

    def _write_head(self) -> None:
        tmp = self._root / f".{HEAD}.tmp"
        head = json.dumps({"seq": self._seq, "hash": self._hash})
        tmp.write_text(head)
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self._head)
        replication.wrote(self._head, head.encode())

    def entries(self) -> Iterator[dict[str, Any]]:
        yield from read_entries(self._log)

    def sources(self, last: int) -> set[str]:
        """The `source` references of the last `last` entries (redelivery dedupe)."""
        found: list[str] = [e["source"] for e in self.entries() if "source" in e]
        return set(found[-last:])


def read_entries(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def verify(root: Path) -> Verified:
    """Check the whole chain of `root` (= `DIR/audit`) and its head; the first bad entry."""
    log, head_path = root / LOG, root / HEAD
    prev, count = GENESIS, 0
    if log.exists():
        with log.open("rb") as f:
            for number, line in enumerate(f, start=1):
                count = number
                try:
                    entry = json.loads(line)
                    seq = entry.get("seq") if isinstance(entry, dict) else None
                except ValueError:
                    return Verified(number - 1, prev, Broken(number, None, "not JSON"))
                if not isinstance(entry, dict) or "hash" not in entry:
                    return Verified(number - 1, prev, Broken(number, None, "not an entry"))
                if entry_hash(entry) != entry["hash"]:
                    return Verified(number - 1, prev,
                                    Broken(number, seq, "its hash does not match its content"))
                if entry.get("prev") != prev:
                    return Verified(number - 1, prev, Broken(
                        number, seq, "its prev is not the hash of the entry before it "
                                     "(an entry was deleted, inserted or moved)"))
                if seq != number:
                    return Verified(number - 1, prev, Broken(
                        number, seq, f"its seq is {seq}, expected {number}"))
                prev = str(entry["hash"])
    if head_path.exists():
        head = json.loads(head_path.read_text())
        if head.get("seq") != count or head.get("hash") != prev:
            return Verified(count, prev, Broken(
                min(count, int(head.get("seq") or 0)) + 1, head.get("seq"),
                f"the head records entry {head.get('seq')} but the log ends at {count} "
                "(entries cut off the end)"))
    elif count:
        return Verified(count, prev, Broken(count, count, "the head file is missing"))
    return Verified(count, prev, None)


__all__ = ["GENESIS", "AuditEntry", "AuditLog", "Broken", "Verified", "canonical", "entry_hash",
           "read_entries", "verify"]
