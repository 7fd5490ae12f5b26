"""Request/reply subjects served on raw nats-py subscriptions (`RoutesBroker`), on a real
nats-server: the same reply bytes as faststream's subscribers, queue groups, bounded concurrency,
arrival order with one worker, graceful drain, and faststream for everything else."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.errors import NoRespondersError

from mcp import types

from memgate import MemgateClient
from memgate.adapters.mcp_server import MemoryTools
from memgate.bus import BusClient, EmbeddedNats, NatsRouter, decode_reply, parse, replying
from memgate.bus.connections import NatsBroker
from memgate.bus.client import RETRIES
from memgate.bus.replies import reply_to
from memgate.bus.serving import RoutesBroker
from memgate.contracts.errors import (
    MemgateError, NotFoundError, OutcomeUnknownError, PayloadTooLargeError, UnavailableError,
)
from memgate.bus import subjects
from memgate.contracts.internal import Ready
from memgate.contracts.memory import RememberResult
from memgate.runtime.actor import readiness
from memgate.tasks import cancelled

SECRET = "the text of a memory"
WAIT_S = 10.0


@pytest.fixture
async def url(tmp_path: Path) -> AsyncIterator[str]:
    async with EmbeddedNats(tmp_path) as server:
        yield server.url


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def client(url: str, stack: AsyncExitStack) -> Any:
    nc = await nats.connect(url)
    stack.push_async_callback(nc.close)
    return nc


async def serve(url: str, router: NatsRouter, stack: AsyncExitStack,
                broker_type: type[NatsBroker] = RoutesBroker) -> NatsBroker:
    broker = broker_type(url, logger=None, apply_types=False, graceful_timeout=WAIT_S)
    broker.include_router(router)
    await broker.start()
    stack.push_async_callback(broker.stop)
    await broker.connection.flush()
    return broker


async def echo(payload: bytes) -> Ready:
    ready = parse(Ready, payload)
    if ready.actor == "missing":
        raise NotFoundError("no such thing", {"id": "m-1"})
    if ready.actor == "bug":
        raise RuntimeError(SECRET)
    return ready


@pytest.mark.parametrize("actor", ["echo", "missing", "bug", "{not json"])
async def test_replies_are_the_bytes_reply_to_produces_and_faststream_sent(
        url: str, stack: AsyncExitStack, actor: str, caplog: pytest.LogCaptureFixture) -> None:
    raw, routed = NatsRouter(), NatsRouter()
    raw.subscriber("t.raw")(replying(echo))
    routed.subscriber("t.faststream")(replying(echo))
    await serve(url, raw, stack)
    await serve(url, routed, stack, NatsBroker)
    nc = await client(url, stack)
    payload = actor.encode() if actor.startswith("{") else Ready(actor=actor).to_json()

    with caplog.at_level(logging.INFO):
        answer = await nc.request("t.raw", payload, timeout=WAIT_S)
        before = await nc.request("t.faststream", payload, timeout=WAIT_S)

    assert answer.data == before.data == await reply_to(echo, payload, "t.raw")
    assert SECRET not in caplog.text


async def test_a_queue_group_hands_each_request_to_one_of_its_members(
        url: str, stack: AsyncExitStack) -> None:
    handled: dict[str, list[str]] = {"a": [], "b": []}
    for member in handled:
        async def handle(payload: bytes, member: str = member) -> Ready:
            handled[member].append(parse(Ready, payload).actor)
            return Ready(actor=member)

        router = NatsRouter()
        router.subscriber("t.queue", queue="q", max_workers=8)(replying(handle))
        await serve(url, router, stack)
    nc = await client(url, stack)

    await asyncio.gather(*(nc.request("t.queue", Ready(actor=str(i)).to_json(), timeout=WAIT_S)
                           for i in range(200)))

    assert sorted(handled["a"] + handled["b"], key=int) == [str(i) for i in range(200)]
    assert handled["a"] and handled["b"]


async def test_one_worker_handles_requests_one_at_a_time_in_arrival_order(
        url: str, stack: AsyncExitStack) -> None:
    running, most, order = 0, 0, []

    async def handle(payload: bytes) -> Ready:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0)  # let any other handler of the subject start, were it allowed to
        order.append(parse(Ready, payload).actor)
        running -= 1
        return Ready(actor="ok")

    router = NatsRouter()
    router.subscriber("t.serial")(replying(handle))
    await serve(url, router, stack)
    nc = await client(url, stack)

    await asyncio.gather(*(nc.request("t.serial", Ready(actor=str(i)).to_json(), timeout=WAIT_S)
                           for i in range(50)))

    assert most == 1
    assert order == [str(i) for i in range(50)]


async def test_max_workers_bounds_how_many_requests_are_handled_at_once(
        url: str, stack: AsyncExitStack) -> None:
    running, most = 0, 0
    full, release = asyncio.Event(), asyncio.Event()

    async def handle(payload: bytes) -> Ready:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running == 4:
            full.set()
        await release.wait()
        running -= 1
        return Ready(actor="ok")

    router = NatsRouter()
    router.subscriber("t.bounded", max_workers=4)(replying(handle))
    broker = await serve(url, router, stack)
    nc = await client(url, stack)

    requests = asyncio.gather(*(nc.request("t.bounded", b'{"actor":"x"}', timeout=WAIT_S)
                                for _ in range(12)))
    await asyncio.wait_for(full.wait(), WAIT_S)
    await nc.flush()  # every request has reached the server,
    await broker.connection.flush()  # and the serving connection has read what it was sent
    release.set()
    answers = await requests

    assert most == 4
    assert len(answers) == 12


async def test_stop_answers_the_requests_already_received_then_takes_no_more(
        url: str, stack: AsyncExitStack) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def handle(payload: bytes) -> Ready:
        started.set()
        await release.wait()
        return Ready(actor="done")

    router = NatsRouter()
    router.subscriber("t.drain", max_workers=2)(replying(handle))
    broker = await serve(url, router, stack)
    nc = await client(url, stack)
    request = asyncio.create_task(nc.request("t.drain", b'{"actor":"x"}', timeout=WAIT_S))
    await asyncio.wait_for(started.wait(), WAIT_S)

    stopping = asyncio.create_task(broker.stop())
    await nc.flush()
    assert not stopping.done()
    release.set()

    assert decode_reply((await request).data, Ready).actor == "done"
    await asyncio.wait_for(stopping, WAIT_S)
    with pytest.raises(NoRespondersError):
        await nc.request("t.drain", b'{"actor":"x"}', timeout=WAIT_S)


async def test_events_and_ready_routes_on_the_same_router_are_served(
        url: str, stack: AsyncExitStack) -> None:
    heard = asyncio.Event()

    async def changed(payload: Any) -> None:
        heard.set()

    router = NatsRouter()
    router.subscriber("t.changed")(changed)
    ready = readiness("tester")
    router.subscriber(ready.subject)(replying(ready.handler))
    await serve(url, router, stack)
    nc = await client(url, stack)

    answer = await nc.request(ready.subject, b"{}", timeout=WAIT_S)
    await nc.publish("t.changed", b"{}")

    assert answer.data == b'{"v":1,"ok":true,"result":{"actor":"tester"}}'
    await asyncio.wait_for(heard.wait(), WAIT_S)


@pytest.mark.parametrize("actor", ["echo", "missing", "bug", "{not json"])
async def test_a_subject_answered_in_process_fails_and_succeeds_as_over_the_server(
        url: str, stack: AsyncExitStack, actor: str, caplog: pytest.LogCaptureFixture) -> None:
    """`BusClient(local=...)`: what the REST adapter of a `front` process sends its governance."""
    router = NatsRouter()
    router.subscriber("t.echo")(replying(echo))
    await serve(url, router, stack)
    over = BusClient(await client(url, stack), timeout=WAIT_S)
    here = BusClient(await client(url, stack), timeout=WAIT_S, local={"t.echo": echo})
    payload = actor.encode() if actor.startswith("{") else Ready(actor=actor).to_json()

    async def outcome(bus: BusClient, subject: str = "t.echo") -> object:
        try:
            return await bus.request(subject, payload, Ready)
        except MemgateError as exc:
            return type(exc), exc.code, str(exc), exc.details

    with caplog.at_level(logging.INFO):
        assert await outcome(here) == await outcome(over)
    assert SECRET not in caplog.text
    # answered here, not by the server: no actor on the bus listens to this one
    alone = BusClient(await client(url, stack), timeout=WAIT_S, local={"t.here": echo})
    assert await outcome(alone, "t.here") == await outcome(over)
    assert (await outcome(over, "t.here"))[:2] == (UnavailableError, "UNAVAILABLE")  # type: ignore[index]


async def test_a_subject_answered_in_process_still_times_out_and_refuses_oversized(
        url: str, stack: AsyncExitStack) -> None:
    cancelled = asyncio.Event()

    async def stuck(payload: bytes) -> Ready:
        try:
            await asyncio.sleep(WAIT_S)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Ready(actor="late")

    nc = await client(url, stack)
    here = BusClient(nc, timeout=0.2, local={"t.stuck": stuck})
    with pytest.raises(OutcomeUnknownError, match="timed out") as failed:  # it may have run
        await here.request("t.stuck", Ready(actor="x"), Ready)
    assert failed.value.details == {"subject": "t.stuck"}
    assert failed.value.status == 504  # a 503 says "not done"; this one may have been
    assert cancelled.is_set()  # the handler does not run on after its caller gave up
    with pytest.raises(PayloadTooLargeError):
        await here.request("t.stuck", b"x" * (nc.max_payload + 1), Ready)


@pytest.mark.skipif(sys.platform != "linux", reason="reads the server's environment in /proc")
async def test_the_embedded_server_runs_go_on_one_thread_unless_the_user_says_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def gomaxprocs(server: EmbeddedNats) -> str:
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        return dict(v.decode().partition("=")[::2] for v in environ if v)["GOMAXPROCS"]

    monkeypatch.delenv("GOMAXPROCS", raising=False)
    async with EmbeddedNats(tmp_path / "default") as server:
        assert gomaxprocs(server) == "1"
    monkeypatch.setenv("GOMAXPROCS", "3")
    async with EmbeddedNats(tmp_path / "users") as server:
        assert gomaxprocs(server) == "3"


async def test_a_nats_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    """Its port taken (another memgate, a left-over server): the error names the cause the
    server gave, not a guess."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="address already in use"):
            async with EmbeddedNats(tmp_path / "nats", port=port):
                pass


@pytest.mark.parametrize("caller", ["MemgateClient", "MCP stdio"])
async def test_a_remember_is_asked_again_under_the_same_idempotency_key_until_answered(
        url: str, stack: AsyncExitStack, caller: str) -> None:
    """A remember that timed out (perhaps written) and then answered 503 (not written) is sent
    again on its own by the agents' client and by the MCP stdio server, every time under the
    key of its first try, so a governance that stored the first try answers it and writes
    nothing more."""
    nc = await client(url, stack)
    tries: list[dict[str, Any]] = []

    async def governance(payload: bytes) -> RememberResult:
        tries.append(json.loads(payload)["body"])
        if len(tries) == 1:
            await asyncio.sleep(1.0)  # past the caller's timeout
        if len(tries) == 2:
            raise UnavailableError("no owner now")
        return RememberResult(memory_id="m-1", created_at=datetime.now(UTC), superseded=0)

    async def answered(msg: Any) -> None:
        await msg.respond(await reply_to(governance, msg.data, msg.subject))

    async def received(msg: Any) -> None:  # each try in a task: the first one is slow
        stack.push_async_callback(cancelled, asyncio.create_task(answered(msg)))

    await nc.subscribe(subjects.REMEMBER, cb=received)
    await nc.flush()
    if caller == "MemgateClient":
        agent = await MemgateClient.connect(url, "token", timeout=0.3)
        stack.push_async_callback(agent.close)
        assert (await agent.remember("n", "the boiler is serviced in March")).memory_id == "m-1"
    else:
        tools = MemoryTools(BusClient(nc, timeout=0.3), credential=lambda _: "token",
                            retries=RETRIES)
        called = await tools.call_tool(None, types.CallToolRequestParams(  # type: ignore[arg-type]
            name="remember_memory", arguments={"namespace": "n", "text": "the boiler"}))
        assert not called.is_error and called.structured_content["memoryId"] == "m-1"
    assert len(tries) == 3
    assert len({t["idempotencyKey"] for t in tries}) == 1
