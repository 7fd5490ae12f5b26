"""What every actor shares: a serial worker thread for its synchronous resources, and routing."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import sys
import threading
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from memgate.cluster import fence
from memgate.bus import NatsRouter, ok_bytes, parse, replying
from memgate.contracts import Contract, Envelope
from memgate.contracts.errors import UnauthenticatedError
from memgate.contracts.internal import Ready

R = TypeVar("R")


class Actor(Protocol):
    name: str

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def router(self) -> NatsRouter: ...


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
    in a process that lost a lease on its stores (`cluster.fence`: `LeaseLostError`)."""

    def __init__(self, name: str, *, background: bool = False) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name,
                                        initializer=_lower_priority if background else None)

    async def __call__(self, fn: Callable[..., R], *args: object) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._pool, _fenced, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


def _fenced(fn: Callable[..., R], *args: object) -> R:
    fence.check()  # on the thread, just before: a process stopped in between is caught too
    return fn(*args)


def partition_of(workspace_id: str, partitions: int) -> str:
    """The storage partition that owns a workspace (stable, so data never moves by itself)."""
    return f"p{zlib.crc32(workspace_id.encode()) % partitions}"


EnvelopeHandler = Callable[[Envelope], Awaitable[Contract]]


def enveloped(handler: EnvelopeHandler, *, operator: Callable[[], str] | None = None,
              ) -> Callable[[bytes], Awaitable[Contract]]:
    """A public command's handler: the envelope parsed first. With `operator` (the operator
    token's SHA-256 hex, read at each call), refused unless the envelope carries that token."""

    async def handle(payload: bytes) -> Contract:
        envelope = parse(Envelope, payload)
        if operator is not None:
            given = hashlib.sha256((envelope.token or "").encode()).hexdigest()
            if not envelope.token or not secrets.compare_digest(given, operator()):
                raise UnauthenticatedError("the operator token is required")
        return await handler(envelope)

    handle.__name__ = handler.__name__
    return handle


def ready_route(router: NatsRouter, subject: str, name: str) -> None:
    """Answer readiness probes for `name` (the REST `/healthz` asks every actor)."""

    async def ready(payload: bytes) -> Ready:
        return Ready(actor=name)

    router.subscriber(subject)(replying(ready))


__all__ = ["Actor", "EnvelopeHandler", "Serial", "enveloped", "ok_bytes", "partition_of",
           "ready_route"]
