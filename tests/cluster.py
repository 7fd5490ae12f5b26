"""Three `memgate up` nodes on loopback, clustered (SPEC §6, "Many machines"), for the cluster
tests: a node the test can kill -9 (its whole process tree) and start again, an agent whose
acknowledged writes are counted, and the operator's view of the stores."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from memgate import MemgateClient
from tests.conftest import ADMIN_TOKEN, eventually, free_port
from tests.test_processes import alive, children, healthy

NODES = 3
STANDBYS = 1  # the in-sync standbys a store keeps by default (`Settings.standbys`)
# a cluster where every store keeps one on each other node
EVERY_OTHER = {"MEMGATE_STANDBYS": str(NODES - 1)}
RESUME_WITHIN_S = 20.0  # the target for writes on a lost node's partitions
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


class Node:
    """One `memgate up` node that the test can kill -9 (its whole process tree) and start
    again on the same data directory and ports."""

    def __init__(self, tmp_path: Path, n: int, cluster_ports: list[int],
                 env: dict[str, str] | None = None) -> None:
        self.name = f"n{n}"
        self._env = env or {}
        self.data_dir = tmp_path / self.name
        self.http_port, self.nats_port = free_port(), free_port()
        self._log = tmp_path / f"{self.name}.log"
        self._args = ["--data-dir", str(self.data_dir), "--http", f"127.0.0.1:{self.http_port}",
                      "--nats-port", str(self.nats_port), "--node", self.name,
                      "--cluster", f"127.0.0.1:{cluster_ports[n]}", "--routes",
                      ",".join(f"nats://127.0.0.1:{port}" for port in cluster_ports)]
        self.process: asyncio.subprocess.Process | None = None
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.http_port}", timeout=30)

    async def start(self) -> None:
        if self.http.is_closed:  # stopped before
            self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.http_port}",
                                          timeout=30)
        with self._log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "memgate.adapters", "up", *self._args,
                # the load runs past the hourly remember limit (120) on a fast machine
                env={**os.environ, "MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN,
                     "MEMGATE_LIMIT_REMEMBERS_PER_HOUR": "100000", **self._env},
                stdout=log, stderr=log)

    async def drain(self) -> str:
        """`memgate cluster drain` of this node: what it printed (asserted to succeed)."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "memgate.adapters", "cluster", "drain", self.name,
            "--data-dir", str(self.data_dir), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(process.communicate(), 180)
        assert process.returncode == 0, out.decode()
        return out.decode()

    async def kill(self) -> None:
        """kill -9 of the supervisor, its nats-server and every child at once."""
        assert self.process is not None
        tree = [self.process.pid, *children(self.process.pid)]
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await self.process.wait()
        for pid in tree:
            await eventually(lambda pid=pid: _gone(pid), timeout=30)

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 60)
            except TimeoutError:
                await self.kill()
        await self.http.aclose()


async def _gone(pid: int) -> bool:
    return not alive(pid)


class Agent:
    """One agent's remembers through a node: what was acknowledged, and what was refused
    (503: not written) and not acknowledged since."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.acked: dict[str, str] = {}
        self.sent: set[str] = set()
        self.refused: set[str] = set()

    async def remember(self, through: Node, text: str) -> bool:
        self.sent.add(text)
        try:
            answer = await through.http.post("/api/agent/v1/memories/remember",
                                             headers=self.headers,
                                             json={"namespace": "n", "text": text}, timeout=15)
        except httpx.TransportError:
            return False
        if answer.status_code == 503:
            self.refused.add(text)
        if answer.status_code != 200:
            return False
        self.acked[answer.json()["memoryId"]] = text
        self.refused.discard(text)  # sent again (`until`) and written this time
        return True

    async def load(self, through: Node, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.remember(through, f"note {len(self.acked)} through {through.name} "
                                         f"at {time.monotonic():.3f}")
            await asyncio.sleep(0.02)

    async def listed(self, through: Node) -> dict[str, str]:
        found: dict[str, str] = {}
        cursor = None
        while True:  # (asked again while a store the list needs is still moving)
            page = await answered(lambda: through.http.post(
                "/api/agent/v1/memories/list", headers=self.headers,
                json={"namespace": "n", "limit": 100, "cursor": cursor}))
            for memory in page["memories"]:
                assert memory["memoryId"] not in found  # none twice
                found[memory["memoryId"]] = memory["text"]
            if not (cursor := page.get("nextCursor")):
                return found

    async def all_kept(self, through: Node) -> None:
        """Every acknowledged memory listed once; nothing listed that was not sent (a write
        whose answer was lost in the failover may be kept, never made up) or was answered
        503 (not written)."""
        found = await self.listed(through)
        assert self.acked.items() <= found.items()
        assert set(found.values()) <= self.sent
        assert not set(found.values()) & self.refused


ELECTION_S = 30.0  # JetStream electing the leaders a killed node led (4-9 s each), and more


async def answered(call: Callable[[], Awaitable[httpx.Response]], *,
                   done_before: int | None = None) -> dict[str, Any]:
    """The JSON of a 200 answer to `call`, asked again while the cluster answers 503 or 504 (a
    store moving to another node, its buckets' leaders being elected), for up to
    `ELECTION_S`. `done_before`: the status a call asked again gets when a try answered 503 or
    504 was done all the same (a forget's 404); then `{}`."""
    started = time.monotonic()
    asked_again = False
    while True:
        answer = await call()
        if asked_again and answer.status_code == done_before:
            return {}
        if answer.status_code not in (503, 504) or time.monotonic() - started > ELECTION_S:
            break
        asked_again = True
        await asyncio.sleep(0.5)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def agent_in_a_new_workspace(through: Node) -> tuple[str, str]:
    """A workspace made for an agent (memory read and write), and the agent's token."""
    created = await answered(lambda: through.http.post(
        "/api/admin/workspaces", json={"name": "acme"}, headers=ADMIN))
    ws, owner = created["workspaceId"], {
        "Authorization": f"Bearer {created['owner']['memberToken']}"}
    await answered(lambda: through.http.put(f"/api/w/{ws}/ask-history/settings", headers=owner,
                                            json={"agentMemoriesEnabled": True}))
    return ws, str((await answered(lambda: through.http.post(
        f"/api/w/{ws}/credentials", headers=owner,
        json={"name": "bot", "scopes": ["memory:read", "memory:write"]})))["token"])


async def start_cluster(tmp_path: Path, env: dict[str, str] | None = None,
                   ) -> tuple[list[Node], Agent]:
    cluster_ports = [free_port() for _ in range(NODES)]
    nodes = [Node(tmp_path, n, cluster_ports, env) for n in range(NODES)]
    try:
        for one_node in nodes:
            await one_node.start()
        for one_node in nodes:
            await eventually(lambda n=one_node: healthy(n.http), timeout=150)
        _, token = await agent_in_a_new_workspace(nodes[0])
    except BaseException:  # no node outlives a cluster that did not come up
        for one_node in nodes:
            await one_node.stop()
        raise
    return nodes, Agent({"Authorization": f"Bearer {token}"})


async def cluster_stores(through: Node) -> dict[str, dict[str, object]]:
    """The operator's view of every store; asked again while it answers 503 (the buckets'
    leaders being elected after a node was killed), for up to `ELECTION_S`."""
    shown = await answered(lambda: through.http.get("/api/admin/cluster", headers=ADMIN))
    return {s["name"]: s for s in shown["stores"]}


async def in_sync(through: Node, names: list[str], standbys: int) -> bool:
    stores = await cluster_stores(through)
    return all(len(stores[name].get("inSync") or []) >= standbys for name in names)


async def until(check: Callable[[], Awaitable[bool]], within_s: float) -> float:
    """Seconds until `check` holds (polled), failing past `within_s`."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < within_s, f"not within {within_s} s"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


async def nats_agent(url: str, token: str, login: dict[str, str]) -> MemgateClient:
    """An agent on NATS through the node at `url`, once that node has loaded its login."""
    for _ in range(60):
        try:
            return await MemgateClient.connect(url, token, nats_seed=login["seed"],
                                               inbox_prefix=login["inboxPrefix"], timeout=5.0)
        except Exception:  # the node has not loaded the new login yet
            await asyncio.sleep(0.5)
    raise AssertionError(f"the agent's login never worked on {url}")
