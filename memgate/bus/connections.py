"""NATS connections of a memgate process: one per kind of actor, on that kind's own login."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from contextlib import AsyncExitStack
from typing import Any, Protocol

from faststream.nats import NatsBroker
from faststream.security import SASLPlaintext
from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext

from memgate.bus.client import BusClient
from memgate.bus.replies import Handler
from memgate.bus.serving import RoutesBroker
from memgate.bus.streams import EventPublisher

log = logging.getLogger("memgate.bus")

__all__ = ["KindConnections", "Logins", "NatsBroker"]


class Logins(Protocol):
    """Where the NATS is, and how each kind of actor logs in to it."""

    @property
    def url(self) -> str: ...

    def login(self, kind: str) -> dict[str, Any]: ...


class KindConnections:
    """One NATS connection per kind of actor, logged in as that kind; opened only for the kinds
    this process runs (`connect`), so `memgate actors --only governance` opens one."""

    def __init__(self, bus: Logins, *, timeout: float, replicas: int = 1) -> None:
        self._bus = bus
        self._timeout = timeout
        self._replicas = replicas  # of the events streams
        self._connections: dict[str, NatsClient] = {}
        self._clients: list[BusClient] = []  # those answered in process for some subjects

    def _nc(self, kind: str) -> NatsClient:
        return self._connections.setdefault(kind, NatsClient())

    def client(self, kind: str, *, local: Mapping[str, Handler] | None = None) -> BusClient:
        """A client on `kind`'s connection; `local`: subjects an actor of this process answers."""
        client = BusClient(self._nc(kind), timeout=self._timeout, local=local)
        if local:
            self._clients.append(client)
        return client

    def withdraw(self, subjects: Collection[str]) -> None:
        """Every client made here asks these subjects over the bus from now on (`BusClient`)."""
        for client in self._clients:
            client.withdraw(subjects)

    def publisher(self, kind: str) -> EventPublisher:
        return EventPublisher(self._nc(kind), replicas=self._replicas)

    def jetstream(self, kind: str) -> JetStreamContext:
        return self._nc(kind).jetstream(timeout=self._timeout)

    async def connect(self, kind: str, stack: AsyncExitStack) -> None:
        nc = self._nc(kind)
        if nc.is_connected:
            return
        await nc.connect(self._bus.url, name=f"memgate-{kind}", error_cb=_nats_error(kind),
                         **self._bus.login(kind))
        stack.push_async_callback(_drain_or_close, nc)

    def broker(self, kind: str, *, graceful_timeout: float) -> NatsBroker:
        """A broker for the subjects `kind` serves, on that kind's login: request/reply subjects
        on raw nats-py subscriptions (`RoutesBroker`), anything else through faststream.

        Without FastDepends (`apply_types=False`): `replying` handlers take the raw message and
        parse it with their own model, so per-message argument models are pure overhead."""
        login = self._bus.login(kind)
        security = (SASLPlaintext(username=login["user"], password=login["password"])
                    if "user" in login else None)
        return RoutesBroker(self._bus.url, logger=None, apply_types=False,
                            graceful_timeout=graceful_timeout,
                            security=security, name=f"memgate-{kind}-routes",
                            error_cb=_nats_error(kind))


async def _drain_or_close(nc: NatsClient) -> None:
    """Drain a connection that can drain; one whose server is gone (it died with a killed
    `memgate up`) closes at once instead of waiting out the drain timeout."""
    if nc.is_connected:
        await nc.drain()
    else:
        await nc.close()


def _nats_error(kind: str) -> Callable[[Exception], Awaitable[None]]:
    """Log what the server refuses a login (a permissions violation names a subject only)."""

    async def error(exc: Exception) -> None:
        log.error("NATS (%s login): %s", kind, exc)

    return error
