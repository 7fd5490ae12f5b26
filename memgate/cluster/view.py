"""The operator's view of a cluster (SPEC §6), the same for `GET /api/admin/cluster` and
`memgate cluster status`: each store's home, the node and process serving it and under which
epoch, the nodes the standbys bucket records in sync, each standby's lag as its owner says, and
each node's server as JetStream sees it. Reads the leases, homes and standbys buckets; writes
nothing.

It is asked exactly when something is wrong, so it answers whatever it can read: each read is
bounded (`READ_TIMEOUT_S`), and what could not be read (a bucket whose leader is being elected
after a node was killed) is shown as unknown and named in `degraded`, never raised."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError, NoKeysError, NotFoundError
from nats.js.kv import KeyValue

from memgate.cluster.lease import BUCKET, Lease, holder
from memgate.cluster.ownership import HOMES, home_of
from memgate.cluster.replication import STANDBYS, InSync, in_sync
from memgate.contracts.cluster import ClusterStatus, ServerState, StandbyLag, StoreOwner

Lagging = Callable[[str], Awaitable[list[StandbyLag] | None]]
T = TypeVar("T")

READ_TIMEOUT_S = 2.0  # one read of a bucket; they run together, so the view takes about this


class _Reads:
    """Bounded reads; each one that fails or times out is named once in `degraded`."""

    def __init__(self) -> None:
        self.degraded: list[str] = []

    async def __call__(self, what: str, read: Awaitable[T], fallback: T) -> T:
        try:
            return await asyncio.wait_for(read, READ_TIMEOUT_S)
        except (TimeoutError, nats.errors.Error):
            if what not in self.degraded:
                self.degraded.append(what)
            return fallback


async def cluster_view(js: JetStreamContext, names: list[str] | None, lag: Lagging,
                       ) -> ClusterStatus:
    """`names` (None: every store that has a home), each with what `lag(name)` says of its
    standbys, asked together."""
    read = _Reads()
    # a bucket not found: nothing has claimed a store yet, or nothing is replicated (standbys)
    homes, leases, standbys = await asyncio.gather(
        *(read(bucket, _bucket(js, bucket), None) for bucket in (HOMES, BUCKET, STANDBYS)))
    if names is None:
        names = sorted(await read(HOMES, _keys(homes), [])) if homes is not None else []
    servers, lags = await asyncio.gather(read("servers", _servers(js), []), asyncio.gather(
        *(read(f"lag of {name}", lag(name), None) if standbys is not None else _no_lag()
          for name in names)))
    stores = await asyncio.gather(*(
        _store(read, name, homes, leases, standbys, lagging)
        for name, lagging in zip(names, lags, strict=True)))
    nodes = sorted({n for s in stores for n in (s.home, s.served_by) if n is not None}
                   | {s.name for s in servers})
    return ClusterStatus(nodes=nodes, stores=list(stores), servers=servers,
                         degraded=read.degraded)


async def _store(read: _Reads, name: str, homes: KeyValue | None, leases: KeyValue | None,
                 standbys: KeyValue | None, lagging: list[StandbyLag] | None) -> StoreOwner:
    home, lease, synced = await asyncio.gather(
        read(HOMES, home_of(homes, name), None) if homes else _none(dict[str, str]),
        read(BUCKET, holder(leases, name), None) if leases else _none(Lease),
        read(STANDBYS, in_sync(standbys, name), None) if standbys else _none(InSync))
    return StoreOwner(
        name=name, home=None if home is None else home.get("node"),
        served_by=None if lease is None else lease.node,
        epoch=None if lease is None else lease.epoch,
        process=None if lease is None else
        f"{lease.about.get('host', '?')}:{lease.about.get('pid', '?')}",
        in_sync=synced.nodes if synced and lease and synced.epoch == lease.epoch else [],
        kept=synced.kept if synced and (lease is None or synced.epoch == lease.epoch) else [],
        standbys=lagging)


async def _none(_: type[T]) -> T | None:
    return None


async def _no_lag() -> list[StandbyLag] | None:
    return None


async def _bucket(js: JetStreamContext, name: str) -> KeyValue | None:
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        return None


async def _keys(kv: KeyValue) -> list[str]:
    try:
        return list(await kv.keys())
    except NoKeysError:
        return []


async def _servers(js: JetStreamContext) -> list[ServerState]:
    """The leases bucket's peers: every node's server once the bucket has its copies there."""
    try:
        cluster = (await js.stream_info(f"KV_{BUCKET}")).cluster
    except NotFoundError:  # no lease claimed yet
        return []
    if cluster is None or cluster.leader is None:
        return [] if cluster is None else [
            ServerState(name=p.name, up=False) for p in cluster.replicas or [] if p.name]
    return sorted([ServerState(name=cluster.leader, up=True, leader=True),
                   *(ServerState(name=p.name, up=bool(p.current) and not p.offline)
                     for p in cluster.replicas or [] if p.name)], key=lambda s: s.name)


__all__ = ["cluster_view"]
