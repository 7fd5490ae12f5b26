"""The events stream on a three-node cluster (SPEC §6): kill -9 of the node leading `MEM_EVT`
mid-load — its nats-server, and the store if it is served there — and the events resume with no
gap: every acknowledged memory has its `stored` event in the stream, and the owner's versions
in it run 1, 2, 3, … without a hole."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import ServiceUnavailableError

from memgate.app.logins import internal_logins
from memgate.app.settings import Settings
from memgate.bus import subjects
from memgate.bus.logins import inbox_prefix
from memgate.bus.streams import until_jetstream_answers
from memgate.contracts.events import MEMORY_EVENT, MemoryStored
from tests.conftest import close_nats, eventually
from tests.cluster import ELECTION_S, STANDBYS, Node, in_sync, start_cluster

pytestmark = pytest.mark.timeout(420)



async def _connect(node: Node) -> nats.NATS:
    login = internal_logins(Settings(data_dir=node.data_dir))["indexer"]
    return await nats.connect(f"nats://127.0.0.1:{node.nats_port}", user=login.user,
                              password=login.password, inbox_prefix=inbox_prefix("indexer"),
                              max_reconnect_attempts=0)


async def _leader(node: Node) -> str:
    """The node leading the events stream (waiting out an election: JetStream answers 503, or
    nothing, meanwhile)."""
    nc = await _connect(node)
    try:
        js = nc.jetstream(timeout=5)

        async def led() -> str:
            info = await js.stream_info(subjects.EVENTS_STREAM)
            if info.cluster is None or not info.cluster.leader:
                raise ServiceUnavailableError  # no leader yet: asked again
            return str(info.cluster.leader)

        return await until_jetstream_answers(led, timeout_s=ELECTION_S)
    finally:
        await close_nats(nc)


async def _stored(node: Node) -> list[MemoryStored]:
    """Every `stored` event the stream holds, read through `node`."""
    nc = await _connect(node)
    try:
        js = nc.jetstream(timeout=10)
        pending = (await until_jetstream_answers(
            lambda: js.stream_info(subjects.EVENTS_STREAM), timeout_s=ELECTION_S)).state.messages
        subscription = await until_jetstream_answers(lambda: js.pull_subscribe(
            subjects.EVENTS_SUBJECTS, durable=None, stream=subjects.EVENTS_STREAM),
            timeout_s=ELECTION_S)
        found: list[MemoryStored] = []
        read = 0
        while read < pending:
            with contextlib.suppress(NatsTimeoutError):
                for message in await subscription.fetch(200, timeout=5):
                    read += 1
                    event = MEMORY_EVENT.validate_json(message.data)
                    if isinstance(event, MemoryStored):
                        found.append(event)
        return found
    finally:
        await close_nats(nc)


async def test_a_kill_of_the_events_stream_leader_leaves_no_gap_in_the_events(
        tmp_path: Path) -> None:
    nodes, agent = await start_cluster(tmp_path)
    try:
        await eventually(lambda: in_sync(nodes[0], ["storage.p0"], STANDBYS), timeout=90)
        leader = await _leader(nodes[0])
        victim = next(n for n in nodes if n.name == leader)
        through = next(n for n in nodes if n is not victim)

        stop = asyncio.Event()
        load = asyncio.create_task(agent.load(through, stop))
        await asyncio.sleep(1.0)
        before = len(agent.acked)
        await victim.kill()

        async def resumed() -> bool:
            return len(agent.acked) > before + 20

        await eventually(resumed, timeout=60)
        stop.set()
        await load
        assert await _leader(through) != leader  # another node leads the stream now

        # The outbox relay publishes after the commit, and may still be waiting out its retry
        # of a publish the election refused: the events come, a little after the answers.
        events: list[MemoryStored] = []

        async def relayed() -> bool:
            nonlocal events
            try:
                events = await _stored(through)
            except ServiceUnavailableError:  # the new consumer's stream still electing: again
                return False
            return set(agent.acked) <= {e.memory_id for e in events}

        await eventually(relayed, timeout=ELECTION_S)
        seqs = {e.seq for e in events}
        assert seqs == set(range(1, max(seqs) + 1)), "a gap in the owner's versions"
    finally:
        for one_node in nodes:
            await one_node.stop()
