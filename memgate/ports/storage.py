"""The storage actors as the other actors see them: one partition per workspace (`BusStorage`),
or one partition's actor (`PartitionStorage`) for the actors that work partition by partition."""

from __future__ import annotations

from typing import Protocol

from memgate.bus import subjects
from memgate.contracts import ForgetResult, ListResult, RememberResult
from memgate.contracts.memory import ImportResult
from memgate.contracts.erasure import SubjectCount, SubjectTarget
from memgate.contracts.internal import (
    CatalogRequest, CatalogRows, OwnedText, Owner, Reaped, RecallFilters, RecallScope,
    RememberedAll, Rows, RowsRequest, StoreForget, StorePurge, StoreQuery, StoreReap,
    StoreImport, StoreRemember, StoreRememberAll, Texts, TextsRequest,
)
from memgate.ports.bus import Requester


class Storage(Protocol):
    async def remember(self, command: StoreRemember) -> RememberResult: ...

    async def remember_all(self, command: StoreRememberAll) -> RememberedAll:
        """Every version stored, or none if a limit refuses one."""
        ...

    async def import_memories(self, command: StoreImport) -> ImportResult:
        """Each item stored or refused alone, in one transaction; positions as in `items`."""
        ...

    async def list(self, query: StoreQuery) -> ListResult: ...
    async def forget(self, command: StoreForget) -> ForgetResult: ...

    async def recall_scope(self, filters: RecallFilters) -> RecallScope:
        """The owner's newest seq, how many versions the filters allow, the citing ones."""
        ...

    async def rows(self, request: RowsRequest) -> Rows:
        """Those of the ids that still exist and that the filters still allow."""
        ...

    async def purge(self, command: StorePurge) -> ForgetResult:
        """Every version of the tenant (or of its subject, or those ids), deleted at once."""
        ...


class BusStorage:
    """`Storage` over the bus: each command goes to the partition that owns its workspace."""

    def __init__(self, bus: Requester, *, partitions: int) -> None:
        self._bus = bus
        self._partitions = partitions

    def _subject(self, tenant: str, operation: str) -> str:
        return subjects.store(subjects.partition_of(tenant, self._partitions), operation)

    async def remember(self, command: StoreRemember) -> RememberResult:
        return await self._bus.request(self._subject(command.owner.tenant, "remember"), command,
                                       RememberResult)

    async def remember_all(self, command: StoreRememberAll) -> RememberedAll:
        return await self._bus.request(self._subject(command.items[0].owner.tenant,
                                                     "remember_all"), command, RememberedAll)

    async def import_memories(self, command: StoreImport) -> ImportResult:
        return await self._bus.request(self._subject(command.items[0].owner.tenant, "import"),
                                       command, ImportResult)

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

    async def purge(self, command: StorePurge) -> ForgetResult:
        return await self._bus.request(self._subject(command.tenant, "purge"), command,
                                       ForgetResult)


class PartitionStorage:
    """One partition's storage actor, over the bus: what its indexer and embedder read, and
    what the reaper and the erasure ask of each partition in turn."""

    def __init__(self, bus: Requester, partition: str) -> None:
        self._bus = bus
        self._partition = partition

    def _subject(self, operation: str) -> str:
        return subjects.store(self._partition, operation)

    async def catalog(self, request: CatalogRequest) -> CatalogRows:
        """The owner's versions after `request.after_seq` (with their texts if asked)."""
        return await self._bus.request(self._subject("catalog"), request, CatalogRows)

    async def texts(self, owner: Owner, memory_ids: list[str] | None = None) -> list[OwnedText]:
        """The texts of those versions of the owner (None: every version it has)."""
        return (await self._bus.request(self._subject("texts"), TextsRequest(
            owner=owner, memory_ids=memory_ids), Texts)).items

    async def subject(self, target: SubjectTarget) -> SubjectCount:
        """An erasure's subject: its versions counted, or (`target.erase`) deleted."""
        return await self._bus.request(self._subject("subject"), target, SubjectCount)

    async def reap(self, command: StoreReap, *, timeout: float) -> Reaped:
        """What retention allows no longer, deleted (the file rewritten: a long wait)."""
        return await self._bus.request(self._subject("reap"), command, Reaped, timeout=timeout)
