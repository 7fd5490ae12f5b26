"""In-memory fakes of the ports actors depend on, and an actor served on faststream's in-memory
broker (`TestNatsBroker`): the fast tier's whole world (no nats-server, no ONNX, no uvicorn)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from datetime import UTC, datetime, timedelta
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from faststream.nats import NatsBroker, TestNatsBroker

from memgate.bus import decode_reply
from memgate.contracts import (
    Contract, Envelope, ForgetResult, ListResult, Memory, Principal, RememberResult,
)
from memgate.contracts.errors import UnauthenticatedError, UnavailableError
from memgate.contracts.internal import (
    CatalogRequest, CatalogRows, Neighbours, OwnedText, Owner, Ranking, RankRequest,
    RecallFilters, RecallScope, Rows, RowsRequest, StoreForget, StoreQuery, StoreRemember, Texts,
    TextsRequest,
)
from memgate.contracts.registry import CheckRemember, Citation, Scope, Verification
from memgate.ports.bus import BatchHandler
from memgate.runtime.actor import Actor

T = TypeVar("T", bound=Contract)


class Served:
    """Actors on one in-memory broker; `call` sends bytes and decodes the `Ok`/`Failure` reply."""

    def __init__(self, broker: NatsBroker) -> None:
        self._broker = broker

    async def call(self, subject: str, payload: Contract | bytes, result_type: type[T]) -> T:
        data = payload if isinstance(payload, bytes) else payload.to_json()
        reply = await self._broker.request(data, subject, timeout=5.0)
        return decode_reply(reply.body, result_type)

    async def command(self, subject: str, token: str | None, body: dict[str, Any],
                      result_type: type[T], **params: str) -> T:
        """A public or admin command: the token travels inside the envelope."""
        return await self.call(subject, Envelope(token=token, body=body, params=params),
                               result_type)


@asynccontextmanager
async def served(*actors: Actor) -> AsyncIterator[Served]:
    """Start the actors, include their routers, and serve them in memory; stop them in `finally`."""
    broker = NatsBroker()
    async with AsyncExitStack() as stack:
        for actor in actors:
            await actor.start()
            stack.push_async_callback(actor.stop)
            broker.include_router(actor.router())
        test_broker = await stack.enter_async_context(TestNatsBroker(broker))
        yield Served(test_broker)


# --- the bus ---

Route = Callable[[bytes], Awaitable[Contract]]


class FakeRequester:
    """`Requester`: subjects answered by in-memory functions; what was asked is kept."""

    def __init__(self, routes: dict[str, Route] | None = None) -> None:
        self.routes: dict[str, Route] = dict(routes or {})
        self.asked: list[tuple[str, bytes]] = []
        self.announced: list[str] = []

    async def request(self, subject: str, payload: Contract | bytes, result_type: type[T],
                      *, timeout: float | None = None) -> T:
        data = payload if isinstance(payload, bytes) else payload.to_json()
        self.asked.append((subject, data))
        route = self.routes.get(subject)
        if route is None:
            raise UnavailableError("no actor answers on this subject", {"subject": subject})
        return result_type.model_validate(await route(data))

    async def announce(self, subject: str) -> None:
        self.announced.append(subject)


@dataclass
class FakeConsumer:
    subject: str
    durable: str
    handler: BatchHandler
    running: bool = False
    pending: int = 0  # as `DurableConsumer.pending`: events waiting in the stream

    async def start(self) -> None:
        self.running = True

    async def stop(self) -> None:
        self.running = False


class FakeBus(FakeRequester):
    """`Bus`: requests as `FakeRequester`, durable consumers the test feeds by hand, and
    core-NATS announcements kept in `published`."""

    def __init__(self, routes: dict[str, Route] | None = None) -> None:
        super().__init__(routes)
        self.consumers: dict[str, FakeConsumer] = {}
        self.published: list[tuple[str, dict[str, Any]]] = []

    def consumer(self, subject: str, durable: str, handler: BatchHandler,
                 *, batch_size: int = 64, **_: Any) -> FakeConsumer:
        self.consumers[durable] = FakeConsumer(subject, durable, handler)
        return self.consumers[durable]

    async def publish(self, subject: str, fact: dict[str, Any]) -> None:
        self.published.append((subject, fact))

    async def deliver(self, durable: str, payloads: list[bytes]) -> None:
        """Hand a batch to a running consumer, as JetStream would."""
        consumer = self.consumers[durable]
        assert consumer.running, f"{durable} is not started"
        await consumer.handler(payloads)


class FakePublisher:
    """`Publisher`: the events stream as a list; `published` is set at every publish."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bytes, str]] = []
        self.published = asyncio.Event()

    async def ensure_stream(self) -> None:
        return None

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        self.events.append((subject, payload, msg_id))
        self.published.set()

    async def wait_for(self, count: int, timeout: float = 5.0) -> None:
        async def enough() -> None:
            while len(self.events) < count:
                self.published.clear()
                await self.published.wait()

        await asyncio.wait_for(enough(), timeout)


# --- other actors, as ports ---


class FakeDirectory:
    """`Directory`: credentials by token hash; a missing one is UNAUTHENTICATED."""

    def __init__(self) -> None:
        self.principals: dict[str, Principal] = {}
        self.asked = 0

    async def principal(self, token_hash: str) -> Principal:
        self.asked += 1
        principal = self.principals.get(token_hash)
        if principal is None:
            raise UnauthenticatedError("unknown or revoked credential")
        return principal

    def changed(self) -> None:
        return None


@dataclass
class FakeRegistry:
    """`Registry`: fixed scopes, citations and verdict; verify calls are kept."""

    scopes: dict[str, Scope] = field(default_factory=dict)
    citations: list[Citation] = field(default_factory=list)
    verdict: Verification = field(default_factory=Verification)
    verified: list[dict[str, list[Citation]]] = field(default_factory=list)
    checked: list[CheckRemember] = field(default_factory=list)

    async def scope(self, workspace_id: str, context_set_id: str) -> Scope:
        return self.scopes.get(context_set_id,
                               Scope(exists=False, collection_ids=[], document_ids=[]))

    async def check_remember(self, request: CheckRemember) -> list[Citation]:
        self.checked.append(request)
        return self.citations

    async def verify(self, workspace_id: str, context_set_id: str | None,
                     cited: dict[str, list[Citation]], query: str | None = None) -> Verification:
        self.verified.append(cited)
        return self.verdict


@dataclass
class FakeStorage:
    """`Storage`: keeps what it was sent; answers lists, and recall's scope and rows, from
    fixed values (`memories` newest first)."""

    remembered: list[StoreRemember] = field(default_factory=list)
    forgotten: list[StoreForget] = field(default_factory=list)
    queries: list[StoreQuery] = field(default_factory=list)
    page: ListResult = field(default_factory=lambda: ListResult(memories=[]))
    memories: list[Memory] = field(default_factory=list)
    scopes: list[RecallFilters] = field(default_factory=list)
    rows_asked: list[list[str]] = field(default_factory=list)

    async def remember(self, command: StoreRemember) -> RememberResult:
        self.remembered.append(command)
        return RememberResult(memory_id=f"m{len(self.remembered)}",
                              created_at=datetime(2026, 1, 1, tzinfo=UTC), superseded=0,
                              masked=command.masked)

    async def list(self, query: StoreQuery) -> ListResult:
        self.queries.append(query)
        return self.page

    async def forget(self, command: StoreForget) -> ForgetResult:
        self.forgotten.append(command)
        return ForgetResult(deleted=1)

    async def recall_scope(self, filters: RecallFilters) -> RecallScope:
        self.scopes.append(filters)
        return RecallScope(high_seq=len(self.memories), total=len(self.memories),
                           cited={m.memory_id: m.citations for m in self.memories if m.citations})

    async def rows(self, request: RowsRequest) -> Rows:
        self.rows_asked.append(list(request.memory_ids))
        return Rows(memories=[m for m in self.memories if m.memory_id in request.memory_ids])


@dataclass
class FakeRankers:
    """`Rankers`: fixed BM25 and cosine lists (without the excluded ids, as the real ones)."""

    bm25_ids: list[str] = field(default_factory=list)
    cosine_ids: list[str] = field(default_factory=list)
    requests: list[RankRequest] = field(default_factory=list)
    sequence: list[str] = field(default_factory=list)  # remembered in this order (neighbours)
    bm25_late_s: float = 0.0  # BM25 answers this long after it is asked

    def _ranking(self, ids: list[str], request: RankRequest) -> Ranking:
        listed = [i for i in ids if i not in request.exclude]
        allowed = [i for i in self.sequence if i not in request.exclude]
        width = request.neighbours
        around = {i: Neighbours(before=allowed[max(0, at - width): at][::-1],
                                after=allowed[at + 1: at + 1 + width])
                  for at, i in enumerate(allowed) if i in listed and width}
        return Ranking(memory_ids=listed, neighbours=around)

    async def bm25(self, request: RankRequest) -> Ranking:
        self.requests.append(request)
        await asyncio.sleep(self.bm25_late_s)
        return self._ranking(self.bm25_ids, request)

    async def cosine(self, request: RankRequest) -> Ranking:
        assert request.vector is not None, "recall sends the query's vector"
        self.requests.append(request)
        return self._ranking(self.cosine_ids, request)


class FakeEmbedder:
    """`Embedder`: deterministic unit vectors from a hash of the words (similar texts share
    words, so share components). With `gate`, each call blocks until the gate is opened."""

    dim = 16

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        if self.gate is not None:
            self.gate.wait(timeout=10.0)  # a model that is slow until the test lets it finish
        self.calls.append(list(texts))
        rows = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in zip(rows, texts, strict=True):
            for word in text.lower().split():
                row[hashlib.sha256(word.encode()).digest()[0] % self.dim] += 1.0
            row /= max(float(np.linalg.norm(row)), 1e-12)
        return rows


def texts_route(texts: dict[str, str]) -> Route:
    """A storage `texts` route over a dict of memory id → masked text."""
    async def answer(payload: bytes) -> Texts:
        request = TextsRequest.model_validate_json(payload)
        ids = request.memory_ids if request.memory_ids is not None else list(texts)
        return Texts(items=[OwnedText(memory_id=i, text=texts[i]) for i in ids if i in texts])

    return answer



def catalog_route(texts: dict[str, str], owners: dict[str, Owner] | None = None) -> Route:
    """A storage `catalog` route over the same dict: each id gets the next seq when first seen
    (dict order), all in namespace "n", created a second apart; the texts when asked. Every
    owner holds them all, unless `owners` says whose each one is."""
    seqs: dict[str, int] = {}

    async def answer(payload: bytes) -> CatalogRows:
        request = CatalogRequest.model_validate_json(payload)
        for memory_id in texts:
            seqs.setdefault(memory_id, len(seqs) + 1)
        start = datetime(2026, 1, 1, tzinfo=UTC)
        held = [i for i in texts if owners is None or owners.get(i) == request.owner]
        rows = [(seqs[i], i) for i in held if seqs[i] > request.after_seq]
        return CatalogRows(
            high_seq=max((seqs[i] for i in held), default=0), memory_ids=[i for _, i in rows],
            seqs=[s for s, _ in rows], namespaces=["n"] * len(rows), keys=[None] * len(rows),
            collection_ids=[None] * len(rows),
            created_at=[start + timedelta(seconds=s) for s, _ in rows],
            superseded_at=[None] * len(rows), legal_hold=[False] * len(rows),
            texts=[texts[i] for _, i in rows] if request.texts else None)

    return answer
