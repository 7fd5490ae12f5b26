"""Workspaces, members and credentials: a DuckDB file owned by the directory actor.

Tokens are stored only as SHA-256 hashes (they are 256-bit random, so a fast hash suffices).
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import astuple, dataclass, replace
from pathlib import Path

import duckdb

from memgate.storage import compaction
from memgate.storage.named import named
from memgate.storage.transaction import transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS workspaces (
    workspace_id VARCHAR NOT NULL, name VARCHAR NOT NULL, non_retaining BOOLEAN NOT NULL,
    agent_memories_enabled BOOLEAN NOT NULL, retention_days INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
    member_id VARCHAR NOT NULL, workspace_id VARCHAR NOT NULL, name VARCHAR NOT NULL,
    role VARCHAR NOT NULL, token_hash VARCHAR NOT NULL
);
ALTER TABLE members ADD COLUMN IF NOT EXISTS memory_spaces_enabled BOOLEAN DEFAULT false;
CREATE TABLE IF NOT EXISTS nats_agents (
    agent_id VARCHAR NOT NULL, name VARCHAR NOT NULL, public_key VARCHAR NOT NULL,
    inbox_prefix VARCHAR NOT NULL, revoked BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS credentials (
    credential_id VARCHAR NOT NULL, workspace_id VARCHAR NOT NULL, member_id VARCHAR NOT NULL,
    name VARCHAR NOT NULL, scopes VARCHAR[] NOT NULL, context_set_id VARCHAR,
    token_hash VARCHAR NOT NULL, revoked BOOLEAN NOT NULL
);
"""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass(frozen=True)
class WorkspaceRow:
    workspace_id: str
    name: str
    non_retaining: bool
    agent_memories_enabled: bool
    retention_days: int


@dataclass(frozen=True)
class MemberRow:
    member_id: str
    workspace_id: str
    name: str
    role: str
    token_hash: str
    memory_spaces_enabled: bool = False


@dataclass(frozen=True)
class CredentialRow:
    credential_id: str
    workspace_id: str
    member_id: str
    scopes: tuple[str, ...]
    context_set_id: str | None
    token_hash: str


class DirectoryStore:
    """The directory's DuckDB file, mirrored in memory.

    The directory actor is the file's only writer, so the mirror is always exact: lookups (one
    per agent command) cost a dict access, and every change is visible to the next lookup.
    """

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The file's connection now (a rewrite replaces it): what a backup reads."""
        return self._db

    def __init__(self, path: Path) -> None:
        self._path = path
        self._db = compaction.open_owned(path, SCHEMA)
        self._workspaces = {w.workspace_id: w for w in named(
            WorkspaceRow, self._db.execute("SELECT * FROM workspaces"))}
        self._members = {m.member_id: m for m in named(
            MemberRow, self._db.execute("SELECT * FROM members"))}
        self._member_tokens = {m.token_hash: m.member_id for m in self._members.values()}
        self._credentials = {c.credential_id: c for c in named(CredentialRow, self._db.execute(
            "SELECT credential_id, workspace_id, member_id, scopes, context_set_id, token_hash "
            "FROM credentials WHERE NOT revoked"), scopes=tuple)}
        self._credential_tokens = {c.token_hash: c.credential_id
                                   for c in self._credentials.values()}

    def close(self) -> None:
        self._db.execute("CHECKPOINT")
        self._db.close()

    def create_workspace(self, name: str, non_retaining: bool) -> str:
        row = WorkspaceRow(new_id("ws"), name, non_retaining, False, 90)
        self._db.execute("INSERT INTO workspaces VALUES (?, ?, ?, ?, ?)", list(astuple(row)))
        self._workspaces[row.workspace_id] = row
        return row.workspace_id

    def workspace(self, workspace_id: str) -> WorkspaceRow | None:
        return self._workspaces.get(workspace_id)

    def retention(self) -> dict[str, int]:
        """Every workspace's retentionDays (for the reaper)."""
        return {w.workspace_id: w.retention_days for w in self._workspaces.values()}

    def update_settings(self, workspace_id: str, *, agent_memories_enabled: bool | None,
                        retention_days: int | None) -> None:
        old = self._workspaces[workspace_id]
        row = replace(old, agent_memories_enabled=old.agent_memories_enabled
                      if agent_memories_enabled is None else agent_memories_enabled,
                      retention_days=retention_days or old.retention_days)
        self._db.execute("UPDATE workspaces SET agent_memories_enabled = ?, retention_days = ? "
                         "WHERE workspace_id = ?",
                         [row.agent_memories_enabled, row.retention_days, workspace_id])
        self._workspaces[workspace_id] = row

    def add_member(self, workspace_id: str, name: str, role: str) -> tuple[str, str]:
        token = new_token("mgm")
        row = MemberRow(new_id("mb"), workspace_id, name, role, hash_token(token))
        self._db.execute("INSERT INTO members VALUES (?, ?, ?, ?, ?, ?)", list(astuple(row)))
        self._members[row.member_id] = row
        self._member_tokens[row.token_hash] = row.member_id
        return row.member_id, token

    def member(self, workspace_id: str, member_id: str) -> MemberRow | None:
        row = self._members.get(member_id)
        return row if row is not None and row.workspace_id == workspace_id else None

    def members(self, workspace_id: str) -> list[MemberRow]:
        return [m for m in self._members.values() if m.workspace_id == workspace_id]

    def member_by_token(self, token_hash: str) -> MemberRow | None:
        row = self._members.get(self._member_tokens.get(token_hash, ""))
        if row is None or not secrets.compare_digest(row.token_hash, token_hash):
            return None
        return row

    def set_role(self, workspace_id: str, member_id: str, role: str) -> None:
        self._db.execute("UPDATE members SET role = ? WHERE workspace_id = ? AND member_id = ?",
                         [role, workspace_id, member_id])
        self._members[member_id] = replace(self._members[member_id], role=role)

    def forget_member(self, member_id: str) -> None:
        """An erased member (SPEC §5.5): the name goes, the member token and every credential
        stop working, and the file is rewritten so the name is in none of its bytes. The id
        stays, tied to nobody, so that the audit log's references lead nowhere."""
        row = self._members.get(member_id)
        if row is None:
            return
        unusable = hash_token(secrets.token_urlsafe(32))  # no token hashes to it
        with transaction(self._db):
            self._db.execute("UPDATE members SET name = '', token_hash = ?, "
                             "memory_spaces_enabled = false WHERE member_id = ?",
                             [unusable, member_id])
            self._db.execute("UPDATE credentials SET name = '', revoked = true "
                             "WHERE member_id = ?", [member_id])
            compaction.mark(self._db)
        self._db = compaction.rewrite(self._db, self._path)
        self._member_tokens.pop(row.token_hash, None)
        self._members[member_id] = replace(row, name="", token_hash=unusable,
                                           memory_spaces_enabled=False)
        for credential in [c for c in self._credentials.values() if c.member_id == member_id]:
            del self._credentials[credential.credential_id]
            self._credential_tokens.pop(credential.token_hash, None)

    def set_memory_spaces(self, member_id: str, enabled: bool) -> None:
        self._db.execute("UPDATE members SET memory_spaces_enabled = ? WHERE member_id = ?",
                         [enabled, member_id])
        self._members[member_id] = replace(self._members[member_id],
                                           memory_spaces_enabled=enabled)

    def create_credential(self, member: MemberRow, name: str, scopes: list[str],
                          context_set_id: str | None) -> tuple[str, str]:
        token = new_token("mga")
        row = CredentialRow(new_id("cr"), member.workspace_id, member.member_id, tuple(scopes),
                            context_set_id, hash_token(token))
        self._db.execute(
            "INSERT INTO credentials VALUES (?, ?, ?, ?, ?, ?, ?, false)",
            [row.credential_id, row.workspace_id, row.member_id, name, scopes, context_set_id,
             row.token_hash])
        self._credentials[row.credential_id] = row
        self._credential_tokens[row.token_hash] = row.credential_id
        return row.credential_id, token

    def credential(self, workspace_id: str, credential_id: str) -> CredentialRow | None:
        row = self._credentials.get(credential_id)
        return row if row is not None and row.workspace_id == workspace_id else None

    def credential_names(self, workspace_id: str) -> dict[str, str]:
        """The names of the workspace's credentials that still work, by id."""
        return dict(self._db.execute(
            "SELECT credential_id, name FROM credentials WHERE workspace_id = ? AND NOT revoked",
            [workspace_id]).fetchall())

    def credentials(self, workspace_id: str) -> list[CredentialRow]:
        return [c for c in self._credentials.values() if c.workspace_id == workspace_id]

    def credential_by_token(self, token_hash: str) -> CredentialRow | None:
        row = self._credentials.get(self._credential_tokens.get(token_hash, ""))
        if row is None or not secrets.compare_digest(row.token_hash, token_hash):
            return None
        return row

    def add_nats_agent(self, name: str, public_key: str) -> tuple[str, str]:
        agent_id = new_id("na")
        inbox_prefix = f"_INBOX_{agent_id}"
        self._db.execute("INSERT INTO nats_agents VALUES (?, ?, ?, ?, false)",
                         [agent_id, name, public_key, inbox_prefix])
        return agent_id, inbox_prefix

    def revoke_nats_agent(self, agent_id: str) -> bool:
        rows = self._db.execute("UPDATE nats_agents SET revoked = true WHERE agent_id = ? "
                                "AND NOT revoked RETURNING agent_id", [agent_id]).fetchall()
        return bool(rows)

    def nats_agents(self) -> list[tuple[str, str]]:
        """(public key, inbox prefix) of every agent that may connect to the bus."""
        return [(r[0], r[1]) for r in self._db.execute(
            "SELECT public_key, inbox_prefix FROM nats_agents WHERE NOT revoked").fetchall()]

    def revoke(self, credential_id: str) -> None:
        self._db.execute("UPDATE credentials SET revoked = true WHERE credential_id = ?",
                         [credential_id])
        row = self._credentials.pop(credential_id)
        del self._credential_tokens[row.token_hash]
