"""The directory actor as governance sees it: credentials resolved to principals."""

from __future__ import annotations

from typing import Protocol

from memgate.bus import subjects
from memgate.contracts import Principal
from memgate.contracts.internal import PrincipalRequest
from memgate.ports.bus import Requester


class Directory(Protocol):
    async def principal(self, token_hash: str) -> Principal:
        """Who holds this credential, as of now (role, scopes and settings re-read)."""
        ...


class BusDirectory:
    """`Directory` over the bus (`mem.int.dir.principal`)."""

    def __init__(self, bus: Requester) -> None:
        self._bus = bus

    async def principal(self, token_hash: str) -> Principal:
        return await self._bus.request(subjects.DIRECTORY_PRINCIPAL,
                                       PrincipalRequest(token_hash=token_hash), Principal)
