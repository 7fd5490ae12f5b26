"""Memory spaces, their shares, and the mem0 entities seen in each: a DuckDB file owned by the
spaces actor, mirrored in memory (the actor is its only writer, so the mirror is exact).

The entities table maps a space's mem0 `user_id` / `agent_id` / `run_id` to an opaque storage
namespace: the ids may be personal, so they stay here, in one file that erasure can reach,
and never in the memory store. A new entity's namespace is first only reserved (in memory, so
that adds about it at the same time share it) and written only once the memory store accepted
a memory about it (`settle`): a refused add leaves no row, and no id, in the file.

Spaces are a per-member quota (`storage.quotas`): at most so many created by each member, and
so many created by them in any hour.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from pathlib import Path

from memgate.contracts.base import canonical_id
from memgate.storage import compaction
from memgate.storage.directory import new_id
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
"""


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

    @property
    def ids(self) -> tuple[str | None, str | None, str | None]:
        return self.user_id, self.agent_id, self.run_id


Ids = tuple[str | None, str | None, str | None]  # an entity's (user_id, agent_id, run_id)


class SpaceStore:
    def __init__(self, path: Path, *, quota: Quota = SPACES) -> None:
        self._path = path
        self._db = compaction.open_owned(path, SCHEMA)
        self._spaces = {row[0]: SpaceRow(*row) for row in
                        self._db.execute("SELECT * FROM spaces").fetchall()}
        self._shares: dict[str, dict[str, str]] = {}
        for space_id, member_id, role in self._db.execute("SELECT * FROM shares").fetchall():
            self._shares.setdefault(space_id, {})[member_id] = role
        self._entities: dict[str, dict[Ids, EntityRow]] = {}
        for row in self._db.execute("SELECT * FROM entities").fetchall():
            entity = EntityRow(*row)
            self._entities.setdefault(entity.space_id, {})[entity.ids] = entity
        # New entities being stored about, not yet in the file: (row, adds still under way).
        self._reserved: dict[str, dict[Ids, tuple[EntityRow, int]]] = {}
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
               llm_model_name: str | None, llm_base_url: str | None) -> SpaceRow:
        """A space created by the member, within their quota (else MEMORY_SPACE_FULL or
        MEMORY_SPACE_RATE_LIMITED)."""
        now = datetime.now(UTC).replace(tzinfo=None)
        self.usage.check((workspace_id, member_id), 1, now)
        row = SpaceRow(new_id("sp"), workspace_id, description, llm_model_name, llm_base_url,
                       member_id, now)
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
            compaction.mark(self._db)
        self._db = compaction.rewrite(self._db, self._path)  # its end users' ids leave the file
        gone = self._spaces.pop(space_id, None)
        self._shares.pop(space_id, None)
        self._entities.pop(space_id, None)
        self._reserved.pop(space_id, None)
        if gone is not None:
            self.usage.stale([(gone.workspace_id, gone.created_by)])

    def entity(self, space_id: str, ids: Ids) -> EntityRow:
        """This entity's namespace in the space: its row's, or one reserved for an add about a
        new entity, which `settle` then writes (stored) or gives up (refused)."""
        if (known := self._entities.get(space_id, {}).get(ids)) is not None:
            return known
        reserved = self._reserved.setdefault(space_id, {})
        row, adds = reserved.get(ids) or (EntityRow(space_id, f"m0-{secrets.token_hex(10)}",
                                                    *ids), 0)
        reserved[ids] = (row, adds + 1)
        return row

    def settle(self, space_id: str, ids: Ids, *, stored: bool) -> None:
        """An add about a reserved entity ended: with memories stored (the row is written,
        once), or none (the reservation ends with the last add that holds it)."""
        reserved = self._reserved.get(space_id, {})
        if ids not in reserved:  # written already, or the space was deleted meanwhile
            return
        row, adds = reserved.pop(ids)
        if stored:
            self._db.execute("INSERT INTO entities VALUES (?, ?, ?, ?, ?)", list(astuple(row)))
            self._entities.setdefault(space_id, {})[ids] = row
        elif adds > 1:
            reserved[ids] = (row, adds - 1)
        if not reserved:
            self._reserved.pop(space_id, None)

    def entities(self, space_id: str, namespaces: Collection[str] | None = None
                 ) -> list[EntityRow]:
        """The space's entities (those of these namespaces only, when given)."""
        known = self._entities.get(space_id, {}).values()
        if namespaces is None:
            return list(known)
        wanted = set(namespaces)
        return [entity for entity in known if entity.namespace in wanted]

    def entities_of_user(self, workspace_id: str, user_id: str) -> list[EntityRow]:
        """Every entity naming this end user in the workspace's spaces (an erasure's subject)."""
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
            compaction.mark(self._db)
        for entity in entities:
            self._entities.get(entity.space_id, {}).pop(entity.ids, None)
        self._db = compaction.rewrite(self._db, self._path)  # the ids leave every byte
