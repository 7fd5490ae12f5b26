"""The reaper actor: retention (SPEC §3.9, §5.1). It owns nothing and decides nothing alone.

A sweep reads every workspace's retentionDays from the directory and asks each partition's
storage actor to reap at the reaper's `now` (`mem.int.store.<p>.reap`): the storage actor, the
file's single writer, deletes in one transaction what is past its `expires_at` or older than its
workspace's retentionDays, and what derives from it (`derived_from`), never a record on legal
hold; it queues the same `MemoriesDeleted` events as a forget (so the indexer and embedder drop
them), and answers only once its file is rewritten without them. So a sweep is idempotent, and
reapers in several processes may race: the second finds nothing.

Memories citing a deleted document or collection are purged by the storage actors themselves,
as the registry's events arrive (their durable `storage-<p>-cascade` consumers).

A sweep runs every `interval_s` (the first `first_sweep_s` after start, once the other actors
serve), and at once on request (`mem.int.reaper.sweep`: the directory asks when an owner changes
retentionDays). The clock is injected (`now`): tests move time, they never wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from memgate.bus import subjects
from memgate.contracts.internal import Reaped, StoreReap
from memgate.ports.bus import Requester
from memgate.ports.directory import BusDirectory
from memgate.ports.storage import PartitionStorage
from memgate.runtime.actor import ActorBase, Endpoint
from memgate.tasks import cancelled

log = logging.getLogger("memgate.reaper")

# The first sweep waits this long after start: the actors of the other processes (and of this
# one: brokers start after every actor) are serving by then.
FIRST_SWEEP_S = 10.0
# A reap deletes, then waits for its file's rewrite: longer than an ordinary request.
REAP_TIMEOUT_S = 300.0


def utc_now() -> datetime:
    return datetime.now(UTC)


class ReaperActor(ActorBase):
    name = "reaper"

    def __init__(self, *, bus: Requester, partitions: int, interval_s: float,
                 now: Callable[[], datetime] = utc_now,
                 first_sweep_s: float = FIRST_SWEEP_S) -> None:
        self._directory = BusDirectory(bus)
        self._partitions = [f"p{i}" for i in range(partitions)]
        self._storage = {p: PartitionStorage(bus, p) for p in self._partitions}
        self._count = partitions
        self._interval = interval_s
        self._first = first_sweep_s
        self._now = now
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._schedule(), name=self.name)

    async def stop(self) -> None:
        await cancelled(self._task)

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint(subjects.REAPER_SWEEP, self.on_sweep)]

    async def on_sweep(self, payload: bytes) -> Reaped:
        return Reaped(deleted=await self.sweep())

    async def sweep(self) -> int:
        """Reap every partition at `now()`: how many versions were deleted."""
        now = self._now()
        retention = await self._directory.retention()
        by_partition: dict[str, dict[str, int]] = {p: {} for p in self._partitions}
        for workspace_id, days in retention.items():
            by_partition[subjects.partition_of(workspace_id, self._count)][workspace_id] = days
        reaped = await asyncio.gather(*(
            self._storage[partition].reap(
                StoreReap(now=now, retention_days=by_partition[partition]),
                timeout=REAP_TIMEOUT_S)
            for partition in self._partitions))
        deleted = sum(r.deleted for r in reaped)
        if deleted:
            log.info("reaper: %d memory versions past retention deleted", deleted)
        return deleted

    async def _schedule(self) -> None:
        await asyncio.sleep(self._first)
        while True:
            try:
                await self.sweep()
            except Exception as exc:  # the next sweep retries; the type only, never content
                log.warning("reaper: a sweep failed (%s)", type(exc).__name__)
            await asyncio.sleep(self._interval)
