"""Memory spaces, their shares, and the mem0 entities seen in each: a DuckDB file owned by the
spaces actor, mirrored in memory (the actor is its only writer, so the mirror is exact).

The entities table maps a space's mem0 `user_id` / `agent_id` / `run_id` to an opaque storage
namespace: the ids may be personal, so they stay here, in one file that erasure can reach,
and never in the memory store. A new entity's row is written *before* any memory about it is
stored, pending (`settled` false): should the process die between the store and `settle`, the
erasure of its end user still finds the namespace (`entities_of_user`), pending or not. `settle`
marks it settled once the store accepted a memory about it; when every add about a pending row
this process wrote was refused, the row is deleted (and the file rewritten by the actor: the id
leaves its bytes), so a refused add leaves no row behind.

A pending row is shown like a settled one, because it shows only through memories: reads name
the entities of the namespaces their memories are in (`entities`), and a filter's namespaces
(`entities` of the whole space, for `scope`) select memories, never rows. A pending row without
memories (a crash before the store, or a lost settle) is therefore never seen by a member; one
whose memories were stored before a crash is seen with them, and the next add about it that
stores settles it. A pending row read from the file is never deleted on a refusal: its memories
may have been stored before the crash. Rows from before the column are settled.

Spaces are a per-member quota (`storage.quotas`): at most so many created by each member, and
so many created by them in any hour.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection
from dataclasses import astuple, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from memgate.contracts.base import canonical_id
from memgate.storage import compaction, profiles
from memgate.storage.directory import new_id
from memgate.storage.named import named
from memgate.storage.quotas import SPACES, Key, Quota, Usage
from memgate.storage.transaction import transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS spaces (
    space_id VARCHAR NOT NULL, workspace_id VARCHAR NOT NULL, description VARCHAR NOT NULL,
    llm_model_name VARCHAR, llm_base_url VARCHAR, created_by VARCHAR NOT NULL,
    created_at TIMESTAMP NOT NULL
);
CREATE TABLE IF NOT EXISTS shares (
    space_id VARCHAR NOT NULL, member_id VARCHAR NOT NULL, role VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS entities (
    space_id VARCHAR NOT NULL, namespace VARCHAR NOT NULL, user_id VARCHAR, agent_id VARCHAR,
    run_id VARCHAR
);
ALTER TABLE entities ADD COLUMN IF NOT EXISTS settled BOOLEAN DEFAULT true;
""" + profiles.SCHEMA
ENTITY_COLUMNS = "space_id, namespace, user_id, agent_id, run_id, settled"


@dataclass(frozen=True)
class SpaceRow:
    space_id: str
    workspace_id: str
    description: str
    llm_model_name: str | None
    llm_base_url: str | None
    created_by: str
    created_at: datetime


@dataclass(frozen=True)
class EntityRow:
    space_id: str
    namespace: str
    user_id: str | None
    agent_id: str | None
    run_id: str | None
    settled: bool = True  # false: written before its memories were known to be stored

    @property
    def ids(self) -> tuple[str | None, str | None, str | None]:
        return self.user_id, self.agent_id, self.run_id


Ids = tuple[str | None, str | None, str | None]  # an entity's (user_id, agent_id, run_id)


class SpaceStore(compaction.Rewritable):
    def __init__(self, path: Path, *, quota: Quota = SPACES) -> None:
        self._path = path
        self._db = compaction.open_owned(path, SCHEMA)
        self._spaces = {space.space_id: space for space in named(
            SpaceRow, self._db.execute("SELECT * FROM spaces"))}
        self._shares: dict[str, dict[str, str]] = {}
        for space_id, member_id, role in self._db.execute("SELECT * FROM shares").fetchall():
            self._shares.setdefault(space_id, {})[member_id] = role
        self._entities: dict[str, dict[Ids, EntityRow]] = {}
        for entity in named(EntityRow, self._db.execute(f"SELECT {ENTITY_COLUMNS} FROM entities")):
            self._entities.setdefault(entity.space_id, {})[entity.ids] = entity
        # Pending rows this process wrote, none of whose adds stored yet: the adds under way.
        self._fresh: dict[str, dict[Ids, int]] = {}
        self.deletions_pending = False  # rows deleted since the last rewrite (`compact`)
        self.profiles = profiles.ProfileStore(lambda: self._db)
        self.usage = Usage(quota, count=self._held, made=self._made)

    def _held(self, key: Key) -> int:
        return sum(1 for space in self._spaces.values()
                   if (space.workspace_id, space.created_by) == key)

    def _made(self, key: Key, since: datetime) -> list[tuple[datetime, int]]:
        return [(space.created_at, 1) for space in self._spaces.values()
                if (space.workspace_id, space.created_by) == key and space.created_at > since]

    def close(self) -> None:
        self._db.execute("CHECKPOINT")
        self._db.close()


    def create(self, workspace_id: str, member_id: str, description: str,
               llm_model_name: str | None, llm_base_url: str | None, *,
               space_id: str | None = None) -> SpaceRow:
        """A space created by the member, within their quota (else MEMORY_SPACE_FULL or
        MEMORY_SPACE_RATE_LIMITED); under `space_id` if given, and that space if it exists
        (a create retried under its idempotency key: nothing written)."""
        if space_id is not None and (first := self._spaces.get(space_id)) is not None:
            return first
        now = datetime.now(UTC).replace(tzinfo=None)
        self.usage.check((workspace_id, member_id), 1, now)
        row = SpaceRow(space_id or new_id("sp"), workspace_id, description, llm_model_name,
                       llm_base_url, member_id, now)
        with transaction(self._db):
            self._db.execute("INSERT INTO spaces VALUES (?, ?, ?, ?, ?, ?, ?)",
                             list(astuple(row)))
            self._db.execute("INSERT INTO shares VALUES (?, ?, 'owner')",
                             [row.space_id, member_id])
        self._spaces[row.space_id] = row
        self._shares[row.space_id] = {member_id: "owner"}
        self.usage.took((workspace_id, member_id), 1, now)
        return row

    def space(self, space_id: str) -> SpaceRow | None:
        return self._spaces.get(space_id)

    def role(self, space_id: str, member_id: str) -> str | None:
        return self._shares.get(space_id, {}).get(member_id)

    def spaces_of(self, workspace_id: str, member_id: str) -> list[tuple[SpaceRow, str]]:
        """The member's spaces in the workspace, with their role, oldest first."""
        found = [(space, self._shares[space.space_id][member_id])
                 for space in self._spaces.values()
                 if space.workspace_id == workspace_id
                 and member_id in self._shares.get(space.space_id, {})]
        return sorted(found, key=lambda pair: pair[0].created_at)

    def share(self, space_id: str, member_id: str, role: str) -> None:
        with transaction(self._db):
            self._db.execute("DELETE FROM shares WHERE space_id = ? AND member_id = ?",
                             [space_id, member_id])
            self._db.execute("INSERT INTO shares VALUES (?, ?, ?)", [space_id, member_id, role])
        self._shares.setdefault(space_id, {})[member_id] = role

    def revoke(self, space_id: str, member_id: str) -> bool:
        gone = self._db.execute("DELETE FROM shares WHERE space_id = ? AND member_id = ? "
                                "RETURNING member_id", [space_id, member_id]).fetchall()
        self._shares.get(space_id, {}).pop(member_id, None)
        return bool(gone)

    def delete(self, space_id: str) -> None:
        """The space, its shares and its entity map (the ids of its end users)."""
        with transaction(self._db):
            for table in ("spaces", "shares", "entities"):
                self._db.execute(f"DELETE FROM {table} WHERE space_id = ?", [space_id])
            self.profiles.forget_space(space_id)
            compaction.mark(self._db)
        self.compact()  # its end users' ids leave the file
        gone = self._spaces.pop(space_id, None)
        self._shares.pop(space_id, None)
        self._entities.pop(space_id, None)
        self._fresh.pop(space_id, None)
        if gone is not None:
            self.usage.stale([(gone.workspace_id, gone.created_by)])

    def entity(self, space_id: str, ids: Ids) -> EntityRow:
        """This entity's namespace in the space, for an add about it: a new entity's row is
        written now, pending, before the store (`settle` ends the add)."""
        if (known := self._entities.get(space_id, {}).get(ids)) is not None:
            if ids in (fresh := self._fresh.get(space_id, {})):
                fresh[ids] += 1  # one more add under way about a row none has stored to yet
            return known
        row = EntityRow(space_id, f"m0-{secrets.token_hex(10)}", *ids, settled=False)
        self._db.execute(f"INSERT INTO entities ({ENTITY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                         list(astuple(row)))
        self._entities.setdefault(space_id, {})[ids] = row
        self._fresh.setdefault(space_id, {})[ids] = 1
        return row

    def settle(self, space_id: str, ids: Ids, *, stored: bool) -> None:
        """An add about this entity ended: with memories stored (a pending row is settled), or
        none (a pending row this process wrote is deleted with the last of its adds, all
        refused; `deletions_pending` then asks for the rewrite)."""
        row = self._entities.get(space_id, {}).get(ids)
        fresh = self._fresh.get(space_id, {})
        if row is None:  # the space was deleted, or the entity erased, meanwhile
            fresh.pop(ids, None)
        elif stored:
            fresh.pop(ids, None)
            if not row.settled:
                self._db.execute("UPDATE entities SET settled = true "
                                 "WHERE space_id = ? AND namespace = ?",
                                 [space_id, row.namespace])
                self._entities[space_id][ids] = replace(row, settled=True)
        elif ids in fresh:
            fresh[ids] -= 1
            if not fresh[ids]:
                del fresh[ids]
                with transaction(self._db):
                    self._db.execute("DELETE FROM entities WHERE space_id = ? AND namespace = ?",
                                     [space_id, row.namespace])
                    compaction.mark(self._db)
                del self._entities[space_id][ids]
                self.deletions_pending = True
        if not fresh:
            self._fresh.pop(space_id, None)

    def entities(self, space_id: str, namespaces: Collection[str] | None = None
                 ) -> list[EntityRow]:
        """The space's entities, pending ones too (those of these namespaces only, when
        given)."""
        known = self._entities.get(space_id, {}).values()
        if namespaces is None:
            return list(known)
        wanted = set(namespaces)
        return [entity for entity in known if entity.namespace in wanted]

    def users(self, space_id: str) -> list[str]:
        """The space's end users (mem0 `user_id`s) that memories were stored about, in the
        order they came."""
        return list(dict.fromkeys(e.user_id for e in self._entities.get(space_id, {}).values()
                                  if e.user_id is not None and e.settled))

    def entities_of_user(self, workspace_id: str, user_id: str) -> list[EntityRow]:
        """Every entity naming this end user in the workspace's spaces, pending ones too (an
        erasure's subject: a pending row's memories may have been stored)."""
        return [entity for space in self._spaces.values() if space.workspace_id == workspace_id
                for entity in self._entities.get(space.space_id, {}).values()
                if entity.user_id is not None
                and canonical_id(entity.user_id) == canonical_id(user_id)]

    def forget_entities(self, entities: list[EntityRow]) -> None:
        """Delete these entities: their namespaces no longer lead to anyone."""
        with transaction(self._db):
            for entity in entities:
                self._db.execute("DELETE FROM entities WHERE space_id = ? AND namespace = ?",
                                 [entity.space_id, entity.namespace])
                if entity.user_id is not None:  # their profile goes with them
                    self.profiles.forget_users(entity.space_id, [entity.user_id])
            compaction.mark(self._db)
        for entity in entities:
            self._entities.get(entity.space_id, {}).pop(entity.ids, None)
            self._fresh.get(entity.space_id, {}).pop(entity.ids, None)
        self.compact()  # the ids leave every byte
