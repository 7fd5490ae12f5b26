"""`cluster.fence`: a writer thread's commits are refused once the lease of the store it writes
is given up, and only then: a store handed over (a drain's step-down) fences its own writes, not
those of the other stores of its process. Real `PartitionLease`s on a real nats-server's KV."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from memgate.bus.server import EmbeddedNats
from memgate.cluster import fence
from memgate.cluster.lease import LeaseLostError, PartitionLease, lease_bucket
from memgate.runtime.actor import Serial
from tests.conftest import close_nats


@pytest.fixture
async def leases(tmp_path: Path) -> AsyncIterator[list[PartitionLease]]:
    async with EmbeddedNats(tmp_path / "nats") as server:
        nc = await nats.connect(server.url)
        kv = await lease_bucket(nc.jetstream())
        held = [PartitionLease(kv, name, "n1") for name in ("storage.p0", "indexer.p0")]
        for lease in held:
            assert await lease.acquire() is not None
            fence.hold(lease)
        try:
            yield held
        finally:
            for lease in held:
                fence.drop(lease)
                await lease.release()
            await close_nats(nc)


async def test_a_store_given_up_fences_its_own_writer_threads_only(
        leases: list[PartitionLease]) -> None:
    storage, indexer = leases
    writers = {name: Serial(name) for name in ("storage.p0", "indexer.p0.commit",
                                                   "recall.model")}
    try:
        await storage.step_down()

        with pytest.raises(LeaseLostError):
            await writers["storage.p0"](lambda: None)
        assert await writers["indexer.p0.commit"](lambda: "written") == "written"
        assert await writers["recall.model"](lambda: "run") == "run"  # no store: no lease
        with pytest.raises(LeaseLostError):  # a thread that names no store: every lease
            fence.check()
        assert indexer.valid()
    finally:
        for writer in writers.values():
            writer.shutdown()
