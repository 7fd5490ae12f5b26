"""Workspaces, members, credentials and settings (SPEC §2) as they cross the bus."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from memgate.contracts.base import Contract, Id


class Role(StrEnum):
    VIEWER = "viewer"
    EDITOR = "editor"
    OWNER = "owner"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Role.VIEWER: 1, Role.EDITOR: 2, Role.OWNER: 3}


class Scope(StrEnum):
    READ = "memory:read"
    WRITE = "memory:write"

    @property
    def minimum_role(self) -> Role:
        return Role.VIEWER if self is Scope.READ else Role.EDITOR


class WorkspaceSettings(Contract):
    agent_memories_enabled: bool = False
    retention_days: int = Field(default=90, ge=1, le=365)
    non_retaining: bool = False


class SettingsUpdate(Contract):
    agent_memories_enabled: bool | None = None
    retention_days: int | None = Field(default=None, ge=1, le=365)


class Principal(Contract):
    """Who an agent credential speaks for (governance keeps it until the directory announces
    a change: `ports.directory.PrincipalCache`)."""

    workspace_id: str
    member_id: str
    credential_id: str
    role: Role
    scopes: frozenset[Scope]
    context_set_id: str | None = None
    settings: WorkspaceSettings


class CreateWorkspace(Contract):
    name: str = Field(min_length=1, max_length=120)
    non_retaining: bool = False


class MemberToken(Contract):
    member_id: str
    member_token: str


class WorkspaceCreated(Contract):
    workspace_id: str
    owner: MemberToken


class AddMember(Contract):
    name: str = Field(min_length=1, max_length=120)
    role: Role


class PatchMember(Contract):
    role: Role | None = None
    memory_spaces_enabled: bool | None = None  # the per-user memory-space flag (SPEC §4.5)


class MemberView(Contract):
    member_id: str
    name: str
    role: Role
    memory_spaces_enabled: bool = False


class MemberRequest(Contract):
    """A member by token (who is calling), or by id within a workspace (whom a share names)."""

    token_hash: str | None = None
    workspace_id: str | None = None
    member_id: str | None = None


class MemberPrincipal(Contract):
    """Who a member token speaks for, resolved afresh at every use."""

    workspace_id: str
    member_id: str
    role: Role
    memory_spaces_enabled: bool
    settings: WorkspaceSettings


class CreateCredential(Contract):
    name: str = Field(min_length=1, max_length=120)
    scopes: list[Scope] = Field(default_factory=list, max_length=len(Scope))
    context_set_id: Id | None = None


class CredentialCreated(Contract):
    credential_id: str
    token: str
    scopes: list[Scope]


class Done(Contract):
    ok: bool = True


class CreateNatsAgent(Contract):
    name: str = Field(min_length=1, max_length=120)


class NatsAgentCreated(Contract):
    """An agent's NATS credential: shown once; the server keeps only the public key."""

    agent_id: str
    seed: str
    inbox_prefix: str
    publish: list[str]


class NatsAgentKey(Contract):
    public_key: str
    inbox_prefix: str


class NatsAgents(Contract):
    agents: list[NatsAgentKey]


class Me(Contract):
    """Who a token speaks for, for the console: the operator, or a member (never an agent)."""

    kind: Literal["operator", "member"]
    workspace_id: str | None = None
    member_id: str | None = None
    name: str | None = None
    role: Role | None = None
    memory_spaces_enabled: bool = False


class Members(Contract):
    members: list[MemberView]


class CredentialView(Contract):
    """An agent credential as its owner sees it: never the token (shown once, at creation)."""

    credential_id: str
    name: str
    member_id: str
    scopes: list[Scope]
    context_set_id: str | None = None


class Credentials(Contract):
    credentials: list[CredentialView]
