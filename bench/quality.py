"""Retrieval quality on a labelled set: recall@1 and recall@5 for BM25, cosine and fused.

    python -m bench.quality [--set bench/data/relevance.json]

Fused numbers come from the public recall command; the single lists come from the indexer and
the embedder over all of the member's memories (the internal subjects recall itself calls).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import defaultdict
from pathlib import Path

import nats

from bench.harness import agent_token, consumers_idle, memgate_up
from memgate.bus import BusClient
from memgate.contracts import Principal
from memgate.contracts.internal import (
    Owner,
    PrincipalRequest,
    Ranking,
    RankRequest,
    RecallFilters,
)
from memgate.storage.directory import hash_token

DEFAULT_SET = Path(__file__).parent / "data" / "relevance.json"
METHODS = ("bm25", "cosine", "fused")


def hit(ranked: list[str], relevant: set[str], k: int) -> bool:
    return bool(relevant.intersection(ranked[:k]))


async def evaluate(labelled: dict) -> dict[str, dict[str, list[bool]]]:  # type: ignore[type-arg]
    async with memgate_up() as running:
        token = await agent_token(running)
        directory_nc = await nats.connect(running.nats_url, **running.internal_login("governance"))
        principal = await BusClient(directory_nc).request(
            "mem.int.dir.principal", PrincipalRequest(token_hash=hash_token(token)), Principal
        )
        await directory_nc.close()
        nc = await nats.connect(running.nats_url, **running.internal_login("recall"))
        bus = BusClient(nc)  # asks the rankers, as the recall actor does
        owner = Owner(tenant=principal.workspace_id, subject_id=principal.member_id)
        results: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
        async with await running.agent(token) as agent:
            ids = {}
            for memory in labelled["memories"]:
                stored = await agent.remember(memory["namespace"], memory["text"])
                ids[stored.memory_id] = memory["id"]
            await consumers_idle(running)
            for query in labelled["queries"]:
                rank = RankRequest(
                    filters=RecallFilters(owner=owner), query=query["query"], depth=100
                )
                ranked = {
                    "bm25": (await bus.request("mem.int.index.p0.rank", rank, Ranking)).memory_ids,
                    "cosine": (
                        await bus.request("mem.int.embed.p0.rank", rank, Ranking)
                    ).memory_ids,
                    "fused": [
                        m.memory_id for m in (await agent.recall(query["query"], limit=5)).memories
                    ],
                }
                relevant = set(query["relevant"])
                for group in ("all", f"lang={query['lang']}", f"kind={query['kind']}"):
                    for method in METHODS:
                        labels = [ids[i] for i in ranked[method]]
                        results[group][f"{method}@1"].append(hit(labels, relevant, 1))
                        results[group][f"{method}@5"].append(hit(labels, relevant, 5))
        await nc.close()
    return results


def table(results: dict[str, dict[str, list[bool]]]) -> str:
    columns = [f"{m}@{k}" for k in (1, 5) for m in METHODS]
    lines = [
        "| queries        |   n | " + " | ".join(f"{c:>9}" for c in columns) + " |",
        "|----------------|-----|" + "|".join("-" * 11 for _ in columns) + "|",
    ]
    for group in sorted(results, key=lambda g: (g != "all", g)):
        n = len(results[group]["fused@1"])
        cells = " | ".join(f"{sum(results[group][c]) / n:>9.3f}" for c in columns)
        lines.append(f"| {group:<14} | {n:>3} | {cells} |")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--set", type=Path, default=DEFAULT_SET)
    args = parser.parse_args()
    labelled = json.loads(args.set.read_text())
    print(f"{len(labelled['memories'])} memories, {len(labelled['queries'])} queries", flush=True)
    print(table(await evaluate(labelled)))


if __name__ == "__main__":
    asyncio.run(main())
