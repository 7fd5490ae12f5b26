"""An in-sync standby for every store (SPEC §6, "Many machines"): a store's home node killed
outright (its nats-server and disk with it) moves the store to a standby on another node, which
serves every acknowledged write, and the node that comes back keeps a copy again."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import eventually, free_port
from tests.test_cluster_nodes import ADMIN, NODES, Node
from tests.test_processes import children, healthy

pytestmark = pytest.mark.timeout(420)

RESUME_WITHIN_S = 20.0  # the targets for a lost node's partitions
RECALL_WITHIN_S = 30.0


class Agent:
    """One agent's remembers through a node, and what was acknowledged."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.acked: dict[str, str] = {}
        self.sent: set[str] = set()

    async def remember(self, through: Node, text: str) -> bool:
        self.sent.add(text)
        try:
            answer = await through.http.post("/api/agent/v1/memories/remember",
                                             headers=self.headers,
                                             json={"namespace": "n", "text": text}, timeout=15)
        except httpx.TransportError:
            return False
        if answer.status_code != 200:
            return False
        self.acked[answer.json()["memoryId"]] = text
        return True

    async def load(self, through: Node, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.remember(through, f"note {len(self.acked)} through {through.name} "
                                         f"at {time.monotonic():.3f}")
            await asyncio.sleep(0.02)

    async def listed(self, through: Node) -> dict[str, str]:
        found: dict[str, str] = {}
        cursor = None
        while True:
            answer = await through.http.post(
                "/api/agent/v1/memories/list", headers=self.headers,
                json={"namespace": "n", "limit": 100, "cursor": cursor})
            assert answer.status_code == 200, answer.text
            page = answer.json()
            for memory in page["memories"]:
                assert memory["memoryId"] not in found  # none twice
                found[memory["memoryId"]] = memory["text"]
            if not (cursor := page.get("nextCursor")):
                return found

    async def all_kept(self, through: Node) -> None:
        """Every acknowledged memory listed once; nothing listed that was not sent (a write
        whose answer was lost in the failover may be kept, never made up)."""
        found = await self.listed(through)
        assert self.acked.items() <= found.items()
        assert set(found.values()) <= self.sent


async def _cluster(tmp_path: Path, env: dict[str, str] | None = None,
                   ) -> tuple[list[Node], Agent]:
    cluster_ports = [free_port() for _ in range(NODES)]
    nodes = [Node(tmp_path, n, cluster_ports, env) for n in range(NODES)]
    try:
        for one_node in nodes:
            await one_node.start()
        for one_node in nodes:
            await eventually(lambda n=one_node: healthy(n.http), timeout=150)
        created = (await nodes[0].http.post("/api/admin/workspaces", json={"name": "acme"},
                                            headers=ADMIN)).json()
        ws, owner = created["workspaceId"], {
            "Authorization": f"Bearer {created['owner']['memberToken']}"}
        await nodes[0].http.put(f"/api/w/{ws}/ask-history/settings", headers=owner,
                                json={"agentMemoriesEnabled": True})
        token = (await nodes[0].http.post(f"/api/w/{ws}/credentials", headers=owner, json={
            "name": "bot", "scopes": ["memory:read", "memory:write"]})).json()["token"]
    except BaseException:  # no node outlives a cluster that did not come up
        for one_node in nodes:
            await one_node.stop()
        raise
    return nodes, Agent({"Authorization": f"Bearer {token}"})


async def _stores(through: Node) -> dict[str, dict[str, object]]:
    shown = await through.http.get("/api/admin/cluster", headers=ADMIN)
    assert shown.status_code == 200, shown.text
    return {s["name"]: s for s in shown.json()["stores"]}


async def _in_sync(through: Node, names: list[str], standbys: int) -> bool:
    stores = await _stores(through)
    return all(len(stores[name].get("inSync") or []) >= standbys for name in names)


async def _until(check: Callable[[], Awaitable[bool]], within_s: float) -> float:
    """Seconds until `check` holds (polled), failing past `within_s`."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < within_s, f"not within {within_s} s"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


REPLICATED = ["storage.p0", "audit", "directory", "erasure", "keys", "registry", "sessions",
              "spaces"]


async def test_a_stores_home_killed_outright_moves_it_to_a_standby_losing_nothing(
        tmp_path: Path) -> None:
    nodes, agent = await _cluster(tmp_path)
    try:
        # every replicated store has an in-sync standby on each other node
        await eventually(lambda: _in_sync(nodes[0], REPLICATED, NODES - 1), timeout=60)
        stores = await _stores(nodes[0])
        home = next(n for n in nodes if n.name == stores["storage.p0"]["home"])
        survivors = [n for n in nodes if n is not home]
        for i in range(20):
            assert await agent.remember(home, f"before {i}")

        # kill -9 of the whole node mid-load through a survivor
        stop = asyncio.Event()
        load = asyncio.create_task(agent.load(survivors[0], stop))
        await asyncio.sleep(1.0)
        before = len(agent.acked)
        await home.kill()
        killed = time.monotonic()

        async def resumed() -> bool:
            return len(agent.acked) > before + 5

        moved_s = await _until(resumed, RESUME_WITHIN_S + 10)
        stop.set()
        await load
        print(f"writes resumed {moved_s:.1f} s after the kill")
        assert moved_s <= RESUME_WITHIN_S

        # every acknowledged memory, once, through either survivor
        for survivor in survivors:
            await agent.all_kept(survivor)

        async def recalled() -> bool:
            answer = await survivors[1].http.post(
                "/api/agent/v1/memories/recall", headers=agent.headers,
                json={"namespace": "n", "query": "before 3"})
            return answer.status_code == 200 and answer.json()["degraded"] == [] and \
                bool(answer.json()["memories"])

        await _until(recalled, RECALL_WITHIN_S)
        recall_s = time.monotonic() - killed
        print(f"non-degraded recall {recall_s:.1f} s after the kill")
        assert recall_s <= RECALL_WITHIN_S

        stores = await _stores(survivors[0])
        assert stores["storage.p0"]["home"] in {n.name for n in survivors}
        assert stores["storage.p0"]["servedBy"] == stores["storage.p0"]["home"]

        # the lost node comes back with an empty disk: it copies every store again, serves
        # nothing stale, and reads through it see every acknowledged write
        shutil.rmtree(home.data_dir)
        await home.start()
        await eventually(lambda: healthy(home.http), timeout=150)
        await eventually(lambda: _in_sync(survivors[0], REPLICATED, NODES - 1), timeout=90)
        await agent.all_kept(home)
    finally:
        for one_node in nodes:
            await one_node.stop()


def _store_process(node: Node) -> int:
    """The node's `store` child: where its stores' owners run."""
    assert node.process is not None
    [pid] = [pid for pid, cmdline in children(node.process.pid).items()
             if "--group store" in cmdline]
    return pid


async def test_a_drained_node_hands_its_stores_over_and_a_stopped_owner_commits_nothing_after(
        tmp_path: Path) -> None:
    nodes, agent = await _cluster(tmp_path)
    try:
        await eventually(lambda: _in_sync(nodes[0], REPLICATED, NODES - 1), timeout=60)
        stores = await _stores(nodes[0])
        home = next(n for n in nodes if n.name == stores["storage.p0"]["home"])
        through = next(n for n in nodes if n is not home)

        # drained under load: every replicated store it served moves, nothing is lost
        stop = asyncio.Event()
        load = asyncio.create_task(agent.load(through, stop))
        await asyncio.sleep(1.0)
        drained = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "memgate.adapters", "cluster", "drain", home.name,
            "--data-dir", str(home.data_dir), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(drained.communicate(), 180)
        print(out.decode())
        assert drained.returncode == 0, out.decode()
        await asyncio.sleep(1.0)
        stop.set()
        await load
        stores = await _stores(through)
        moved = [name for name in REPLICATED if stores[name]["servedBy"] != home.name]
        assert moved == REPLICATED, stores
        # the standby the drain handed the partition to is the one serving it
        [line] = [line for line in out.decode().splitlines() if "storage.p0:" in line]
        assert f"moved to {stores['storage.p0']['servedBy']} " in line, line
        assert line.endswith(f"handed to {stores['storage.p0']['servedBy']})"), line
        await agent.all_kept(through)
        # the drained node keeps an in-sync copy again
        await eventually(lambda: _in_sync(through, REPLICATED, NODES - 1), timeout=90)

        # the new owner's process stopped (SIGSTOP) past its lease: a standby takes over;
        # woken, the old owner commits nothing, and becomes a standby again
        owner = next(n for n in nodes if n.name == stores["storage.p0"]["servedBy"])
        other = next(n for n in nodes if n is not owner)
        stop = asyncio.Event()
        load = asyncio.create_task(agent.load(other, stop))
        await asyncio.sleep(1.0)
        stopped = _store_process(owner)
        os.kill(stopped, signal.SIGSTOP)
        before = len(agent.acked)
        try:
            resumed_s = await _until(lambda: _more(agent, before), RESUME_WITHIN_S + 10)
            print(f"writes resumed {resumed_s:.1f} s after the owner stopped")
        finally:
            os.kill(stopped, signal.SIGCONT)
        stop.set()
        await load
        stores = await _stores(other)
        assert stores["storage.p0"]["servedBy"] != owner.name
        await eventually(lambda: _in_sync(other, ["storage.p0"], NODES - 1), timeout=90)
        for one_node in nodes:
            await eventually(lambda n=one_node: healthy(n.http), timeout=90)
            await agent.all_kept(one_node)
    finally:
        for one_node in nodes:
            await one_node.stop()


async def _more(agent: Agent, than: int) -> bool:
    return len(agent.acked) > than + 5
