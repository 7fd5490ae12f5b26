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
from nats.js.errors import KeyWrongLastSequenceError

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


@pytest.mark.parametrize("in_sync", [
    # its owner (node a, whose disk is lost) recorded it out of sync
    replication.InSync(epoch=3, nodes=[]),
    # or named node b in sync with another disk: b's data directory was made afresh since
    replication.InSync(epoch=3, nodes=["b"], disks={"b": "disk-b-before"})],
    ids=["out-of-sync", "another-disk"])
async def test_a_copy_not_in_sync_is_kept_while_nobody_serves_the_store(
        tmp_path: Path, js: JetStreamContext, in_sync: replication.InSync) -> None:
    path = a_copy(tmp_path / "b", rows=94)
    # nobody holds the lease
    await record(js, epoch=3, nodes=[], home={"node": "a", "disk": "disk-a"})
    await (await replication.standbys_bucket(js)).put(STORE, in_sync.to_json())
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


@pytest.mark.parametrize(("in_sync", "rows"), [
    # the owner's last word: b (this disk) is in sync
    (replication.InSync(epoch=3, nodes=["b"], disks={"b": HOME["disk"]}), 685),
    # or was, until it died: its owner, left with no standby, acknowledged nothing since
    (replication.InSync(epoch=3, nodes=[], kept=["b"], disks={"b": HOME["disk"]}), 685),
    # a store that never wrote a file (the keys before a first personal field): nothing to
    # copy, and in sync all the same (in the lost-disk round it was served by nobody)
    (replication.InSync(epoch=3, nodes=["b"], disks={"b": HOME["disk"]}), None),
    # a record made before disks were named
    (replication.InSync(epoch=3, nodes=["b"]), 685)],
    ids=["in-sync", "kept", "no-file", "no-disks"])
async def test_a_copy_in_sync_is_kept_and_promoted_after_its_process_was_killed(
        tmp_path: Path, js: JetStreamContext,
        in_sync: replication.InSync, rows: int | None) -> None:
    path = a_copy(tmp_path / "b", rows=rows) if rows is not None else tmp_path / "b" / FILE
    (tmp_path / "b").mkdir(exist_ok=True)
    await record(js, epoch=in_sync.epoch, nodes=in_sync.nodes, home=HOME)
    await (await replication.standbys_bucket(js)).put(STORE, in_sync.to_json())
    became: list[str] = []
    standby = await started(tmp_path / "b", js, became)
    try:
        async def promoted() -> bool:
            return became == [STORE]

        await eventually(promoted, timeout=10)
        assert held(path) == rows if rows is not None else not path.exists()
    finally:
        await standby.stop()


async def test_an_empty_data_directory_is_not_the_copy_its_node_kept(
        tmp_path: Path, js: JetStreamContext) -> None:
    """Node b started again on a data directory made afresh (another disk) is named in sync
    under the disk it had: it holds nothing, and is never promoted."""
    (tmp_path / "b").mkdir()
    await record(js, epoch=3, nodes=["b"], home={"node": "a", "disk": "disk-a"})
    await (await replication.standbys_bucket(js)).put(STORE, replication.InSync(
        epoch=3, nodes=["b"], disks={"b": "disk-b-before"}).to_json())
    became: list[str] = []
    standby = await started(tmp_path / "b", js, became)
    try:
        await asyncio.sleep(8 * replication.WATCH_EVERY_S)
        assert became == []
    finally:
        await standby.stop()


class HeldLease:
    """The owner's lease as the record's writer reads it: held, under `epoch`."""

    def __init__(self, epoch: int) -> None:
        self.lease = type("Lease", (), {"epoch": epoch})()
        self.node = "a"

    def check(self) -> None:
        return None


async def test_an_owners_in_sync_record_never_overwrites_another_owners(
        tmp_path: Path, js: JetStreamContext) -> None:
    """The record an owner writes is on its own last one (compare-and-set): an owner that
    does not know it was replaced (paused past its lease, its clock not yet past it) cannot
    name its standbys in sync over the new owner's record. Before, a blind put."""
    kv = await replication.standbys_bucket(js)
    old = replication.Primary(STORE, lease=HeldLease(3), bus=NobodyAnswers(),  # type: ignore[arg-type]
                              kv=kv, homes=await homes_bucket(js), data_dir=tmp_path)
    await old.record()
    # a new owner, epoch 4, records its own standbys
    await kv.put(STORE, replication.InSync(epoch=4, nodes=["c"]).to_json())
    old._in_sync.add("b")
    with pytest.raises(KeyWrongLastSequenceError):
        await old.record()
    assert await replication.in_sync(kv, STORE) == replication.InSync(epoch=4, nodes=["c"])


async def test_an_owner_that_lost_its_last_standby_keeps_it_named_until_another_is_in_sync(
        tmp_path: Path, js: JetStreamContext) -> None:
    """Its last in-sync standby gone (a batch unanswered), an owner acknowledges nothing more
    (503 before a write, 504 for the batch in flight), so that standby's copy still holds every
    acknowledged write: the record keeps it promotable (`kept`) until a standby is in sync
    again. Before, it was recorded out, and its owner's disk lost next, no copy was left to
    promote (issue 47's lost-disk round: `not within 150 s` here)."""
    kv = await replication.standbys_bucket(js)
    owner = replication.Primary(STORE, lease=HeldLease(3), bus=NobodyAnswers(),  # type: ignore[arg-type]
                                kv=kv, homes=await homes_bucket(js), data_dir=tmp_path)
    owner._followers["b"] = replication._Follower("b", HOME, after=0, waiting=None)
    owner._in_sync.add("b")
    await owner.record()
    with pytest.raises(UnavailableError):  # b does not answer: 504 to the job's caller
        await owner.ship(1, [(FILE, [("INSERT INTO acknowledged VALUES (1)", [])])])
    assert await replication.in_sync(kv, STORE) == replication.InSync(
        epoch=3, nodes=[], kept=["b"], disks={"b": HOME["disk"]})
    # c copies the store and is in sync: from here on the owner acknowledges without b
    owner._followers["c"] = replication._Follower("c", {"node": "c", "disk": "disk-c"},
                                                   after=1, waiting=None)
    owner._in_sync.add("c")
    await owner.record()
    assert await replication.in_sync(kv, STORE) == replication.InSync(
        epoch=3, nodes=["c"], disks={"c": "disk-c"})


async def test_the_cluster_view_names_the_copy_kept_when_its_owner_is_gone(
        tmp_path: Path, js: JetStreamContext) -> None:
    """What an operator looks at when a node is lost: the copy that will be promoted, though
    no batch reaches it (`kept`), is named; nobody serves the store."""
    from memgate.cluster.view import cluster_view

    await record(js, epoch=3, nodes=[], home={"node": "a", "disk": "disk-a"})
    await (await replication.standbys_bucket(js)).put(STORE, replication.InSync(
        epoch=3, nodes=[], kept=["b"], disks={"b": HOME["disk"]}).to_json())

    async def no_lag(name: str) -> None:
        return None

    [store] = (await cluster_view(js, [STORE], no_lag)).stores
    assert (store.home, store.served_by, store.in_sync, store.kept) == ("a", None, [], ["b"])
