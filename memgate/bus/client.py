"""Bus clients: `BusClient` for actors and adapters, `MemgateClient` for agents."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import nats
from pydantic import JsonValue, ValidationError
from pydantic_core import PydanticSerializationError
from nats.aio.client import Client as NatsConnection
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError, NoRespondersError

from memgate.bus import subjects
from memgate.bus.replies import Handler, answer, decode_reply, validation_failure
from memgate.bus.streams import BatchHandler, DurableConsumer
from memgate.contracts import (
    Contract, Envelope, ForgetRequest, ForgetResult, ListRequest, ListResult, RecallRequest,
    RecallResult, RememberRequest, RememberResult,
)
from memgate.contracts.memory import ImportRequest, ImportResult
from memgate.contracts.errors import (
    MemgateError, OutcomeUnknownError, PayloadTooLargeError, UnavailableError,
    ValidationFailedError,
)
from memgate.observe import metrics, tracing

T = TypeVar("T", bound=Contract)
log = logging.getLogger("memgate.bus")


def _build(model: type[T], **fields: Any) -> T:
    """A request built on the agent's side fails as the server would: `ValidationFailedError`."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise validation_failure(exc) from None


class Partition:
    """Where an agent's remember, list and forget go. In a cluster, the reply to a plain one
    names the agent's partition (`subjects.PARTITION_HEADER`); the next ones are sent for it,
    to the governance on the node that owns it, saving the trip from another node's
    (docs/DECISIONS.md, "An agent's commands go to its partition's node")."""

    def __init__(self) -> None:
        self.name: str | None = None

    def subject(self, command: str) -> str:
        if self.name is None or command not in subjects.BESIDE_STORAGE:
            return command
        return subjects.partitioned(command, self.name)

    def learn(self, headers: Mapping[str, str] | None) -> None:
        name = (headers or {}).get(subjects.PARTITION_HEADER)
        if name is not None and name.isalnum():  # a subject token, never a wildcard
            self.name = name


class BusClient:
    """Request/reply over one NATS connection, decoding `Ok`/`Failure` replies.

    `local`: subjects an actor of this process answers (in a `front` process: governance, for
    the REST and MCP adapters; recall, for governance and space-memories). Those requests go to
    its handler with the same bytes, without the two trips through the server, and fail as its
    reply would; the result comes back as the handler made it. A subject withdrawn from it
    (`withdraw`: its actor stopped, the store handed over) goes over the bus again.

    `partition` (an agent's): commands go to its partition's node once a reply has named it;
    while nobody answers there (the partition is moving), to any governance."""

    def __init__(self, nc: NatsConnection, *, timeout: float = 10.0,
                 local: Mapping[str, Handler] | None = None,
                 partition: Partition | None = None) -> None:
        self._nc = nc
        self._timeout = timeout
        self._local = dict(local or {})
        self._partition = partition

    def withdraw(self, subjects: Collection[str]) -> None:
        """These subjects' actors no longer run in this process: asked over the bus."""
        for subject in subjects:
            self._local.pop(subject, None)

    @classmethod
    async def connect(cls, url: str, *, name: str, timeout: float = 10.0,
                      connect_timeout: float | None = None,
                      local: Mapping[str, Handler] | None = None, **options: Any) -> BusClient:
        """A client on a connection of its own (`close()` drains it). With `connect_timeout`,
        an unreachable NATS or a refused login raises `TimeoutError` after that many seconds."""

        async def error(exc: Exception) -> None:  # the type only: the URL may hold a password
            log.warning("NATS (%s): %s", name, type(exc).__name__)

        connecting = nats.connect(url, name=name, error_cb=error, **options)
        nc = await (connecting if connect_timeout is None
                    else asyncio.wait_for(connecting, connect_timeout))
        return cls(nc, timeout=timeout, local=local)

    async def close(self) -> None:
        """Let outstanding requests finish, then close the connection."""
        await self._nc.drain()

    async def request(self, subject: str, payload: Contract | bytes, result_type: type[T],
                      *, timeout: float | None = None) -> T:
        """The reply of whoever answers `subject`; traced, a span of this hop whose
        `traceparent` goes with the request (`observe.tracing`)."""
        local = subject in self._local
        if tracing.quiet():  # off (no header), or a command not sampled (`UNSAMPLED`)
            return await self._request(subject, payload, result_type, timeout,
                                       None if local else tracing.headers())
        with tracing.span(f"{'local' if local else 'send'} {subject}",
                          kind="internal" if local else "client"):
            return await self._request(subject, payload, result_type, timeout,
                                       None if local else tracing.headers())

    async def _request(self, subject: str, payload: Contract | bytes, result_type: type[T],
                       timeout: float | None, headers: dict[str, str] | None = None) -> T:
        data = payload if isinstance(payload, bytes) else payload.to_json()
        handler = self._local.get(subject)
        try:
            if handler is not None:
                return await self._here(handler, subject, data, result_type,
                                        timeout or self._timeout)
            msg = await self._sent(subject, data, timeout or self._timeout, headers)
        except NoRespondersError:
            raise UnavailableError("no actor answers on this subject",
                                   {"subject": subject}) from None
        except TimeoutError:  # nats-py's is one too; the command may have been done
            raise OutcomeUnknownError("the request timed out", {"subject": subject}) from None
        except MaxPayloadError:  # a NATS of the operator's own, with a smaller max_payload
            raise PayloadTooLargeError("the request exceeds the bus's payload limit") from None
        return decode_reply(msg.data, result_type)

    async def _sent(self, subject: str, data: bytes, timeout: float,
                    headers: dict[str, str] | None) -> Msg:
        partition = self._partition
        if partition is None:
            return await self._nc.request(subject, data, timeout=timeout, headers=headers)
        target = partition.subject(subject)
        try:
            msg = await self._nc.request(target, data, timeout=timeout, headers=headers)
        except NoRespondersError:
            if target == subject:
                raise
            partition.name = None  # moving: any governance takes it, and names where it went
            msg = await self._nc.request(subject, data, timeout=timeout, headers=headers)
        partition.learn(msg.headers)
        return msg

    async def _here(self, handler: Handler, subject: str, data: bytes, result_type: type[T],
                    timeout: float) -> T:
        """The answer of an actor of this process, refused as the server would refuse it, and
        failing as its reply would; the result as it is, not encoded and parsed again."""
        if len(data) > self._nc.max_payload:
            raise MaxPayloadError
        async with asyncio.timeout(timeout):  # in this task: no task of its own to wake
            result = await answer(handler, data, subject)
        if not isinstance(result, result_type):  # a wiring mistake, not a runtime condition
            raise TypeError(f"{subject} answered {type(result).__name__}")
        return result

    async def publish(self, subject: str, fact: dict[str, Any]) -> None:
        """Announce a fact (ids only) on a subject; events subjects are kept by JetStream."""
        await self._nc.publish(subject, json.dumps(fact).encode())

    async def announce(self, subject: str) -> None:
        """Publish an empty message and wait until the server has it (a PING round trip): what
        the caller answers afterwards reaches every listener after the announcement."""
        await self._nc.publish(subject, b"{}")
        await self._nc.flush()

    def consumer(self, subject: str, durable: str, handler: BatchHandler,
                 *, batch_size: int = 64) -> DurableConsumer:
        """A durable pull consumer of the events stream on this connection (see `bus.streams`)."""
        return DurableConsumer(self._nc, subject, durable, handler, batch_size=batch_size)

    async def command(self, subject: str, token: str | None, body: Contract | dict[str, Any],
                      result_type: type[T], *, params: dict[str, str] | None = None,
                      transport: str | None = None) -> T:
        """Send a public command: the credential travels inside the envelope. An adapter
        names its `transport` (`rest`, `mcp`): the command is then counted and timed by
        outcome (`observe.metrics`), and is a trace's first span."""
        if transport is None:
            return await self._command(subject, token, body, result_type, params)
        started = time.perf_counter()
        code = "CANCELLED"
        try:
            with tracing.span(f"{transport} {metrics.command_name(subject)}", kind="server"):
                result = await self._command(subject, token, body, result_type, params)
            code = metrics.OK
            return result
        except MemgateError as exc:
            code = exc.code
            raise
        except Exception:
            code = "INTERNAL"
            raise
        finally:
            metrics.command_done(subject, transport, code, time.perf_counter() - started)

    async def _command(self, subject: str, token: str | None, body: Contract | dict[str, Any],
                       result_type: type[T], params: dict[str, str] | None) -> T:
        data = body if isinstance(body, dict) else body.model_dump(
            mode="json", by_alias=True, exclude_none=True)
        envelope = Envelope(token=token, body=data, params=params or {})
        try:
            payload = envelope.to_json()
        except PydanticSerializationError:  # a lone surrogate ("\ud800" in JSON): not UTF-8
            raise ValidationFailedError("the request is not valid", {"problems": [
                {"field": "body", "problem": "must be Unicode text (no lone surrogates)"}]},
            ) from None
        return await self.request(subject, payload, result_type)


# How long the client waits before each time it sends a command again (a 503: not done; a
# timeout: perhaps done, which the idempotency key settles): a store moving to another node
# takes ~10 s (docs/processes-and-cluster.md).
RETRIES = (0.5, 1.0, 2.0, 4.0)


class MemgateClient:
    """What an agent imports: `async with await MemgateClient.connect(url, token) as mem: ...`.

    Failures raise the typed exceptions of `contracts.errors` (each with `.code`).
    """

    def __init__(self, nc: NatsConnection, token: str, *, timeout: float = 10.0) -> None:
        self._nc = nc
        self._bus = BusClient(nc, timeout=timeout, partition=Partition())
        self._token = token

    @classmethod
    async def connect(cls, url: str, token: str, *, nats_seed: str | None = None,
                      inbox_prefix: str | None = None, timeout: float = 10.0,
                      **nats_options: Any) -> MemgateClient:
        """`nats_seed` and `inbox_prefix` are the agent's NATS credential
        (`memgate admin nats-credential`); `token` is its memgate credential."""
        options: dict[str, Any] = {"servers": [url], "name": "memgate-agent", **nats_options}
        if nats_seed is not None:
            options["nkeys_seed_str"] = nats_seed
        if inbox_prefix is not None:
            options["inbox_prefix"] = inbox_prefix
        return cls(await nats.connect(**options), token, timeout=timeout)

    async def remember(self, namespace: str, text: str, *, key: str | None = None,
                       collection_id: str | None = None, citations: list[str] | None = None,
                       idempotency_key: str | None = None) -> RememberResult:
        """Stored once, whatever the bus does: a 503 (not written) or a timeout (perhaps
        written) is sent again on its own (`RETRIES`), under the same `idempotency_key` (one is
        made when none is given), so a retry gets the first answer and writes nothing."""
        body = _build(RememberRequest, namespace=namespace, text=text, key=key,
                      collection_id=collection_id, citations=citations or [],
                      idempotency_key=idempotency_key or uuid.uuid4().hex)
        return await self._retried(subjects.REMEMBER, body, RememberResult)

    async def _retried(self, subject: str, body: Contract, result_type: type[T]) -> T:
        """A command that may be sent again: a read, or a write under an idempotency key."""
        for wait_s in RETRIES:
            try:
                return await self._bus.command(subject, self._token, body, result_type)
            except UnavailableError:  # OutcomeUnknownError too
                await asyncio.sleep(wait_s)
        return await self._bus.command(subject, self._token, body, result_type)

    async def import_memories(self, items: Sequence[RememberRequest | JsonValue]
                              ) -> ImportResult:
        """Up to 1,000 remembers at once, each stored or refused alone (`ImportResult`: by
        position); an item with an `idempotency_key` is stored once however often it is sent."""
        body = _build(ImportRequest, items=[
            item.model_dump(mode="json", by_alias=True, exclude_none=True)
            if isinstance(item, RememberRequest) else item for item in items])
        return await self._bus.command(subjects.IMPORT, self._token, body, ImportResult)

    async def recall(self, query: str, *, namespace: str | None = None,
                     collection_id: str | None = None, as_of: datetime | None = None,
                     limit: int = 10) -> RecallResult:
        body = _build(RecallRequest, query=query, namespace=namespace,
                      collection_id=collection_id, as_of=as_of, limit=limit)
        return await self._retried(subjects.RECALL, body, RecallResult)

    async def list(self, *, namespace: str | None = None, key: str | None = None,
                   collection_id: str | None = None, as_of: datetime | None = None,
                   limit: int = 20, cursor: str | None = None) -> ListResult:
        body = _build(ListRequest, namespace=namespace, key=key, collection_id=collection_id,
                      as_of=as_of, limit=limit, cursor=cursor)
        return await self._retried(subjects.LIST, body, ListResult)

    async def forget(self, *, memory_id: str | None = None, namespace: str | None = None,
                     key: str | None = None, idempotency_key: str | None = None
                     ) -> ForgetResult:
        """Sent again like a remember (`RETRIES`, one `idempotency_key`): a retry of a forget
        that was done gets its first answer, not a 404."""
        body = _build(ForgetRequest, memory_id=memory_id, namespace=namespace, key=key,
                      idempotency_key=idempotency_key or uuid.uuid4().hex)
        return await self._retried(subjects.FORGET, body, ForgetResult)

    async def close(self) -> None:
        await self._nc.drain()

    async def __aenter__(self) -> MemgateClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
