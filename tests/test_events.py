"""Events that cannot stall or vanish, on a real nats-server: sequence numbers that never repeat,
bounded retries with a dead letter, tolerant versioned events, and the registry's outbox."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client as NatsClient

from memgate.bus import EmbeddedNats, subjects
from memgate.bus.server import nats_server_binary, render_config
from memgate.bus.streams import (
    DEAD_LETTERS, EVENTS, FETCH_WAIT_S, DurableConsumer, EventPublisher, OutboxRelay,
)
from memgate.contracts.events import (
    EVENT_VERSION, MEMORY_EVENT, DeadLetter, DocumentDeleted, MemoryStored, UnreadableEventError,
    read_event,
)
from memgate.contracts.internal import Owner
from memgate.runtime.actor import Serial
from memgate.storage import Filters, MemoryStore
from memgate.storage.registry import RegistryStore
from tests.conftest import Memgate, eventually, free_port, run_memgate
from tests.test_recall import index_files, live_index
from tests.test_registry import collection, put_document

# --- contracts ---


def test_events_ignore_unknown_fields_and_refuse_newer_major_versions() -> None:
    stored = MemoryStored(partition="p0", owner=Owner(tenant="ws", subject_id="mb"),
                          memory_id="m1", seq=7)
    wire = json.loads(stored.to_json())
    assert wire["v"] == EVENT_VERSION
    newer_minor = json.dumps({**wire, "addedLater": {"any": "thing"}}).encode()
    assert read_event(MEMORY_EVENT, newer_minor) == stored
    for payload, reason in ((json.dumps({**wire, "v": EVENT_VERSION + 1}).encode(),
                             "unsupported_version"),
                            (json.dumps({"v": EVENT_VERSION + 1, "kind": "renamed"}).encode(),
                             "unsupported_version"),
                            (b'{"kind": "stored"', "malformed"),
                            (json.dumps({**wire, "kind": "unknown"}).encode(), "malformed")):
        with pytest.raises(UnreadableEventError) as refused:
            read_event(MEMORY_EVENT, payload)
        assert refused.value.reason == reason


# --- sequence numbers ---


def test_sequence_numbers_never_repeat_after_the_newest_memories_are_deleted(
        tmp_path: Path) -> None:
    path = tmp_path / "memories.duckdb"
    filters = Filters("ws", "mb", "notes")

    def remember(store: MemoryStore, memory_id: str) -> int:
        return store.remember(filters, memory_id=memory_id, credential_id="cr", text="t",
                              retention_days=1).seq

    def forget(store: MemoryStore, memory_id: str) -> None:
        store.delete("ws", "mb", memory_id=memory_id, event_subject="s",
                     event=lambda owner, ids: b"{}")

    store = MemoryStore(path)
    used = [remember(store, "a"), remember(store, "b")]
    forget(store, "b")
    used += [seq for seq, _, _ in store.pending_events()]
    store.events_sent(max(used))
    store.close()
    store = MemoryStore(path)
    forget(store, "a")
    fresh = [seq for seq, _, _ in store.pending_events()] + [remember(store, "c")]
    store.close()
    assert min(fresh) > max(used), (used, fresh)


@asynccontextmanager
async def shared_nats(directory: Path) -> AsyncIterator[tuple[EmbeddedNats, str]]:
    """A locked-down nats-server that outlives the memgate processes started against it."""
    password = secrets.token_urlsafe(16)
    async with EmbeddedNats(directory, config=render_config("memgate", password, [])) as server:
        yield server, password


@asynccontextmanager
async def connected(directory: Path) -> AsyncIterator[NatsClient]:
    """An open nats-server and a client of it, both closed afterwards."""
    async with EmbeddedNats(directory) as server:
        nc = await nats.connect(server.url)
        try:
            yield nc
        finally:
            await nc.close()


async def test_forgetting_the_newest_memories_then_restarting_loses_no_event(
        tmp_path: Path) -> None:
    """Remember A, B, C; forget B, C; restart on the same data and nats-server: a forget and
    new remembers must not reuse event ids JetStream saw inside its duplicate window."""
    async with shared_nats(tmp_path / "nats") as (server, password):
        on_server = {"nats_url": server.url, "nats_password": password}
        async with AsyncExitStack() as stack:
            memgate = await run_memgate(tmp_path, stack, **on_server)
            owner = await memgate.workspace()
            token = await memgate.credential(owner)
            agent = await memgate.agent("rest", token)
            a = await agent.remember("notes", "the zebracorn project ships in spring")
            b = await agent.remember("notes", "the office plant needs water")
            c = await agent.remember("notes", "parking is on level three")
            await agent.forget(memory_id=b.memory_id)
            await agent.forget(memory_id=c.memory_id)

            async def a_is_indexed() -> bool:
                try:
                    searcher = live_index(memgate, owner.workspace_id, owner.member_id).searcher()
                except (FileNotFoundError, ValueError):  # no index yet
                    return False
                return list(searcher.terms_with_prefix("text", "zebracorn")) == [("zebracorn", 1)]

            await eventually(a_is_indexed)

        async with AsyncExitStack() as stack:
            memgate = await run_memgate(tmp_path, stack, **on_server)
            agent = await memgate.agent("rest", token)
            await agent.forget(memory_id=a.memory_id)
            new = [await agent.remember("prefs", text) for text in (
                "the user deploys on Fridays", "lunch is usually sushi", "standup is at nine")]

            def on_disk() -> bool:
                for path in index_files(memgate):
                    try:
                        if b"zebracorn" in path.read_bytes():
                            return True
                    except FileNotFoundError:  # removed by a rebuild while we looked
                        continue
                return False

            async def forgotten_words_left_the_index() -> bool:
                return not on_disk()

            async def every_new_memory_has_a_vector() -> bool:
                recalled = await agent.recall("what does the user do", limit=10)
                with_vectors = {m.memory_id for m in recalled.memories if m.ranks.cosine}
                return with_vectors == {m.memory_id for m in new}

            await eventually(forgotten_words_left_the_index)
            await eventually(every_new_memory_has_a_vector)


# --- dead letters ---


async def dead_letters(nc: NatsClient, count: int) -> list[tuple[DeadLetter, bytes]]:
    """The first `count` records of the dead-letter stream, once there are that many."""
    js = nc.jetstream()

    async def recorded() -> bool:
        return (await js.stream_info(DEAD_LETTERS.name)).state.messages >= count

    await eventually(recorded)
    records = []
    for seq in range(1, count + 1):
        raw = await js.get_msg(DEAD_LETTERS.name, seq)
        assert raw.data is not None
        records.append((DeadLetter.model_validate_json(raw.data), raw.data))
    return records


async def test_a_malformed_and_a_newer_version_event_are_dead_lettered_while_indexing_goes_on(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()
    agent = await memgate.agent("rest", await memgate.credential(owner))
    nc = await memgate.internal("storage")
    try:
        js = nc.jetstream()
        marker = "personal-detail-9f3"
        malformed = await js.publish(subjects.memory_events("p0"),
                                     f'{{"kind": "stored", "note": "{marker}"'.encode())
        newer = await js.publish(subjects.memory_events("p0"), json.dumps({
            "v": EVENT_VERSION + 1, "kind": "stored", "partition": "p0", "note": marker,
            "owner": {"tenant": owner.workspace_id, "subjectId": owner.member_id},
            "memoryId": "from-the-future", "seq": 1}).encode())
        remembered = await agent.remember("prefs", "the quokka team deploys on Fridays")

        async def indexed_and_embedded() -> bool:
            try:
                searcher = live_index(memgate, owner.workspace_id, owner.member_id).searcher()
            except (FileNotFoundError, ValueError):  # no index yet, or a generation swapped
                return False
            recalled = await agent.recall("when does the team ship releases")
            return (list(searcher.terms_with_prefix("text", "quokka")) == [("quokka", 1)]
                    and [m.memory_id for m in recalled.memories if m.ranks.cosine]
                    == [remembered.memory_id])

        await eventually(indexed_and_embedded)
        consumers = ("indexer-p0", "embedder-p0", "audit")  # every consumer of memory events
        records = await dead_letters(nc, 2 * len(consumers))
        found = {(r.durable, r.stream_seq, r.error) for r, _ in records}
        assert found == {(durable, ack.seq, error)
                         for durable in consumers
                         for ack, error in ((malformed, "malformed"),
                                            (newer, "unsupported_version"))}
        for record, raw in records:
            assert (record.stream, record.subject, record.deliveries) == (
                EVENTS.name, subjects.memory_events("p0"), 1)
            assert marker.encode() not in raw
        for durable in ("indexer-p0", "embedder-p0"):  # nothing left to redeliver
            info = await js.consumer_info(EVENTS.name, durable)
            assert info.num_ack_pending == 0 and info.config.max_deliver == 5
    finally:
        await nc.close()


async def test_a_message_that_keeps_failing_is_dead_lettered_at_max_deliver_and_holds_up_nothing(
        tmp_path: Path) -> None:
    async with connected(tmp_path / "nats") as nc:
        applied: list[bytes] = []
        attempts: list[bytes] = []

        async def handler(payloads: list[bytes]) -> None:
            attempts.extend(payloads)
            if b"broken" in payloads:
                raise RuntimeError("cannot apply this one")
            applied.extend(payloads)

        consumer = DurableConsumer(nc, "mem.evt.test.>", "test-consumer", handler,
                                   max_deliver=3, retry_delays=(0.05,))
        await consumer.start()
        try:
            js = nc.jetstream()
            for payload in (b"first", b"broken", b"second"):
                await js.publish("mem.evt.test.x", payload)

            async def good_ones_applied() -> bool:
                return applied == [b"first", b"second"]

            await eventually(good_ones_applied)
            [(record, raw)] = await dead_letters(nc, 1)
            assert (record.durable, record.stream_seq, record.deliveries, record.error) == (
                "test-consumer", 2, 3, "RuntimeError")
            assert b"broken" not in raw
            assert attempts.count(b"broken") >= 3  # each delivery (also in its batch)
            info = await js.consumer_info(EVENTS.name, "test-consumer")
            assert info.num_ack_pending == 0 and info.num_pending == 0
        finally:
            await consumer.stop()


async def test_a_stopped_consumer_finishes_the_batch_in_hand_and_gives_up_its_waiting_pull(
        tmp_path: Path) -> None:
    """`stop` during a batch lets the batch be applied and acked; `stop` while the next pull
    waits gives that pull up rather than waiting for it to expire, and the next run of the
    consumer gets the next event at once, delivered once (the server dropped the abandoned
    pull, it did not take the event)."""
    async with connected(tmp_path / "nats") as nc:
        js = nc.jetstream()
        entered, release = asyncio.Event(), asyncio.Event()
        applied: list[bytes] = []

        async def slow(payloads: list[bytes]) -> None:
            entered.set()
            await release.wait()
            applied.extend(payloads)

        consumer = DurableConsumer(nc, "mem.evt.stop.>", "stop-consumer", slow)
        await consumer.start()
        await js.publish("mem.evt.stop.x", b"first")
        await asyncio.wait_for(entered.wait(), 10)
        stopping = asyncio.create_task(consumer.stop())
        await asyncio.sleep(0.1)
        assert not stopping.done()  # the batch in hand is not abandoned
        release.set()
        await stopping
        assert applied == [b"first"]
        info = await js.consumer_info(EVENTS.name, "stop-consumer")
        assert info.num_ack_pending == 0 and info.num_pending == 0

        restarted = DurableConsumer(nc, "mem.evt.stop.>", "stop-consumer", slow)
        await restarted.start()
        await asyncio.sleep(0.05)  # its pull waits, FETCH_WAIT_S (0.5 s) from expiring
        loop = asyncio.get_running_loop()
        asked = loop.time()
        await restarted.stop()
        assert loop.time() - asked < FETCH_WAIT_S / 2  # it did not wait for the pull
        await js.publish("mem.evt.stop.x", b"second")
        third = DurableConsumer(nc, "mem.evt.stop.>", "stop-consumer", slow)
        await third.start()
        try:
            async def second_applied() -> bool:
                return applied == [b"first", b"second"]

            await eventually(second_applied, timeout=3.0)  # well before ack_wait (5 s)
            info = await js.consumer_info(EVENTS.name, "stop-consumer")
            assert info.num_redelivered == 0 and info.num_ack_pending == 0
        finally:
            await third.stop()


# --- the registry's outbox ---


async def test_a_registry_event_committed_before_a_nats_server_restart_still_cascades(
        tmp_path: Path) -> None:
    """The registry commits a document deletion (and its event) and dies before publishing;
    nats-server restarts; the next run publishes the event and the citing memory is deleted."""
    async with AsyncExitStack() as stack:
        server, password = await stack.enter_async_context(shared_nats(tmp_path / "nats"))
        async with AsyncExitStack() as run:
            memgate = await run_memgate(tmp_path, run, nats_url=server.url,
                                        nats_password=password)
            owner = await memgate.workspace()
            handbook = await collection(memgate, owner)
            await put_document(memgate, owner, "doc1", handbook)
            token = await memgate.credential(owner)
            agent = await memgate.agent("rest", token)
            await agent.remember("notes", "releases go out on Fridays", citations=["doc1-p1"])
            await agent.remember("notes", "cites nothing")

        registry = RegistryStore(tmp_path / "data" / "registry.duckdb")
        assert registry.delete_document(
            owner.workspace_id, "doc1", event_subject=subjects.registry_event("doc_deleted"),
            event=DocumentDeleted(workspace_id=owner.workspace_id, document_id="doc1").to_json())
        registry.close()  # committed, never published

        await server.stop()
        server = await stack.enter_async_context(
            EmbeddedNats(tmp_path / "nats", config=render_config("memgate", password, [])))

        memgate = await run_memgate(tmp_path, stack, nats_url=server.url, nats_password=password)
        agent = await memgate.agent("rest", token)

        async def cascaded() -> bool:
            return [m.text for m in (await agent.list()).memories] == ["cites nothing"]

        await eventually(cascaded)
        nc = await memgate.internal("storage")
        try:
            last = await nc.jetstream().get_last_msg(EVENTS.name,
                                                      subjects.registry_event("doc_deleted"))
            assert last.headers is not None and last.headers["Nats-Msg-Id"].startswith("registry-")
        finally:
            await nc.close()


async def test_the_relay_keeps_the_outbox_while_jetstream_is_down_and_publishes_when_it_is_back(
        tmp_path: Path) -> None:
    port = free_port()
    serial = Serial("registry")  # the store is used from one thread, as the actor does
    store = await serial(RegistryStore, tmp_path / "registry.duckdb")
    reads = 0
    retried = asyncio.Event()

    async def pending() -> list[tuple[int, str, bytes]]:
        nonlocal reads
        reads += 1
        if reads >= 3:  # at start (empty), after the change, after the failed publish
            retried.set()
        return await serial(store.pending_events)

    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(EmbeddedNats(tmp_path / "nats", port=port))
        nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        stack.push_async_callback(nc.close)
        relay = OutboxRelay(EventPublisher(nc), prefix="registry", retry_s=0.1, pending=pending,
                            sent=lambda seq: serial(store.events_sent, seq))
        await relay.start()
        stack.push_async_callback(relay.stop)
        await server.stop()

        handbook = await serial(store.create_collection, "ws", "handbook")
        await serial(lambda: store.put_document(
            "ws", "doc1", collection_id=handbook, expires_at=None, restricted=False, passages=[],
            event_subject=subjects.registry_event("doc_upserted"),
            event=b'{"event": "doc_upserted"}'))
        relay.wake()
        await asyncio.wait_for(retried.wait(), 30)  # a publish failed while the server was down
        assert len(await serial(store.pending_events)) == 1

        server = await stack.enter_async_context(EmbeddedNats(tmp_path / "nats", port=port))

        async def published() -> bool:
            return not await serial(store.pending_events)

        await eventually(published)
        info = await nc.jetstream().stream_info(EVENTS.name)
        assert info.state.messages == 1
    await serial(store.close)
    serial.shutdown()


async def test_an_event_under_a_number_another_owner_published_is_kept_the_same_one_dropped(
        tmp_path: Path) -> None:
    """A standby promoted after a kill numbers its versions on from what its copy holds, and
    the killed owner may have published an event under the next number for a version its
    standbys never held (committed, never acknowledged). The new owner's event under that
    number is not dropped as its duplicate; the same event published again still is."""
    subject = subjects.memory_events("p0")
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(EmbeddedNats(tmp_path / "nats", port=free_port()))
        nc = await nats.connect(server.url)
        stack.push_async_callback(nc.close)
        for payload in (b'{"memoryId": "never-acknowledged"}', b'{"memoryId": "acknowledged"}',
                        b'{"memoryId": "acknowledged"}'):  # old owner, new owner, new again
            sent = asyncio.Event()

            async def pending(payload: bytes = payload, sent: asyncio.Event = sent,
                              ) -> list[tuple[int, str, bytes]]:
                return [] if sent.is_set() else [(7, subject, payload)]

            async def mark(seq: int, sent: asyncio.Event = sent) -> None:
                sent.set()

            relay = OutboxRelay(EventPublisher(nc), prefix="p0", pending=pending, sent=mark)
            await relay.start()
            await asyncio.wait_for(sent.wait(), 10)
            await relay.stop()
        js = nc.jetstream()
        assert (await js.stream_info(EVENTS.name)).state.messages == 2
        assert (await js.get_last_msg(EVENTS.name, subject)).data == b'{"memoryId": "acknowledged"}'


async def test_the_embedded_server_fsyncs_every_jetstream_write_before_acknowledging_it(
        tmp_path: Path) -> None:
    """The configuration memgate writes for its embedded nats-server, as the running server
    reports it (its monitoring `/varz`): every write synced, not the default two-minute flush."""
    config = tmp_path / "nats.conf"
    config.write_text(render_config("memgate", secrets.token_urlsafe(16), []))
    port, monitor = free_port(), free_port()
    server = await asyncio.create_subprocess_exec(
        str(nats_server_binary()), "-c", str(config), "-js", "-sd", str(tmp_path / "js"),
        "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{monitor}") as http:
            async def varz() -> dict[str, Any] | None:
                with contextlib.suppress(httpx.TransportError):
                    return dict((await http.get("/varz")).json())
                return None

            async def answers() -> bool:
                return await varz() is not None

            await eventually(answers)
            shown = await varz()
        assert shown is not None
        assert shown["jetstream"]["config"]["sync_always"] is True
    finally:
        server.terminate()
        await server.wait()
