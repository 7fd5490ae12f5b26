"""The operator's cluster commands. `memgate cluster status`: each store's owner and its
standbys' lag (`cluster.view`). `memgate cluster drain NODE`: every store NODE serves handed
over to an in-sync standby on another node (`cluster.replication.Primary.drain`) before NODE is
stopped: every home moves first, then each owner gives its lease up.

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
from memgate.cluster.balance import drained_bucket
from memgate.cluster.lease import holder, lease_bucket
from memgate.cluster.ownership import cluster_status
from memgate.cluster.replication import Drain, Drained, follows, movable, standby_lag
from memgate.cluster.view import cluster_view
from memgate.contracts.cluster import ClusterStatus, StandbyLag
from memgate.contracts.errors import MemgateError

WAIT_EVERY_S = 0.2


class _Logins:
    """A connection per actor kind, with that kind's internal login, opened when first used."""

    def __init__(self, settings: Settings) -> None:
        self._logins = internal_logins(settings)
        self._url = nats_of(settings.data_dir)
        self._connections: dict[str, Client] = {}

    async def __call__(self, kind: str) -> Client:
        if kind not in self._connections:
            login = self._logins[kind]
            self._connections[kind] = await nats.connect(
                self._url, user=login.user, password=login.password,
                inbox_prefix=inbox_prefix(kind), connect_timeout=5, max_reconnect_attempts=0)
        return self._connections[kind]

    async def close(self) -> None:
        for nc in self._connections.values():
            await nc.close()


async def status(settings: Settings) -> ClusterStatus:
    """Every store that has a home, and what its owner says of its standbys' lag."""
    connection = _Logins(settings)
    try:
        async def lag(name: str) -> list[StandbyLag] | None:
            return await standby_lag(BusClient(await connection(kind_of(name))), name)

        return await cluster_view((await connection("storage")).jetstream(timeout=10), None, lag)
    finally:
        await connection.close()


async def drain(settings: Settings, node: str, *, timeout_s: float,
                say: Callable[[str], None]) -> list[str]:
    """Drain `node`; the replicated stores it still serves afterwards."""
    connection = _Logins(settings)
    left: list[str] = []
    try:
        js = (await connection("storage")).jetstream(timeout=10)
        served = [o.name for o in await cluster_status(js) if o.owner and o.owner.node == node]
        served.sort(key=lambda name: follows(name) is not None)  # derived: after their partitions
        say(f"memgate: {node} serves {len(served)} stores")
        # from now on it pulls none back (its stores run there as standbys), until started again
        await (await drained_bucket(js, replicas=settings.stream_replicas())).put(node, b"1")
        leases = await lease_bucket(js)

        async def ask(name: str, *, step_down: bool) -> Drained | None:
            try:
                return await BusClient(await connection(kind_of(name)), timeout=10).request(
                    subjects.replica(f"{name}.drain"), Drain(step_down=step_down), Drained)
            except MemgateError as refused:
                say(f"  {name}: refused: {refused}")
                return None

        # first every home moves (nothing is handed over yet), then each owner steps down: a
        # store handed over stops alone, and its standby finds none of the others homed here
        moving: dict[str, tuple[float, Drained]] = {}
        for name in served:
            if not movable(name):  # its files stay on this node's disk
                say(f"  {name}: stays (not replicated: served again when {node} is back)")
                continue
            started = time.monotonic()
            if (answer := await ask(name, step_down=False)) is not None:
                moving[name] = started, answer
            else:
                left.append(name)
        for name, (started, answer) in moving.items():
            now = await holder(leases, name)
            if now is not None and now.node == node:  # refused: it may be stepping down
                await ask(name, step_down=True)  # by itself (`Primary.follow`): wait and see
            while (now := await holder(leases, name)) is None or now.node == node:
                if time.monotonic() - started > timeout_s:
                    break
                await asyncio.sleep(WAIT_EVERY_S)
            moved = now is not None and now.node != node
            say(f"  {name}: {'moved to ' + now.node if moved and now else 'did not move'}"
                f" ({time.monotonic() - started:.1f} s; handed to {answer.to})")
            if not moved:
                left.append(name)
    finally:
        await connection.close()
    return left


__all__ = ["drain", "status"]
