"""Request/reply subjects served on raw nats-py subscriptions of a faststream broker's connection.

faststream's per-message consume and middleware stack cost a serving process ~0.2 ms of CPU per
message, and its concurrent subscriber more (`python -m bench.bus_overhead`); a nats-py callback
that runs the same `reply_to` costs a fraction of it. The reply bytes, queue groups, bounded
concurrency and graceful drain stay as they were.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from faststream.nats import NatsBroker
from faststream.nats import NatsRouter as FaststreamRouter
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from memgate.bus import subjects
from memgate.bus.logins import PUBLIC_COMMANDS
from memgate.bus.replies import NatsRouter, Endpoint, reply_to, undecoded, with_headers
from memgate.observe import metrics, tracing

log = logging.getLogger("memgate.bus")

__all__ = ["ReplySubscription", "RoutesBroker"]

# Replies to memgate's own clients (its adapters, its actors) go to inboxes named so
# (`bus.logins.inbox_prefix`); an agent's request comes with any other reply subject.
INTERNAL_INBOXES = "_INBOX_MG_"


class ReplySubscription:
    """One `Endpoint` on a nats-py subscription: at most `max_workers` messages handled at
    once, in arrival order when it is one; each answered with `reply_to`'s bytes."""

    def __init__(self, nc: NatsClient, route: Endpoint) -> None:
        self._nc = nc
        self._route = route
        self._slots = asyncio.Semaphore(route.max_workers)
        self._tasks: set[asyncio.Task[None]] = set()
        self._subscription: Subscription | None = None
        # an agent's command, counted and timed here as the `nats` transport (the adapters'
        # are counted by the adapters)
        self._command = subjects.unpartitioned(route.subject)
        self._public = self._command in PUBLIC_COMMANDS

    async def start(self) -> None:
        route = self._route
        callback = self._answer if route.max_workers <= 1 else self._dispatch
        self._subscription = await self._nc.subscribe(route.subject, queue=route.queue,
                                                      cb=callback)

    async def _answer(self, msg: Msg) -> None:
        """nats-py awaits this for each message of the subscription, one after the other."""
        headers: dict[str, str] = {}
        if tracing.on():
            with tracing.served(f"serve {self._route.subject}", msg.headers):
                data, headers = await self._reply(msg)
        elif self._public:
            data, headers = await self._reply(msg)
        else:
            data = await reply_to(self._route.handler, msg.data, msg.subject)
        if not msg.reply:  # published, not requested: nobody waits for an answer
            return
        try:
            await self._nc.publish(msg.reply, data, headers=headers or None)
        except NatsError as exc:  # the connection closed under us: the caller times out
            log.warning("reply on %s not sent: %s", msg.subject, type(exc).__name__)

    async def _reply(self, msg: Msg) -> tuple[bytes, dict[str, str]]:
        """The reply and its headers, its outcome on the current span, and an agent's command
        counted."""
        started = time.perf_counter()
        data, code, headers = await with_headers(self._route.handler, msg.data, msg.subject)
        tracing.note({"memgate.code": code})
        if self._public and not (msg.reply or "").startswith(INTERNAL_INBOXES):
            metrics.command_done(self._command, "nats", code, time.perf_counter() - started)
        return data, headers

    async def _dispatch(self, msg: Msg) -> None:
        """Hand the message to a task once a slot is free (until then, later messages wait in
        the subscription's pending queue)."""
        await self._slots.acquire()
        task = asyncio.create_task(self._answer_in_slot(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer_in_slot(self, msg: Msg) -> None:
        try:
            await self._answer(msg)
        finally:
            self._slots.release()

    async def drain(self) -> None:
        """Take no new messages; answer those already received."""
        if self._subscription is not None:
            try:
                await self._subscription.drain()  # type: ignore[no-untyped-call]
            except NatsError as exc:  # closed or draining already: nothing more will arrive
                log.warning("draining %s: %s", self._route.subject, type(exc).__name__)
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()


class RoutesBroker(NatsBroker):
    """A `NatsBroker` that serves the `replies` of the `NatsRouter`s it includes on raw
    subscriptions of its own connection (bound in `start`, drained first in `stop`) and
    everything else (events, other subscribers) through faststream."""

    def __init__(self, *args: Any, graceful_timeout: float | None = None, **options: Any) -> None:
        super().__init__(*args, graceful_timeout=graceful_timeout, **options)
        self._graceful_timeout = graceful_timeout
        self._routes: list[Endpoint] = []
        self._replies: list[ReplySubscription] = []
        self._stopped = False

    def include_router(self, router: Any, **options: Any) -> None:
        if not isinstance(router, NatsRouter):
            super().include_router(router, **options)
            return
        self._routes += router.replies
        if router.others:
            super().include_router(FaststreamRouter(handlers=router.others, decoder=undecoded),
                                   **options)

    async def start(self) -> None:
        await super().start()
        for route in self._routes:
            reply = ReplySubscription(self.connection, route)
            await reply.start()
            self._replies.append(reply)

    async def stop(self, *args: Any) -> None:
        """Drain the reply subscriptions (up to `graceful_timeout`), then faststream's; once
        (a store handed over stops its brokers before its process does)."""
        if self._stopped:
            return
        self._stopped = True
        replies, self._replies = self._replies, []
        if replies:
            drained = asyncio.gather(*(reply.drain() for reply in replies))
            try:
                await asyncio.wait_for(drained, self._graceful_timeout)
            except TimeoutError:
                log.warning("replies still running after %s s: cancelled",
                            self._graceful_timeout)
                for reply in replies:
                    reply.cancel()
        await super().stop(*args)
