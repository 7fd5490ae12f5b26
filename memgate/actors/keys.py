"""The keys actor: the data keys of crypto-shredding, and backups of a running instance
(SPEC §5.2 layers 5 and 6, §5.4).

It owns `DIR/keys/` (single writer) and answers
- `mem.int.keys.subject` (erasure's `eval_exports` and `backups` layers): how many keys the
  subject has in the tenant, or erase them. A member's key is named by the member id; an end
  user's, in each memory space that holds them, `<space>/<namespace>`
  (`storage.backup.memory_subject`).
- `mem.admin.backup.{begin,page,end}` (operator token): `memgate backup` / `memgate export`
  on a running instance. Each owner of a DuckDB file opens a snapshot and hands its rows over
  core NATS (`dump_route`, `mem.int.dump.<owner>.*`); this actor seals the personal ones under
  their subjects' keys before anything leaves it, so the command line, and the file it writes,
  never see a personal field in clear.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import duckdb

from memgate.cluster import fence
from memgate.bus.subjects import Admin
from memgate.bus import parse, subjects
from memgate.contracts import Envelope
from memgate.contracts.base import canonical_id
from memgate.contracts.backup import (
    AuditAppend, BackupBegin, BackupEnd, BackupLines, BackupManifest, BackupPage,
    DumpBegin, DumpPage, DumpRows, DumpTables,
)
from memgate.contracts.directory import Done
from memgate.contracts.erasure import SubjectCount, SubjectTarget
from memgate.contracts.errors import (
    MemgateError, NotFoundError, UnavailableError,
)
from memgate.ports.bus import Requester
from memgate.ports.services import BusAudit, BusDumps
from memgate.runtime.actor import ActorBase, Endpoint, Opened, Operator, Serial
from memgate.storage import backup
from memgate.storage.keys import KeyStore

log = logging.getLogger("memgate.keys")

SESSION_IDLE_S = backup.SNAPSHOT_IDLE_S


class OneFile(Protocol):
    @property
    def connection(self) -> duckdb.DuckDBPyConnection: ...


class HoldsOneFile(Protocol):
    """An actor whose store is one DuckDB file: `name` its owner's name, as backups know it."""

    name: str

    @property
    def store(self) -> OneFile: ...


def dumps(actor: HoldsOneFile, serial: Serial) -> list[Endpoint]:
    """The endpoints by which the keys actor reads `actor`'s DuckDB file for a backup, in one
    snapshot, on the actor's `serial` thread and its store's current connection; the tables
    are those `storage.backup` registers for the owner. Made once per owner: they share its
    snapshots."""
    owner = actor.name
    source = backup.source(owner)
    snapshots = backup.Snapshots()
    tables: dict[str, dict[str, backup.TableInfo]] = {}

    async def begin(payload: bytes) -> DumpTables:
        request = parse(DumpBegin, payload)
        found, skipped = await serial(snapshots.begin, actor.store.connection,
                                      request.snapshot, source)
        tables[request.snapshot] = {t.name: t for t in found}
        return DumpTables(tables=[t.to_json() for t in found], skipped=skipped)

    async def page(payload: bytes) -> DumpRows:
        request = parse(DumpPage, payload)
        table = tables.get(request.snapshot, {}).get(request.table)
        if table is None:
            raise NotFoundError("no such snapshot or table")
        try:
            rows = await serial(snapshots.page, request.snapshot, table, request.offset,
                                request.limit)
        except KeyError:
            raise NotFoundError("the backup snapshot is gone (idle too long)") from None
        return DumpRows(rows=rows)

    async def end(payload: bytes) -> Done:
        request = parse(DumpBegin, payload)
        tables.pop(request.snapshot, None)
        await serial(snapshots.end, request.snapshot)
        return Done()

    return [Endpoint(subjects.dump(owner, operation), handler)
            for operation, handler in (("begin", begin), ("page", page), ("end", end))]


@dataclass
class _Session:
    mode: str
    workspace: str | None
    tables: dict[tuple[str, str], tuple[backup.SourceSpec, backup.TableInfo]]
    owners: list[str]
    tenants: dict[str, str] = field(default_factory=dict)
    used: float = field(default_factory=time.monotonic)


class KeysActor(ActorBase):
    name = "keys"
    keys = Opened[KeyStore]()

    def __init__(self, *, root: Path, bus: Requester, admin_token: Callable[[], str],
                 partitions: list[str]) -> None:
        self._root = root
        self._bus = bus
        self._audit_log = BusAudit(bus)
        self._dumps_of = BusDumps(bus)
        self._operator = Operator(admin_token)
        self._partitions = partitions
        self._serial = Serial("keys")
        self._sessions: dict[str, _Session] = {}

    async def start(self) -> None:
        self._operator.load()
        self.keys = await self._serial(KeyStore, self._root)

    async def stop(self) -> None:
        for backup_id in list(self._sessions):
            await self._close(backup_id)
        self._serial.shutdown()

    def endpoints(self) -> list[Endpoint]:
        admin = {Admin.BACKUP_BEGIN: self.begin, Admin.BACKUP_PAGE: self.page,
                 Admin.BACKUP_END: self.end}
        return [Endpoint(subjects.keys_internal("subject"), self.subject),
                *(Endpoint(subject, self._operator.only(handler))
                  for subject, handler in admin.items())]

    # --- erasure's layers: eval exports and backups ---

    async def subject(self, payload: bytes) -> SubjectCount:
        """The subject's keys in the tenant: a member's, and an end user's in each space
        namespace that held them (`owners`); counted, or erased (crypto-shredding)."""
        target = parse(SubjectTarget, payload)
        names = [target.member_id] if target.member_id is not None else []
        if target.external_id is not None:  # a participant's sessions and events
            names.append(canonical_id(target.external_id))
        names += [backup.memory_subject(owner, namespace)
                  for owner, namespaces in target.owners.items() for namespace in namespaces]

        def sweep() -> list[str]:
            held = [n for n in names if self.keys.has(target.tenant, n)]
            if target.erase:
                for name in held:
                    self.keys.erase(target.tenant, name)
            return held

        held = await self._serial(sweep)
        if target.erase and held:
            await self._audit(AuditAppend(
                action="keys_erased", actor=self.name, tenant=target.tenant,
                subject_id=held[0] if len(held) == 1 else None, layer="backups",
                record_ids=held, count=len(held)))
        return SubjectCount(count=len(held), record_ids=held, node=fence.node())

    async def _audit(self, entry: AuditAppend) -> None:
        try:
            await self._audit_log.append(entry)
        except MemgateError as failure:  # the audit actor down: the work stands, logged
            log.warning("audit entry %s not written: %s", entry.action, failure.code)

    # --- backups of a running instance ---

    async def begin(self, envelope: Envelope) -> BackupManifest:
        request = parse(BackupBegin, envelope.body)
        backup_id = secrets.token_hex(8)
        session = _Session(request.mode, request.workspace, {}, [])
        skipped: list[str] = []
        self._expire()
        for source in backup.sources(self._partitions):
            if request.mode == "export" and not source.owner.startswith("storage."):
                continue
            try:
                found = await self._dumps_of.begin(source.owner, backup_id)
            except UnavailableError:  # no owner answers: not registered (yet), or down
                skipped.append(f"{source.file}: its owner {source.owner} does not answer")
                continue
            session.owners.append(source.owner)
            skipped += found.skipped
            for value in found.tables:
                info = backup.TableInfo.from_json(value)
                if request.mode == "export" and info.name != "memories":
                    continue
                session.tables[(info.file, info.name)] = (source, info)
        self._sessions[backup_id] = session
        return BackupManifest(backup_id=backup_id, skipped=skipped,
                              tables=[info.to_json() for _, info in session.tables.values()])

    async def page(self, envelope: Envelope) -> BackupLines:
        request = parse(BackupPage, envelope.body)
        session = self._sessions.get(request.backup_id)
        if session is None:
            raise NotFoundError("no such backup (ended, or idle too long)")
        session.used = time.monotonic()
        found = session.tables.get((request.file, request.table))
        if found is None:
            raise NotFoundError("no such table in this backup")
        source, info = found
        rows = (await self._dumps_of.page(source.owner, DumpPage(
            snapshot=request.backup_id, table=info.name, offset=request.offset,
            limit=backup.PAGE_ROWS))).rows
        lines: list[dict[str, Any]]
        if session.mode == "export":
            lines = await self._serial(backup.export_rows, self.keys, info, rows,
                                       session.workspace)
        else:
            lines = await self._serial(backup.seal_rows, self.keys, source, info, rows,
                                       session.tenants)
        return BackupLines(lines=lines)

    async def end(self, envelope: Envelope) -> Done:
        request = parse(BackupEnd, envelope.body)
        session = self._sessions.get(request.backup_id)
        if session is not None:
            await self._close(request.backup_id)
            await self._audit(AuditAppend(action=session.mode, actor=self.name,
                                          tenant=session.workspace, count=request.rows))
        return Done()

    async def _close(self, backup_id: str) -> None:
        session = self._sessions.pop(backup_id)
        for owner in session.owners:
            with contextlib.suppress(MemgateError):  # else the owner closes it when idle
                await self._dumps_of.end(owner, backup_id)

    def _expire(self) -> None:
        now = time.monotonic()
        for backup_id, session in list(self._sessions.items()):
            if now - session.used > SESSION_IDLE_S:
                self._sessions.pop(backup_id)


__all__ = ["KeysActor", "dumps"]
