"""`memgate backup`, `restore`, `export`, `export-read` and `audit verify` (SPEC §5.4, §5.5).

A backup reads a stopped data directory directly (every DuckDB file opened read-only, personal
rows sealed here under the directory's keys), or, when memgate runs on it (its processes hold
the DuckDB locks), asks the running keys actor (`mem.admin.backup.*`, operator token, the
adapter's NATS login derived from the directory's internal secret), which has each owner read
its file in one snapshot and seals before anything leaves it. Either way the file holds no
personal field in clear and no key.

A backup ends with a MAC under the directory's backup key (`DIR/keys/backup.mac`). Restore
rebuilds a new data directory from a backup and the keys that still live in `--keys-from`: it
first checks the MAC (a backup altered, cut short or made elsewhere is refused before anything
is written), builds the files from memgate's own schema, and refuses what memgate never writes
(a personal row in clear, a table or column it does not back up); a row whose subject key is
gone (erased) is dropped, the others are opened and written back; the surviving subjects' keys
are carried over; the audit log is carried over and the restore appended to it; every owner's
memories are re-announced (a `MemoryStored` event in the partition's outbox), so the indexer
and the embedder rebuild from storage when `memgate up` starts on it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import duckdb

from memgate.app import dataformat
from memgate.bus.subjects import Admin
from memgate.bus import BusClient, subjects
from memgate.contracts.backup import (
    BackupBegin, BackupEnd, BackupLines, BackupManifest, BackupPage,
)
from memgate.contracts.directory import Done
from memgate.contracts.events import MemoryStored
from memgate.contracts.internal import Owner
from memgate.storage import audit, backup, outbox
from memgate.storage.backup import RestoreRefusedError
from memgate.storage.keys import KeyStore, SealBrokenError, Sealed

FLUSH_ROWS = 1000


class RunningError(Exception):
    """memgate runs on the directory: go through the running service."""


class Dumper(Protocol):
    async def begin(self) -> tuple[list[backup.TableInfo], list[str]]: ...
    async def lines(self, table: backup.TableInfo, offset: int) -> list[dict[str, Any]]: ...
    async def end(self, rows: int) -> None: ...


def is_running(data_dir: Path) -> bool:
    """Whether a memgate process holds the directory's DuckDB files."""
    path = data_dir / "directory.duckdb"
    if not path.exists():
        return False
    try:
        duckdb.connect(str(path), read_only=True).close()
    except duckdb.IOException:
        return True
    return False


class LocalDumper:
    """A stopped directory: each DuckDB file opened read-only; rows sealed with its key store."""

    def __init__(self, data_dir: Path, *, mode: str = "backup",
                 workspace: str | None = None) -> None:
        self._dir = data_dir
        self._mode = mode
        self._workspace = workspace
        self._keys = KeyStore(data_dir / "keys")
        self._open: dict[str, tuple[backup.SourceSpec, duckdb.DuckDBPyConnection]] = {}
        self._tenants: dict[str, str] = {}

    async def begin(self) -> tuple[list[backup.TableInfo], list[str]]:
        tables: list[backup.TableInfo] = []
        skipped: list[str] = []
        for source in backup.sources(backup.partitions_in(self._dir)):
            if self._mode == "export" and not source.owner.startswith("storage."):
                continue
            path = self._dir / source.file
            if not path.exists():
                continue
            try:
                db = duckdb.connect(str(path), read_only=True)
            except duckdb.IOException:
                self.close()
                raise RunningError(f"{source.file} is held by a running memgate") from None
            self._open[source.file] = (source, db)
            found, skip = backup.describe(db, source)
            tables += [t for t in found if self._mode != "export" or t.name == "memories"]
            skipped += skip
        return tables, skipped

    async def lines(self, table: backup.TableInfo, offset: int) -> list[dict[str, Any]]:
        source, db = self._open[table.file]
        rows = backup.page(db, table, offset)
        if self._mode == "export":
            return backup.export_rows(self._keys, table, rows, self._workspace)
        return backup.seal_rows(self._keys, source, table, rows, self._tenants)

    async def end(self, rows: int) -> None:
        self.close()
        if self._mode == "backup" or rows:
            audit.AuditLog(self._dir / "audit").append(audit.AuditEntry(
                action=self._mode, actor="cli", tenant=self._workspace, count=rows))

    def close(self) -> None:
        for _, db in self._open.values():
            db.close()
        self._open.clear()


class BusDumper:
    """A running memgate: the keys actor reads and seals; this side only writes the lines."""

    def __init__(self, client: BusClient, token: str, *, mode: str = "backup",
                 workspace: str | None = None) -> None:
        self._client = client
        self._token = token
        self._begin = BackupBegin(mode="export" if mode == "export" else "backup",
                                  workspace=workspace)
        self._id = ""

    async def begin(self) -> tuple[list[backup.TableInfo], list[str]]:
        manifest = await self._client.command(Admin.BACKUP_BEGIN, self._token,
                                              self._begin, BackupManifest)
        self._id = manifest.backup_id
        return [backup.TableInfo.from_json(t) for t in manifest.tables], manifest.skipped

    async def lines(self, table: backup.TableInfo, offset: int) -> list[dict[str, Any]]:
        page = await self._client.command(
            Admin.BACKUP_PAGE, self._token,
            BackupPage(backup_id=self._id, file=table.file, table=table.name, offset=offset),
            BackupLines)
        return page.lines

    async def end(self, rows: int) -> None:
        if self._id:
            await self._client.command(Admin.BACKUP_END, self._token,
                                       BackupEnd(backup_id=self._id, rows=rows), Done)


@dataclass
class Written:
    tables: dict[str, int] = field(default_factory=dict)  # "file:table" → rows
    sealed: int = 0
    skipped: list[str] = field(default_factory=list)
    audit_entries: int = 0


def _private(path: Path) -> Any:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return os.fdopen(fd, "w", encoding="utf-8")


async def write_backup(dumper: Dumper, out: Path, *, mac_key: bytes | None,
                       audit_root: Path | None = None, mode: str = "backup") -> Written:
    """Write the backup (or the export) to `out` (via `out.partial`, renamed when complete);
    a backup ends with its MAC under `mac_key` (the directory's backup key)."""
    if (mode == "backup") != (mac_key is not None):
        raise ValueError("a backup, and only a backup, is authenticated")
    mac = backup.new_mac(mac_key or b"")
    written = Written()
    partial = out.with_name(out.name + ".partial")
    tables, written.skipped = await dumper.begin()
    rows = 0
    try:
        with _private(partial) as f:

            def write(line: str) -> None:
                f.write(line)
                mac.update(line.encode())

            if mode == "backup":
                write(json.dumps({
                    "memgateBackup": backup.FORMAT,
                    "createdAt": datetime.now(UTC).isoformat(),
                    "tables": [t.to_json() for t in tables], "skipped": written.skipped}) + "\n")
            for table in tables:
                count = 0
                for offset in range(0, table.rows, backup.PAGE_ROWS):
                    lines = await dumper.lines(table, offset)
                    for line in lines:
                        write(json.dumps(line, separators=(",", ":")) + "\n")
                    count += len(lines)
                    written.sealed += sum("sealed" in line for line in lines)
                written.tables[f"{table.file}:{table.name}"] = count
                rows += count
            if mode == "backup" and audit_root is not None:
                for entry in audit.read_entries(audit_root / audit.LOG):
                    write(json.dumps({"audit": entry}, separators=(",", ":")) + "\n")
                    written.audit_entries += 1
            if mode == "backup":
                f.write(backup.mac_line(mac))
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        partial.unlink(missing_ok=True)
        await dumper.end(0)
        raise
    await dumper.end(rows)
    os.replace(partial, out)
    return written


@dataclass
class Restored:
    restored: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)  # rows whose subject key is gone
    announced: int = 0  # owners whose memories were re-announced to the indexer and embedder


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _authentic_lines(path: Path, key: bytes) -> Iterator[dict[str, Any]]:
    """The backup's lines but its MAC line; refused at the end if the MAC does not match."""
    mac = backup.new_mac(key)
    last: bytes | None = None
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if last is not None:
                mac.update(last)
                if last.strip():
                    yield _object(last, number - 1)
            last = raw
    if last is None or not backup.is_authentic(mac, last):
        raise RestoreRefusedError(
            "the backup fails authentication: it was altered or cut short, was made by another "
            "data directory than --keys-from, or predates authenticated backups")


def _object(raw: bytes, number: int) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        raise RestoreRefusedError(f"line {number} of the backup is not JSON") from None
    if not isinstance(value, dict):
        raise RestoreRefusedError(f"line {number} of the backup is not a JSON object")
    return value


def restore(source: Path, data_dir: Path, keys_from: Path) -> Restored:
    """Rebuild `data_dir` (new or empty) from the backup `source` and the keys in
    `keys_from/keys` (the live directory's, which made the backup). Refused with
    `RestoreRefusedError` (a ValueError) and nothing left in `data_dir` if the backup fails
    authentication or holds what memgate never writes."""
    if data_dir.exists() and any(data_dir.iterdir()):
        raise FileExistsError(f"{data_dir} is not empty: restore into a new directory")
    key = backup.mac_key(keys_from / "keys", create=False)
    if key is None:
        raise RestoreRefusedError(f"{keys_from} has no backup key (keys/{backup.MAC_FILE}): "
                                  "restore with --keys-from the directory that made the backup")
    for _ in _authentic_lines(source, key):  # checked whole before anything is written
        pass
    try:
        restored = _restore(_authentic_lines(source, key), data_dir, KeyStore(keys_from / "keys"))
        dataformat.stamp(data_dir)  # built from this memgate's own schema
        return restored
    except BaseException:
        if data_dir.exists():
            for child in data_dir.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def _restore(lines: Iterator[dict[str, Any]], data_dir: Path, old_keys: KeyStore) -> Restored:
    manifest = next(lines, None)
    if manifest is None or manifest.get("memgateBackup") != backup.FORMAT:
        raise RestoreRefusedError("not a memgate backup (or a format this version does not read)")
    result = Restored()
    writer = backup.Restorer(data_dir)
    pending: dict[tuple[str, str], list[list[Any]]] = defaultdict(list)
    carried: dict[tuple[str, str], bytes] = {}
    audit_lines: list[dict[str, Any]] = []
    try:
        try:
            listed = [backup.TableInfo.from_json(t) for t in manifest["tables"]]
        except (KeyError, TypeError, ValueError):
            raise RestoreRefusedError("the backup's list of tables is malformed") from None
        tables = {(t.file, t.name): writer.table(t) for t in listed}
        for table in tables.values():
            result.restored[f"{table.file}:{table.name}"] = 0
        for line in lines:
            if isinstance(line.get("audit"), dict):
                audit_lines.append(line["audit"])
                continue
            listed_as = tables.get((str(line.get("f")), str(line.get("t"))))
            if listed_as is None:
                raise RestoreRefusedError("a row of a table the backup does not list")
            table = listed_as
            name = f"{table.file}:{table.name}"
            values = _opened(old_keys, line, table, name, carried)
            if values is None:
                result.dropped[name] = result.dropped.get(name, 0) + 1
                continue
            key = (table.file, table.name)
            pending[key].append(values)
            result.restored[name] += 1
            if len(pending[key]) >= FLUSH_ROWS:
                writer.insert(table, pending.pop(key))
        for key, rows in pending.items():
            writer.insert(tables[key], rows)
        result.announced = _announce(writer, tables)
    finally:
        writer.close()
    KeyStore(data_dir / "keys").adopt(carried)
    _restore_audit(data_dir / "audit", audit_lines, result)
    return result


def _opened(keys: KeyStore, line: dict[str, Any], table: backup.TableInfo, name: str,
            carried: dict[tuple[str, str], bytes]) -> list[Any] | None:
    """A line's row values as memgate wrote them (None: its subject was erased); the keys
    that opened it noted in `carried`."""
    if "row" in line:
        if table.personal:
            raise RestoreRefusedError(f"{name}: a row of a personal table in clear")
        values = line["row"]
    else:
        if not table.personal:
            raise RestoreRefusedError(f"{name}: a sealed row in a table kept in clear")
        try:
            sealed = Sealed.from_json(line["sealed"])
        except (KeyError, TypeError, ValueError):
            raise RestoreRefusedError(f"{name}: a malformed sealed row") from None
        if not sealed.record.startswith(f"{name}:"):
            raise RestoreRefusedError(f"{name}: a sealed row of another table")
        try:
            values = backup.open_line(keys, line)
        except (SealBrokenError, ValueError):
            raise RestoreRefusedError(f"{name}: a sealed row that does not open") from None
        if values is None:
            return None
        for subject in sealed.subjects:
            found = keys.key_for(sealed.tenant, subject, create=False)
            if found is not None:
                carried[(sealed.tenant, subject)] = found
    if not isinstance(values, list):
        raise RestoreRefusedError(f"{name}: a row that is not a list of values")
    return values


def _announce(writer: backup.Restorer, tables: dict[tuple[str, str], backup.TableInfo]) -> int:
    """Queue one `MemoryStored` per owner (its newest version) in each partition's outbox: the
    indexer and the embedder then load the owner's catalog and embed what it lacks."""
    owners = 0
    for (file, name), _ in tables.items():
        if name != "memories":
            continue
        partition = Path(file).parent.name
        db = writer.db(file)
        highest = db.execute("SELECT coalesce(max(seq), 0) FROM memories").fetchone()
        outbox.create(db, floor=highest[0] if highest else 0)  # numbers above every version's
        newest = db.execute(
            "SELECT tenant, subject_id, arg_max(memory_id, seq), max(seq) FROM memories "
            "GROUP BY tenant, subject_id").fetchall()
        for tenant, subject_id, memory_id, seq in newest:
            event = MemoryStored(partition=partition, owner=Owner(tenant=tenant,
                                                                  subject_id=subject_id),
                                 memory_id=memory_id, seq=seq)
            outbox.queue(db, subjects.memory_events(partition), event.to_json())
            owners += 1
    return owners


def _restore_audit(root: Path, entries: list[dict[str, Any]], result: Restored) -> None:
    """The backed-up chain as it was, then an entry for this restore."""
    if entries:
        root.mkdir(parents=True, exist_ok=True)
        with (root / audit.LOG).open("wb") as f:
            f.write(b"".join(audit.canonical(e) + b"\n" for e in entries))
            f.flush()
            os.fsync(f.fileno())
    audit.AuditLog(root).append(audit.AuditEntry(
        action="restore", actor="cli", layer="backups",
        count=sum(result.restored.values()), source=f"dropped:{sum(result.dropped.values())}"))


def read_export(path: Path, keys_from: Path) -> tuple[list[dict[str, Any]], int]:
    """An export's rows with their content opened, and how many were unreadable (erased)."""
    keys = KeyStore(keys_from / "keys")
    rows, gone = [], 0
    for line in _lines(path):
        row = backup.read_export_row(keys, line)
        if row is None:
            gone += 1
        else:
            rows.append(row)
    return rows, gone


def mac_key(data_dir: Path) -> bytes | None:
    """The key a backup of `data_dir` is authenticated with (made on first use)."""
    return backup.mac_key(data_dir / "keys", create=True)


def verify_audit(data_dir: Path) -> audit.Verified:
    """The audit log's hash chain of `data_dir`, checked (`storage.audit.verify`)."""
    return audit.verify(data_dir / "audit")


__all__ = [
    "BusDumper", "LocalDumper", "Restored", "RunningError", "Written", "is_running",
    "mac_key", "read_export", "restore", "verify_audit", "write_backup",
]
