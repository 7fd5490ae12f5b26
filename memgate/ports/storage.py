"""The storage actors as governance and recall see them: one partition per workspace."""

from __future__ import annotations

from typing import Protocol

from memgate.bus import subjects
from memgate.contracts import ForgetResult, ListResult, RememberResult
from memgate.contracts.internal import (
    RecallFilters, RecallScope, RememberedAll, Rows, RowsRequest, StoreForget, StoreQuery,
    StoreRemember, StoreRememberAll,
)
from memgate.ports.bus import Requester
from memgate.runtime.actor import partition_of


class Storage(Protocol):
    async def remember(self, command: StoreRemember) -> RememberResult: ...

    async def remember_all(self, command: StoreRememberAll) -> RememberedAll:
        """Every version stored, or none if a limit refuses one."""
        ...

    async def list(self, query: StoreQuery) -> ListResult: ...
    async def forget(self, command: StoreForget) -> ForgetResult: ...

    async def recall_scope(self, filters: RecallFilters) -> RecallScope:
        """The owner's newest seq, how many versions the filters allow, the citing ones."""
        ...

    async def rows(self, request: RowsRequest) -> Rows:
        """Those of the ids that still exist and that the filters still allow."""
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

    async def remember_all(self, command: StoreRememberAll) -> RememberedAll:
        return await self._bus.request(self._subject(command.items[0].owner.tenant,
                                                     "remember_all"), command, RememberedAll)

    async def list(self, query: StoreQuery) -> ListResult:
        return await self._bus.request(self._subject(query.owner.tenant, "list"), query,
                                       ListResult)

    async def forget(self, command: StoreForget) -> ForgetResult:
        return await self._bus.request(self._subject(command.owner.tenant, "forget"), command,
                                       ForgetResult)

    async def recall_scope(self, filters: RecallFilters) -> RecallScope:
        return await self._bus.request(self._subject(filters.owner.tenant, "scope"), filters,
                                       RecallScope)

    async def rows(self, request: RowsRequest) -> Rows:
        return await self._bus.request(self._subject(request.filters.owner.tenant, "rows"),
                                       request, Rows)
