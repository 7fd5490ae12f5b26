"""The JetStream side of the bus: the events and dead-letter streams, the outbox relay that
publishes with dedupe ids, and durable pull consumers with bounded retries."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Protocol, TypeVar

from faststream.nats import JStream
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
import nats.errors
from nats.js.errors import (
    BadRequestError, BucketNotFoundError, NoStreamResponseError, NotFoundError,
    ServiceUnavailableError,
)

from memgate.bus import subjects
from memgate.bus.replies import traceback_summary
from memgate.contracts.events import DeadLetter, UnreadableEventError
from memgate.contracts.errors import UnavailableError
from memgate.observe import metrics
from memgate.tasks import cancelled

log = logging.getLogger("memgate.bus")
T = TypeVar("T")


class Publisher(Protocol):
    """The events stream as the outbox relay sees it; `msg_id` makes a re-publish harmless
    (`EventPublisher` over JetStream; the port actors take, `ports.bus`)."""

    async def ensure_stream(self) -> None: ...
    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None: ...

JETSTREAM_WAIT_S = 90.0
# a replicated stream asked for before the cluster's leader knows enough of its servers
NO_PEERS_YET = 10005
TRANSIENT = (nats.errors.TimeoutError, nats.errors.NoRespondersError, ServiceUnavailableError,
             NoStreamResponseError)


async def until_jetstream_answers(step: Callable[[], Awaitable[T]], *,
                                  timeout_s: float = JETSTREAM_WAIT_S) -> T:
    """`step()`, again while JetStream cannot answer yet: a cluster has no leader until a
    majority of its servers are up, a stream or bucket just made (or a server just restarted)
    elects its own. Past `timeout_s`, `UnavailableError`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await step()
        except (*TRANSIENT, BadRequestError) as exc:
            if isinstance(exc, BadRequestError) and exc.err_code != NO_PEERS_YET:
                raise
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"JetStream did not answer within {timeout_s:.0f} s: are a majority of "
                    "the cluster's nodes up?") from None
            await asyncio.sleep(0.5)

EVENTS = JStream(
    subjects.EVENTS_STREAM, subjects=[subjects.EVENTS_SUBJECTS], storage=StorageType.FILE,
    duplicate_window=120.0, max_age=7 * 24 * 3600.0,
)
# Ids and reasons only, kept longer than the events they point at so an operator sees them.
DEAD_LETTERS = JStream(
    subjects.DLQ_STREAM, subjects=[subjects.DLQ_SUBJECTS], storage=StorageType.FILE,
    duplicate_window=120.0, max_age=30 * 24 * 3600.0,
)


async def ensure_events_stream(js: JetStreamContext, *, replicas: int = 1) -> None:
    """Create the events and dead-letter streams with `replicas` copies, or raise an existing
    one's to that number in place (idempotent; any actor may call it)."""
    for stream in (EVENTS, DEAD_LETTERS):
        try:
            await raise_replicas(js, stream.name, replicas)
            continue
        except NotFoundError:
            pass
        await js.add_stream(name=stream.name, subjects=list(stream.subjects),
                            storage=StorageType.FILE, duplicate_window=120.0,
                            max_age=stream.config.max_age, num_replicas=replicas)


async def raise_replicas(js: JetStreamContext, stream: str, replicas: int) -> None:
    """A stream (or a KV bucket's, `KV_<bucket>`) kept on at least `replicas` servers: raised
    in place from fewer, never lowered."""
    info = await js.stream_info(stream)
    if (info.config.num_replicas or 1) < replicas:
        info.config.num_replicas = replicas
        await js.update_stream(info.config)
        log.info("stream %s raised to %d replicas", stream, replicas)


async def kv_bucket(js: JetStreamContext, name: str, *, replicas: int = 1,
                    ttl_s: float | None = None) -> KeyValue:
    """The KV bucket `name` (history 1; each entry expiring `ttl_s` after its last write, if
    given), created on first use. An existing one is taken as it is (`raise_replicas`)."""
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        return await js.create_key_value(bucket=name, history=1, ttl=ttl_s, replicas=replicas)


class EventPublisher:
    """Publishes to the events stream; the message id makes a re-publish harmless."""

    def __init__(self, nc: NatsClient, *, replicas: int = 1) -> None:
        self._js = nc.jetstream()
        self._replicas = replicas

    async def ensure_stream(self) -> None:
        await ensure_events_stream(self._js, replicas=self._replicas)

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        """Returns once JetStream has stored the event (or known it as a duplicate)."""
        await self._js.publish(subject, payload, stream=EVENTS.name,
                               headers={"Nats-Msg-Id": msg_id})


Pending = Sequence[tuple[int, str, bytes]]  # (seq, subject, payload), oldest first


def message_id(prefix: str, seq: int, payload: bytes) -> str:
    """`<prefix>-<seq>-<digest of the payload>`. The number alone never repeats in one file's
    life, but a standby promoted after a kill numbers on from its copy, and the killed owner
    may have published the next number's event for a version no standby held (committed,
    never acknowledged): with the number alone, the new owner's event was dropped as its
    duplicate, and its version reached no index until the owner's next event."""
    return f"{prefix}-{seq}-{hashlib.blake2b(payload, digest_size=8).hexdigest()}"


class OutboxRelay:
    """Publishes what an outbox holds and has it deleted once JetStream has acked it.

    The outbox is written in the same transaction as the change its events announce, so an
    event committed but not yet published (JetStream down, process killed) is published when
    JetStream is back or at the next start. Its `Nats-Msg-Id` (`message_id`) names its number
    and its payload: a re-publish of the same event within the duplicate window is dropped, and
    no other event is ever taken for its duplicate.
    """

    def __init__(self, publisher: Publisher, *, prefix: str,
                 pending: Callable[[], Awaitable[Pending]],
                 sent: Callable[[int], Awaitable[None]], retry_s: float = 1.0) -> None:
        self._publisher = publisher
        self._prefix = prefix
        self._pending = pending
        self._sent = sent
        self._retry_s = retry_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._publisher.ensure_stream()
        self._wake.set()  # whatever a previous run committed but did not publish
        self._task = asyncio.create_task(self._run(), name=f"{self._prefix}.relay")

    def wake(self) -> None:
        """Something was committed to the outbox."""
        self._wake.set()

    async def stop(self) -> None:
        await cancelled(self._task)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                while pending := await self._pending():
                    for seq, subject, payload in pending:
                        await self._publisher.publish(subject, payload, message_id(
                            self._prefix, seq, payload))
                    await self._sent(pending[-1][0])
            except Exception as exc:  # JetStream unavailable: keep the outbox, retry shortly
                log.warning("%s: event relay paused (%s)", self._prefix, type(exc).__name__)
                await asyncio.sleep(self._retry_s)
                self._wake.set()


# A batch takes well under a second; a short ack wait bounds the redelivery of any message
# handed to a pull request that its subscriber abandoned (for instance at shutdown).
ACK_WAIT_S = 5.0
# How long one pull waits for messages; it also bounds how long a stop waits for the pull.
FETCH_WAIT_S = 0.5
# After a failed fetch (connection trouble): the server keeps the messages meanwhile.
FETCH_BACKOFF_S = 1.0
MAX_DELIVER = 5
RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0)  # before the 2nd, 3rd, ... delivery of a failing message

BatchHandler = Callable[[list[bytes]], Awaitable[None]]


class DurableConsumer:
    """Feeds `handler` batches from a durable pull consumer; a batch is acked once it succeeds.

    Retries are bounded and one bad message never holds up the others: when a batch fails, its
    messages are applied one at a time. A message the handler rejects as unreadable
    (`UnreadableEventError`: malformed, or a newer major version) is terminated at once; one
    that keeps failing is nacked with a growing delay and terminated at its `max_deliver`-th
    delivery. Each terminated message is recorded on `mem.dlq.<durable>` (ids and the reason,
    never the payload). Handlers must be idempotent: a message may be applied more than once.

    Pull (not push) so that several replicas can share one durable consumer. Hand-written on
    nats-py rather than a faststream `PullSub`: the latter's partial-batch refetch with
    sub-millisecond timeouts left messages unacknowledged until `ack_wait` expired, a lag of
    many seconds under load (docs/experiments/processes-and-bus.md, "Figures quoted from the
    code").
    """

    def __init__(self, nc: NatsClient, subject: str, durable: str, handler: BatchHandler,
                 *, batch_size: int = 64, linger: float = 0.05, max_deliver: int = MAX_DELIVER,
                 retry_delays: Sequence[float] = RETRY_DELAYS_S) -> None:
        self._js = nc.jetstream()
        self._subject = subject
        self._durable = durable
        self._handler = handler
        self._batch = batch_size
        self._linger = linger  # after a partial batch, let the next one fill a little
        self._max_deliver = max_deliver
        self._retry_delays = tuple(retry_delays)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._waiting = True  # in a pull or a pause, no batch in hand: `stop` need not wait
        # events yet to be applied, the batch in hand included: known from each fetch (the
        # server says how many wait behind its last message), 0 once a fetch finds none
        self.pending = 0
        self._pending = metrics.CONSUMER_PENDING.labels(durable)
        self._redelivered = metrics.CONSUMER_REDELIVERIES.labels(durable)

    async def start(self) -> None:
        await until_jetstream_answers(partial(ensure_events_stream, self._js))
        config = ConsumerConfig(
            name=self._durable, durable_name=self._durable, filter_subject=self._subject,
            ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_S, max_deliver=self._max_deliver)
        # creates, or updates an older one; a cluster may still be placing the stream's copies
        await until_jetstream_answers(partial(self._js.add_consumer, EVENTS.name, config))
        subscription = await self._js.pull_subscribe(self._subject, durable=self._durable,
                                                     stream=EVENTS.name)
        self._task = asyncio.create_task(self._run(subscription), name=self._durable)

    async def stop(self) -> None:
        """Stop pulling. A batch in hand is handled and acked first. A pull still waiting for
        messages is given up at once: the server drops a pull request whose inbox is gone
        (measured: the next message goes to the next pull, delivered once), where waiting for
        it cost up to `FETCH_WAIT_S` per stop. A message already on its way when the pull is
        given up waits out `ack_wait` and is delivered again."""
        self._stopping = True
        if self._task is None:
            return
        if self._waiting:
            self._task.cancel()
        await asyncio.wait({self._task}, timeout=ACK_WAIT_S)
        self._task.cancel()  # a batch still in hand after `ack_wait` is delivered again anyway
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, subscription: JetStreamContext.PullSubscription) -> None:
        try:
            await self._pull(subscription)
        finally:
            await subscription.unsubscribe()

    async def _pull(self, subscription: JetStreamContext.PullSubscription) -> None:
        while not self._stopping:
            try:
                messages = await subscription.fetch(self._batch, timeout=FETCH_WAIT_S)
            except TimeoutError:
                self._count(0)
                continue
            except Exception as exc:  # connection trouble: back off, the server keeps the messages
                log.warning("%s: fetch failed (%s)", self._durable, type(exc).__name__)
                await asyncio.sleep(FETCH_BACKOFF_S)
                continue
            self._waiting = False
            self._fetched(messages)
            try:
                await self._handle(messages)
            finally:
                self._waiting = True
                self._count(self.pending - len(messages))
            if len(messages) < self._batch:
                await asyncio.sleep(self._linger)

    def _count(self, pending: int) -> None:
        self.pending = max(pending, 0)
        self._pending.set(self.pending)

    def _fetched(self, messages: list[Msg]) -> None:
        if not messages:
            return
        redelivered = sum(m.metadata.num_delivered > 1 for m in messages)
        if redelivered:
            self._redelivered.inc(redelivered)
        self._count(len(messages) + messages[-1].metadata.num_pending)

    async def _handle(self, messages: list[Msg]) -> None:
        try:
            await self._handler([m.data for m in messages])
        except Exception as exc:
            if len(messages) == 1:
                await self._failed(messages[0], exc)
                return
            log.info("%s: a batch of %d failed (%s); applying its messages one by one",
                     self._durable, len(messages), type(exc).__name__)
            for message in messages:
                await self._handle([message])
            return
        await asyncio.gather(*(m.ack() for m in messages))

    async def _failed(self, message: Msg, exc: Exception) -> None:
        deliveries = message.metadata.num_delivered
        if isinstance(exc, UnreadableEventError):
            await self._dead_letter(message, exc.reason)
        elif deliveries >= self._max_deliver:
            log.error("%s: message %d failed on its last delivery: %s", self._durable,
                      message.metadata.sequence.stream, traceback_summary(exc))
            await self._dead_letter(message, type(exc).__name__)
        else:  # the type only: an exception's message may quote content
            delay = self._retry_delays[min(deliveries, len(self._retry_delays)) - 1]
            log.warning("%s: message %d failed (%s), delivery %d of %d, retried in %.1f s",
                        self._durable, message.metadata.sequence.stream, type(exc).__name__,
                        deliveries, self._max_deliver, delay)
            await message.nak(delay=delay)

    async def _dead_letter(self, message: Msg, error: str) -> None:
        metadata = message.metadata
        record = DeadLetter(durable=self._durable, stream=metadata.stream,
                            stream_seq=metadata.sequence.stream, subject=message.subject,
                            deliveries=metadata.num_delivered, error=error)
        try:
            await self._js.publish(subjects.dead_letter(self._durable), record.to_json(),
                                   stream=DEAD_LETTERS.name, headers={
                                       "Nats-Msg-Id": f"{self._durable}-{record.stream_seq}"})
        except Exception as failure:  # not recorded: keep the message and try again later
            log.warning("%s: could not record message %d as a dead letter (%s)", self._durable,
                        record.stream_seq, type(failure).__name__)
            await message.nak(delay=self._retry_delays[-1])
            return
        await message.term()
        metrics.DEAD_LETTERS.labels(self._durable).inc()
        log.warning("%s: message %d on %s dead-lettered after %d deliveries (%s)", self._durable,
                    record.stream_seq, record.subject, record.deliveries, error)
