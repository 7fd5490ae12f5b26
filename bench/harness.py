"""Runs `memgate up` as a separate process (as users do) and sets up one agent credential."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats

from memgate.bus.lifetime import die_with_parent
from memgate.app.settings import Settings
from memgate.app.logins import internal_logins
from memgate.bus import MemgateClient
from memgate.bus.logins import inbox_prefix

ADMIN = "bench-operator-token"


# Ports handed to servers started later: below Linux's ephemeral range (32768-60999), which the
# outgoing connections of the servers already running draw from, so none of them takes a port
# between its choice and its server's bind (a clean-clone CI run: "nats-server did not start").
PORTS = range(20_000, 32_768)
_handed: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never handed out before in this process."""
    while True:
        port = random.choice(PORTS)
        if port in _handed:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed.add(port)
        return port


def process_tree(root: int) -> dict[int, list[str]]:
    """`root` and every live descendant (in sessions of their own too), each with the fields
    of its `/proc/<pid>/stat` after the command name."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        stats[int(entry.name)] = stat[stat.rfind(")") + 2:].split()
    tree, grown = {root}, True
    while grown:
        children = {pid for pid, fields in stats.items() if int(fields[1]) in tree} - tree
        tree |= children
        grown = bool(children)
    return {pid: stats[pid] for pid in tree if pid in stats}


@dataclass
class Running:
    nats_url: str
    http_url: str
    http: httpx.AsyncClient
    data_dir: Path
    pid: int | None = None  # of the `memgate up` process (its children are memgate too)

    def internal_login(self, kind: str = "storage") -> dict[str, str]:
        """The login of one kind of actor (the benchmark runs on the same machine as memgate);
        `storage` may read the events stream's consumers."""
        login = internal_logins(Settings(data_dir=self.data_dir))[kind]
        return {"user": login.user, "password": login.password,
                "inbox_prefix": inbox_prefix(kind)}

    async def agent(self, token: str) -> MemgateClient:
        """An agent on the bus, with a NATS login of its own."""
        login = (
            await self.http.post(
                "/api/admin/nats-agents",
                json={"name": "bench"},
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
        ).json()
        return await MemgateClient.connect(
            self.nats_url, token, nats_seed=login["seed"], inbox_prefix=login["inboxPrefix"]
        )


async def until_healthy(http: httpx.AsyncClient, *, timeout_s: float) -> None:
    """Until the memgate behind `http` answers `/healthz` with 200 (`TimeoutError` past
    `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if (await http.get("/healthz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError(f"memgate was not healthy within {timeout_s:.0f} s")


@asynccontextmanager
async def memgate_up(**env_overrides: str) -> AsyncIterator[Running]:
    with tempfile.TemporaryDirectory(prefix="memgate-bench-") as tmp:
        data, http_port, nats_port = Path(tmp) / "data", free_port(), free_port()
        env = {
            **os.environ,
            "MEMGATE_ADMIN_TOKEN": ADMIN,
            "MEMGATE_NATS_PORT": str(nats_port),
            # the benchmark loads thousands of memories with one credential
            "MEMGATE_LIMIT_REMEMBERS_PER_HOUR": "1000000",
            "MEMGATE_LIMIT_VERSIONS_PER_MEMBER": "1000000",
            **env_overrides,
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "memgate.adapters",
            "up",
            "--data-dir",
            str(data),
            "--http",
            f"127.0.0.1:{http_port}",
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=None if os.environ.get("BENCH_LOGS") else asyncio.subprocess.DEVNULL,
            preexec_fn=die_with_parent(),  # a benchmark killed takes its memgate along
        )
        http_url = f"http://127.0.0.1:{http_port}"
        async with httpx.AsyncClient(base_url=http_url, timeout=60) as http:
            try:
                await until_healthy(http, timeout_s=60)
                yield Running(
                    f"nats://127.0.0.1:{nats_port}", http_url, http, data, process.pid
                )
            finally:
                process.send_signal(signal.SIGINT)
                await asyncio.wait_for(process.wait(), 60)


async def agent_token(running: Running) -> str:
    return (await workspace_agent(running))[1]


async def workspace_agent(running: Running) -> tuple[str, str]:
    """A new workspace, agent memories on, and an agent credential of its owner: (workspace
    id, token)."""
    http = running.http
    created = (
        await http.post(
            "/api/admin/workspaces",
            json={"name": "bench"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
    ).json()
    ws, owner = created["workspaceId"], created["owner"]["memberToken"]
    auth = {"Authorization": f"Bearer {owner}"}
    await http.put(
        f"/api/w/{ws}/ask-history/settings", json={"agentMemoriesEnabled": True}, headers=auth
    )
    created = (
        await http.post(
            f"/api/w/{ws}/credentials",
            headers=auth,
            json={"name": "bench", "scopes": ["memory:read", "memory:write"]},
        )
    ).json()
    return ws, str(created["token"])


async def consumers_idle(
    running: Running, durables: Sequence[str] = ("indexer-p0", "embedder-p0"), timeout: float = 600
) -> float:
    """Seconds until every durable consumer has nothing pending or unacknowledged."""
    nc = await nats.connect(running.nats_url, **running.internal_login())
    js = nc.jetstream()
    started = asyncio.get_running_loop().time()
    try:
        while True:
            infos = [await js.consumer_info("MEM_EVT", d) for d in durables]
            if all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos):
                return asyncio.get_running_loop().time() - started
            if asyncio.get_running_loop().time() - started > timeout:
                raise TimeoutError("consumers did not catch up")
            await asyncio.sleep(0.05)
    finally:
        await nc.close()


async def events_idle(running: Running, stream: str = "MEM_EVT", timeout: float = 600) -> float:
    """Seconds until every consumer of `stream`, whatever its name, has nothing left to do."""
    nc = await nats.connect(running.nats_url, **running.internal_login())
    js = nc.jetstream()
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        while True:
            infos = await js.consumers_info(stream)
            if all(not i.num_pending and not i.num_ack_pending for i in infos):
                return loop.time() - started
            if loop.time() - started > timeout:
                raise TimeoutError(f"the consumers of {stream} did not catch up")
            await asyncio.sleep(0.05)
    finally:
        await nc.close()


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def row(name: str, samples_ms: Sequence[float]) -> str:
    return (
        f"| {name:<34} | {len(samples_ms):>5} | {statistics.median(samples_ms):>8.2f} | "
        f"{percentile(samples_ms, 95):>8.2f} | {percentile(samples_ms, 99):>8.2f} |"
    )


HEADER = (
    "| operation                          |     n |  p50 ms  |  p95 ms  |  p99 ms  |\n"
    "|------------------------------------|-------|----------|----------|----------|"
)
