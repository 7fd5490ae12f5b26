"""Latency of remember, list and recall over the bus and over REST, and ingest lag.

    python -m bench.latency [--sizes 300 5000] [--queries 300]

For each size N: load N memories for one member (8 in flight), report remember throughput and how
long the indexer and embedder took to drain the events; then time sequential remember, list and
recall calls over the bus client and over REST (p50/p95/p99).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from bench.harness import HEADER, agent_token, consumers_idle, memgate_up, row

WORDS = [
    "deploy",
    "database",
    "meeting",
    "customer",
    "release",
    "staging",
    "budget",
    "design",
    "review",
    "incident",
    "migration",
    "invoice",
    "roadmap",
    "hiring",
    "laptop",
    "vacation",
    "lunch",
    "coffee",
    "metrics",
    "dashboard",
    "kubernetes",
    "postgres",
    "frontend",
    "backend",
    "security",
    "audit",
    "onboarding",
    "travel",
    "offsite",
]


def note(rng: random.Random, i: int) -> str:
    return f"note {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16)))


async def timed(call: Callable[[], Awaitable[object]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def run(size: int, queries: int) -> list[str]:
    rng = random.Random(size)
    lines = []
    async with memgate_up() as running:
        token = await agent_token(running)
        auth = {"Authorization": f"Bearer {token}"}
        async with await running.agent(token) as agent:
            gate = asyncio.Semaphore(8)

            async def load(i: int) -> None:
                async with gate:
                    await agent.remember(f"ns{i % 5}", note(rng, i))

            started = time.perf_counter()
            await asyncio.gather(*(load(i) for i in range(size)))
            load_s = time.perf_counter() - started
            lag_s = await consumers_idle(running)
            lines.append(
                f"N={size}: loaded in {load_s:.1f} s = {size / load_s:.0f} remembers/s "
                f"(8 in flight); indexer+embedder drained {lag_s:.2f} s after the last "
                "remember returned"
            )
            lines.append(HEADER)

            def query() -> str:
                return " ".join(rng.sample(WORDS, 3))

            http = running.http

            async def rest(op: str, body: dict[str, object]) -> None:
                response = await http.post(f"/api/agent/v1/memories/{op}", json=body, headers=auth)
                response.raise_for_status()

            for _ in range(20):  # warm up both paths
                await agent.recall(query())
                await rest("recall", {"query": query()})
            lines.append(
                row(
                    f"recall over bus (N={size})",
                    await timed(lambda: agent.recall(query()), queries),
                )
            )
            lines.append(
                row(
                    f"recall over REST (N={size})",
                    await timed(lambda: rest("recall", {"query": query()}), queries),
                )
            )
            lines.append(
                row(f"list over bus (N={size})", await timed(lambda: agent.list(limit=20), queries))
            )
            lines.append(
                row(
                    f"list over REST (N={size})",
                    await timed(lambda: rest("list", {"limit": 20}), queries),
                )
            )
            lines.append(
                row(
                    "remember over bus",
                    await timed(lambda: agent.remember("bench", note(rng, 0)), min(queries, 200)),
                )
            )
            lines.append(
                row(
                    "remember over REST",
                    await timed(
                        lambda: rest("remember", {"namespace": "bench", "text": note(rng, 0)}),
                        min(queries, 200),
                    ),
                )
            )
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[300, 5000])
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    for size in args.sizes:
        print(f"loading {size} memories ...", flush=True)
        print("\n".join(await run(size, args.queries)), flush=True)
        print()


if __name__ == "__main__":
    asyncio.run(main())
