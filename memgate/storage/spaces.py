"""Memory spaces, their shares, and the mem0 entities seen in each: a DuckDB file owned by the
spaces actor, mirrored in memory (the actor is its only writer, so the mirror is exact).

The entities table maps a space's mem0 `user_id` / `agent_id` / `run_id` to an opaque storage
namespace: the ids may be personal, so they stay here, in one file that erasure can reach,
and never in the memory store.
"""

from __future__ import annotations

import secrets
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from pathlib import Path

from memgate.contracts.base import canonical_id
from memgate.storage import compaction
from memgate.storage.directory import new_id
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


class SpaceStore:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._db = compaction.open_owned(path, SCHEMA)
        self._spaces = {row[0]: SpaceRow(*row) for row in
                        self._db.execute("SELECT * FROM spaces").fetchall()}
        self._shares: dict[str, dict[str, str]] = {}
        for space_id, member_id, role in self._db.execute("SELECT * FROM shares").fetchall():
            self._shares.setdefault(space_id, {})[member_id] = role
        self._entities: dict[str, dict[tuple[str | None, ...], EntityRow]] = {}
        for row in self._db.execute("SELECT * FROM entities").fetchall():
            entity = EntityRow(*row)
            self._entities.setdefault(entity.space_id, {})[entity.ids] = entity

    def close(self) -> None:
        self._db.execute("CHECKPOINT")
        self._db.close()

    def create(self, workspace_id: str, member_id: str, description: str,
               llm_model_name: str | None, llm_base_url: str | None) -> SpaceRow:
        row = SpaceRow(new_id("sp"), workspace_id, description, llm_model_name, llm_base_url,
                       member_id, datetime.now(UTC).replace(tzinfo=None))
        with transaction(self._db):
            self._db.execute("INSERT INTO spaces VALUES (?, ?, ?, ?, ?, ?, ?)",
                             list(astuple(row)))
            self._db.execute("INSERT INTO shares VALUES (?, ?, 'owner')",
                             [row.space_id, member_id])
        self._spaces[row.space_id] = row
        self._shares[row.space_id] = {member_id: "owner"}
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
        self._spaces.pop(space_id, None)
        self._shares.pop(space_id, None)
        self._entities.pop(space_id, None)

    def entity(self, space_id: str, user_id: str | None, agent_id: str | None,
               run_id: str | None) -> EntityRow:
        """This entity's namespace in the space, issued on first use."""
        known = self._entities.setdefault(space_id, {})
        ids = (user_id, agent_id, run_id)
        if ids in known:
            return known[ids]
        row = EntityRow(space_id, f"m0-{secrets.token_hex(10)}", *ids)
        self._db.execute("INSERT INTO entities VALUES (?, ?, ?, ?, ?)", list(astuple(row)))
        known[ids] = row
        return row

    def entities(self, space_id: str) -> list[EntityRow]:
        return list(self._entities.get(space_id, {}).values())

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
