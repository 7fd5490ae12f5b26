"""`GET /metrics`: the Prometheus text of every process of this memgate, operator only (SPEC §6).

The operator's token authorises it as it authorises `…/erasure-requests/metrics`: the route
asks the erasure actor for its KPIs with the caller's token, and whatever that refuses (401
for no token or any but the operator's; 503 when the actor is unreachable) the scrape is
refused alike. The rest is read from the processes' metric files (`observe.exposition`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter
from fastapi.responses import Response

from memgate.adapters.http_errors import COMMON, responses
from memgate.adapters.routing import CallerToken, Send
from memgate.bus.subjects import Admin
from memgate.contracts.erasure import ErasureMetrics
from memgate.observe import exposition


def erasure_gauges(kpis: ErasureMetrics) -> dict[str, tuple[str, float]]:
    """The erasure KPIs of SPEC §5.3 as gauges."""
    return {
        "memgate_erasure_requests_open": ("Erasure requests neither completed nor failed",
                                          kpis.open),
        "memgate_erasure_requests_overdue": ("Open erasure requests past their deadline",
                                             kpis.overdue),
        "memgate_erasure_requests_completed": ("Erasure requests completed", kpis.completed),
        "memgate_erasure_days_in_process_max": ("Days the oldest open erasure request has "
                                                "been in process", kpis.days_in_process_max),
        "memgate_erasure_days_in_process_median": ("Median days open erasure requests have "
                                                   "been in process",
                                                   kpis.days_in_process_median),
    }


def readiness(answering: dict[str, bool]) -> exposition.Metric:
    """Whether each actor this adapter waits for answers (1) or not (0) at the scrape: in a
    cluster, a store with no owner shows here while `/healthz` stays 200 `degraded`."""
    return exposition.labelled(
        "memgate_actor_ready", "Whether the actor answers its readiness ping at this scrape "
        "(1) or not (0)", "actor", {subject.removeprefix("mem.int.ready."): float(ready)
                                    for subject, ready in answering.items()})


def router(send: Send, answering: Callable[[], Awaitable[dict[str, bool]]]) -> APIRouter:
    routes = APIRouter(tags=["operations"])

    @routes.get("/metrics", response_class=Response, responses={
        **responses(*COMMON), 200: {"content": {exposition.CONTENT_TYPE: {}},
                                    "description": "The Prometheus text format"}})
    async def metrics(token: CallerToken) -> Response:
        """Commands, latencies, group commits, consumers, dead letters, embedding, file
        rewrites, rate limits and erasure KPIs of every process, and which actors answer
        (operator token)."""
        kpis = await send(Admin.ERASURE_METRICS, ErasureMetrics, token, {})
        text = exposition.exposition([*exposition.gauges(erasure_gauges(kpis)),
                                      readiness(await answering())])
        return Response(text, media_type=exposition.CONTENT_TYPE)

    return routes
