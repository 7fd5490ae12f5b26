"""`memgate import mem0` throughput: a mem0 platform export of N memories imported into a new
memory space, then the same import run again (every memory skipped), several runs.

    python -m bench.mem0_import [--size 2000] [--runs 3] [--batch 100]

Starts `memgate up` (a separate process, limits raised for the load), creates a workspace whose
owner imports; each run imports into a space of its own through `adapters.import_mem0.run`
(the CLI's loop: batches over REST, each item masked and checked, its mem0 id looked up, the
accepted ones stored in one transaction). Prints memories/s of each run and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from rich.console import Console

from bench.harness import ADMIN, memgate_up
from memgate.adapters.import_mem0 import Report, run

USERS = 10
TOPICS = ["food", "travel", "work", "health"]


def export(size: int, run_number: int) -> list[dict[str, Any]]:
    start = datetime(2025, 1, 1, tzinfo=UTC)
    return [{"id": f"bench-{run_number}-{n:07d}",
             "memory": f"note {n}: prefers {TOPICS[n % 4]} option {n * 7} on weekdays",
             "user_id": f"user-{n % USERS}", "agent_id": "planner" if n % 5 == 0 else None,
             "metadata": {"n": n, "topic": TOPICS[n % 4]}, "categories": [TOPICS[n % 4]],
             "created_at": (start + timedelta(minutes=n)).isoformat(),
             "updated_at": (start + timedelta(minutes=n, seconds=30)).isoformat()}
            for n in range(size)]


def timed(memories: list[dict[str, Any]], client: httpx.Client, space: str,
          batch: int) -> tuple[float, Report]:
    started = time.perf_counter()
    report = run(memories, client, space, Console(quiet=True), batch=batch)
    return len(memories) / (time.perf_counter() - started), report


async def main(size: int, runs: int, batch: int) -> None:
    async with memgate_up(MEMGATE_LIMIT_IMPORTS_PER_HOUR="1000000") as running:
        http = running.http
        created = (await http.post("/api/admin/workspaces", json={"name": "bench"},
                                   headers={"Authorization": f"Bearer {ADMIN}"})).json()
        ws, owner = created["workspaceId"], created["owner"]
        auth = {"Authorization": f"Bearer {owner['memberToken']}"}
        (await http.patch(f"/api/w/{ws}/members/{owner['memberId']}",
                          json={"memorySpacesEnabled": True}, headers=auth)).raise_for_status()
        first, again = [], []
        with httpx.Client(base_url=running.http_url, headers=auth, timeout=120) as client:
            for number in range(runs):
                space = (await http.post("/memory/spaces", json={"description": "bench"},
                                         headers=auth)).json()["id"]
                memories = export(size, number)
                rate, report = await asyncio.to_thread(timed, memories, client, space, batch)
                assert report.imported == size and report.stopped is None, report
                first.append(rate)
                rate, report = await asyncio.to_thread(timed, memories, client, space, batch)
                assert report.skipped == size, report
                again.append(rate)
                print(f"run {number + 1}: imported {size} at {first[-1]:.0f}/s, "
                      f"run again (all skipped) at {again[-1]:.0f}/s")
    print(f"\n| mem0 import ({size} memories, batch {batch}) | runs | median memories/s |")
    print("|---|---|---|")
    print(f"| first import | {runs} | {statistics.median(first):.0f} |")
    print(f"| run again, all skipped | {runs} | {statistics.median(again):.0f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=100)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.size, arguments.runs, arguments.batch))
