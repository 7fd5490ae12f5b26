"""What operators observe (SPEC §6): Prometheus series (`metrics`, their exposition over every
process of `memgate up`, `exposition`) and OpenTelemetry traces across the bus (`tracing`).

It imports prometheus-client and OpenTelemetry only; every other package may import it."""

from __future__ import annotations

from memgate.observe import metrics, tracing

__all__ = ["metrics", "tracing"]
