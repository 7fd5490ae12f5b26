"""The storage actors as governance and recall see them: one partition per workspace."""

from __future__ import annotations

from typing import Protocol

from memgate.bus import subjects
from memgate.contracts import ForgetResult, ListResult, RememberResult
from memgate.contracts.internal import Candidates, StoreForget, StoreQuery, StoreRemember
from memgate.ports.bus import Requester
from memgate.runtime.actor import partition_of


class Storage(Protocol):
    async def remember(self, command: StoreRemember) -> RememberResult: ...
    async def list(self, query: StoreQuery) -> ListResult: ...
    async def forget(self, command: StoreForget) -> ForgetResult: ...

    async def candidates(self, query: StoreQuery) -> Candidates:
        """The newest `query.limit` versions current at `asOf` (recall's window)."""
        ...


class BusStorage:
    """`Storage` over the bus: each command goes to the partition that owns its workspace."""

    def __init__(self, bus: Requester, *, partitions: int) -> None:
        self._bus = bus
        self._partitions = partitions

    def _subject(self, tenant: str, operation: str) -> str:
        return subjects.store(partition_of(tenant, self._partitions), operation)

    async def remember(self, command: StoreRemember) -> RememberResult:
        return await self._bus.request(self._subject(command.owner.tenant, "remember"), command,
                                       RememberResult)

    async def list(self, query: StoreQuery) -> ListResult:
        return await self._bus.request(self._subject(query.owner.tenant, "list"), query,
                                       ListResult)

    async def forget(self, command: StoreForget) -> ForgetResult:
        return await self._bus.request(self._subject(command.owner.tenant, "forget"), command,
                                       ForgetResult)

    async def candidates(self, query: StoreQuery) -> Candidates:
        return await self._bus.request(self._subject(query.owner.tenant, "candidates"), query,
                                       Candidates)
