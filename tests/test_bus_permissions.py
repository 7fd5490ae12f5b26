"""The embedded bus only lets agents in through the front door (SPEC §3.1, §6)."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from memgate.bus import MemgateClient
from tests.conftest import ADMIN_TOKEN, Memgate


class Violations:
    """Collects the server's permission errors for one connection."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.changed = asyncio.Event()

    async def callback(self, error: Exception) -> None:
        self.seen.append(str(error))
        self.changed.set()

    async def wait_for(self, fragment: str) -> None:
        while not any(fragment.lower() in seen.lower() for seen in self.seen):
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 5)


async def connect_agent(memgate: Memgate, violations: Violations) -> tuple[NATS, dict[str, Any]]:
    credential = await memgate.nats_agent()
    nc = await nats.connect(memgate.nats_url, nkeys_seed_str=credential["seed"],
                            inbox_prefix=credential["inboxPrefix"], error_cb=violations.callback)
    return nc, credential


async def test_an_agent_connection_cannot_read_events_or_internal_subjects(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    token = await memgate.credential(owner)
    violations = Violations()
    agent_nc, credential = await connect_agent(memgate, violations)
    internal = await memgate.internal()
    seen_by_agent: list[Msg] = []

    async def collect(msg: Msg) -> None:
        seen_by_agent.append(msg)

    for subject in ("mem.evt.>", "mem.int.>", "$JS.API.>", "_INBOX.>", ">"):
        await agent_nc.subscribe(subject, cb=collect)
        await violations.wait_for(f'subscription to "{subject}"')
    internal_events = await internal.subscribe("mem.evt.>")

    async with await MemgateClient.connect(memgate.nats_url, token, nats_seed=credential["seed"],
                                           inbox_prefix=credential["inboxPrefix"]) as agent:
        remembered = await agent.remember("notes", "the agent may use the front door")
        await internal_events.next_msg(timeout=5)  # the event exists...
        await agent_nc.flush()
        assert seen_by_agent == []  # ...but the agent's subscriptions got nothing

        await agent_nc.publish("mem.int.store.p0.forget", b"{}")
        await violations.wait_for('publish to "mem.int.store.p0.forget"')
        with pytest.raises(nats.errors.Error):
            await agent_nc.jetstream().stream_info("MEM_EVT")
        assert [m.memory_id for m in (await agent.list()).memories] == [remembered.memory_id]
    await agent_nc.close()
    await internal.close()


async def test_without_a_nats_credential_there_is_no_connection(memgate: Memgate) -> None:
    with pytest.raises(nats.errors.Error):
        await nats.connect(memgate.nats_url, allow_reconnect=False, max_reconnect_attempts=0,
                           connect_timeout=2)


async def test_a_revoked_nats_credential_no_longer_connects(memgate: Memgate) -> None:
    credential = await memgate.nats_agent()
    nc = await nats.connect(memgate.nats_url, nkeys_seed_str=credential["seed"],
                            inbox_prefix=credential["inboxPrefix"])
    await nc.close()
    await memgate.ok("DELETE", f"/api/admin/nats-agents/{credential['agentId']}", ADMIN_TOKEN)
    with pytest.raises(nats.errors.Error):
        await nats.connect(memgate.nats_url, nkeys_seed_str=credential["seed"],
                           allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)


async def test_only_the_operator_issues_nats_credentials(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    refused = await memgate.admin("POST", "/api/admin/nats-agents", owner.token, {"name": "x"})
    assert refused.status_code == 401
