"""`memgate cluster drain NODE`: every store NODE serves handed over to an in-sync standby on
another node (`cluster.replication.Primary.drain`), one after another, before NODE is stopped.

Each store is asked on its own kind's login (only a kind's processes talk to its owner), and
the drain waits until another node holds the store's lease. The stores that do not move (the
keys and the audit log keep their files on their home) are named, and stay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import nats
from nats.aio.client import Client

from memgate.app.datadir import nats_of
from memgate.app.logins import internal_logins
from memgate.app.settings import Settings
from memgate.bus import BusClient, subjects
from memgate.bus.logins import inbox_prefix, kind_of
from memgate.cluster.lease import holder, lease_bucket
from memgate.cluster.ownership import cluster_status
from memgate.cluster.replication import Drained, movable, rebuilt
from memgate.contracts.errors import MemgateError

WAIT_EVERY_S = 0.2


async def drain(settings: Settings, node: str, *, timeout_s: float,
                say: Callable[[str], None]) -> list[str]:
    """Drain `node`; the replicated stores it still serves afterwards."""
    logins = internal_logins(settings)
    url = nats_of(settings.data_dir)
    connections: dict[str, Client] = {}

    async def connection(kind: str) -> Client:
        if kind not in connections:
            login = logins[kind]
            connections[kind] = await nats.connect(
                url, user=login.user, password=login.password, inbox_prefix=inbox_prefix(kind),
                connect_timeout=5, max_reconnect_attempts=0)
        return connections[kind]

    left = []
    try:
        js = (await connection("storage")).jetstream(timeout=10)
        served = [o.name for o in await cluster_status(js) if o.owner and o.owner.node == node]
        served.sort(key=rebuilt)  # the derived stores move after their partitions
        say(f"memgate: {node} serves {len(served)} stores")
        leases = await lease_bucket(js)
        for name in served:
            current = await holder(leases, name)
            if current is None or current.node != node:
                say(f"  {name}: already moved")
                continue
            if not movable(name):  # its files stay on this node's disk
                say(f"  {name}: stays (not replicated: served again when {node} is back)")
                continue
            started = time.monotonic()
            try:
                answer = await BusClient(await connection(kind_of(name)), timeout=10).request(
                    subjects.replica(f"{name}.drain"), b"{}", Drained)
            except MemgateError as refused:
                say(f"  {name}: refused: {refused}")
                left.append(name)
                continue
            while (now := await holder(leases, name)) is None or now.node == node:
                if time.monotonic() - started > timeout_s:
                    break
                await asyncio.sleep(WAIT_EVERY_S)
            moved = now is not None and now.node != node
            say(f"  {name}: {'moved to ' + now.node if moved and now else 'did not move'}"
                f" ({time.monotonic() - started:.1f} s; home {answer.to})")
            if not moved:
                left.append(name)
    finally:
        for nc in connections.values():
            await nc.close()
    return left


__all__ = ["drain"]
