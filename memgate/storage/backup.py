"""Backups and eval-dataset exports: the format, the registry of what is personal, and the
DuckDB reading and writing both ends share (SPEC §5.2 layers 5 and 6, §5.4).

A backup is JSON lines. The first line is the manifest: the format, when, and every table with
its DDL, columns and types. Then one line per row, in table order:

- `{"f": FILE, "t": TABLE, "row": [values…]}` for a table that holds no personal data
  (workspaces, collections, passage hashes, the sequence high-water mark…), in clear;
- `{"f": FILE, "t": TABLE, "sealed": {tenant, subjects, record, nonce, ct}}` for a row of a
  personal table: the whole row, as JSON, sealed (AES-256-GCM) under the data key of the
  subject(s) it is about (`storage.keys`). Only the tenant, the subject ids and the record id
  are in clear: no text, no name, no namespace.

The last line is `{"memgateMac": HEX}`: HMAC-SHA256 of every byte before it, under the backup
key kept in `DIR/keys/backup.mac` (never in the backup). A restore checks it before it writes
anything, builds every file from memgate's own schema (never DDL from the file), and refuses
a row of a personal table in clear, a table or column memgate does not back up, and a sealed
row moved to another table.

`sources` is the registry: for each DuckDB file, which tables are backed up and, for a personal
one, whose row it is, and the file's schema. A table that is not registered is **not** backed
up (listed under `skipped` in the manifest): a new table holds personal data until someone says
otherwise. Derived state (Tantivy indexes, vectors, the outbox and its `relayed` mark,
JetStream) is never backed up: a restored instance rebuilds it from the memories (restore
re-announces them).

An eval-dataset export is JSON lines of memory rows: ids, `derivedFrom`, classification and
times in clear, the text (and namespace, key) sealed under the subject's key.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from pathlib import Path
from typing import Any

import duckdb

from memgate.contracts.internal import SPACE_OWNER_PREFIX, space_owner
from memgate.storage import directory, memories, outbox, registry, sessions, spaces
from memgate.storage.keys import KeyErasedError, KeyStore, Sealed

FORMAT = 2  # 2: authenticated (the MAC line); a format-1 backup carries none and is refused
MAC_FILE = "backup.mac"  # in DIR/keys: the key that authenticates the directory's backups
MAC_BYTES = 32
PAGE_ROWS = 200  # rows per page: a page is one bus reply (200 sealed rows of the longest
# text, a 10 kB session message, stay well under the 8 MiB payload limit)
SNAPSHOT_IDLE_S = 300.0  # an owner closes a backup's snapshot left idle this long

Row = dict[str, Any]


def memory_subject(subject_id: str, namespace: str) -> str:
    """Whose key seals a memory: its member (`mb_…`), or, for a memory space's memory (owner
    `space-sp_…`), the end user behind the namespace (`space-sp_…/<namespace>`), so that
    erasing one end user shreds their memories, and their entity row, and no one else's."""
    return (f"{subject_id}/{namespace}" if subject_id.startswith(SPACE_OWNER_PREFIX)
            else subject_id)


@dataclass(frozen=True)
class Personal:
    """A personal table: the tenant of a row, the subject(s) it is about, its record id."""

    subjects: Callable[[Row], list[str]]
    record: Callable[[Row], str]
    tenant: str = "tenant"  # the column (a space id is mapped to its workspace)


@dataclass(frozen=True)
class TableSpec:
    name: str
    personal: Personal | None = None  # None: no personal data, kept in clear


@dataclass(frozen=True)
class SourceSpec:
    """One DuckDB file, the actor that owns it (it answers the dump of a running instance),
    and its tables."""

    owner: str
    file: str  # relative to the data directory
    tables: tuple[TableSpec, ...]
    schema: str  # memgate's own DDL of the file: what a restore creates

    def table(self, name: str) -> TableSpec | None:
        return next((t for t in self.tables if t.name == name), None)


def _ws(row: Row) -> str:
    return str(row["workspace_id"])


def _directory() -> SourceSpec:
    member = Personal(subjects=lambda r: [str(r["member_id"])], record=lambda r: str(
        r.get("credential_id") or r["member_id"]), tenant="workspace_id")
    return SourceSpec("directory", "directory.duckdb", (
        TableSpec("workspaces"), TableSpec("nats_agents"),
        TableSpec("members", member), TableSpec("credentials", member)), directory.SCHEMA)


def _registry() -> SourceSpec:
    return SourceSpec("registry", "registry.duckdb", tuple(TableSpec(t) for t in (
        "collections", "documents", "passages", "context_sets", "sequence")),
        registry.SCHEMA + outbox.SCHEMA)


def _spaces() -> SourceSpec:
    return SourceSpec("spaces", "spaces.duckdb", (
        TableSpec("spaces"),
        TableSpec("shares", Personal(subjects=lambda r: [str(r["member_id"])],
                                     record=lambda r: f"{r['space_id']}/{r['member_id']}",
                                     tenant="space_id")),
        TableSpec("entities", Personal(
            subjects=lambda r: [memory_subject(space_owner(str(r["space_id"])),
                                               str(r["namespace"]))],
            record=lambda r: f"{r['space_id']}/{r['namespace']}", tenant="space_id")),
        TableSpec("profile_settings"),  # a schema and instructions, masked: no end user's
        TableSpec("profiles", Personal(  # under the keys of the namespaces it was built from
            subjects=lambda r: [memory_subject(space_owner(str(r["space_id"])), str(ns))
                                for ns in r["namespaces"]] or [space_owner(str(r["space_id"]))],
            record=lambda r: f"{r['space_id']}/profile", tenant="space_id"))),
        spaces.SCHEMA)


def _sessions() -> SourceSpec:
    """Conversation logs (layer 3): each session and event sealed under all its participants'
    keys (erasing any one of them shreds it; the keys actor erases `canonical_id(externalId)`).
    The sessions actor answers the dump of a running instance when it registers `dump_route`
    (see actors/keys.py)."""
    participants = Personal(subjects=lambda r: [str(s) for s in r["subject_ids"]],
                            record=lambda r: f"{r['session_id']}/{r.get('sequence_id', '')}")
    return SourceSpec("sessions", "sessions.duckdb", (
        TableSpec("sessions", participants), TableSpec("events", participants),
        TableSpec("lifecycle_runs")), sessions.SCHEMA)


def _partition(partition: str) -> SourceSpec:
    rows = Personal(
        subjects=lambda r: [memory_subject(str(r["subject_id"]), str(r["namespace"]))],
        record=lambda r: str(r["memory_id"]))
    return SourceSpec(f"storage.{partition}", f"partitions/{partition}/memories.duckdb", (
        TableSpec("memories", rows), TableSpec("remember_log"), TableSpec("sequence")),
        memories.SCHEMA + outbox.SCHEMA)


EXTRA: list[SourceSpec] = []  # more sources, registered by the modules that own them


def register(source: SourceSpec) -> None:
    """Add a source (a new DuckDB file holding data worth a backup) to the registry."""
    EXTRA.append(source)


def sources(partitions: Sequence[str]) -> list[SourceSpec]:
    return [_directory(), _registry(), _spaces(), _sessions(),
            *(_partition(p) for p in partitions), *EXTRA]


def source(owner: str) -> SourceSpec:
    """The source an actor owns (`directory`, `storage.p0`, …)."""
    if owner.startswith("storage."):
        return _partition(owner.split(".", 1)[1])
    for spec in (_directory(), _registry(), _spaces(), _sessions(), *EXTRA):
        if spec.owner == owner:
            return spec
    raise KeyError(owner)


def source_of_file(file: str) -> SourceSpec | None:
    """The registered source of a backup's file name (None: memgate backs up no such file)."""
    found = re.fullmatch(r"partitions/(p[0-9]{1,4})/memories\.duckdb", file)
    if found:
        return _partition(found.group(1))
    return next((s for s in (_directory(), _registry(), _spaces(), _sessions(), *EXTRA)
                 if s.file == file), None)


def partitions_in(data_dir: Path) -> list[str]:
    root = data_dir / "partitions"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# --- reading a DuckDB file (the owner's connection, or read-only on a stopped directory) ---


@dataclass(frozen=True)
class TableInfo:
    file: str
    name: str
    columns: list[str]
    types: list[str]
    personal: bool
    rows: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "name": self.name, "columns": self.columns,
                "types": self.types, "personal": self.personal, "rows": self.rows}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> TableInfo:
        return cls(value["file"], value["name"], list(value["columns"]),
                   list(value["types"]), bool(value["personal"]), int(value["rows"]))


def describe(db: duckdb.DuckDBPyConnection, source: SourceSpec,
             ) -> tuple[list[TableInfo], list[str]]:
    """The source's registered tables in this file, and the names of the tables it skips."""
    found = [str(name) for name, in db.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
        "ORDER BY table_name").fetchall()]
    tables: list[TableInfo] = []
    for spec in source.tables:
        if spec.name not in found:
            continue
        cols = db.execute("SELECT column_name, data_type FROM information_schema.columns "
                          "WHERE table_schema = 'main' AND table_name = ? "
                          "ORDER BY ordinal_position", [spec.name]).fetchall()
        count = db.execute(f'SELECT count(*) FROM "{spec.name}"').fetchone()
        tables.append(TableInfo(source.file, spec.name, [str(c[0]) for c in cols],
                                [str(c[1]) for c in cols], spec.personal is not None,
                                int(count[0]) if count else 0))
    registered = {t.name for t in source.tables}
    return tables, [f"{source.file}:{name}" for name in found if name not in registered]


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$b64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def page(db: duckdb.DuckDBPyConnection, table: TableInfo, offset: int,
         limit: int = PAGE_ROWS) -> list[list[Any]]:
    """Rows `offset`… of a table, JSON-ready, in a stable order within one snapshot."""
    columns = ", ".join(f'"{c}"' for c in table.columns)
    return [[_jsonable(v) for v in row] for row in db.execute(
        f'SELECT {columns} FROM "{table.name}" ORDER BY rowid LIMIT ? OFFSET ?',
        [limit, offset]).fetchall()]


class Snapshots:
    """Consistent reads for backups of a running instance, by the file's owner: at `begin`, the
    registered tables are read whole in one read transaction (on a cursor closed before
    returning, so the owner's connection is never left inside a transaction and a compaction
    that rewrites the file meets no open reader); pages are then cut from memory until `end`
    or until idle. Nothing is written to disk. Call from the owner's serial thread only."""

    def __init__(self, idle_s: float = SNAPSHOT_IDLE_S) -> None:
        self._open: dict[str, tuple[dict[str, list[list[Any]]], float]] = {}
        self._idle_s = idle_s

    def begin(self, db: duckdb.DuckDBPyConnection, snapshot: str, source: SourceSpec,
              ) -> tuple[list[TableInfo], list[str]]:
        self.expire()
        cursor = db.cursor()
        try:
            cursor.execute("BEGIN TRANSACTION")
            tables, skipped = describe(cursor, source)
            rows = {t.name: page(cursor, t, 0, t.rows + 1) for t in tables}
            cursor.execute("COMMIT")
        finally:
            cursor.close()
        self._open[snapshot] = (rows, time.monotonic())
        return [replace(t, rows=len(rows[t.name])) for t in tables], skipped

    def page(self, snapshot: str, table: TableInfo, offset: int, limit: int,
             ) -> list[list[Any]]:
        if snapshot not in self._open:
            raise KeyError("no such backup snapshot (ended, or idle too long)")
        rows, _ = self._open[snapshot]
        self._open[snapshot] = (rows, time.monotonic())
        return rows.get(table.name, [])[offset:offset + limit]

    def end(self, snapshot: str) -> None:
        self._open.pop(snapshot, None)

    def expire(self) -> None:
        now = time.monotonic()
        for snapshot, (_, used) in list(self._open.items()):
            if now - used > self._idle_s:
                self.end(snapshot)


# --- sealing ---


def seal_rows(keys: KeyStore, source: SourceSpec, table: TableInfo,
              rows: Sequence[list[Any]], tenants: dict[str, str]) -> list[dict[str, Any]]:
    """The backup lines of these rows: clear, or sealed under their subjects' keys (made on
    first use). `tenants` maps a space to its workspace: a space's tables name only the space,
    and keys are per workspace; it is filled from the `spaces` table (read first, in clear)."""
    spec = source.table(table.name)
    assert spec is not None
    if table.name == "spaces" and "workspace_id" in table.columns:
        for values in rows:
            row = dict(zip(table.columns, values, strict=True))
            tenants[str(row["space_id"])] = str(row["workspace_id"])
    if spec.personal is None:
        return [{"f": table.file, "t": table.name, "row": row} for row in rows]
    lines = []
    for values in rows:
        row = dict(zip(table.columns, values, strict=True))
        tenant = str(row[spec.personal.tenant])
        sealed = keys.encrypt(tenants.get(tenant, tenant), spec.personal.subjects(row),
                              f"{table.file}:{table.name}:{spec.personal.record(row)}",
                              json.dumps(values, separators=(",", ":")).encode())
        lines.append({"f": table.file, "t": table.name, "sealed": sealed.to_json()})
    return lines


def open_line(keys: KeyStore, line: dict[str, Any]) -> list[Any] | None:
    """A backup line's row values; None if its subject's key is gone (erased)."""
    if "row" in line:
        return list(line["row"])
    try:
        return list(json.loads(keys.decrypt(Sealed.from_json(line["sealed"]))))
    except KeyErasedError:
        return None


EXPORT_CLEAR = ("memory_id", "tenant", "subject_id", "classification", "derived_from",
                "created_at", "expires_at", "legal_hold")
EXPORT_SEALED = ("text", "namespace", "key")


def export_rows(keys: KeyStore, table: TableInfo, rows: Iterable[list[Any]],
                workspace: str | None = None) -> list[dict[str, Any]]:
    """Eval-dataset rows of memory rows: references in clear, content sealed; each row
    `derivedFrom` its memory (and what that memory derives from)."""
    lines = []
    for values in rows:
        row = dict(zip(table.columns, values, strict=True))
        if workspace is not None and row["tenant"] != workspace:
            continue
        if row.get("legal_hold"):  # use restricted (SPEC §5.1): not for datasets
            continue
        subject = memory_subject(str(row["subject_id"]), str(row["namespace"]))
        content = {name: row.get(name) for name in EXPORT_SEALED}
        sealed = keys.encrypt(str(row["tenant"]), subject, f"export:{row['memory_id']}",
                              json.dumps(content, separators=(",", ":")).encode())
        lines.append({
            "recordId": f"ex_{row['memory_id']}", "memoryId": row["memory_id"],
            "tenant": row["tenant"], "subjectId": subject,
            "classification": row["classification"],
            "derivedFrom": [row["memory_id"], *(row.get("derived_from") or [])],
            "createdAt": row["created_at"], "expiresAt": row.get("expires_at"),
            "sealed": sealed.to_json()})
    return lines


def read_export_row(keys: KeyStore, line: dict[str, Any]) -> dict[str, Any] | None:
    """An export row with its content opened; None if the subject's key is gone."""
    try:
        content = json.loads(keys.decrypt(Sealed.from_json(line["sealed"])))
    except KeyErasedError:
        return None
    return {**{k: v for k, v in line.items() if k != "sealed"}, **content}


# --- authenticating a backup ---


def mac_key(keys_dir: Path, *, create: bool) -> bytes | None:
    """The directory's backup key (made on first use, 0600); None if it has none."""
    path = keys_dir / MAC_FILE
    if create and not path.exists():
        keys_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # made meanwhile
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(MAC_BYTES))
                f.flush()
                os.fsync(f.fileno())
    if not path.exists():
        return None
    key = path.read_bytes()
    if len(key) != MAC_BYTES:
        raise ValueError(f"{path} is not a backup key")
    return key


def new_mac(key: bytes) -> hmac.HMAC:
    return hmac.new(key, digestmod="sha256")


def mac_line(mac: hmac.HMAC) -> str:
    return json.dumps({"memgateMac": mac.hexdigest()}) + "\n"


def is_authentic(mac: hmac.HMAC, last_line: bytes) -> bool:
    """Whether `last_line` is the MAC line of what `mac` has read."""
    try:
        trailer = json.loads(last_line)
    except ValueError:
        return False
    return (isinstance(trailer, dict) and list(trailer) == ["memgateMac"]
            and isinstance(trailer["memgateMac"], str)
            and hmac.compare_digest(trailer["memgateMac"], mac.hexdigest()))


# --- writing a restored file ---


class RestoreRefusedError(ValueError):
    """The backup is not one this directory made, or holds what memgate never writes."""


@dataclass
class Restorer:
    """Rebuilds the DuckDB files of a new data directory: each file from memgate's own schema,
    each table's rows checked against it (the backup's manifest only names tables)."""

    data_dir: Path
    _open: dict[str, duckdb.DuckDBPyConnection] = field(default_factory=dict)

    def db(self, file: str) -> duckdb.DuckDBPyConnection:
        if file not in self._open:
            source = source_of_file(file)
            if source is None:
                raise RestoreRefusedError(f"{file!r} is not a file memgate backs up")
            path = self.data_dir / source.file
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._open[file] = db = duckdb.connect(str(path))
            db.execute(source.schema)
        return self._open[file]

    def table(self, listed: TableInfo) -> TableInfo:
        """The manifest's table as memgate's schema has it: a registered table, columns that
        exist, their types from the schema (never from the backup)."""
        source = source_of_file(listed.file)
        spec = None if source is None else source.table(listed.name)
        if spec is None:
            raise RestoreRefusedError(
                f"{listed.file}:{listed.name!r} is not a table memgate backs up")
        types = dict(self.db(listed.file).execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main' AND table_name = ?", [spec.name]).fetchall())
        if not listed.columns or len(set(listed.columns)) != len(listed.columns) or any(
                c not in types for c in listed.columns):
            raise RestoreRefusedError(
                f"{listed.file}:{spec.name}: columns that memgate's schema does not have")
        return TableInfo(listed.file, spec.name, list(listed.columns),
                         [str(types[c]) for c in listed.columns], spec.personal is not None,
                         listed.rows)

    def insert(self, table: TableInfo, rows: list[list[Any]]) -> None:
        if not rows:
            return
        if any(len(row) != len(table.columns) for row in rows):
            raise RestoreRefusedError(f"{table.file}:{table.name}: a row of the wrong width")
        casts = ", ".join(f"CAST(? AS {t})" for t in table.types)
        columns = ", ".join(f'"{c}"' for c in table.columns)
        decoded = [[base64.b64decode(v["$b64"]) if isinstance(v, dict) and "$b64" in v else v
                    for v in row] for row in rows]
        try:
            self.db(table.file).executemany(
                f'INSERT INTO "{table.name}" ({columns}) VALUES ({casts})', decoded)
        except (duckdb.Error, ValueError, TypeError):  # the message would quote the values
            raise RestoreRefusedError(
                f"{table.file}:{table.name}: a row that does not fit memgate's schema") from None

    def close(self) -> None:
        for db in self._open.values():
            db.execute("CHECKPOINT")
            db.close()
        self._open.clear()


__all__ = [
    "EXPORT_CLEAR", "EXPORT_SEALED", "EXTRA", "FORMAT", "MAC_FILE", "PAGE_ROWS", "Personal",
    "RestoreRefusedError", "Restorer", "SourceSpec", "Snapshots", "TableInfo", "TableSpec",
    "describe", "export_rows", "is_authentic", "mac_key", "mac_line", "memory_subject",
    "new_mac", "open_line", "page", "partitions_in", "read_export_row", "register",
    "seal_rows", "source", "source_of_file", "sources",
]
