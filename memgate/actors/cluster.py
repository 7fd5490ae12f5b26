"""The cluster actor: answers the operator's `GET /api/admin/cluster` (`cluster.view`).
Stateless, in the `front`; reads, never writes, the buckets."""

from __future__ import annotations

from collections.abc import Callable

from nats.js.client import JetStreamContext

from memgate.bus.subjects import Admin
from memgate.cluster.replication import standby_lag
from memgate.cluster.view import cluster_view
from memgate.contracts.cluster import ClusterStatus, StandbyLag
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
        return await cluster_view(self._js(), self._names, self._lag)

    async def _lag(self, name: str) -> list[StandbyLag] | None:
        return await standby_lag(self._bus, name, timeout_s=LAG_TIMEOUT_S)


__all__ = ["ClusterActor"]
