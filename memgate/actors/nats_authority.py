"""The NATS authority: keeps the embedded nats-server's users in step with the directory.

It lives in the process that owns the embedded server. The directory asks it to reload after
every change of agent NATS credentials, and it answers once the server has applied them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from memgate.runtime.actor import ActorBase, Endpoint
from memgate.bus import BusClient, EmbeddedNats, parse, subjects
from memgate.bus.server import AgentKey, Login, server_config
from memgate.contracts import Done, NatsAgents
from memgate.contracts.errors import UnavailableError
from memgate.ports.directory import BusDirectory


# At start the directory may not listen yet, or (in a cluster) be moving to another node, which
# takes up to a lease's TTL and a restarting owner's grace: ask again every 50 ms for 60 s.
SYNC_WITHIN_S = 60.0
SYNC_RETRY_S = 0.05


class NatsAuthorityActor(ActorBase):
    name = "nats-authority"

    def __init__(self, *, server: EmbeddedNats, bus: BusClient, logins: Sequence[Login]) -> None:
        self._server = server
        self._directory = BusDirectory(bus)
        self._logins = tuple(logins)  # the internal users, kept in every configuration

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint(subjects.NATS_RELOAD, self.reload)]

    async def apply(self, agents: NatsAgents) -> None:
        keys = [AgentKey(a.public_key, a.inbox_prefix) for a in agents.agents]
        await self._server.reload(server_config(self._logins, keys))

    async def reload(self, payload: bytes) -> Done:
        await self.apply(parse(NatsAgents, payload))
        return Done()

    async def sync(self, within_s: float = SYNC_WITHIN_S) -> None:
        """At start: load the agents the directory already knows (waiting for it to listen)."""
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            try:
                agents = await self._directory.nats_agents()
                break
            except UnavailableError:
                if asyncio.get_running_loop().time() >= deadline:
                    raise
                await asyncio.sleep(SYNC_RETRY_S)
        await self.apply(agents)
