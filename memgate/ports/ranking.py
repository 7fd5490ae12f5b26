"""Recall's ranking channels: BM25 (the indexers) and cosine (the embedders), per partition."""

from __future__ import annotations

from typing import Protocol

from memgate.bus import subjects
from memgate.contracts.erasure import Drop, SubjectCount
from memgate.contracts.internal import RankRequest, Ranking
from memgate.ports.bus import Requester


class Rankers(Protocol):
    async def bm25(self, request: RankRequest) -> Ranking:
        """The allowed versions that match the query's words, best first (and their
        neighbours, when the request asks)."""
        ...

    async def cosine(self, request: RankRequest) -> Ranking:
        """The allowed versions that have vectors, most similar to `request.vector` first."""
        ...

    async def drop(self, drop: Drop) -> list[SubjectCount]:
        """`drop.memory_ids` gone from both channels (the index and the vectors) once this
        returns, with each channel's answer; idempotent with the events that drop them too."""
        ...


class BusRankers:
    """`Rankers` over the bus, each request to the partition that owns the workspace."""

    def __init__(self, bus: Requester, *, partitions: int) -> None:
        self._bus = bus
        self._partitions = partitions

    async def bm25(self, request: RankRequest) -> Ranking:
        partition = subjects.partition_of(request.filters.owner.tenant, self._partitions)
        return await self._bus.request(subjects.index(partition, "rank"), request, Ranking)

    async def cosine(self, request: RankRequest) -> Ranking:
        partition = subjects.partition_of(request.filters.owner.tenant, self._partitions)
        return await self._bus.request(subjects.embed(partition, "rank"), request, Ranking)

    async def drop(self, drop: Drop) -> list[SubjectCount]:
        partition = subjects.partition_of(drop.owner.tenant, self._partitions)
        return [await self._bus.request(subjects.index(partition, "drop"), drop, SubjectCount),
                await self._bus.request(subjects.embed(partition, "drop"), drop, SubjectCount)]
