"""One node against three clustered nodes on this machine, in one run (issue 29).

    python -m bench.cluster [--calls 200] [--seconds 5] [--agents 8] [--rounds 5]
                            [--memories 10000]

Starts `memgate up` alone, then three `memgate up --node nN --cluster … --routes …` on loopback
(each its own data directory, ports and embedded nats-server), and measures on each, over REST
through node 1: sequential remember and recall p50/p99, then `--agents` concurrent agents
remembering and recalling (half each) for `--seconds` (throughput).

Then `--rounds` failovers: kill -9 of the whole process tree of the node serving `storage.p0`
(the partition every memory here lands in); the time from the kill to the first remember
acknowledged through another node (a standby took the partition over) and to the first recall
that is not degraded; then the node started again on its data directory, and the time until the
partition has its in-sync standbys again (`MEMGATE_STANDBYS`, default 1). Last, the
resynchronisation: `--memories` memories, the partition's standby node stopped and its data
directory deleted, and the time from the owner recording it out of sync to a full copy in sync
again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
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
    ADMIN, Running, agent_token, free_port, memgate_up, percentile, process_tree,
    until_healthy,
)
from bench.latency import note

NODES = 3
STANDBYS = int(os.environ.get("MEMGATE_STANDBYS", "1"))  # the nodes' setting (default 1)
OPERATOR = {"Authorization": f"Bearer {ADMIN}"}


@dataclass
class Node:
    name: str
    data_dir: Path
    http: httpx.AsyncClient
    command: list[str]
    env: dict[str, str]
    nats_url: str = ""
    process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Started (again); what it prints goes to `nN.log` beside its data directory."""
        with self.data_dir.with_name(f"{self.name}.log").open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.command, env=self.env, stdout=log, stderr=log, start_new_session=True)

    def kill_tree(self) -> None:
        """kill -9 of the node's whole process tree, its nats-server and actors included (each
        runs in a session of its own: killed with the supervisor's group only, they were sent
        SIGTERM by the kernel and drained, still answering meanwhile)."""
        assert self.process is not None
        for pid in process_tree(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@asynccontextmanager
async def three_nodes(root: Path, env: dict[str, str] | None = None,
                      ) -> AsyncIterator[list[Node]]:
    """Three clustered `memgate up` nodes under `root`, healthy; `env` added to theirs."""
    cluster_ports = [free_port() for _ in range(NODES)]
    routes = ",".join(f"nats://127.0.0.1:{port}" for port in cluster_ports)
    env = {**os.environ, "MEMGATE_ADMIN_TOKEN": ADMIN,
           "MEMGATE_LIMIT_REMEMBERS_PER_HOUR": "1000000",
           "MEMGATE_LIMIT_VERSIONS_PER_MEMBER": "1000000", **(env or {})}
    async with AsyncExitStack() as stack:
        nodes = []
        for n in range(NODES):
            http_port, nats_port = free_port(), free_port()
            command = [sys.executable, "-m", "memgate.adapters", "up", "--data-dir",
                       str(root / f"n{n}"), "--http", f"127.0.0.1:{http_port}",
                       "--nats-port", str(nats_port), "--node", f"n{n}",
                       "--cluster", f"127.0.0.1:{cluster_ports[n]}", "--routes", routes]
            http = await stack.enter_async_context(httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{http_port}", timeout=60))
            node = Node(f"n{n}", root / f"n{n}", http, command, env,
                        nats_url=f"nats://127.0.0.1:{nats_port}")
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
        self.http, self.auth = http, {"Authorization": f"Bearer {token}"}

    async def remember(self, text: str) -> httpx.Response:
        return await self.http.post("/api/agent/v1/memories/remember", headers=self.auth,
                                    json={"namespace": "bench", "text": text})

    async def recall(self, query: str) -> httpx.Response:
        return await self.http.post("/api/agent/v1/memories/recall", headers=self.auth,
                                    json={"namespace": "bench", "query": query})


async def timed(call: Callable[[], Awaitable[object]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        answer = await call()
        if isinstance(answer, httpx.Response):
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


async def measure(rest: Rest, on_bus: Running, args: argparse.Namespace) -> dict[str, float]:
    """Sequential remembers and recalls over REST, then remembers by an agent on the bus
    (NATS, its own login), then the closed-loop throughput over REST."""
    remembers = await timed(lambda: rest.remember(note_of(0, int(time.monotonic_ns()))),
                            args.calls)
    await asyncio.sleep(1)  # the events embedded and indexed
    recalls = await timed(lambda: rest.recall("deploy the database"), args.calls)
    token = rest.auth["Authorization"].removeprefix("Bearer ")
    agent = await on_bus.agent(token)
    try:
        on_the_bus = await timed(lambda: agent.remember(
            "bench", note_of(1, int(time.monotonic_ns()))), args.calls)
    finally:
        await agent.close()
    await asyncio.sleep(1)
    return {"remember p50": statistics.median(remembers),
            "remember p99": percentile(remembers, 99),
            "remember over the bus p50": statistics.median(on_the_bus),
            "remember over the bus p99": percentile(on_the_bus, 99),
            "recall p50": statistics.median(recalls), "recall p99": percentile(recalls, 99),
            "ops/s": await throughput(rest, args.agents, args.seconds)}


async def stores(node: Node) -> dict[str, dict[str, object]]:
    shown = (await node.http.get("/api/admin/cluster", headers=OPERATOR)).json()
    return {s["name"]: s for s in shown["stores"]}


async def until(check: Callable[[], Awaitable[bool]], within_s: float = 300) -> float:
    """Seconds until `check` holds (polled every 0.1 s); NaN past `within_s`."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        try:
            if await check():
                return time.monotonic() - started
        except (httpx.TransportError, KeyError, ValueError):
            pass
        await asyncio.sleep(0.1)
    return float("nan")


async def in_sync(node: Node, standbys: int = STANDBYS) -> bool:
    shown = await stores(node)
    return all(len(s.get("inSync") or []) >= standbys  # type: ignore[arg-type]
               for name, s in shown.items() if name.startswith("storage."))


def running(nodes: list[Node]) -> Node:
    """A node whose `memgate up` runs."""
    return next(n for n in nodes if n.process is not None and n.process.returncode is None)


async def settled_owner(nodes: list[Node]) -> Node:
    """The node serving `storage.p0` once it stays put: served from its home, with its in-sync
    standbys, by the same node two looks apart (a node restarted by the round before
    may still be pulling its share of the partitions back)."""
    seen = None
    while True:
        with contextlib.suppress(httpx.TransportError, KeyError, ValueError):
            node = running(nodes)
            p0 = (await stores(node))["storage.p0"]
            serving = p0["servedBy"]
            if serving is not None and serving == seen == p0["home"] and await in_sync(node):
                return next(n for n in nodes if n.name == serving)
            seen = serving
        await asyncio.sleep(2.0)


async def failover(nodes: list[Node], token: str) -> dict[str, float]:
    """kill -9 of the whole node serving `storage.p0`: seconds to the first remember
    acknowledged through another node (its standby took the partition over), to the first
    recall that is not degraded; then the node restarted on its data directory, and seconds
    from the kill until the partition has its in-sync standbys again."""
    acked: set[str] = set()
    stop = asyncio.Event()

    async def load(other: Rest) -> None:  # an agent remembering through a survivor all along
        while not stop.is_set():
            with contextlib.suppress(httpx.TransportError):
                answer = await other.remember(note_of(7, len(acked)))
                if answer.status_code == 200:
                    acked.add(answer.json()["memoryId"])
            await asyncio.sleep(0.02)

    # from a settled state: a recall degraded already (new memories not embedded yet, after a
    # bulk load) is not the failover's doing
    settled_s = await until(lambda: recall_whole(Rest(running(nodes).http, token)))
    if settled_s > 1:
        print(f"recall not degraded before the kill after {settled_s:.1f} s", file=sys.stderr)
    while True:
        victim = await settled_owner(nodes)
        survivor = next(node for node in nodes if node is not victim)
        other = Rest(survivor.http, token)
        loading = asyncio.create_task(load(other))
        await asyncio.sleep(1.0)
        p0 = (await stores(survivor))["storage.p0"]
        if p0["servedBy"] == p0["home"] == victim.name:
            break
        stop.set()  # it moved meanwhile (a node pulling its share): choose again
        await loading
        stop.clear()
    killed = time.monotonic()
    victim.kill_tree()
    assert victim.process is not None
    await victim.process.wait()

    async def written() -> bool:
        return (await other.remember("the failover bench was here")).status_code == 200

    seen: list[tuple[float, str]] = []  # what kept a recall degraded, from when

    async def recalled() -> bool:
        answer = await other.recall("failover bench")
        state = (",".join(answer.json()["degraded"]) or "none") if answer.status_code == 200 \
            else str(answer.status_code)
        if not seen or seen[-1][1] != state:
            seen.append((time.monotonic() - killed, state))
        return state == "none"

    await until(written)
    first_write = time.monotonic() - killed
    await until(recalled)
    first_recall = time.monotonic() - killed
    print("recall after the kill: " + ", ".join(f"{state} from {at:.1f} s" for at, state in seen),
          file=sys.stderr)
    await victim.start()
    await until(lambda: in_sync(survivor))
    rejoined = time.monotonic() - killed
    await until_healthy(victim.http, timeout_s=180)
    stop.set()
    await loading
    return {"kill -9 → first acknowledged remember s": first_write,
            "kill -9 → first non-degraded recall s": first_recall,
            "kill -9 → its standbys in sync again s": rejoined,
            "remembers acknowledged during the round": len(acked),
            "of them not listed afterwards": len(acked - await listed(other))}


async def recall_whole(rest: Rest) -> bool:
    answer = await rest.recall("failover bench")
    return answer.status_code == 200 and not answer.json()["degraded"]


async def listed(rest: Rest) -> set[str]:
    """Every memory id of the bench's namespace, page by page."""
    found: set[str] = set()
    cursor = None
    while True:
        answer = await rest.http.post("/api/agent/v1/memories/list", headers=rest.auth,
                                      json={"namespace": "bench", "limit": 100,
                                            "cursor": cursor})
        answer.raise_for_status()
        page = answer.json()
        found |= {m["memoryId"] for m in page["memories"]}
        if not (cursor := page.get("nextCursor")):
            return found


async def resync(nodes: list[Node], token: str, memories: int) -> dict[str, float]:
    """`memories` memories in `storage.p0`, then its in-sync standby's node stopped and its data
    directory deleted: seconds from the owner recording that standby out of sync (at its next
    write) to a full copy in sync again (another node's, or that node's once started again)."""
    rest = Rest(running(nodes).http, token)
    done = 0

    async def writer(i: int) -> None:
        nonlocal done
        while done < memories:
            done += 1
            (await rest.remember(note_of(i, done))).raise_for_status()

    started = time.monotonic()
    await asyncio.gather(*(writer(i) for i in range(16)))
    loaded_s = time.monotonic() - started
    await until(lambda: in_sync(running(nodes)))
    p0 = (await stores(running(nodes)))["storage.p0"]
    standby = next(node for node in nodes if node.name in p0["inSync"])  # type: ignore[operator]
    assert standby.process is not None
    standby.process.send_signal(signal.SIGINT)
    await standby.process.wait()
    shutil.rmtree(standby.data_dir)
    rest = Rest(running(nodes).http, token)

    async def dropped() -> bool:
        await rest.remember("the resync bench was here")  # the owner notices at a write
        shown = (await stores(running(nodes)))["storage.p0"]
        return standby.name not in shown["inSync"]  # type: ignore[operator]

    await until(dropped)
    out = time.monotonic()
    await standby.start()
    await until(lambda: in_sync(running(nodes)))
    copied_s = time.monotonic() - out
    await until_healthy(standby.http, timeout_s=180)
    return {f"remember {memories:,} memories (16 agents) s": loaded_s,
            f"standby out of sync → a full copy of {memories:,} memories in sync s": copied_s}


async def single(args: argparse.Namespace) -> dict[str, float]:
    async with memgate_up() as running:
        token = await agent_token(running)
        return await measure(Rest(running.http, token), running, args)


async def clustered(args: argparse.Namespace) -> tuple[dict[str, float],
                                                       list[dict[str, float]], dict[str, float]]:
    prefix = "memgate-bench-cluster-"
    with (contextlib.nullcontext(tempfile.mkdtemp(prefix=prefix)) if args.keep
          else tempfile.TemporaryDirectory(prefix=prefix)) as tmp:
        print(f"bench.cluster: nodes' data and logs under {tmp}", file=sys.stderr)
        async with three_nodes(Path(tmp)) as nodes:
            first = Running(nodes[0].nats_url, "", nodes[0].http, nodes[0].data_dir)
            token = await agent_token(first)
            await until(lambda: in_sync(nodes[0]))
            measured = await measure(Rest(nodes[0].http, token), first, args)
            rounds = [await failover(nodes, token) for _ in range(args.rounds)]
            if not args.memories:
                return measured, rounds, {}
            resynced = await resync(nodes, token, args.memories)
            # the vectors travel with the replica: how long with many memories
            large = await failover(nodes, token)
            resynced[f"with {args.memories:,} memories: kill -9 → first non-degraded recall s"] \
                = large["kill -9 → first non-degraded recall s"]
            return measured, rounds, resynced


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--keep", action="store_true",
                        help="keep the nodes' data and logs (deleted by default)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5, help="failover rounds (0: none)")
    parser.add_argument("--memories", type=int, default=10_000,
                        help="memories in the partition a resynchronising node copies "
                             "(0: no resynchronisation)")
    args = parser.parse_args()
    one = await single(args)
    three, rounds, resynced = await clustered(args)
    print("| through node 1 (REST unless said) | one node | three nodes | three / one |")
    print("|---|---:|---:|---:|")
    for name in one:
        print(f"| {name} {'' if name == 'ops/s' else 'ms'} | {one[name]:.2f} | "
              f"{three[name]:.2f} | {three[name] / one[name]:.2f} |")
    if rounds:
        print_rounds(rounds)
    if resynced:
        print()
        print("| resynchronisation | s |")
        print("|---|---:|")
        for name, seconds in resynced.items():
            print(f"| {name} | {seconds:.1f} |")


def print_rounds(rounds: list[dict[str, float]]) -> None:
    print()
    print(f"| failover of the node serving storage.p0 ({len(rounds)} rounds) | "
          + " | ".join(f"round {i + 1}" for i in range(len(rounds))) + " | median |")
    print("|---|" + "---:|" * (len(rounds) + 1))
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in values)
              + f" | {statistics.median(values):.1f} |")
    lost = sum(r["of them not listed afterwards"] for r in rounds)
    print(f"\nacknowledged remembers lost over {len(rounds)} kill -9 rounds: {lost:.0f}")


if __name__ == "__main__":
    asyncio.run(main())
