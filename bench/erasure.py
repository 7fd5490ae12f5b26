"""How long erasing a member takes end to end (SPEC §5.3), at N memories.

`python -m bench.erasure [N ...]` (default 5000) starts `memgate up` on a fresh data directory,
has one member's agent remember N memories (and another member's 100, which must survive),
waits for the indexer and embedder, then runs one erasure request through every stage over
REST, as `memgate admin erase` does, and prints a table: seconds per stage, records per layer.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from typing import Any

from bench.harness import ADMIN, Running, consumers_idle, memgate_up
from bench.latency import note

BASE = "/api/admin/erasure-requests"


async def run(size: int) -> list[str]:
    rng = random.Random(size)
    async with memgate_up() as running:
        http = running.http
        operator = {"Authorization": f"Bearer {ADMIN}"}

        async def call(method: str, path: str, body: dict[str, Any] | None = None,
                       ) -> dict[str, Any]:
            response = await http.request(method, path, json=body, headers=operator)
            response.raise_for_status()
            return dict(response.json())

        member, other = await setup(running), await setup(running)
        async with await running.agent(member["token"]) as agent, \
                await running.agent(other["token"]) as bystander:
            gate = asyncio.Semaphore(8)

            async def load(client: Any, i: int) -> None:
                async with gate:
                    await client.remember(f"ns{i % 5}", note(rng, i))

            started = time.perf_counter()
            await asyncio.gather(*(load(agent, i) for i in range(size)),
                                 *(load(bystander, i) for i in range(100)))
            load_s = time.perf_counter() - started
            await consumers_idle(running)
            timings: dict[str, float] = {}

            async def stage(name: str, method: str, path: str,
                            body: dict[str, Any] | None = None) -> dict[str, Any]:
                began = time.perf_counter()
                result = await call(method, path, body)
                timings[name] = time.perf_counter() - began
                return result

            created = await stage("intake", "POST", BASE, {
                "workspaceId": member["workspaceId"],
                "subject": {"memberId": member["memberId"]}})
            request = f"{BASE}/{created['requestId']}"
            await stage("verify", "POST", f"{request}/verify",
                        {"method": "bench", "verifiedBy": "bench"})
            found = (await stage("discover", "POST", f"{request}/discover"))["discovery"]
            await stage("decide", "POST", f"{request}/decide", {"holds": [], "reason": "bench"})
            began = time.perf_counter()
            view = await call("POST", f"{request}/execute")
            while view["status"] == "executing":
                await asyncio.sleep(0.05)
                view = await call("GET", request)
            timings["execute"] = time.perf_counter() - began
            assert view["status"] == "completed", view
            left = await bystander.list(limit=5)
            assert left.memories, "the other member's memories must survive"
            lines = [f"N={size}: loaded in {load_s:.1f} s; erasure of one member end to end "
                     f"{sum(timings.values()):.2f} s",
                     "| stage | seconds |", "|---|---|"]
            lines += [f"| {name} | {seconds:.3f} |" for name, seconds in timings.items()]
            lines += ["", "| layer | discovered | erased |", "|---|---|---|"]
            erased = {e["layer"]: e["erased"] for e in view["evidence"]}
            lines += [f"| {layer} | {count} | {erased.get(layer, '-')} |"
                      for layer, count in found.items()]
            return lines


async def setup(running: Running) -> dict[str, str]:
    """A fresh workspace whose owner has an agent credential: ids and the token."""
    http, operator = running.http, {"Authorization": f"Bearer {ADMIN}"}
    created = (await http.post("/api/admin/workspaces", json={"name": "bench"},
                               headers=operator)).json()
    auth = {"Authorization": f"Bearer {created['owner']['memberToken']}"}
    workspace = created["workspaceId"]
    await http.put(f"/api/w/{workspace}/ask-history/settings",
                   json={"agentMemoriesEnabled": True}, headers=auth)
    credential = (await http.post(f"/api/w/{workspace}/credentials", headers=auth, json={
        "name": "bench", "scopes": ["memory:read", "memory:write"]})).json()
    return {"workspaceId": workspace, "memberId": created["owner"]["memberId"],
            "token": credential["token"]}


async def main() -> None:
    sizes = [int(arg) for arg in sys.argv[1:]] or [5000]
    for size in sizes:
        print("\n".join(await run(size)))


if __name__ == "__main__":
    asyncio.run(main())
