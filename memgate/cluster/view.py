"""The operator's view of a cluster (SPEC §6), the same for `GET /api/admin/cluster` and
`memgate cluster status`: each store's home, the node and process serving it and under which
epoch, the nodes the standbys bucket records in sync, and each standby's lag as its owner says.
Reads the leases, homes and standbys buckets; writes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import nats.js.errors
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError

from memgate.cluster.lease import BUCKET, holder
from memgate.cluster.ownership import HOMES, home_of
from memgate.cluster.replication import STANDBYS, in_sync
from memgate.contracts.cluster import ClusterStatus, StandbyLag, StoreOwner

Lagging = Callable[[str], Awaitable[list[StandbyLag] | None]]


async def cluster_view(js: JetStreamContext, names: list[str] | None, lag: Lagging,
                       ) -> ClusterStatus:
    """`names` (None: every store that has a home), each with what `lag(name)` says of its
    standbys, asked together."""
    try:
        homes, leases = await js.key_value(HOMES), await js.key_value(BUCKET)
    except BucketNotFoundError:  # nothing has claimed a store yet
        return ClusterStatus(nodes=[], stores=[StoreOwner(name=n) for n in names or []])
    if names is None:
        try:
            names = sorted(await homes.keys())
        except nats.js.errors.NoKeysError:
            names = []
    try:
        standbys = await js.key_value(STANDBYS)
    except BucketNotFoundError:  # nothing is replicated: one node
        standbys = None
    lags = await asyncio.gather(*(lag(name) for name in names)) \
        if standbys is not None else [None] * len(names)
    stores = []
    for name, lagging in zip(names, lags, strict=True):
        home, lease = await home_of(homes, name), await holder(leases, name)
        synced = None if standbys is None else await in_sync(standbys, name)
        stores.append(StoreOwner(
            name=name, home=None if home is None else home.get("node"),
            served_by=None if lease is None else lease.node,
            epoch=None if lease is None else lease.epoch,
            process=None if lease is None else
            f"{lease.about.get('host', '?')}:{lease.about.get('pid', '?')}",
            in_sync=synced.nodes if synced and lease and synced.epoch == lease.epoch else [],
            standbys=lagging))
    nodes = sorted({n for s in stores for n in (s.home, s.served_by) if n is not None})
    return ClusterStatus(nodes=nodes, stores=stores)


__all__ = ["cluster_view"]
