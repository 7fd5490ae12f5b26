"""The directory on the in-memory broker (real DuckDB in a temp dir): principals resolved
afresh at every use, so demotion and revocation bite at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from memgate.actors.directory import DirectoryActor
from memgate.bus import subjects
from memgate.contracts import (
    Contract, CredentialCreated, Done, ErrorCode, MemberToken, MemberView, Principal, Role, Scope,
    WorkspaceCreated, WorkspaceSettings,
)
from memgate.contracts.errors import MemgateError
from memgate.contracts.internal import OwnerCheck, PrincipalRequest
from memgate.storage.directory import hash_token
from tests.fakes import FakeBus, Served, served

pytestmark = pytest.mark.unit

OPERATOR = "operator-token"
T = TypeVar("T", bound=Contract)


@dataclass
class World:
    bus: Served
    workspace_id: str
    owner: str  # the owner's member token

    async def principal(self, token: str) -> Principal:
        return await self.bus.call(subjects.DIRECTORY_PRINCIPAL,
                                   PrincipalRequest(token_hash=hash_token(token)), Principal)

    async def admin(self, operation: str, token: str | None, body: dict[str, object],
                    result: type[T], **params: str) -> T:
        return await self.bus.command(subjects.admin(operation), token, body, result,
                                      wsId=self.workspace_id, **params)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    actor = DirectoryActor(path=tmp_path / "directory.duckdb", admin_token=lambda: OPERATOR,
                           bus=FakeBus())
    async with served(actor) as bus:
        created = await bus.command(subjects.admin("workspaces.create"), OPERATOR,
                                    {"name": "acme"}, WorkspaceCreated)
        yield World(bus, created.workspace_id, created.owner.member_token)


async def test_only_the_operator_creates_workspaces(world: World) -> None:
    with pytest.raises(MemgateError) as caught:
        await world.bus.command(subjects.admin("workspaces.create"), world.owner,
                                {"name": "other"}, WorkspaceCreated)
    assert caught.value.code == ErrorCode.UNAUTHENTICATED


async def test_a_credential_resolves_to_its_member_scopes_and_settings(world: World) -> None:
    await world.admin("settings.put", world.owner, {"agentMemoriesEnabled": True},
                      WorkspaceSettings)
    editor = await world.admin("members.add", world.owner, {"name": "ed", "role": "editor"},
                               MemberToken)
    credential = await world.admin("credentials.create", editor.member_token,
                                   {"name": "agent", "scopes": ["memory:read"]},
                                   CredentialCreated)
    principal = await world.principal(credential.token)
    assert (principal.workspace_id, principal.member_id, principal.role) == \
        (world.workspace_id, editor.member_id, Role.EDITOR)
    assert principal.scopes == frozenset({Scope.READ})
    assert principal.settings.agent_memories_enabled


async def test_demotion_shows_in_the_next_resolution(world: World) -> None:
    editor = await world.admin("members.add", world.owner, {"name": "ed", "role": "editor"},
                               MemberToken)
    credential = await world.admin("credentials.create", editor.member_token,
                                   {"name": "agent", "scopes": ["memory:read", "memory:write"]},
                                   CredentialCreated)
    assert (await world.principal(credential.token)).role == Role.EDITOR
    demoted = await world.admin("members.patch", world.owner, {"role": "viewer"}, MemberView,
                                memberId=editor.member_id)
    assert demoted.role == Role.VIEWER
    assert (await world.principal(credential.token)).role == Role.VIEWER


async def test_a_revoked_credential_no_longer_resolves(world: World) -> None:
    credential = await world.admin("credentials.create", world.owner,
                                   {"name": "agent", "scopes": ["memory:read"]},
                                   CredentialCreated)
    await world.admin("credentials.revoke", world.owner, {}, Done,
                      credentialId=credential.credential_id)
    with pytest.raises(MemgateError) as caught:
        await world.principal(credential.token)
    assert caught.value.code == ErrorCode.UNAUTHENTICATED


async def test_a_viewer_cannot_be_granted_write(world: World) -> None:
    viewer = await world.admin("members.add", world.owner, {"name": "v", "role": "viewer"},
                               MemberToken)
    with pytest.raises(MemgateError) as caught:
        await world.admin("credentials.create", viewer.member_token,
                          {"name": "agent", "scopes": ["memory:write"]}, CredentialCreated)
    assert caught.value.code == ErrorCode.INSUFFICIENT_SCOPE


async def test_the_owner_check_accepts_the_owner_and_the_operator_only(world: World) -> None:
    for token in (world.owner, OPERATOR):
        await world.bus.call(subjects.DIRECTORY_OWNER_CHECK, OwnerCheck(
            token_hash=hash_token(token), workspace_id=world.workspace_id), Done)
    member = await world.admin("members.add", world.owner, {"name": "ed", "role": "editor"},
                               MemberToken)
    with pytest.raises(MemgateError) as caught:
        await world.bus.call(subjects.DIRECTORY_OWNER_CHECK, OwnerCheck(
            token_hash=hash_token(member.member_token), workspace_id=world.workspace_id), Done)
    assert caught.value.code == ErrorCode.FORBIDDEN
