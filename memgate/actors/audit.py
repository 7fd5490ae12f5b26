"""The audit actor: the hash-chained audit log (SPEC §5.5, `storage.audit`).

It owns `DIR/audit/` (single writer) and appends
- an entry for every deletion of memories (forget, self-delete, purge, cascade, retention,
  erasure): it consumes the `MemoriesDeleted` events of every partition (`mem.evt.*.memory`,
  durable `audit`), so nothing that storage deleted escapes the log, whoever asked;
- the entries other actors send on `mem.int.audit.append` (erasure layers, keys erased,
  backups and exports), references only (`AuditAppend` has no field for content or identity).

Redelivered events are not logged twice: each entry records the event's digest (`source`),
and the digests of the last entries are kept to skip one seen again.
"""

from __future__ import annotations

import hashlib
from collections import deque
from pathlib import Path

from collections.abc import Callable

from memgate.bus.subjects import Admin
from memgate.bus import parse, subjects
from memgate.contracts.backup import AuditAppend, AuditAppended, AuditVerified
from memgate.contracts.reply import Envelope
from memgate.contracts.events import MEMORY_EVENT, MemoriesDeleted, read_event
from memgate.ports.bus import Consumers
from memgate.runtime.actor import ActorBase, Endpoint, Opened, Operator, Serial
from memgate.storage.audit import AuditEntry, AuditLog
from memgate.storage.audit import verify as verify_chain

DURABLE = "audit"
SEEN_KEPT = 10_000  # event digests remembered against redelivery


class AuditActor(ActorBase):
    name = "audit"
    log = Opened[AuditLog]()

    def __init__(self, *, root: Path, bus: Consumers, admin_token: Callable[[], str]) -> None:
        self._root = root
        self._operator = Operator(admin_token)
        self._serial = Serial("audit")
        self._seen: deque[str] = deque(maxlen=SEEN_KEPT)
        self._events = bus.consumer(subjects.memory_events("*"), DURABLE, self.on_events)

    async def start(self) -> None:
        self._operator.load()
        self.log = await self._serial(AuditLog, self._root)
        self._seen.extend(await self._serial(self.log.sources, SEEN_KEPT))
        await self._events.start()

    async def stop(self) -> None:
        await self._events.stop()
        self._serial.shutdown()

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint(subjects.AUDIT_APPEND, self.append),
                Endpoint(Admin.AUDIT_VERIFY, self._operator.only(self.verify))]

    async def on_events(self, payloads: list[bytes]) -> None:
        entries = []
        for payload in payloads:
            event = read_event(MEMORY_EVENT, payload)
            if not isinstance(event, MemoriesDeleted) or not event.memory_ids:
                continue
            digest = hashlib.sha256(payload).hexdigest()[:32]
            if digest in self._seen:
                continue
            entries.append(AuditEntry(
                action="memories_deleted", actor=f"storage.{event.partition}",
                tenant=event.owner.tenant, subject_id=event.owner.subject_id,
                layer="memory_store", record_ids=tuple(event.memory_ids), source=digest))
        if entries:
            await self._serial(self.log.append, *entries)
            self._seen.extend(e.source for e in entries if e.source is not None)

    async def append(self, payload: bytes) -> AuditAppended:
        request = parse(AuditAppend, payload)
        written = await self._serial(self.log.append, AuditEntry(
            action=request.action, actor=request.actor, tenant=request.tenant,
            subject_id=request.subject_id, layer=request.layer,
            record_ids=tuple(request.record_ids), count=request.count, source=request.source))
        return AuditAppended(seq=written[-1]["seq"], hash=written[-1]["hash"])

    async def verify(self, envelope: Envelope) -> AuditVerified:
        """The operator checks the whole chain (after the appends before it, in order)."""
        checked = await self._serial(verify_chain, self._root)
        broken = checked.broken
        return AuditVerified(ok=checked.ok, entries=checked.entries, head=checked.head,
                             broken_line=broken.line if broken else None,
                             broken_reason=broken.reason if broken else None)


__all__ = ["AuditActor"]
