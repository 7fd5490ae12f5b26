"""The JetStream side of the bus: the events stream, publishing with dedupe ids, durable pulls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from faststream import AckPolicy
from faststream.nats import JStream, NatsMessage, NatsRouter, PullSub
from nats.aio.client import Client as NATS
from nats.js.api import StorageType

from bus import subjects

EVENTS = JStream(
    subjects.EVENTS_STREAM, subjects=[subjects.EVENTS_SUBJECTS], storage=StorageType.FILE,
    duplicate_window=120.0, max_age=7 * 24 * 3600.0,
)


class EventPublisher:
    """Publishes to the events stream; the message id makes a re-publish harmless."""

    def __init__(self, nc: NATS) -> None:
        self._js = nc.jetstream()

    async def ensure_stream(self) -> None:
        await self._js.add_stream(
            name=EVENTS.name, subjects=list(EVENTS.subjects), storage=StorageType.FILE,
            duplicate_window=120.0, max_age=7 * 24 * 3600.0,
        )

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        await self._js.publish(subject, payload, stream=EVENTS.name,
                               headers={"Nats-Msg-Id": msg_id})


BatchHandler = Callable[[list[bytes]], Awaitable[None]]


def durable_batches(router: NatsRouter, subject: str, durable: str, handler: BatchHandler,
                    *, batch_size: int = 64) -> None:
    """Feed `handler` batches from a durable pull consumer; a batch is acked only if it succeeds.

    Pull (not push) so that several replicas can share one durable consumer.
    """

    async def consume(batch: NatsMessage) -> None:  # a batch: its body is a list of bodies
        await handler(list(batch.body))

    router.subscriber(
        subject, stream=EVENTS, durable=durable,
        pull_sub=PullSub(batch_size=batch_size, timeout=0.5, batch=True),
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )(consume)
