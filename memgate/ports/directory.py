"""The directory actor as the other actors see it: credentials resolved to principals
(governance), members (spaces, erasure), retention (the reaper), owners (the registry)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from memgate.bus import subjects
from memgate.contracts import Done, Principal
from memgate.contracts.directory import MemberPrincipal, MemberRequest, NatsAgents
from memgate.contracts.internal import OwnerCheck, PrincipalRequest, RetentionRequest, Retentions
from memgate.ports.bus import Requester


# How long governance may use a principal it resolved without asking the directory again: the
# bound on a revocation whose announcement was lost (`PrincipalCache`).
PRINCIPAL_TTL_S = 2.0


class Directory(Protocol):
    async def principal(self, token_hash: str) -> Principal:
        """Who holds this credential, as of now (role, scopes and settings re-read)."""
        ...

    def changed(self) -> None:
        """The directory announced a change: nothing resolved before it may be used again."""
        ...


class BusDirectory:
    """`Directory` over the bus (`mem.int.dir.principal`): every call asks."""

    def __init__(self, bus: Requester) -> None:
        self._bus = bus

    async def principal(self, token_hash: str) -> Principal:
        return await self._bus.request(subjects.DIRECTORY_PRINCIPAL,
                                       PrincipalRequest(token_hash=token_hash), Principal)

    def changed(self) -> None:
        return None

    async def member(self, request: MemberRequest) -> MemberPrincipal:
        """A member by token (who is calling), or by id within a workspace."""
        return await self._bus.request(subjects.DIRECTORY_MEMBER, request, MemberPrincipal)

    async def forget_member(self, workspace_id: str, member_id: str) -> None:
        """An erasure's last step: the member's name goes, its tokens stop working."""
        await self._bus.request(subjects.DIRECTORY_FORGET_MEMBER, MemberRequest(
            workspace_id=workspace_id, member_id=member_id), Done)

    async def retention(self) -> dict[str, int]:
        """Every workspace's retentionDays."""
        return (await self._bus.request(subjects.DIRECTORY_RETENTION, RetentionRequest(),
                                        Retentions)).retention_days

    async def owner_check(self, check: OwnerCheck) -> None:
        """Refused unless the token is the workspace owner's or the operator's."""
        await self._bus.request(subjects.DIRECTORY_OWNER_CHECK, check, Done)

    async def nats_agents(self) -> NatsAgents:
        """Every agent's NATS public key, for the nats-authority."""
        return await self._bus.request(subjects.DIRECTORY_NATS_AGENTS, b"{}", NatsAgents)


class PrincipalCache:
    """A `Directory` that keeps the principals it resolved, so a command costs no directory
    round trip, until the directory announces a change (`mem.int.principals.changed`).

    The directory announces every change of a credential, member or workspace before it
    answers the change, and the server delivers the announcement to governance ahead of any
    command sent after that answer: a revoked credential or a demoted member is refused at its
    next use (SPEC §2.1). An answer that was on its way while a change was announced is not
    kept (the generation moved). Failures are never kept.

    The announcement is a core-NATS message, which a governance can miss (it was reconnecting,
    a slow consumer's messages were dropped, it subscribed a moment later): revocation does not
    depend on it. An entry lives at most `ttl_s` (`PRINCIPAL_TTL_S`, 2 s) from the directory's
    answer, so a missed announcement leaves a revoked credential usable for 2 s at most, and
    each credential in use costs one directory round trip (~1 ms) per 2 s. `size` bounds memory
    (least recent out).
    """

    def __init__(self, directory: Directory, *, ttl_s: float = PRINCIPAL_TTL_S,
                 size: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._directory = directory
        self._ttl = ttl_s
        self._size = size
        self._clock = clock
        self._held: OrderedDict[str, tuple[Principal, float]] = OrderedDict()
        self._generation = 0

    async def principal(self, token_hash: str) -> Principal:
        held = self._held.get(token_hash)
        if held is not None and self._clock() < held[1]:
            self._held.move_to_end(token_hash)
            return held[0]
        generation = self._generation
        principal = await self._directory.principal(token_hash)
        if generation == self._generation:
            self._held[token_hash] = (principal, self._clock() + self._ttl)
            self._held.move_to_end(token_hash)
            while len(self._held) > self._size:
                self._held.popitem(last=False)
        return principal

    def changed(self) -> None:
        self._generation += 1
        self._held.clear()
        self._directory.changed()
