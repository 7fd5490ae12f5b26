"""One node against three clustered nodes on this machine, in one run (issue 29).

    python -m bench.cluster [--calls 200] [--seconds 5] [--agents 8]

Starts `memgate up` alone, then three `memgate up --node nN --cluster … --routes …` on loopback
(each its own data directory, ports and embedded nats-server), and measures on each, over REST
through node 1: sequential remember and recall p50/p99, then `--agents` concurrent agents
remembering and recalling (half each) for `--seconds` (throughput). Then the failover as it is
today: kill -9 of the whole process tree of the node that is home of `storage.p0` (the
partition every memory here lands in), that node started again on its data directory, and the
time from the kill to the first remember acknowledged through another node, and to the first
recall that is not degraded. (A partition's home does not move yet: until in-sync standbys
exist its writes wait for its node.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness import (
    ADMIN, Running, agent_token, free_port, memgate_up, percentile, until_healthy,
)
from bench.latency import note

NODES = 3
OPERATOR = {"Authorization": f"Bearer {ADMIN}"}


@dataclass
class Node:
    name: str
    data_dir: Path
    http: httpx.AsyncClient
    command: list[str]
    env: dict[str, str]
    process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.command, env=self.env, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True)

    def kill_tree(self) -> None:
        """kill -9 of the node's whole process group (its nats-server and actors included)."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)


@asynccontextmanager
async def three_nodes(root: Path) -> AsyncIterator[list[Node]]:
    cluster_ports = [free_port() for _ in range(NODES)]
    routes = ",".join(f"nats://127.0.0.1:{port}" for port in cluster_ports)
    env = {**os.environ, "MEMGATE_ADMIN_TOKEN": ADMIN,
           "MEMGATE_LIMIT_REMEMBERS_PER_HOUR": "1000000",
           "MEMGATE_LIMIT_VERSIONS_PER_MEMBER": "1000000"}
    async with AsyncExitStack() as stack:
        nodes = []
        for n in range(NODES):
            http_port = free_port()
            command = [sys.executable, "-m", "memgate.adapters", "up", "--data-dir",
                       str(root / f"n{n}"), "--http", f"127.0.0.1:{http_port}",
                       "--nats-port", str(free_port()), "--node", f"n{n}",
                       "--cluster", f"127.0.0.1:{cluster_ports[n]}", "--routes", routes]
            http = await stack.enter_async_context(httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{http_port}", timeout=60))
            node = Node(f"n{n}", root / f"n{n}", http, command, env)
            await node.start()
            nodes.append(node)
        try:
            for node in nodes:  # they start together: JetStream needs a majority
                await until_healthy(node.http, timeout_s=180)
            yield nodes
        finally:
            running = [(node, node.process) for node in nodes
                       if node.process is not None and node.process.returncode is None]
            for _, process in running:
                process.send_signal(signal.SIGINT)
            for node, process in running:
                try:
                    await asyncio.wait_for(process.wait(), 60)
                except TimeoutError:
                    node.kill_tree()


class Rest:
    """One agent credential's remember and recall over one node's REST listener."""

    def __init__(self, http: httpx.AsyncClient, token: str) -> None:
        self.http, self._auth = http, {"Authorization": f"Bearer {token}"}

    async def remember(self, text: str) -> httpx.Response:
        return await self.http.post("/api/agent/v1/memories/remember", headers=self._auth,
                                    json={"namespace": "bench", "text": text})

    async def recall(self, query: str) -> httpx.Response:
        return await self.http.post("/api/agent/v1/memories/recall", headers=self._auth,
                                    json={"namespace": "bench", "query": query})


async def timed(call: Callable[[], Awaitable[httpx.Response]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        answer = await call()
        answer.raise_for_status()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def throughput(rest: Rest, agents: int, seconds: float) -> float:
    """Commands answered per second by `agents` closed-loop agents, half remembering."""
    done = 0
    stop = time.monotonic() + seconds

    async def agent(i: int) -> None:
        nonlocal done
        while time.monotonic() < stop:
            answer = await (rest.remember(note_of(i, done)) if i % 2 else rest.recall(
                "deploy database"))
            answer.raise_for_status()
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(agent(i) for i in range(agents)))
    return done / (time.monotonic() - started)


def note_of(i: int, n: int) -> str:
    return note(random.Random(i * 100_003 + n), n)


async def measure(rest: Rest, args: argparse.Namespace) -> dict[str, float]:
    remembers = await timed(lambda: rest.remember(note_of(0, int(time.monotonic_ns()))),
                            args.calls)
    await asyncio.sleep(1)  # the events embedded and indexed
    recalls = await timed(lambda: rest.recall("deploy the database"), args.calls)
    return {"remember p50": statistics.median(remembers),
            "remember p99": percentile(remembers, 99),
            "recall p50": statistics.median(recalls), "recall p99": percentile(recalls, 99),
            "ops/s": await throughput(rest, args.agents, args.seconds)}


async def storage_home(node: Node) -> str:
    shown = (await node.http.get("/api/admin/cluster", headers=OPERATOR)).json()
    return str(next(s["home"] for s in shown["stores"] if s["name"] == "storage.p0"))


async def failover(nodes: list[Node], token: str) -> dict[str, float]:
    home = await storage_home(nodes[0])
    victim = next(node for node in nodes if node.name == home)
    other = Rest(next(node for node in nodes if node is not victim).http, token)
    killed = time.monotonic()
    victim.kill_tree()
    assert victim.process is not None
    await victim.process.wait()
    await victim.start()
    first_write = first_recall = None
    while first_recall is None and time.monotonic() - killed < 300:
        try:
            if first_write is None:
                if (await other.remember("the failover bench was here")).status_code == 200:
                    first_write = time.monotonic() - killed
            else:
                answer = await other.recall("failover bench")
                if answer.status_code == 200 and not answer.json()["degraded"]:
                    first_recall = time.monotonic() - killed
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    return {"kill -9 → first acknowledged remember s": first_write or float("nan"),
            "kill -9 → first non-degraded recall s": first_recall or float("nan")}


async def single(args: argparse.Namespace) -> dict[str, float]:
    async with memgate_up() as running:
        token = await agent_token(running)
        return await measure(Rest(running.http, token), args)


async def clustered(args: argparse.Namespace) -> tuple[dict[str, float], dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="memgate-bench-cluster-") as tmp:
        async with three_nodes(Path(tmp)) as nodes:
            token = await agent_token(Running("", "", nodes[0].http, nodes[0].data_dir))
            measured = await measure(Rest(nodes[0].http, token), args)
            return measured, await failover(nodes, token)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--agents", type=int, default=8)
    args = parser.parse_args()
    one = await single(args)
    three, failed_over = await clustered(args)
    print("| over REST, through node 1 | one node | three nodes | three / one |")
    print("|---|---:|---:|---:|")
    for name in one:
        print(f"| {name} {'' if name == 'ops/s' else 'ms'} | {one[name]:.2f} | "
              f"{three[name]:.2f} | {three[name] / one[name]:.2f} |")
    print()
    print("| failover (the home restarted: homes do not move yet) | s |")
    print("|---|---:|")
    for name, seconds in failed_over.items():
        print(f"| {name} | {seconds:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
