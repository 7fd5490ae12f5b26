"""Backups, exports and the audit log on the bus (SPEC §5.4, §5.5).

An operator's `memgate backup` on a running instance: `mem.admin.backup.begin` (snapshots open at
every owner of a DuckDB file), `.page` (one page of a table's lines, personal rows already
sealed by the keys actor), `.end`. The keys actor asks each owner on `mem.int.dump.<owner>.*`
for its rows in clear, over core NATS request/reply (never persisted), as it asks for texts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from memgate.contracts.base import Contract

PAGE_MAX = 10_000


class DumpBegin(Contract):
    snapshot: str = Field(min_length=1, max_length=64)


class DumpTables(Contract):
    tables: list[dict[str, Any]]  # storage.backup.TableInfo.to_json()
    skipped: list[str] = Field(default_factory=list)


class DumpPage(Contract):
    snapshot: str = Field(min_length=1, max_length=64)
    table: str = Field(min_length=1, max_length=128)
    offset: int = Field(ge=0)
    limit: int = Field(ge=1, le=PAGE_MAX)


class DumpRows(Contract):
    rows: list[list[Any]]


class BackupBegin(Contract):
    mode: Literal["backup", "export"] = "backup"
    workspace: str | None = Field(default=None, max_length=128)  # export: one workspace only


class BackupManifest(Contract):
    backup_id: str
    tables: list[dict[str, Any]]
    skipped: list[str] = Field(default_factory=list)


class BackupPage(Contract):
    backup_id: str = Field(min_length=1, max_length=64)
    file: str = Field(min_length=1, max_length=256)
    table: str = Field(min_length=1, max_length=128)
    offset: int = Field(ge=0)


class BackupLines(Contract):
    lines: list[dict[str, Any]]


class BackupEnd(Contract):
    backup_id: str = Field(min_length=1, max_length=64)
    rows: int = Field(default=0, ge=0)  # what the client wrote, for the audit entry


class AuditAppend(Contract):
    """An entry for the audit log: references only (SPEC §5.5)."""

    model_config = ConfigDict(extra="forbid")

    action: str = Field(min_length=1, max_length=64)
    actor: str = Field(min_length=1, max_length=64)
    tenant: str | None = Field(default=None, max_length=128)
    subject_id: str | None = Field(default=None, max_length=256)
    layer: str | None = Field(default=None, max_length=64)
    record_ids: list[str] = Field(default_factory=list, max_length=10_000)
    count: int | None = Field(default=None, ge=0)
    source: str | None = Field(default=None, max_length=128)


class AuditAppended(Contract):
    seq: int
    hash: str


class AuditVerified(Contract):
    """The whole chain checked (SPEC §5.5): its length, head, and the first bad entry if any."""

    ok: bool
    entries: int
    head: str
    broken_line: int | None = None
    broken_reason: str | None = None


__all__ = [
    "AuditAppend", "AuditAppended", "AuditVerified", "BackupBegin", "BackupEnd", "BackupLines",
    "BackupManifest", "BackupPage", "DumpBegin", "DumpPage", "DumpRows", "DumpTables", "PAGE_MAX",
]
