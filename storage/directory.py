"""Workspaces, members and credentials: a DuckDB file owned by the directory actor.

Tokens are stored only as SHA-256 hashes (they are 256-bit random, so a fast hash suffices).
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb

_SCHEMA = """
CREATE TABLE IF NOT EXISTS workspaces (
    workspace_id VARCHAR NOT NULL, name VARCHAR NOT NULL, non_retaining BOOLEAN NOT NULL,
    agent_memories_enabled BOOLEAN NOT NULL, retention_days INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
    member_id VARCHAR NOT NULL, workspace_id VARCHAR NOT NULL, name VARCHAR NOT NULL,
    role VARCHAR NOT NULL, token_hash VARCHAR NOT NULL
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


@dataclass(frozen=True)
class CredentialRow:
    credential_id: str
    workspace_id: str
    member_id: str
    scopes: tuple[str, ...]
    context_set_id: str | None
    token_hash: str


class DirectoryStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = duckdb.connect(str(path))
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        self._db.execute("CHECKPOINT")
        self._db.close()

    def create_workspace(self, name: str, non_retaining: bool) -> str:
        workspace_id = new_id("ws")
        self._db.execute("INSERT INTO workspaces VALUES (?, ?, ?, false, 90)",
                         [workspace_id, name, non_retaining])
        return workspace_id

    def workspace(self, workspace_id: str) -> WorkspaceRow | None:
        row = self._db.execute("SELECT * FROM workspaces WHERE workspace_id = ?",
                               [workspace_id]).fetchone()
        return WorkspaceRow(*row) if row else None

    def update_settings(self, workspace_id: str, *, agent_memories_enabled: bool | None,
                        retention_days: int | None) -> None:
        self._db.execute(
            "UPDATE workspaces SET agent_memories_enabled = coalesce(?, agent_memories_enabled), "
            "retention_days = coalesce(?, retention_days) WHERE workspace_id = ?",
            [agent_memories_enabled, retention_days, workspace_id])

    def add_member(self, workspace_id: str, name: str, role: str) -> tuple[str, str]:
        member_id, token = new_id("mb"), new_token("mgm")
        self._db.execute("INSERT INTO members VALUES (?, ?, ?, ?, ?)",
                         [member_id, workspace_id, name, role, hash_token(token)])
        return member_id, token

    def member(self, workspace_id: str, member_id: str) -> MemberRow | None:
        row = self._db.execute("SELECT * FROM members WHERE workspace_id = ? AND member_id = ?",
                               [workspace_id, member_id]).fetchone()
        return MemberRow(*row) if row else None

    def member_by_token(self, token_hash: str) -> MemberRow | None:
        row = self._db.execute("SELECT * FROM members WHERE token_hash = ?", [token_hash]).fetchone()
        if row is None or not secrets.compare_digest(row[4], token_hash):
            return None
        return MemberRow(*row)

    def set_role(self, workspace_id: str, member_id: str, role: str) -> None:
        self._db.execute("UPDATE members SET role = ? WHERE workspace_id = ? AND member_id = ?",
                         [role, workspace_id, member_id])

    def create_credential(self, member: MemberRow, name: str, scopes: list[str],
                          context_set_id: str | None) -> tuple[str, str]:
        credential_id, token = new_id("cr"), new_token("mga")
        self._db.execute(
            "INSERT INTO credentials VALUES (?, ?, ?, ?, ?, ?, ?, false)",
            [credential_id, member.workspace_id, member.member_id, name, scopes, context_set_id,
             hash_token(token)])
        return credential_id, token

    def credential(self, workspace_id: str, credential_id: str) -> CredentialRow | None:
        row = self._db.execute(
            "SELECT credential_id, workspace_id, member_id, scopes, context_set_id, token_hash "
            "FROM credentials WHERE workspace_id = ? AND credential_id = ? AND NOT revoked",
            [workspace_id, credential_id]).fetchone()
        return CredentialRow(row[0], row[1], row[2], tuple(row[3]), row[4], row[5]) if row else None

    def credential_by_token(self, token_hash: str) -> CredentialRow | None:
        row = self._db.execute(
            "SELECT credential_id, workspace_id, member_id, scopes, context_set_id, token_hash "
            "FROM credentials WHERE token_hash = ? AND NOT revoked", [token_hash]).fetchone()
        if row is None or not secrets.compare_digest(row[5], token_hash):
            return None
        return CredentialRow(row[0], row[1], row[2], tuple(row[3]), row[4], row[5])

    def revoke(self, credential_id: str) -> None:
        self._db.execute("UPDATE credentials SET revoked = true WHERE credential_id = ?",
                         [credential_id])
