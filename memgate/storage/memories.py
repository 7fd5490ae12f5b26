"""The memory store of one partition: a DuckDB file owned by exactly one storage actor."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from memgate.contracts.internal import SPACE_OWNER_PREFIX
from memgate.storage import compaction, idempotency, outbox
from memgate.storage.idempotency import Scoped
from memgate.storage.inserts import MEMORIES, OUTBOX, REMEMBER_LOG, Inserted, insert
from memgate.storage.memory_rows import (
    Filters, LimitReachedError, Limits, Remember, Stored, StoredEvent, key_of, naive, stored_json,
)
from memgate.storage.memory_reads import MemoryReads
from memgate.storage.recent import Recent, Version
from memgate.storage.transaction import transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    memory_id      VARCHAR   NOT NULL,
    seq            BIGINT    NOT NULL,
    tenant         VARCHAR   NOT NULL,  -- workspace id (SPEC §5.1)
    subject_id     VARCHAR   NOT NULL,  -- whose: the member, or space-<spaceId> (a space's)
    credential_id  VARCHAR   NOT NULL,
    namespace      VARCHAR   NOT NULL,
    key            VARCHAR,
    collection_id  VARCHAR,
    text           VARCHAR   NOT NULL,  -- masked text only
    classification VARCHAR   NOT NULL,
    derived_from   VARCHAR[] NOT NULL,
    created_at     TIMESTAMP NOT NULL,  -- UTC
    superseded_at  TIMESTAMP,
    expires_at     TIMESTAMP NOT NULL,
    legal_hold     BOOLEAN   NOT NULL,
    citations      VARCHAR   DEFAULT '[]',  -- JSON: passage, document, version, sha256
    member_id      VARCHAR,  -- who wrote it: the member whose version limit counts it
    extras         VARCHAR   -- JSON: a mem0 memory's metadata (masked like the text), timestamp
                             -- and expiration date; NULL for others (`contracts.memory.Extras`)
);
-- The hourly rate limit counts a credential's remembers of the last hour: its versions created
-- in it, and these, the versions of it that were deleted since (forget does not erase a remember).
CREATE TABLE IF NOT EXISTS remember_log (
    credential_id VARCHAR   NOT NULL,
    remembered_at TIMESTAMP NOT NULL
);
-- One row: every version up to this seq has had its event published. A version's event is
-- built from its row, so a remember writes one row and no outbox row (`remember_group`).
CREATE TABLE IF NOT EXISTS relayed (
    up_to BIGINT NOT NULL
);
"""


_DEFAULT_LIMITS = Limits()
# credential (None: counted by no rate), (tenant, member), instant
_Counted = tuple[str | None, tuple[str, str], datetime]


@dataclass(frozen=True)
class _Written:
    """What a group's transaction wrote, for the in-memory mirrors once it has committed."""

    versions: list[Version]
    superseded: list[tuple[str, datetime]]  # (id, instant) of the earlier versions superseded


# The unsent events: the outbox's (deletions), and the versions' above the relayed mark.
_UNSENT = (
    "SELECT seq, subject, payload, NULL, NULL, NULL FROM outbox WHERE seq > ? "
    "UNION ALL SELECT seq, NULL, NULL, tenant, subject_id, memory_id FROM memories "
    "WHERE seq > greatest(?, (SELECT max(up_to) FROM relayed)) ORDER BY seq LIMIT ?")


def _scoped(item: Remember) -> Scoped | None:
    """Where an item's idempotency key applies: its workspace and writing member."""
    if item.idempotency is None:
        return None
    return Scoped(item.filters.tenant, item.writer, item.idempotency)


class MemoryStore(MemoryReads, compaction.Rewritable):
    """Synchronous DuckDB access; the storage actor serialises calls onto one thread (the
    writer's). The `known_*` methods answer from the in-memory mirror alone, from any thread,
    or return None when the answer needs the file."""

    def __init__(self, path: Path, *, event_subject: str = "memories",
                 stored_event: StoredEvent = stored_json) -> None:
        """`event_subject` and `stored_event`: where and what a stored version's event is."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self._event_subject, self._stored_event = event_subject, stored_event
        self._path = path
        self._db = compaction.connect(path)
        self._db.execute(SCHEMA)
        self._db.execute("ALTER TABLE memories ADD COLUMN IF NOT EXISTS citations VARCHAR "
                         "DEFAULT '[]'")  # data directories from before citations
        # Versions from before the writer was kept: an agent memory's is its member; a space's
        # is named by its credential, `space-<spaceId>:<memberId>` (an extracted one's,
        # `…:lifecycle`, is no member's). Restored old backups come back without it too.
        self._db.execute("ALTER TABLE memories ADD COLUMN IF NOT EXISTS member_id VARCHAR")
        self._db.execute("ALTER TABLE memories ADD COLUMN IF NOT EXISTS extras VARCHAR")
        self._db.execute(
            "UPDATE memories SET member_id = CASE WHEN starts_with(subject_id, ?) "
            "THEN split_part(credential_id, ':', 2) ELSE subject_id END WHERE member_id IS NULL",
            [SPACE_OWNER_PREFIX])
        highest, last = self._one("SELECT coalesce(max(seq), 0), max(created_at) FROM memories")
        # seq never repeats (events' ids come from it). A remember does not persist the mark:
        # its version carries its seq; a deletion, which may take the highest, persists it.
        self._high = outbox.create(self._db, floor=highest)
        if self._one("SELECT count(*) FROM relayed")[0] == 0:  # new, or its events in the outbox
            self._db.execute("INSERT INTO relayed VALUES (?)", [highest])
        hour_ago = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=1)
        self._db.execute(  # files from before: the log also held the remembers that still exist
            "DELETE FROM remember_log WHERE remembered_at <= ? OR EXISTS (SELECT 1 FROM memories m "
            "WHERE m.credential_id = remember_log.credential_id "
            "AND m.created_at = remember_log.remembered_at)", [hour_ago])
        self._unsent = outbox.Unsent(self._read_unsent, self._forget_sent)
        self._mirror = Recent(floor=int(highest))  # no version above the newest yet
        compaction.create(self._db)
        self._records = idempotency.Records(self._db)
        # Rows deleted since the file was last rewritten (read by the owner's event loop).
        self.deletions_pending = compaction.pending(self._db)
        if self.deletions_pending:  # deleted before a crash, not rewritten since
            self.compact()
        self._last_created: datetime = last or datetime.min
        self._log_swept = datetime.min  # when rows older than an hour were last deleted
        # What the limits count, as committed, loaded per credential and owner on first use and
        # kept up to date by every write below (this store is the file's only writer): no scan
        # of the tables per remember. A new way of writing `memories` must keep them too.
        self._window: dict[str, deque[datetime]] = {}  # credential → remembers of the last hour
        self._counted: dict[tuple[str, str], int] = {}  # (tenant, member) → versions written

    def close(self) -> None:
        try:  # the sent events forgotten: a write, refused for a store handed over (fenced)
            self._unsent.flush(self._db)
            self._db.execute("CHECKPOINT")
        finally:  # the file closed all the same (`runtime.actor.Serial.unreplicated`)
            self._db.close()


    def _instant(self) -> datetime:
        """A creation instant later than every earlier one."""
        now = max(datetime.now(UTC).replace(tzinfo=None),
                  self._last_created + timedelta(microseconds=1))
        self._last_created = now
        return now

    def remember(self, filters: Filters, *, memory_id: str, credential_id: str, text: str,
                 retention_days: int, limits: Limits = _DEFAULT_LIMITS,
                 citations: Sequence[dict[str, Any]] = (), member_id: str | None = None) -> Stored:
        """One remember alone (`remember_group` of one); a refusal raises `LimitReachedError`."""
        [outcome] = self.remember_group([Remember(
            filters, memory_id=memory_id, credential_id=credential_id, text=text,
            retention_days=retention_days, citations=tuple(citations),
            member_id=member_id)], limits)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def remember_group(self, items: Sequence[Remember], limits: Limits = _DEFAULT_LIMITS, *,
                       together: bool = False) -> list[Stored | Exception]:
        """Remember a group at once (group commit), each as if alone and in order: the limits
        count the earlier ones of the group (the version limit per writing member, across
        every owner), a later version of a key supersedes an earlier one. One outcome per
        item: what it stored, or the `LimitReachedError` that refused it.
        The group's rows are one INSERT (with the UPDATE of what it supersedes, one
        transaction), and each version's event is built from its row: no outbox row to write.
        Should the writing fail, each item is tried alone, so that one bad item fails no other.
        `together`: all or none; if a limit refuses one, its refusals are the only outcomes."""
        last_created = self._last_created
        try:
            outcomes, counted, written = self._remember_all(items, limits, together)
        except Exception as exc:
            self._last_created = last_created
            if len(items) == 1 or together:
                return [exc]
            return [outcome for item in items
                    for outcome in self.remember_group([item], limits)]
        for credential, writer, created in counted:
            if credential is not None:
                self._window[credential].append(created)
            self._counted[writer] += 1
        if written is not None:
            self._high = max(self._high, written.versions[-1].seq)
            self._mirror.committed(written.versions, written.superseded)
            self._unsent.committed([  # after the mirror: an event's reader finds the version
                (v.seq, self._event_subject,
                 self._stored_event(v.seq, v.tenant, v.subject_id, v.memory_id))
                for v in written.versions])
        return outcomes

    def _recent(self, credentials: list[str],
                hour_ago: datetime) -> dict[str, tuple[int, datetime | None]]:
        """Per credential: its remembers in the last hour, and the oldest of them."""
        if hour_ago - self._log_swept > timedelta(minutes=1):  # rows that can never count again
            self._db.execute("DELETE FROM remember_log WHERE remembered_at <= ?", [hour_ago])
            self._log_swept = hour_ago
            for window in self._window.values():
                while window and window[0] <= hour_ago:
                    window.popleft()
            self._window = {c: window for c, window in self._window.items() if window}
        if missing := [c for c in credentials if c not in self._window]:
            self._window.update((c, deque()) for c in missing)
            for credential, instant in self._db.execute(
                    "SELECT credential_id, created_at FROM memories WHERE created_at > ? "
                    "AND list_contains(?, credential_id) UNION ALL SELECT credential_id, "
                    "remembered_at FROM remember_log WHERE remembered_at > ? "
                    "AND list_contains(?, credential_id) ORDER BY 2",
                    [hour_ago, missing, hour_ago, missing]).fetchall():
                self._window[credential].append(instant)
        recent: dict[str, tuple[int, datetime | None]] = {}
        for credential in credentials:
            window = self._window[credential]
            while window and window[0] <= hour_ago:
                window.popleft()
            recent[credential] = (len(window), window[0] if window else None)
        return recent

    def _versions(self, writers: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """How many versions each member (tenant, member) wrote, in every owner's memories:
        their agent memories and every space's (the version limit is the member's)."""
        if missing := writers - self._counted.keys():
            self._counted.update((writer, 0) for writer in missing)
            for tenant, member, count in self._db.execute(
                    "SELECT tenant, member_id, count(*) FROM memories WHERE list_contains(?, "
                    "tenant) AND list_contains(?, member_id) GROUP BY tenant, member_id",
                    [sorted({t for t, _ in missing}), sorted({m for _, m in missing})]).fetchall():
                if (tenant, member) in missing:
                    self._counted[(tenant, member)] = count
        return {writer: self._counted[writer] for writer in writers}

    def _remember_all(self, items: Sequence[Remember], limits: Limits, together: bool = False,
                      ) -> tuple[list[Stored | Exception], list[_Counted], _Written | None]:
        """The outcomes, what the limits are to count once committed (credential, owner,
        instant) and what was written. Counted in the partition's single writer, so the limits
        hold however many governance processes there are. An item whose idempotency key has an
        answer (kept, or given to an earlier item of the group) gets it, and writes nothing."""
        db = self._db
        now = datetime.now(UTC).replace(tzinfo=None)
        hour_ago = now - timedelta(hours=1)
        recent = self._recent(sorted({i.counted_as for i in items if i.rate}), hour_ago)
        versions = self._versions({(i.filters.tenant, i.writer) for i in items})
        answers = self._records.answered(db, {s for i in items if (s := _scoped(i))}, now)
        outcomes: list[Stored | Exception | None] = []  # None: accepted, stored below
        accepted: list[tuple[int, Remember, datetime]] = []  # (outcome index, item, created)
        claimed: dict[Scoped, int] = {}  # key → the position of the accepted item it names
        again: list[tuple[int, int]] = []  # (outcome index, position) of a key given twice
        for item in items:
            count, oldest = recent.get(item.counted_as, (0, None))
            writer = (item.filters.tenant, item.writer)
            limit = item.limit(limits)
            scoped = _scoped(item)
            if scoped is not None and (answer := answers.get(scoped)) is not None:
                outcomes.append(Stored(answer.memory_id, answer.seq,
                                       answer.created_at.replace(tzinfo=UTC), answer.superseded,
                                       masked=answer.masked, replayed=True))
            elif scoped is not None and scoped in claimed:
                again.append((len(outcomes), claimed[scoped]))
                outcomes.append(None)
            elif limit is not None and count >= limit:
                assert oldest is not None
                wait = int((oldest - hour_ago).total_seconds()) + 1
                outcomes.append(LimitReachedError("rate" if item.rate == "remembers"
                                                  else "imports", min(3600, max(1, wait))))
            elif versions.get(writer, 0) >= limits.versions_per_member:
                outcomes.append(LimitReachedError("versions"))
            else:
                created = item.created_at or self._instant()
                if item.rate is not None:
                    recent[item.counted_as] = (count + 1, oldest or created)
                versions[writer] = versions.get(writer, 0) + 1
                if scoped is not None:
                    claimed[scoped] = len(accepted)
                accepted.append((len(outcomes), item, created))
                outcomes.append(None)
        if not accepted or (together and len(accepted) < len(items) - len(again)):
            return [o for o in outcomes if o is not None], [], None
        first = self._high + 1  # the mark moves once committed (`remember_group`)
        superseded_at: list[datetime | None] = [None] * len(accepted)
        superseding = [0] * len(accepted)
        newest: dict[tuple[str, str, str, str], int] = {}  # key → its latest accepted item
        for position, (_, item, created) in enumerate(accepted):
            if (key := key_of(item.filters)) is not None:
                if (earlier := newest.get(key)) is not None:
                    superseded_at[earlier] = created
                    superseding[position] = 1
                newest[key] = position
        rows = [
            Inserted(item.memory_id, first + position, item.filters.tenant,
                      item.filters.subject_id, item.counted_as, item.filters.namespace,
                      item.filters.key, item.filters.collection_id, item.text,
                      [*(c["passageId"] for c in item.citations), *item.derived_from],
                      created, superseded_at[position], item.expires(created),
                      json.dumps(list(item.citations)), item.writer, item.extras)
            for position, (_, item, created) in enumerate(accepted)]
        if newest or claimed:  # the UPDATE, the INSERT and the records commit together
            with transaction(db):
                superseded = self._supersede(accepted, newest, superseding)
                insert(db, MEMORIES, rows)
                if claimed:
                    insert(db, idempotency.INSERT, [
                        (*scoped, rows[position].memory_id, rows[position].seq,
                         rows[position].created_at, superseding[position],
                         accepted[position][1].masked, now)
                        for scoped, position in claimed.items()])
        else:
            superseded = []
            insert(db, MEMORIES, rows)  # one statement: its own transaction
        for position, (index, item, created) in enumerate(accepted):
            outcomes[index] = Stored(memory_id=item.memory_id, seq=first + position,
                                     created_at=created.replace(tzinfo=UTC),
                                     superseded=superseding[position])
        for index, position in again:
            stored = outcomes[accepted[position][0]]
            assert isinstance(stored, Stored)
            outcomes[index] = replace(stored, masked=accepted[position][1].masked,
                                      replayed=True)
        written = _Written(
            versions=[row.version() for row in rows],
            superseded=superseded)
        return [o for o in outcomes if o is not None], [
            (item.counted_as if item.rate is not None else None,
             (item.filters.tenant, item.writer), created)
            for _, item, created in accepted], written

    def _supersede(self, accepted: list[tuple[int, Remember, datetime]],
                   newest: dict[tuple[str, str, str, str], int],
                   superseding: list[int]) -> list[tuple[str, datetime]]:
        """The live versions of the group's keys, superseded by the first of the group that
        has the key (adds to `superseding`, by position in `accepted`); their (id, instant)."""
        firsts: dict[tuple[str, str, str, str], int] = {}
        for position, (_, item, _) in enumerate(accepted):
            if (key := key_of(item.filters)) is not None:
                firsts.setdefault(key, position)
        if not firsts:
            return []
        keys = list(firsts)
        rows = self._db.execute(
            "UPDATE memories SET superseded_at = v.at FROM (SELECT unnest(?) AS t, "
            "unnest(?) AS s, unnest(?) AS n, unnest(?) AS k, unnest(?::TIMESTAMP[]) AS at) v "
            "WHERE memories.tenant = v.t AND memories.subject_id = v.s "
            "AND memories.namespace = v.n AND memories.key = v.k "
            "AND memories.superseded_at IS NULL "
            "RETURNING memories.tenant, memories.subject_id, memories.namespace, memories.key, "
            "memories.memory_id, memories.superseded_at",
            [[k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
             [k[3] for k in keys], [accepted[firsts[k]][2] for k in keys]]).fetchall()
        for tenant, subject_id, namespace, key, _, _ in rows:
            superseding[firsts[(tenant, subject_id, namespace, key)]] += 1
        return [(memory_id, at) for *_, memory_id, at in rows]

    def delete(self, tenant: str, subject_id: str | None = None, *, memory_id: str | None = None,
               namespace: str | None = None, key: str | None = None,
               memory_ids: list[str] | None = None,
               collection_ids: tuple[str, ...] | None = None,
               namespaces: list[str] | None = None, keys: list[str] | None = None,
               cited_documents: list[str] | None = None, not_owner_prefix: str | None = None,
               answered: Scoped | None = None,
               event_subject: str, event: Callable[[str, list[str]], bytes]) -> list[str]:
        """Hard-delete the versions that match every given condition (none: the whole tenant),
        except those on legal hold; one event per owner, in the same transaction, and the
        answer under the caller's idempotency key if it gave one (`answered`, `forgotten`)."""
        clauses = ["tenant = ?", "legal_hold = false"]
        params: list[Any] = [tenant]
        if not_owner_prefix is not None:
            clauses.append("NOT starts_with(subject_id, ?)")
            params.append(not_owner_prefix)
        for column, value in (("subject_id", subject_id), ("memory_id", memory_id),
                              ("namespace", namespace), ("key", key)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        for column, values in (("memory_id", memory_ids), ("collection_id", collection_ids),
                               ("namespace", namespaces), ("key", keys)):
            if values is not None:
                clauses.append(f"list_contains(?, {column})")
                params.append(list(values))
        if cited_documents is not None:
            clauses.append("list_has_any(json_extract_string(citations, '$[*].documentId'), ?)")
            params.append(cited_documents)
        return self._purge(" AND ".join(clauses), params, event_subject,
                           lambda _, owner, ids: event(owner, ids), answered)

    def forgotten(self, key: Scoped) -> int | None:
        """How many versions the forget first answered under this key deleted (None: none
        was answered under it)."""
        return self._records.deleted(self._db, key, datetime.now(UTC).replace(tzinfo=None))

    def reap(self, now: datetime, cutoffs: dict[str, datetime], *, event_subject: str,
             event: Callable[[str, str, list[str]], bytes]) -> list[str]:
        """Retention (SPEC §3.9, §5.1): hard-delete every version past its `expires_at`, or
        created at or before its tenant's cutoff (now − the workspace's retentionDays), except
        those on legal hold; what derives from them goes too. Deletes nothing the second time."""
        tenants = sorted(cutoffs)
        return self._purge(
            "legal_hold = false AND (expires_at <= ? OR created_at <= (SELECT c.cutoff FROM "
            "(SELECT unnest(?::VARCHAR[]) AS tenant, unnest(?::TIMESTAMP[]) AS cutoff) c "
            "WHERE c.tenant = memories.tenant))",
            [naive(now), tenants, [naive(cutoffs[t]) for t in tenants]], event_subject, event)

    def _purge(self, where: str, params: list[Any], event_subject: str,
               event: Callable[[str, str, list[str]], bytes],
               answered: Scoped | None = None) -> list[str]:
        """Delete the versions `where` selects, then, in the same transaction, every version
        derived from a deleted one (`derived_from`, in its tenant, to the end of the chain;
        legal holds kept); one event per owner; the file marked for compaction."""
        db = self._db
        hour_ago = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=1)
        returning = "RETURNING tenant, subject_id, memory_id, credential_id, created_at, member_id"
        with transaction(db):
            deleted_rows = db.execute(f"DELETE FROM memories WHERE {where} {returning}",
                                      params).fetchall()
            sources = deleted_rows
            while sources:  # per tenant: list_has_any is ~10x cheaper than a correlated join
                by_tenant: dict[str, list[str]] = {}
                for tenant, _, deleted, *_ in sources:
                    by_tenant.setdefault(tenant, []).append(deleted)
                sources = [row for tenant, ids in by_tenant.items() for row in db.execute(
                    "DELETE FROM memories WHERE legal_hold = false AND tenant = ? "
                    f"AND list_has_any(derived_from, ?) {returning}", [tenant, ids]).fetchall()]
                deleted_rows += sources
            rows = [(tenant, owner, deleted) for tenant, owner, deleted, *_ in deleted_rows]
            if counted := [(credential, created) for *_, credential, created, _ in deleted_rows
                           if created > hour_ago]:  # the rate limit still counts them
                insert(db, REMEMBER_LOG, counted)
            by_owner: dict[tuple[str, str], list[str]] = {}
            for tenant, owner, deleted in rows:
                by_owner.setdefault((tenant, owner), []).append(deleted)
            events: outbox.Pending = []
            high = self._high
            for (tenant, owner), ids in by_owner.items():
                high += 1
                payload = event(tenant, owner, ids)
                events.append((high, event_subject, payload))
            if events:  # the versions deleted may have carried the highest seq: persist it
                insert(db, OUTBOX, events)
                outbox.mark(db, high)
            if rows:
                compaction.mark(db)
                if answered is not None:
                    self._records.record_deleted(db, answered, len(rows),
                                                 datetime.now(UTC).replace(tzinfo=None))
        self._high = high
        self._mirror.deleted(rows)
        self._unsent.committed(events)
        for tenant, *_, writer in deleted_rows:
            if (tenant, writer) in self._counted:
                self._counted[(tenant, writer)] -= 1
        if rows:
            self.deletions_pending = True
        return [deleted for _, _, deleted in rows]

    def _read_unsent(self, db: duckdb.DuckDBPyConnection, after: int,
                     limit: int) -> outbox.Pending:
        return [(seq, subject, bytes(payload)) if subject is not None else
                (seq, self._event_subject, self._stored_event(seq, tenant, owner, memory_id))
                for seq, subject, payload, tenant, owner, memory_id in db.execute(
                    _UNSENT, [after, after, limit]).fetchall()]

    @staticmethod
    def _forget_sent(db: duckdb.DuckDBPyConnection, up_to: int) -> None:
        with transaction(db):
            outbox.sent(db, up_to)
            db.execute("UPDATE relayed SET up_to = greatest(up_to, ?)", [up_to])

    def pending_events(self, limit: int = 500) -> outbox.Pending:
        return self._unsent.pending(self._db, limit)

    def known_pending_events(self, limit: int = 500) -> outbox.Pending | None:
        """`pending_events` from memory (any thread); None when they need the file."""
        return self._unsent.known(limit)

    def events_sent(self, up_to_seq: int) -> None:
        if self._unsent.sent(up_to_seq):
            self._unsent.flush(self._db)

    def known_events_sent(self, up_to_seq: int) -> bool:
        """`events_sent` in memory (any thread); True when `events_sent` must still delete
        the sent rows from the file."""
        return self._unsent.sent(up_to_seq)

