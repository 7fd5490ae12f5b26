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


# At start the directory may not listen yet: ask again for up to 100 × 50 ms = 5 s.
SYNC_ATTEMPTS = 100
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

    async def sync(self, attempts: int = SYNC_ATTEMPTS) -> None:
        """At start: load the agents the directory already knows (waiting for it to listen)."""
        for _ in range(attempts - 1):
            try:
                agents = await self._directory.nats_agents()
                break
            except UnavailableError:
                await asyncio.sleep(SYNC_RETRY_S)
        else:
            agents = await self._directory.nats_agents()
        await self.apply(agents)
