"""What every actor shares: its lifecycle, its endpoints as data, readiness, a serial worker
thread for its synchronous resources, and routing."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import sys
import threading
from collections.abc import Awaitable, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Generic, Protocol, TypeVar, overload

from memgate.cluster import fence, replication
from memgate.bus import NatsRouter, hearing, ok_bytes, parse, replying, subjects
from memgate.bus.replies import Endpoint, Handler
from memgate.contracts import Contract, Envelope
from memgate.contracts.errors import UnauthenticatedError
from memgate.contracts.internal import Ready

R = TypeVar("R")
Listener = Callable[[bytes], Awaitable[None]]


class Actor(Protocol):
    name: str

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def endpoints(self) -> list[Endpoint]: ...
    def router(self) -> NatsRouter: ...


class ActorBase:
    """The lifecycle every actor shares. An actor declares what it answers (`endpoints`) and
    what it only hears (`listeners`, by subject: published facts, no reply); its router, with
    its readiness endpoint, is built from them here, and nowhere else. `start` opens what the
    actor holds, `stop` closes it; both do nothing unless the actor has something to open."""

    name: str

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def endpoints(self) -> list[Endpoint]:
        return []

    def listeners(self) -> dict[str, Listener]:
        return {}

    def router(self) -> NatsRouter:
        return routed([*self.endpoints(), readiness(self.name)], self.listeners())


def routed(endpoints: Collection[Endpoint],
           listeners: dict[str, Listener] | None = None) -> NatsRouter:
    """A router answering `endpoints` and hearing `listeners` (by subject)."""
    router = NatsRouter()
    for endpoint in endpoints:
        router.subscriber(endpoint.subject, endpoint.queue,
                          max_workers=endpoint.max_workers)(replying(endpoint.handler))
    for subject, listener in (listeners or {}).items():
        router.subscriber(subject)(hearing(listener))
    return router


def answered(actors: Collection[Actor]) -> dict[str, Handler]:
    """Every endpoint of `actors`, by subject: what a client of the same process may ask them
    in process (`bus.client.BusClient(local=...)`)."""
    return {endpoint.subject: endpoint.handler for actor in actors
            for endpoint in actor.endpoints()}


class Opened(Generic[R]):
    """An attribute an actor sets in `start()` (a store, a model): read before, it raises
    `RuntimeError` naming it, instead of passing None on."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, actor: None, owner: type) -> Opened[R]: ...
    @overload
    def __get__(self, actor: object, owner: type) -> R: ...

    def __get__(self, actor: object | None, owner: type) -> Opened[R] | R:
        if actor is None:
            return self
        try:
            value: R = actor.__dict__[self._name]
        except KeyError:
            raise RuntimeError(f"{type(actor).__name__}.{self._name}: start() first") from None
        return value

    def __set__(self, actor: object, value: R) -> None:
        actor.__dict__[self._name] = value

    def opened(self, actor: object) -> bool:
        return self._name in actor.__dict__

    def take(self, actor: object) -> R | None:
        """The value, no longer set (for `stop()` to close it), or None if never opened."""
        value: R | None = actor.__dict__.pop(self._name, None)
        return value


# How much nicer a background thread is: under the 50-agent mix the embedding of new memories yields
# the cores to the recalls waiting on them (docs/DECISIONS.md, "New memories are embedded at a
# lower priority").
BACKGROUND_NICE = 10

# How soon a busy event loop hands the GIL to a worker thread that wants it back (CPython's
# default: 5 ms). A query's embedding takes the GIL back after each ONNX run and tokenizer
# call, so beside a busy loop it waited several intervals (docs/DECISIONS.md, "GIL switch
# interval 0.5 ms in every memgate process"; bench/gil_handoff.py).
GIL_SWITCH_S = 0.0005


def hand_off_the_gil_promptly() -> None:
    """For a process whose actors wait on their worker threads (every process of memgate)."""
    sys.setswitchinterval(GIL_SWITCH_S)


def _lower_priority() -> None:
    """This thread yields the CPU to the others while they want it (Linux schedules threads)."""
    if sys.platform == "linux":
        thread = threading.get_native_id()
        nice = os.getpriority(os.PRIO_PROCESS, thread) + BACKGROUND_NICE
        os.setpriority(os.PRIO_PROCESS, thread, min(nice, 19))


class Serial:
    """Runs blocking calls one at a time on a thread of their own (one writer, event loop free).
    `background`: the thread runs at a lower priority, for work no command waits on. None runs
    in a process that lost a lease on its stores (`cluster.fence`: `LeaseLostError`).

    The writer of a replicated store (`name` is the store's, `cluster.replication`): once its
    owner serves standbys, what a call committed is applied by every in-sync standby before
    the call returns."""

    def __init__(self, name: str, *, background: bool = False) -> None:
        self._name = name
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name,
                                        initializer=partial(_started, name, background))
        replication.writer(name, self.unreplicated)

    async def __call__(self, fn: Callable[..., R], *args: object) -> R:
        loop = asyncio.get_running_loop()
        primary = replication.primary(self._name)
        if primary is None:
            return await loop.run_in_executor(self._pool, _fenced, fn, *args)
        return await primary.committed(
            await loop.run_in_executor(self._pool, primary.journal, loop, _fenced, fn, *args))

    async def unreplicated(self, fn: Callable[[], R]) -> R:
        """`fn` on the thread, between two calls, neither fenced nor shipped: a copy's writes,
        and a store's close (a store handed over closes its files all the same: left open, a
        file this process opens again would join the stale database, `compaction.plain`)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


def _started(name: str, background: bool) -> None:
    """A writer thread's start: the store it writes, for `cluster.fence`; a background one
    yields the CPU."""
    fence.writing(name)
    if background:
        _lower_priority()


def _fenced(fn: Callable[..., R], *args: object) -> R:
    fence.check()  # on the thread, just before: a process stopped in between is caught too
    return fn(*args)


EnvelopeHandler = Callable[[Envelope], Awaitable[Contract]]


class Operator:
    """The operator token that admin endpoints require, kept as its SHA-256 hex and read when
    the actor starts (`memgate up` may generate the token at its first start)."""

    def __init__(self, token: Callable[[], str]) -> None:
        self._token = token
        self._digest = ""

    def load(self) -> None:
        self._digest = hashlib.sha256(self._token().encode()).hexdigest()

    def is_digest(self, digest: str) -> bool:
        return bool(self._digest) and secrets.compare_digest(digest, self._digest)

    def is_token(self, token: str | None) -> bool:
        return bool(token) and self.is_digest(hashlib.sha256((token or "").encode()).hexdigest())

    def only(self, handler: EnvelopeHandler) -> Handler:
        """`handler` behind `enveloped`, refused unless the envelope carries the token."""
        return enveloped(handler, operator=self)


def enveloped(handler: EnvelopeHandler, *, operator: Operator | None = None) -> Handler:
    """A public command's handler: the envelope parsed first. With `operator`, refused unless
    the envelope carries the operator token."""

    async def handle(payload: bytes) -> Contract:
        envelope = parse(Envelope, payload)
        if operator is not None and not operator.is_token(envelope.token):
            raise UnauthenticatedError("the operator token is required")
        return await handler(envelope)

    handle.__name__ = handler.__name__
    return handle


def readiness(name: str) -> Endpoint:
    """The endpoint that answers readiness probes for the actor `name` (the REST `/healthz`
    asks every actor)."""
    ready = Ready(actor=name)

    async def answer(payload: bytes) -> Ready:
        return ready

    return Endpoint(subjects.ready(name), answer)


__all__ = ["Actor", "ActorBase", "Endpoint", "EnvelopeHandler", "Listener", "Opened", "Operator",
           "Serial", "answered", "routed", "enveloped", "ok_bytes", "readiness"]
