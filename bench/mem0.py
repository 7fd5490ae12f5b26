"""Latency of the mem0-compatible routes through the real `mem0ai` client, beside the agent
routes' figures, at N memories in one space (SPEC §4.4).

    python -m bench.mem0 [--size 5000] [--queries 300]

Starts `memgate up` (a separate process, limits raised for the load), creates a memory space,
and times, through the unmodified `MemoryClient`: `add` (one message stored verbatim, the
space has no LLM) for each of the N memories, spread over 10 users; then `search` (fused
recall) over the whole space and filtered to one user, `get`, and `get_all` of one user's
first page. The same instance then holds N agent memories for one member, loaded over the bus,
and times REST `remember` and `recall` for comparison. Prints a table (p50/p95/p99 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from collections.abc import Callable

os.environ["MEM0_TELEMETRY"] = "False"  # before mem0 is imported: it sends nothing anywhere
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-bench-"))

from mem0 import MemoryClient

from bench.harness import (
    ADMIN, HEADER, agent_token, consumers_idle, memgate_up, row,
)
from bench.latency import WORDS, note

USERS = 10


def timed(call: Callable[[], object], n: int) -> list[float]:
    """Sequential calls of a blocking client (memgate runs in another process)."""
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def run(size: int, queries: int) -> list[str]:
    rng = random.Random(size)
    lines: list[str] = []
    async with memgate_up() as running:
        http = running.http
        created = (await http.post("/api/admin/workspaces", json={"name": "bench"},
                                   headers={"Authorization": f"Bearer {ADMIN}"})).json()
        ws, owner = created["workspaceId"], created["owner"]
        auth = {"Authorization": f"Bearer {owner['memberToken']}"}
        (await http.patch(f"/api/w/{ws}/members/{owner['memberId']}",
                          json={"memorySpacesEnabled": True}, headers=auth)).raise_for_status()
        space = (await http.post("/memory/spaces", json={"description": "bench"},
                                 headers=auth)).json()
        client = MemoryClient(host=f"{running.http_url}/memory/{space['id']}",
                              api_key=owner["memberToken"])

        ids: list[str] = []

        def add() -> None:
            i = len(ids)
            added = client.add(note(rng, i), user_id=f"user-{i % USERS}")
            ids.append(added["results"][0]["id"])

        started = time.perf_counter()
        adds = timed(add, size)
        load_s = time.perf_counter() - started
        lag_s = await consumers_idle(running)
        lines.append(f"mem0: {size} memories added in {load_s:.1f} s through MemoryClient.add "
                     f"(one at a time, {USERS} users); indexer+embedder drained {lag_s:.2f} s "
                     "after the last add returned")

        def query() -> str:
            return " ".join(rng.sample(WORDS, 3))

        for _ in range(20):  # warm up
            client.search(query(), top_k=10)
        table = [HEADER, row(f"mem0 add (0..{size} in the space)", adds)]
        table.append(row(f"mem0 search, whole space (N={size})",
                         timed(lambda: client.search(query(), top_k=10), queries)))
        table.append(row(f"mem0 search, one user (N={size})",
                         timed(lambda: client.search(query(), top_k=10,
                                                     filters={"user_id": "user-3"}), queries)))
        table.append(row("mem0 get", timed(lambda: client.get(rng.choice(ids)), queries)))
        table.append(row(f"mem0 get_all, 1 user, 100 (N={size})",
                         timed(lambda: client.get_all(filters={"user_id": "user-3"},
                                                      page=1, page_size=100), queries)))

        token = await agent_token(running)
        agent_auth = {"Authorization": f"Bearer {token}"}
        async with await running.agent(token) as agent:
            gate = asyncio.Semaphore(8)

            async def load(i: int) -> None:
                async with gate:
                    await agent.remember(f"ns{i % 5}", note(rng, i))

            await asyncio.gather(*(load(i) for i in range(size)))
        await consumers_idle(running)

        async def rest(op: str, body: dict[str, object]) -> None:
            (await http.post(f"/api/agent/v1/memories/{op}", json=body,
                             headers=agent_auth)).raise_for_status()

        async def atimed(op: str, body: Callable[[], dict[str, object]], n: int) -> list[float]:
            samples = []
            for _ in range(n):
                started = time.perf_counter()
                await rest(op, body())
                samples.append((time.perf_counter() - started) * 1000)
            return samples

        await atimed("recall", lambda: {"query": query()}, 20)
        table.append(row(f"agent recall over REST (N={size})",
                         await atimed("recall", lambda: {"query": query()}, queries)))
        table.append(row("agent remember over REST",
                         await atimed("remember", lambda: {"namespace": "bench",
                                                           "text": note(rng, 0)},
                                      min(queries, 200))))
        lines += table
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=5000)
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    print(f"loading {args.size} memories through the mem0 client ...", flush=True)
    print("\n".join(await run(args.size, args.queries)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
