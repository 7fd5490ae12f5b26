"""The bus as actors use it: request/reply, durable event consumers, the event outbox's sink.

`memgate.bus.BusClient` and `memgate.bus.streams.EventPublisher` implement these over NATS;
the fast tests implement them in memory (`tests/fakes.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from memgate.bus.streams import Publisher  # defined beside the relay that takes it
from memgate.contracts import Contract

T = TypeVar("T", bound=Contract)

BatchHandler = Callable[[list[bytes]], Awaitable[None]]


class Requester(Protocol):
    """Ask another actor and wait for its reply; a `Failure` comes back as its typed error."""

    async def request(self, subject: str, payload: Contract | bytes, result_type: type[T],
                      *, timeout: float | None = None) -> T: ...


class Announcer(Protocol):
    """Tell every listener of a subject that something changed (no payload, no reply); the
    server has the announcement before `announce` returns, so it reaches them ahead of
    anything sent after."""

    async def announce(self, subject: str) -> None: ...


class Teller(Protocol):
    """Tell whoever listens a fact (core NATS: no reply, no wait, at most once)."""

    async def publish(self, subject: str, fact: dict[str, Any]) -> None: ...


class Consumer(Protocol):
    """A running durable consumer: feeds its handler batches between `start` and `stop`."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class Consumers(Protocol):
    """Where durable consumers of the events stream come from."""

    def consumer(self, subject: str, durable: str, handler: BatchHandler,
                 *, batch_size: int = ...) -> Consumer: ...


class Bus(Requester, Consumers, Teller, Protocol):
    """All three: what an actor that asks, consumes events and tells needs (indexer, embedder,
    storage)."""


__all__ = ["BatchHandler", "Bus", "Consumer", "Consumers", "Publisher", "Requester", "Teller"]
