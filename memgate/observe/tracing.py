"""OpenTelemetry traces of commands across memgate's processes (SPEC §6).

Off unless the process was configured (`configure`, at its entry point, from
`MEMGATE_OTLP_ENDPOINT` or `MEMGATE_TRACE_DIR`): then every helper here is one check of a
module variable, with no span object and no header made. On, a command is one trace: the
adapter's span, a span per bus hop (the caller's and the server's, joined by the W3C
`traceparent` header of the NATS message) and per stage (governance, storage commit, BM25,
cosine, fusion, rows).

Sampling is decided once, where a trace begins (`MEMGATE_TRACE_SAMPLE_RATIO`): a command
not sampled is no span at any later hop or stage, in any process. Its hops carry one fixed
`traceparent` whose flags say "not sampled" (`UNSAMPLED`), which the serving process reads
as "make nothing" instead of beginning a trace of its own (docs/experiments/observing.md:
the SDK's non-recording spans, attached contexts and injected headers of unsampled commands
cost more than the sampled ones).

Spans carry names of kinds of things only (subjects, stages, transports, error codes, sizes):
never a memory's text, a token, an id of a workspace, member or end user, an exception's
message (`record_exception` is off) or anything else a caller sent.

Like `logging`, the tracer is process-wide: set once where the process starts, read
everywhere; memgate's provider is its own, not OpenTelemetry's global one, so libraries that
trace on their own (FastAPI, faststream) stay silent (docs/DECISIONS.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from contextlib import AbstractContextManager as ContextManager
from typing import Any, Literal, TypeVar

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor, SpanExporter, SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer, get_current_span, use_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_tracer: Tracer | None = None
_EXPORT_DELAY_MS = 200
_PROPAGATOR = TraceContextTextMapPropagator()
_OFF: ContextManager[None] = contextlib.nullcontext()
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER}
Kind = Literal["internal", "client", "server"]
T = TypeVar("T")
TRACES_PATH = "/v1/traces"
# the traceparent of every hop of a command not sampled (W3C: flags 00, "not sampled")
UNSAMPLED = {"traceparent": "00-6d656d676174652d756e73616d706c65-756e73616d706c65-00"}
# set for the work of a command not sampled: no span is begun in it, not even a root
_unsampled: contextvars.ContextVar[bool] = contextvars.ContextVar("unsampled", default=False)


class JsonLinesExporter(SpanExporter):
    """Each finished span as one line of OpenTelemetry's JSON (`ReadableSpan.to_json`) in a
    file of this process: for tests and for a look without a collector."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # one write(2) per batch on an O_APPEND descriptor: a text file's buffer would split a
        # long batch into several writes, and a reader could see half a line between them
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(span.to_json(indent=None) + "\n" for span in spans).encode()
        with self._lock:
            while lines:
                lines = lines[os.write(self._fd, lines):]
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            os.close(self._fd)


def _otlp(endpoint: str) -> SpanExporter:
    try:
        # the extra memgate[otlp]: not installed, it is not type-checked either
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError:
        raise RuntimeError("MEMGATE_OTLP_ENDPOINT needs the OTLP exporter: "
                           "pip install 'memgate[otlp]'") from None
    url = endpoint if endpoint.rstrip("/").endswith(TRACES_PATH) else (
        endpoint.rstrip("/") + TRACES_PATH)
    exporter: SpanExporter = OTLPSpanExporter(endpoint=url)
    return exporter


def configure(process: str, *, otlp_endpoint: str | None, trace_dir: Path | None,
              sample_ratio: float = 1.0) -> Callable[[], None]:
    """Trace this process (named `process`: `front`, `store`, …) if an exporter is set: OTLP
    over HTTP and/or JSON lines in `trace_dir/<process>-<pid>.jsonl`, both batched (written
    off the event loop, within `_EXPORT_DELAY_MS`). Returns what flushes and stops it (a
    no-op when off)."""
    global _tracer
    if otlp_endpoint is None and trace_dir is None:
        return lambda: None
    resource = Resource.create({"service.name": "memgate", "memgate.process": process,
                                "service.instance.id": f"{process}-{os.getpid()}"})
    provider = TracerProvider(resource=resource,
                              sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
    if otlp_endpoint is not None:
        provider.add_span_processor(BatchSpanProcessor(_otlp(otlp_endpoint)))
    if trace_dir is not None:
        exporter = JsonLinesExporter(trace_dir / f"{process}-{os.getpid()}.jsonl")
        provider.add_span_processor(BatchSpanProcessor(exporter,
                                                       schedule_delay_millis=_EXPORT_DELAY_MS))
    _tracer = provider.get_tracer("memgate")

    def shutdown() -> None:
        global _tracer
        _tracer = None
        provider.shutdown()

    return shutdown


def on() -> bool:
    return _tracer is not None


def quiet() -> bool:
    """Off, or in a command not sampled: no span will be made here."""
    return _tracer is None or _unsampled.get()


def _failed(span: Span, exc: BaseException) -> None:
    """The outcome of a failed span: its error code (a `MemgateError`'s) or the exception's
    type, never its message (it may quote content)."""
    span.set_status(StatusCode.ERROR)
    span.set_attribute("memgate.code", str(getattr(exc, "code", "INTERNAL")))
    span.set_attribute("error.type", type(exc).__name__)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The work of a command not sampled: nothing in it makes a span."""
    token = _unsampled.set(True)
    try:
        yield
    finally:
        _unsampled.reset(token)


@contextlib.contextmanager
def _span(tracer: Tracer, name: str, kind: SpanKind, context: Context | None,
          attributes: Mapping[str, Any] | None) -> Iterator[None]:
    """A span, current for the work inside; where it would begin a trace the sampler left
    out, the work is quiet instead."""
    current = tracer.start_span(name, context=context, kind=kind, attributes=attributes,
                                record_exception=False, set_status_on_exception=False)
    if not current.is_recording():
        with _quiet():
            yield
        return
    with use_span(current, end_on_exit=True, record_exception=False,
                  set_status_on_exception=False):
        try:
            yield
        except BaseException as exc:
            _failed(current, exc)
            raise


def span(name: str, *, kind: Kind = "internal",
         attributes: Mapping[str, Any] | None = None) -> ContextManager[None]:
    """`with span("fusion"):` a child of the current span; nothing at all when off or not
    sampled."""
    if _tracer is None or _unsampled.get():
        return _OFF
    return _span(_tracer, name, _KINDS[kind], None, attributes)


async def _staged(name: str, work: Awaitable[T]) -> T:
    with span(name):
        return await work


def staged(name: str, work: Awaitable[T]) -> Awaitable[T]:
    """`work` in a span of its own (for work awaited on another task); `work` itself when
    off or not sampled."""
    return work if quiet() else _staged(name, work)


def _sampled(traceparent: str) -> bool:
    """The W3C flags' "sampled" bit (the last two hex digits); a malformed value is not a
    decision, and is left to the propagator."""
    try:
        return bool(int(traceparent[-2:], 16) & 1)
    except ValueError:
        return True


def served(name: str, headers: Mapping[str, str] | None,
           attributes: Mapping[str, Any] | None = None) -> ContextManager[None]:
    """A server span continuing the caller's trace from a message's `traceparent` header (a
    new trace without one); nothing at all when off, and quiet work when the caller's trace
    is not sampled."""
    if _tracer is None:
        return _OFF
    parent = headers.get("traceparent") if headers else None
    if parent is not None and not _sampled(parent):
        return _quiet()
    context = _PROPAGATOR.extract(headers) if headers else None
    return _span(_tracer, name, SpanKind.SERVER, context, attributes)


def headers() -> dict[str, str] | None:
    """The `traceparent` (and `tracestate`) of the current span, for a NATS message: None when
    off (no header at all is sent then), `UNSAMPLED` in a command not sampled."""
    if _tracer is None:
        return None
    if _unsampled.get():
        return UNSAMPLED
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier or None


def note(attributes: Mapping[str, str | int | float | bool]) -> None:
    """Attributes of the current span (kinds, codes and sizes only); nothing when off."""
    if not quiet():
        get_current_span().set_attributes(attributes)


__all__ = ["UNSAMPLED", "JsonLinesExporter", "Kind", "configure", "headers", "note", "on",
           "quiet", "served", "span", "staged"]
