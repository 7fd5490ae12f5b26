"""Collections, documents, passages and context sets: a DuckDB file owned by the registry actor,
mirrored in memory (it is the only writer). Passages are kept as SHA-256 hashes and entities.

Not thread-safe: the registry actor calls it from its one worker thread only, reads included.
A change and the event announcing it are committed together (the outbox, relayed to JetStream).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from memgate.storage import compaction, outbox
from memgate.storage.transaction import transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    workspace_id VARCHAR NOT NULL, collection_id VARCHAR NOT NULL, name VARCHAR NOT NULL,
    deleted BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS documents (
    workspace_id VARCHAR NOT NULL, document_id VARCHAR NOT NULL, collection_id VARCHAR NOT NULL,
    version INTEGER NOT NULL, expires_at TIMESTAMP, restricted BOOLEAN NOT NULL,
    deleted BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS passages (
    workspace_id VARCHAR NOT NULL, document_id VARCHAR NOT NULL, version INTEGER NOT NULL,
    passage_id VARCHAR NOT NULL, sha256 VARCHAR NOT NULL, entities VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS context_sets (
    workspace_id VARCHAR NOT NULL, context_set_id VARCHAR NOT NULL, name VARCHAR NOT NULL,
    collection_ids VARCHAR[] NOT NULL, document_ids VARCHAR[] NOT NULL
);
"""

EntityNames = tuple[tuple[str, tuple[str, ...]], ...]  # (entity id, (name, *aliases))


@dataclass(frozen=True)
class Document:
    document_id: str
    collection_id: str
    version: int
    expires_at: datetime | None
    restricted: bool
    deleted: bool = False


@dataclass(frozen=True)
class Passage:
    document_id: str
    version: int
    sha256: str
    entities: EntityNames = ()


@dataclass(frozen=True)
class ContextSet:
    name: str
    collection_ids: frozenset[str]
    document_ids: frozenset[str]


@dataclass
class Workspace:
    collections: dict[str, bool] = field(default_factory=dict)  # id → deleted
    documents: dict[str, Document] = field(default_factory=dict)
    passages: dict[str, Passage] = field(default_factory=dict)  # of current versions only
    context_sets: dict[str, ContextSet] = field(default_factory=dict)


def _naive(instant: datetime | None) -> datetime | None:
    return None if instant is None else instant.astimezone(UTC).replace(tzinfo=None)


class RegistryStore:
    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The file's connection now (a rewrite replaces it): what a backup reads."""
        return self._db

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = compaction.connect(path)
        self._db.execute(SCHEMA)
        outbox.create(self._db)
        self._workspaces: dict[str, Workspace] = {}
        db = self._db
        for ws, cid, _, deleted in db.execute("SELECT * FROM collections").fetchall():
            self._writable(ws).collections[cid] = deleted
        for ws, did, cid, version, expires, restricted, deleted in db.execute(
                "SELECT * FROM documents").fetchall():
            self._writable(ws).documents[did] = Document(
                did, cid, version, expires and expires.replace(tzinfo=UTC), restricted, deleted)
        for ws, did, version, pid, sha, entities in db.execute(
                "SELECT * FROM passages").fetchall():
            document = self._writable(ws).documents.get(did)
            if document is not None and document.version == version:
                self._writable(ws).passages[pid] = Passage(did, version, sha, _entities(entities))
        for ws, sid, name, collections, documents in db.execute(
                "SELECT * FROM context_sets").fetchall():
            self._writable(ws).context_sets[sid] = ContextSet(name, frozenset(collections),
                                                              frozenset(documents))

    def close(self) -> None:
        self._db.execute("CHECKPOINT")
        self._db.close()

    def workspace(self, workspace_id: str) -> Workspace:
        """What the registry holds for a workspace (an empty one, not kept, if nothing). Read
        it; never change it: changes go through the methods below, which keep the file."""
        return self._workspaces.get(workspace_id) or Workspace()

    def _writable(self, workspace_id: str) -> Workspace:
        return self._workspaces.setdefault(workspace_id, Workspace())

    def _announce(self, subject: str, payload: bytes) -> None:
        """Queue an event in the caller's transaction."""
        outbox.queue(self._db, subject, payload)

    def create_collection(self, workspace_id: str, name: str) -> str:
        collection_id = f"col_{uuid.uuid4().hex[:20]}"
        self._db.execute("INSERT INTO collections VALUES (?, ?, ?, false)",
                         [workspace_id, collection_id, name])
        self._writable(workspace_id).collections[collection_id] = False
        return collection_id

    def collection_exists(self, workspace_id: str, collection_id: str) -> bool:
        return self.workspace(workspace_id).collections.get(collection_id) is False

    def delete_collection(self, workspace_id: str, collection_id: str, *, event_subject: str,
                          event: Callable[[list[str]], bytes]) -> bool:
        """Mark it deleted; its event names the documents that were live in it."""
        if not self.collection_exists(workspace_id, collection_id):
            return False
        documents = sorted(d.document_id for d in self.workspace(workspace_id).documents.values()
                           if d.collection_id == collection_id and not d.deleted)
        db = self._db
        with transaction(db):
            db.execute("UPDATE collections SET deleted = true WHERE workspace_id = ? "
                       "AND collection_id = ?", [workspace_id, collection_id])
            self._announce(event_subject, event(documents))
        self._writable(workspace_id).collections[collection_id] = True
        return True

    def put_document(self, workspace_id: str, document_id: str, *, collection_id: str,
                     expires_at: datetime | None, restricted: bool,
                     passages: list[tuple[str, str, EntityNames]], event_subject: str,
                     event: bytes) -> int:
        """Store a new version (1 for a new document) with its passages' hashes and entities."""
        ws = self._writable(workspace_id)
        previous = ws.documents.get(document_id)
        version = 1 if previous is None else previous.version + 1
        db = self._db
        with transaction(db):
            db.execute("DELETE FROM documents WHERE workspace_id = ? AND document_id = ?",
                       [workspace_id, document_id])
            db.execute("INSERT INTO documents VALUES (?, ?, ?, ?, ?, ?, false)",
                       [workspace_id, document_id, collection_id, version, _naive(expires_at),
                        restricted])
            if passages:  # executemany refuses an empty list
                db.executemany("INSERT INTO passages VALUES (?, ?, ?, ?, ?, ?)", [
                    [workspace_id, document_id, version, pid, sha, json.dumps(entities)]
                    for pid, sha, entities in passages])
            self._announce(event_subject, event)
        ws.documents[document_id] = Document(document_id, collection_id, version, expires_at,
                                             restricted)
        for pid in [p for p, passage in ws.passages.items() if passage.document_id == document_id]:
            del ws.passages[pid]
        for pid, sha, entities in passages:
            ws.passages[pid] = Passage(document_id, version, sha, entities)
        return version

    def delete_document(self, workspace_id: str, document_id: str, *, event_subject: str,
                        event: bytes) -> bool:
        ws = self._writable(workspace_id)
        document = ws.documents.get(document_id)
        if document is None or document.deleted:
            return False
        db = self._db
        with transaction(db):
            db.execute("UPDATE documents SET deleted = true WHERE workspace_id = ? "
                       "AND document_id = ?", [workspace_id, document_id])
            self._announce(event_subject, event)
        ws.documents[document_id] = replace(document, deleted=True)
        return True

    def save_context_set(self, workspace_id: str, context_set_id: str | None, name: str,
                         collection_ids: list[str], document_ids: list[str]) -> str:
        context_set_id = context_set_id or f"cs_{uuid.uuid4().hex[:20]}"
        self._db.execute("DELETE FROM context_sets WHERE workspace_id = ? AND context_set_id = ?",
                         [workspace_id, context_set_id])
        self._db.execute("INSERT INTO context_sets VALUES (?, ?, ?, ?, ?)",
                         [workspace_id, context_set_id, name, collection_ids, document_ids])
        self._writable(workspace_id).context_sets[context_set_id] = ContextSet(
            name, frozenset(collection_ids), frozenset(document_ids))
        return context_set_id

    def pending_events(self, limit: int = 500) -> outbox.Pending:
        return outbox.pending(self._db, limit)

    def events_sent(self, up_to_seq: int) -> None:
        outbox.sent(self._db, up_to_seq)


def _entities(raw: str) -> EntityNames:
    return tuple((entity_id, tuple(names)) for entity_id, names in json.loads(raw))
