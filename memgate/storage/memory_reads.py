"""The memory store's reads (`memories.MemoryStore` is one): versions, recall scopes, rows,
catalogs and texts, from the in-memory mirror when it holds the answer, else from the file."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from typing import Any

import duckdb

from memgate.storage.memory_rows import CatalogRow, Filters, Row, aware, allows, naive, row_of
from memgate.storage.named import named
from memgate.storage.recent import Recent, Version

_COLUMNS = ("memory_id, seq, namespace, key, collection_id, text, created_at, superseded_at, "
            "citations, extras")


def _catalog_row(v: Version, texts: bool) -> CatalogRow:
    return CatalogRow(v.memory_id, v.seq, v.namespace, v.key, v.collection_id,
                      v.created_at.replace(tzinfo=UTC), aware(v.superseded_at), False,
                      v.text if texts else None)


class MemoryReads:
    """Reads of the memories table; the store sets the connection and the mirror."""

    _db: duckdb.DuckDBPyConnection
    _mirror: Recent

    def _one(self, sql: str, params: list[Any] | None = None) -> tuple[Any, ...]:
        """The single row an aggregate query returns."""
        row = self._db.execute(sql, params or []).fetchone()
        assert row is not None, "an aggregate returns one row"
        return row

    def _where(self, filters: Filters, as_of: datetime) -> tuple[str, list[Any]]:
        clauses = ["tenant = ?", "subject_id = ?", "legal_hold = false", "created_at <= ?",
                   "(superseded_at IS NULL OR superseded_at > ?)"]
        instant = naive(as_of)
        params: list[Any] = [filters.tenant, filters.subject_id, instant, instant]
        for column in ("namespace", "key", "collection_id"):
            value = getattr(filters, column)
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if filters.collection_ids is not None:
            clauses.append("list_contains(?, collection_id)")
            params.append(list(filters.collection_ids))
        if filters.namespaces is not None:
            clauses.append("list_contains(?::VARCHAR[], namespace)")
            params.append(list(filters.namespaces))
        if filters.memory_ids is not None:
            clauses.append("list_contains(?::VARCHAR[], memory_id)")
            params.append(sorted(filters.memory_ids))
        if filters.keys is not None:
            clauses.append("list_contains(?::VARCHAR[], key)")
            params.append(list(filters.keys))
        return " AND ".join(clauses), params

    def versions(self, filters: Filters, *, as_of: datetime, limit: int,
             before_seq: int | None = None) -> list[Row]:
        """Versions current at `as_of`, newest first."""
        where, params = self._where(filters, as_of)
        if before_seq is not None:
            where += " AND seq < ?"
            params.append(before_seq)
        return named(Row, self._db.execute(
            f"SELECT {_COLUMNS} FROM memories WHERE {where} ORDER BY seq DESC LIMIT ?",
            [*params, limit]), created_at=aware, superseded_at=aware)

    def high_seq(self, tenant: str, subject_id: str) -> int:
        """The seq of the owner's newest version (0: none). Channels that have applied it have
        every version the owner has."""
        if (high := self._mirror.high((tenant, subject_id))) is None:
            high = int(self._one("SELECT coalesce(max(seq), 0) FROM memories "
                                 "WHERE tenant = ? AND subject_id = ?", [tenant, subject_id])[0])
            self._mirror.learn((tenant, subject_id), high=high)
        return high

    def _citing(self, tenant: str, subject_id: str) -> int:
        """How many of the owner's versions cite something."""
        if (citing := self._mirror.citing((tenant, subject_id))) is None:
            citing = int(self._one("SELECT count(*) FROM memories WHERE tenant = ? AND "
                                   "subject_id = ? AND citations <> '[]'", [tenant, subject_id])[0])
            self._mirror.learn((tenant, subject_id), citing=citing)
        return citing

    def known_scope(self, tenant: str, subject_id: str) -> int | None:
        """`recall_scope`'s answer when the owner's versions cite nothing (its newest seq),
        from memory; None when that needs the file."""
        return self._mirror.uncited_high((tenant, subject_id))

    def recall_scope(self, filters: Filters, *, as_of: datetime,
                     window: int | None) -> tuple[int, int | None, list[tuple[str, str]]]:
        """For recall: the owner's highest seq; the versions among those the filters allow
        (the newest `window` of them at most) that cite anything, (memory id, citations JSON);
        and, only when some do (some may be hidden), how many versions the filters allow."""
        if not self._citing(filters.tenant, filters.subject_id):  # most owners cite nothing
            return self.high_seq(filters.tenant, filters.subject_id), None, []
        where, params = self._where(filters, as_of)
        allowed = f"SELECT memory_id, citations, seq FROM memories WHERE {where}"
        limited = params
        if window is not None:
            allowed += " ORDER BY seq DESC LIMIT ?"
            limited = [*params, window]
        cited = self._db.execute(f"SELECT memory_id, citations FROM ({allowed}) "
                                 "WHERE citations <> '[]' ORDER BY seq DESC", limited).fetchall()
        if not cited:
            return self.high_seq(filters.tenant, filters.subject_id), None, []
        high, total = self._one(
            f"SELECT coalesce(max(seq), 0), count(*) FILTER (WHERE {where}) FROM memories "
            "WHERE tenant = ? AND subject_id = ?", [*params, filters.tenant, filters.subject_id])
        total = int(total) if window is None else min(int(total), window)
        return int(high), total, [(r[0], r[1]) for r in cited]

    def rows(self, filters: Filters, *, as_of: datetime, memory_ids: list[str]) -> list[Row]:
        """Those of `memory_ids` that exist and that the filters allow at `as_of`."""
        found, unknown = self._known_rows(filters, naive(as_of), memory_ids)
        if unknown:
            where, params = self._where(filters, as_of)
            read = named(partial(Version, tenant=filters.tenant, subject_id=filters.subject_id),
                         self._db.execute(f"SELECT {_COLUMNS} FROM memories WHERE {where} "
                                          "AND memory_id = ANY(?)", [*params, unknown]))
            self._mirror.read(read)  # as read: the filters hid no held version among them
            found += [row_of(v) for v in read]
        return found

    def known_rows(self, filters: Filters, *, as_of: datetime,
                   memory_ids: list[str]) -> list[Row] | None:
        """`rows`, from memory; None when some of the ids are not held there."""
        found, unknown = self._known_rows(filters, naive(as_of), memory_ids)
        return None if unknown else found

    def _known_rows(self, filters: Filters, instant: datetime,
                    memory_ids: list[str]) -> tuple[list[Row], list[str]]:
        found, unknown = self._mirror.rows((filters.tenant, filters.subject_id), memory_ids,
                                           lambda version: allows(filters, instant, version))
        return [row_of(v) for v in found], unknown

    def catalog(self, tenant: str, subject_id: str, after_seq: int, *,
                texts: bool = False) -> list[CatalogRow]:
        """The owner's versions above `after_seq`, oldest first; the text only when asked
        (else None: a first load of thousands of rows needs none)."""
        if (held := self._mirror.above((tenant, subject_id), after_seq)) is not None:
            return [_catalog_row(v, texts) for v in held]
        return named(CatalogRow, self._db.execute(
            "SELECT memory_id, seq, namespace, key, collection_id, created_at, superseded_at, "
            f"legal_hold, {'text' if texts else 'NULL AS text'} FROM memories WHERE tenant = ? "
            "AND subject_id = ? AND seq > ? ORDER BY seq", [tenant, subject_id, after_seq]),
            created_at=aware, superseded_at=aware)

    def known_catalog(self, tenant: str, subject_id: str, after_seq: int, *,
                      texts: bool = False) -> tuple[int, list[CatalogRow]] | None:
        """(`high_seq`, `catalog`) from memory, as of one instant; None when either needs the
        file."""
        if (known := self._mirror.catalog((tenant, subject_id), after_seq)) is None:
            return None
        high, held = known
        return high, [_catalog_row(v, texts) for v in held]

    def held_by(self, tenant: str, subject_id: str,
                namespaces: list[str] | None = None) -> list[str]:
        """The ids of every version a subject's erasure would delete (legal holds excluded)."""
        sql = ("SELECT memory_id FROM memories WHERE tenant = ? AND subject_id = ? "
               "AND legal_hold = false")
        params: list[Any] = [tenant, subject_id]
        if namespaces is not None:
            sql += " AND list_contains(?, namespace)"
            params.append(namespaces)
        return [row[0] for row in self._db.execute(sql, params).fetchall()]

    def derived_from_any(self, tenant: str, records: list[str]) -> dict[str, list[str]]:
        """Owner → the ids of the versions derived from any of the sessions of `records`
        (`<sessionId>` or `<sessionId>/<sequenceId>`; legal holds excluded): what a
        participant's erasure takes with their conversations."""
        sessions = sorted({record.split("/", 1)[0] for record in records})
        if not sessions:
            return {}
        found: dict[str, list[str]] = {}
        for owner, memory_id in self._db.execute(
                "SELECT subject_id, memory_id FROM memories WHERE tenant = ? AND "
                "legal_hold = false AND list_has_any(list_transform(derived_from, lambda x: "
                "split_part(x, '/', 1)), ?) ORDER BY seq", [tenant, sessions]).fetchall():
            found.setdefault(owner, []).append(memory_id)
        return found

    def texts(self, tenant: str, subject_id: str,
              memory_ids: list[str] | None) -> list[tuple[str, str]]:
        """(id, masked text) of the owner's versions (those of `memory_ids` that exist), in
        seq order."""
        if memory_ids is not None and (
                known := self.known_texts(tenant, subject_id, memory_ids)) is not None:
            return known
        sql = "SELECT memory_id, text FROM memories WHERE tenant = ? AND subject_id = ?"
        params: list[Any] = [tenant, subject_id]
        if memory_ids is not None:
            sql += " AND list_contains(?, memory_id)"
            params.append(memory_ids)
        return [(r[0], r[1]) for r in self._db.execute(sql + " ORDER BY seq", params).fetchall()]

    def known_texts(self, tenant: str, subject_id: str,
                    memory_ids: list[str]) -> list[tuple[str, str]] | None:
        """`texts` of these ids, from memory; None when some are not held there."""
        held = self._mirror.texts((tenant, subject_id), memory_ids)
        return None if held is None else [(v.memory_id, v.text) for v in held]
