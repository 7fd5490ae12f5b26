"""Turning handler results and failures into reply bytes, and reply bytes back into values."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import faststream.nats
from faststream.nats import NatsMessage, NatsRoute
from pydantic import ValidationError

from memgate.contracts import REPLY, Contract, Failure, MemgateError, error_for
from memgate.contracts.errors import InternalError, ValidationFailedError

log = logging.getLogger("memgate.bus")

T = TypeVar("T", bound=Contract)
C = TypeVar("C", bound=Contract)
Handler = Callable[[bytes], Awaitable[Contract]]
NatsHandler = Callable[[Any], Awaitable[bytes]]


def traceback_summary(exc: BaseException) -> str:
    """Where `exc` (and what caused it) was raised: types, files, lines and functions only.

    Exception messages and local values are left out: they may carry memory text, tokens or
    personal data, which must never reach a log."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = traceback.extract_tb(current.__traceback__)
        parts.append(f"{type(current).__module__}.{type(current).__qualname__}")
        parts += [f'  File "{f.filename}", line {f.lineno}, in {f.name}' for f in frames]
        current = current.__cause__ or current.__context__
        if current is not None:
            parts.append("raised while handling:")
    return "\n".join(parts)


def validation_failure(exc: ValidationError) -> ValidationFailedError:
    """A VALIDATION_ERROR naming fields and rules, never echoing the input (it may be personal)."""
    problems = [
        {"field": ".".join(str(part) for part in err["loc"]), "problem": err["msg"]}
        for err in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
    return ValidationFailedError("the request is not valid", {"problems": problems})


def parse(model: type[C], payload: bytes | str | dict[str, object]) -> C:
    """Validate `payload` as `model`, raising a VALIDATION_ERROR that carries no input values."""
    try:
        if isinstance(payload, dict):
            return model.model_validate(payload)
        return model.model_validate_json(payload)
    except ValidationError as exc:
        raise validation_failure(exc) from None


OK_PREFIX = b'{"v":1,"ok":true,"result":'

# The headers of the reply being made, if its subscription sends any (`bus.serving`): a
# handler adds to them with `reply_header`.
_REPLY_HEADERS: ContextVar[dict[str, str] | None] = ContextVar("reply_headers", default=None)


def reply_header(name: str, value: str) -> None:
    """A header for the reply to the request being handled (none when asked in process)."""
    headers = _REPLY_HEADERS.get()
    if headers is not None:
        headers[name] = value


async def with_headers(handler: Handler, payload: bytes, subject: str
                       ) -> tuple[bytes, str, dict[str, str]]:
    """`coded_reply`, and the headers the handler added (`reply_header`)."""
    headers: dict[str, str] = {}
    token = _REPLY_HEADERS.set(headers)
    try:
        data, code = await coded_reply(handler, payload, subject)
    finally:
        _REPLY_HEADERS.reset(token)
    return data, code, headers


def ok_bytes(result: Contract) -> bytes:
    return OK_PREFIX + result.to_json() + b"}"


async def answer(handler: Handler, payload: bytes, subject: str) -> Contract:
    """The handler's result. Any failure is the typed error its reply carries: its own, a
    validation failure (no input values), or for an unexpected bug `INTERNAL`, logged with
    where it came from and never its message (content)."""
    try:
        return await handler(payload)
    except MemgateError:
        raise
    except ValidationError as exc:
        raise validation_failure(exc) from None
    except Exception as exc:
        log.error("handler on %s failed: %s", subject, traceback_summary(exc))
        raise InternalError("internal error") from None


async def reply_to(handler: Handler, payload: bytes, subject: str) -> bytes:
    return (await coded_reply(handler, payload, subject))[0]


async def coded_reply(handler: Handler, payload: bytes, subject: str) -> tuple[bytes, str]:
    """The reply's bytes and its outcome: `OK`, or the failure's error code."""
    try:
        return ok_bytes(await answer(handler, payload, subject)), "OK"
    except MemgateError as exc:
        return Failure.of(exc).to_json(), exc.code


async def undecoded(msg: NatsMessage) -> NatsMessage:
    """The decoder of `NatsRouter`: the handler gets the message itself. Its body is parsed
    once, by the handler's own model, not first into a dict that nobody reads."""
    return msg


@dataclass(frozen=True)
class Endpoint:
    """A request/reply subject an actor answers, declared as data beside its handler: the
    `bytes -> Contract` handler, its queue group (empty: no group) and how many requests it
    handles at once (one: in arrival order)."""

    subject: str
    handler: Handler
    queue: str = ""
    max_workers: int = 1


REPLIES = "__memgate_replies__"  # the attribute by which a `replying` adapter names its handler


class NatsRouter(faststream.nats.NatsRouter):
    """faststream's router for `replying` handlers, which also keeps what was registered.

    A plain `NatsBroker` (the in-memory `TestNatsBroker` too) serves every route through
    faststream. `RoutesBroker` (what `memgate up` runs) takes the `replies` instead and serves
    them on raw nats-py subscriptions, and only the `others` through faststream."""

    def __init__(self, **options: Any) -> None:
        super().__init__(decoder=undecoded, **options)
        self.replies: list[Endpoint] = []
        self.others: list[NatsRoute] = []

    def subscriber(  # type: ignore[override]
        self, subject: str = "", queue: str = "", *, max_workers: int | None = None,
        **options: Any,
    ) -> Callable[[Callable[..., Any]], Any]:
        """`router.subscriber(subject, queue=..., max_workers=N)(handler)`, as faststream's;
        `max_workers` bounds how many messages are handled at once (default one)."""
        register = super().subscriber(subject, queue, max_workers=max_workers, **options)

        def decorate(call: Callable[..., Any]) -> Any:
            handler: Handler | None = getattr(call, REPLIES, None)
            if handler is not None and not options:
                self.replies.append(Endpoint(subject, handler, queue, max_workers or 1))
            else:
                self.others.append(NatsRoute(call, subject, queue=queue,
                                             max_workers=max_workers, **options))
            return register(call)

        return decorate


def replying(handler: Handler) -> NatsHandler:
    """Adapt `bytes -> Contract` into a faststream handler whose reply is `Ok` or `Failure`.

    Its one parameter is plain (`Any`): a `NatsMessage` one would be resolved as a context
    field, on a worker thread, for every message. `NatsRouter`'s decoder hands it over. The
    handler itself stays reachable (`REPLIES`) for `RoutesBroker`'s raw subscriptions."""

    async def handle(msg: Any) -> bytes:
        return await reply_to(handler, msg.body, msg.raw_message.subject)

    handle.__name__ = getattr(handler, "__name__", "handle")
    setattr(handle, REPLIES, handler)
    return handle


def hearing(listener: Callable[[bytes], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
    """Adapt `bytes -> None` into a faststream subscriber of published facts (no reply): the
    message's body handed over, as `replying` hands a request's."""

    async def hear(msg: Any) -> None:
        await listener(msg.body)

    hear.__name__ = getattr(listener, "__name__", "hear")
    return hear


def decode_reply(data: bytes, result_type: type[T]) -> T:
    """The result of a reply, or the typed `MemgateError` its `Failure` carries."""
    if data.startswith(OK_PREFIX) and data.endswith(b"}"):  # as `ok_bytes` frames it:
        try:  # the result is parsed once, straight into its model, not first into a dict
            return result_type.model_validate_json(data[len(OK_PREFIX): -1])
        except ValidationError:
            pass  # not framed that way after all: the general path below decides
    reply = REPLY.validate_json(data)
    if isinstance(reply, Failure):
        raise error_for(reply.error.code, reply.error.message, reply.error.details)
    return result_type.model_validate(reply.result)
