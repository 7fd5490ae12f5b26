"""The cluster actor: answers the operator's `GET /api/admin/cluster` from the leases, homes and
standbys buckets (`cluster.ownership`, `cluster.replication`). Stateless, in the `front`;
reads, never writes, the buckets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError

from memgate.bus.subjects import Admin
from memgate.cluster.lease import BUCKET, holder
from memgate.cluster.ownership import HOMES, home_of
from memgate.cluster.replication import STANDBYS, in_sync, standby_lag
from memgate.contracts.cluster import ClusterStatus, StandbyLag, StoreOwner
from memgate.ports.bus import Requester
from memgate.contracts.reply import Envelope
from memgate.runtime.actor import ActorBase, Endpoint, Operator


LAG_TIMEOUT_S = 1.0  # an owner that does not say its standbys' lag by then is shown without


class ClusterActor(ActorBase):
    name = "cluster"

    def __init__(self, *, js: Callable[[], JetStreamContext], bus: Requester, names: list[str],
                 admin_token: Callable[[], str]) -> None:
        self._js = js  # the connection opens after the actors are made
        self._bus = bus
        self._names = names  # every single-writer actor of the deployment
        self._operator = Operator(admin_token)

    async def start(self) -> None:
        self._operator.load()

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint(Admin.CLUSTER_STATUS, self._operator.only(self.status),
                         queue=self.name)]

    async def status(self, envelope: Envelope) -> ClusterStatus:
        js = self._js()
        try:
            homes, leases = await js.key_value(HOMES), await js.key_value(BUCKET)
        except BucketNotFoundError:  # nothing has claimed a store yet
            return ClusterStatus(nodes=[], stores=[StoreOwner(name=n) for n in self._names])
        try:
            standbys = await js.key_value(STANDBYS)
        except BucketNotFoundError:  # nothing is replicated: one node
            standbys = None
        # each owner's view of its standbys' lag, asked together
        lags = await asyncio.gather(*(self._lag(name) for name in self._names)) \
            if standbys is not None else [None] * len(self._names)
        stores = []
        for name, lag in zip(self._names, lags, strict=True):
            home, lease = await home_of(homes, name), await holder(leases, name)
            synced = None if standbys is None else await in_sync(standbys, name)
            stores.append(StoreOwner(
                name=name, home=None if home is None else home.get("node"),
                served_by=None if lease is None else lease.node,
                epoch=None if lease is None else lease.epoch,
                in_sync=synced.nodes if synced and lease and synced.epoch == lease.epoch else [],
                standbys=lag))
        nodes = sorted({n for s in stores for n in (s.home, s.served_by) if n is not None})
        return ClusterStatus(nodes=nodes, stores=stores)

    async def _lag(self, name: str) -> list[StandbyLag] | None:
        return await standby_lag(self._bus, name, timeout_s=LAG_TIMEOUT_S)


__all__ = ["ClusterActor"]
