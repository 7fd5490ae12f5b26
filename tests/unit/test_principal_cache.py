"""`PrincipalCache`: governance's principals, kept until the directory announces a change."""

from __future__ import annotations

import asyncio

import pytest

from memgate.contracts import Principal, Role, Scope, WorkspaceSettings
from memgate.contracts.errors import UnauthenticatedError
from memgate.ports.directory import PrincipalCache
from tests.fakes import FakeDirectory

pytestmark = pytest.mark.unit


def principal(role: Role = Role.EDITOR) -> Principal:
    return Principal(workspace_id="w", member_id="m", credential_id="c", role=role,
                     scopes=frozenset({Scope.READ, Scope.WRITE}), context_set_id=None,
                     settings=WorkspaceSettings(agent_memories_enabled=True))


async def test_a_principal_is_asked_once_until_the_directory_changes() -> None:
    directory = FakeDirectory()
    directory.principals["h"] = principal()
    cache = PrincipalCache(directory)
    assert await cache.principal("h") == await cache.principal("h") == principal()
    assert directory.asked == 1
    directory.principals["h"] = principal(Role.VIEWER)
    cache.changed()
    assert (await cache.principal("h")).role == Role.VIEWER
    assert directory.asked == 2


async def test_failures_are_never_kept() -> None:
    directory = FakeDirectory()
    cache = PrincipalCache(directory)
    for _ in range(2):
        with pytest.raises(UnauthenticatedError):
            await cache.principal("h")
    assert directory.asked == 2


async def test_an_answer_in_flight_while_a_change_is_announced_is_not_kept() -> None:
    directory = FakeDirectory()
    directory.principals["h"] = principal()
    release = asyncio.Event()
    ask = directory.principal

    async def slow(token_hash: str) -> Principal:
        found = await ask(token_hash)
        await release.wait()
        return found

    directory.principal = slow  # type: ignore[method-assign]
    cache = PrincipalCache(directory)
    pending = asyncio.ensure_future(cache.principal("h"))
    await asyncio.sleep(0)
    cache.changed()  # the credential was revoked while its old principal was on its way
    del directory.principals["h"]
    release.set()
    assert (await pending).role == Role.EDITOR  # that command was already under way
    with pytest.raises(UnauthenticatedError):
        await cache.principal("h")


async def test_entries_expire_and_the_least_recent_leave_first() -> None:
    now = [0.0]
    directory = FakeDirectory()
    for h in ("a", "b", "c"):
        directory.principals[h] = principal()
    cache = PrincipalCache(directory, ttl_s=10, size=2, clock=lambda: now[0])
    for h in ("a", "b", "a", "c"):  # "b" is the least recent when "c" comes in
        await cache.principal(h)
    assert directory.asked == 3
    await cache.principal("a")
    assert directory.asked == 3
    await cache.principal("b")
    assert directory.asked == 4
    now[0] = 11.0
    await cache.principal("b")
    assert directory.asked == 5
