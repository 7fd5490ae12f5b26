"""No copy of a store is deleted while it may be the newest one left (issue 47), on a real
nats-server (the leases, in-sync records and homes in its JetStream buckets) with a real DuckDB
copy on disk. A standby's process starts again after a kill (no mark of a clean stop):

- its copy, not named in sync, is kept, unserved and never promoted, while nobody serves the
  store (its owner's disk may be the one lost), and deleted once another node serves it;
- its copy, named in sync, is promoted when nobody serves the store.

Before, both copies were deleted as the process started: in the lost-disk round, twice every
acknowledged write of `storage.p0`, once the six internal stores, were gone from every disk."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import nats
import pytest
from nats.js.client import JetStreamContext

from memgate.bus.server import EmbeddedNats
from memgate.cluster import replication
from memgate.cluster.lease import PartitionLease, lease_bucket
from memgate.cluster.ownership import homes_bucket
from memgate.contracts.base import Contract
from memgate.contracts.errors import UnavailableError
from tests.conftest import close_nats, eventually

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")
STORE, FILE = "registry", "registry.duckdb"
HOME = {"node": "b", "disk": "disk-b"}


class NobodyAnswers:
    """The bus of a node whose peers are gone: every request unanswered (a join finds no
    owner to copy from)."""

    async def request(self, subject: str, payload: Contract | bytes, result_type: type[T], *,
                      timeout: float | None = None) -> T:
        raise UnavailableError("no responders")


@pytest.fixture
async def js(tmp_path: Path) -> AsyncIterator[JetStreamContext]:
    async with EmbeddedNats(tmp_path / "nats") as server:
        nc = await nats.connect(server.url)
        try:
            yield nc.jetstream()
        finally:
            await close_nats(nc)


def a_copy(data_dir: Path, rows: int) -> Path:
    """A store's file as a standby left it when it was killed: committed rows, no mark."""
    data_dir.mkdir(parents=True, exist_ok=True)
    db = duckdb.connect(str(data_dir / FILE))
    db.execute("CREATE TABLE acknowledged (n INTEGER)")
    db.execute("INSERT INTO acknowledged SELECT range FROM range(?)", [rows])
    db.close()
    return data_dir / FILE


def held(path: Path) -> int:
    db = duckdb.connect(str(path), read_only=True)
    try:
        return int(db.execute("SELECT count(*) FROM acknowledged").fetchone()[0])  # type: ignore[index]
    finally:
        db.close()


async def started(data_dir: Path, js: JetStreamContext, became: list[str]) -> replication.Standby:
    async def become() -> None:
        became.append(STORE)

    standby = replication.Standby(STORE, node="b", bus=NobodyAnswers(), js=lambda: js,
                                  data_dir=data_dir, become=become, disk_home=HOME)
    await standby.start()
    return standby


async def record(js: JetStreamContext, epoch: int, nodes: list[str], home: dict[str, Any]) -> None:
    await (await replication.standbys_bucket(js)).put(
        STORE, replication.InSync(epoch=epoch, nodes=nodes).to_json())
    await (await homes_bucket(js)).put(STORE, json.dumps(home).encode())


async def test_a_copy_not_in_sync_is_kept_while_nobody_serves_the_store(
        tmp_path: Path, js: JetStreamContext) -> None:
    path = a_copy(tmp_path / "b", rows=94)
    # its owner (node a, whose disk is lost) recorded it out of sync; nobody holds the lease
    await record(js, epoch=3, nodes=[], home={"node": "a", "disk": "disk-a"})
    became: list[str] = []
    standby = await started(tmp_path / "b", js, became)
    try:
        await asyncio.sleep(12 * replication.WATCH_EVERY_S)
        assert path.exists() and held(path) == 94
        assert became == []  # never promoted: it may lack what its owner acknowledged later

        # another node serves the store: the copy is stale for sure, and deleted
        lease = PartitionLease(await lease_bucket(js), STORE, "c")
        assert await lease.acquire() is not None

        async def deleted() -> bool:
            return not path.exists()

        await eventually(deleted, timeout=10)
        assert became == []
    finally:
        await standby.stop()


async def test_a_copy_in_sync_is_kept_and_promoted_after_its_process_was_killed(
        tmp_path: Path, js: JetStreamContext) -> None:
    path = a_copy(tmp_path / "b", rows=685)
    await record(js, epoch=3, nodes=["b"], home=HOME)  # the owner's last word: b is in sync
    became: list[str] = []
    standby = await started(tmp_path / "b", js, became)
    try:
        async def promoted() -> bool:
            return became == [STORE]

        await eventually(promoted, timeout=10)
        assert held(path) == 685
    finally:
        await standby.stop()
