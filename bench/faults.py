"""A generated fault schedule over three clustered nodes under load, and a checker (issue 47).

    python -m bench.faults [--seed 1] [--faults 6] [--agents 6] [--partitions 3] [--keep]

Starts three `memgate up --node nN --cluster … --routes …` on loopback (`bench.cluster`), with
`--partitions` storage partitions, then `--agents` REST agents, each in a workspace of its own
(as many in each partition), remember unique notes through random live nodes, each with an
`Idempotency-Key`, while a schedule drawn from `--seed` hits one node at a time (a majority
always stays: JetStream's quorum):

- `kill`: kill -9 of the node's whole process tree, started again on its disk 5-15 s later;
- `stop`: SIGSTOP of the tree past the lease (15-20 s), then SIGCONT;
- `wipe`: kill -9, its data directory deleted, started again empty 5-15 s later.

Every answer is classed: 200 (acknowledged: its memory id), 503 (documented as "not written"),
504, a timeout or a dropped connection (unknown: asked again with the same key once the schedule
is over), anything else. Once every node is back and healthy, the memories are listed through every
node and checked: every acknowledged write listed exactly once through every node; no write
answered 503 visible; an unknown write visible at most once, and its retry with the same key
answers the memory listed; the nodes' listings equal. Prints a table per run; exit 1 when a
check fails. No memory text is printed (the notes are the bench's own).

Then, per fault, how long writes paused: from the fault until the next one (the node's restart
and its partitions' return included), the longest time without an acknowledged remember of
one agent, the longest among the agents whose partition the struck node served when it was
struck (its stores), and among the others (issue 47's targets: ≤ 10 s and ≤ 2 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.cluster import Node, stores, three_nodes
from bench.harness import Running, process_tree, until_healthy, workspace_agent
from memgate.bus.subjects import partition_of

NAMESPACE = "faults"
KINDS = ("kill", "stop", "wipe")
LEASE_PAST_S = (15.0, 20.0)  # a SIGSTOP longer than the lease (10 s by default)
DOWN_S = (5.0, 15.0)
BETWEEN_S = (3.0, 10.0)
TIMEOUT_S = 10.0  # a REST answer not in by then counts as unknown


@dataclass(frozen=True)
class Fault:
    kind: str
    node: int
    after_s: float  # since the previous fault ended
    lasts_s: float


def schedule(seed: int, faults: int, nodes: int = 3) -> list[Fault]:
    """The same faults for the same seed: one node at a time, any kind."""
    rng = random.Random(seed)
    return [Fault(kind, rng.randrange(nodes), rng.uniform(*BETWEEN_S),
                  rng.uniform(*(LEASE_PAST_S if kind == "stop" else DOWN_S)))
            for kind in (rng.choice(KINDS) for _ in range(faults))]


@dataclass
class Outcomes:
    """Each write by its text: what it was answered, and its key."""

    acked: dict[str, str] = field(default_factory=dict)  # text → memory id
    refused: set[str] = field(default_factory=set)  # answered 503
    unknown: dict[str, str] = field(default_factory=dict)  # text → key (timeout, dropped)
    other: Counter[int] = field(default_factory=Counter)  # other statuses
    keys: dict[str, str] = field(default_factory=dict)  # text → key
    agents: dict[str, int] = field(default_factory=dict)  # text → the agent that wrote it
    acks: dict[int, list[float]] = field(default_factory=dict)  # agent → when answered 200


@dataclass(frozen=True)
class Agent:
    """One agent: its credential, in a workspace of its own, and that workspace's partition."""

    auth: dict[str, str]
    store: str  # `storage.pN`


@dataclass(frozen=True)
class Pause:
    """A fault's longest pause of acknowledged writes: of the agents whose partition the struck
    node served, and of the others (NaN: no such agent)."""

    fault: Fault
    its_stores_s: float
    other_stores_s: float


def live(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if n.process is not None and n.process.returncode is None]


async def remember(node: Node, auth: dict[str, str], text: str, key: str) -> httpx.Response:
    return await node.http.post("/api/agent/v1/memories/remember", timeout=TIMEOUT_S,
                                headers={**auth, "Idempotency-Key": key},
                                json={"namespace": NAMESPACE, "text": text})


async def agent(n: int, nodes: list[Node], auth: dict[str, str], seen: Outcomes,
                stop: asyncio.Event, rng: random.Random) -> None:
    i = 0
    acks = seen.acks.setdefault(n, [])
    while not stop.is_set():
        text, key = f"fault bench agent {n} note {i}", f"faults-{n}-{i}"
        i += 1
        seen.keys[text], seen.agents[text] = key, n
        try:
            answer = await remember(rng.choice(live(nodes) or nodes), auth, text, key)
        except (httpx.TransportError, httpx.TimeoutException):
            seen.unknown[text] = key
            await asyncio.sleep(0.2)
            continue
        if answer.status_code == 200:
            seen.acked[text] = answer.json()["memoryId"]
            acks.append(time.monotonic())
        elif answer.status_code == 503:  # "not written, retry later": a client backs off
            seen.refused.add(text)
            await asyncio.sleep(0.2)
        elif answer.status_code == 504:  # it may have been written: asked again with the key
            seen.unknown[text] = key
            await asyncio.sleep(0.2)
        else:
            seen.other[answer.status_code] += 1
            await asyncio.sleep(0.2)


async def strike(fault: Fault, node: Node) -> None:
    assert node.process is not None
    tree = list(process_tree(node.process.pid))
    if fault.kind == "stop":
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(fault.lasts_s)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        return
    node.kill_tree()
    await node.process.wait()
    if fault.kind == "wipe":
        shutil.rmtree(node.data_dir, ignore_errors=True)
    await asyncio.sleep(fault.lasts_s)
    await node.start()


async def every_store_served(nodes: list[Node], within_s: float = 300) -> None:
    """Until every store has a node serving it (a node's `/healthz` is 200 while a store of
    another node is being taken over: the cluster is degraded, not this node)."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        with contextlib.suppress(httpx.TransportError, ValueError, KeyError):
            if all(store.get("servedBy") for store in (await stores(live(nodes)[0])).values()):
                return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"a store had nobody serving it for {within_s:.0f} s")


async def listed(node: Node, auth: dict[str, str]) -> list[tuple[str, str]]:
    """(text, memory id) of every memory of the namespace, through `node`."""
    found: list[tuple[str, str]] = []
    cursor = None
    while True:
        for _ in range(120):  # 503: "retry later" (a partition moving back to its node)
            answer = await node.http.post("/api/agent/v1/memories/list", headers=auth, json={
                "namespace": NAMESPACE, "limit": 100, "cursor": cursor})
            if answer.status_code != 503:
                break
            await asyncio.sleep(1.0)
        answer.raise_for_status()
        page = answer.json()
        found += [(m["text"], m["memoryId"]) for m in page["memories"]]
        if not (cursor := page.get("nextCursor")):
            return found


async def check(nodes: list[Node], agents: list[Agent], seen: Outcomes) -> dict[str, int]:
    retried: dict[str, str] = {}
    for text, key in seen.unknown.items():  # asked again with the same key
        with contextlib.suppress(httpx.TransportError, httpx.TimeoutException):
            answer = await remember(nodes[0], agents[seen.agents[text]].auth, text, key)
            if answer.status_code == 200:
                retried[text] = answer.json()["memoryId"]
    views = [[pair for a in agents for pair in await listed(node, a.auth)] for node in nodes]
    counts = [Counter(text for text, _ in view) for view in views]
    ids = [dict(view) for view in views]
    return {
        "acknowledged": len(seen.acked),
        "answered 503": len(seen.refused),
        "504, timed out or dropped": len(seen.unknown),
        "other answers": sum(seen.other.values()),
        "acknowledged, missing on some node": sum(
            any(c[text] == 0 for c in counts) for text in seen.acked),
        "listed more than once": len({text for c in counts for text, n in c.items() if n > 1}),
        "answered 503, yet listed": sum(any(c[text] for c in counts) for text in seen.refused),
        "retry answered another memory than the listed one": sum(
            ids[0].get(text) not in (None, memory) for text, memory in retried.items()),
        "acknowledged id differs from the listed one": sum(
            ids[0].get(text) not in (None, memory) for text, memory in seen.acked.items()),
        "nodes whose listing differs from node 1's": sum(
            sorted(view) != sorted(views[0]) for view in views[1:]),
    }


FAILURES = ("acknowledged, missing on some node", "listed more than once",
            "answered 503, yet listed", "retry answered another memory than the listed one",
            "acknowledged id differs from the listed one",
            "nodes whose listing differs from node 1's")


async def workspaces(node: Node, agents: int, partitions: int) -> list[Agent]:
    """`agents` agents, each in a new workspace, as many in each partition as can be."""
    each = -(-agents // partitions)
    found: list[Agent] = []
    while len(found) < agents:
        ws, token = await workspace_agent(Running(node.nats_url, "", node.http, node.data_dir))
        store = f"storage.{partition_of(ws, partitions)}"
        if sum(a.store == store for a in found) < each:
            found.append(Agent({"Authorization": f"Bearer {token}"}, store))
    return found


@dataclass
class Struck:
    fault: Fault
    at: float  # monotonic
    stores: set[str]  # the storage partitions the node served then


def pauses(struck: list[Struck], ended: float, agents: list[Agent],
           seen: Outcomes) -> list[Pause]:
    """Each fault's longest pauses, from it until the next (or the end of the load)."""
    found = []
    for i, strike in enumerate(struck):
        until = struck[i + 1].at if i + 1 < len(struck) else ended
        longest: dict[bool, float] = {}
        for n, agent_ in enumerate(agents):
            times = [strike.at, *(t for t in seen.acks.get(n, []) if strike.at < t < until),
                     until]
            pause = max(b - a for a, b in itertools.pairwise(times))
            mine = agent_.store in strike.stores
            longest[mine] = max(longest.get(mine, 0.0), pause)
        found.append(Pause(strike.fault, longest.get(True, math.nan),
                           longest.get(False, math.nan)))
    return found


@dataclass
class Outcome:
    found: dict[str, int]  # the checker's counts (`FAILURES` must be 0)
    pauses: list[Pause]


async def under_faults(root: Path, faults: list[Fault], *, agents: int, seed: int,
                       partitions: int = 1) -> Outcome:
    """Three nodes under `root`, `agents` agents remembering while `faults` strike one after
    another, then the checker's counts and each fault's pauses."""
    env = {"MEMGATE_PARTITIONS": str(partitions)}
    async with three_nodes(root, env) as nodes:
        writers = await workspaces(nodes[0], agents, partitions)
        seen, stop, rng = Outcomes(), asyncio.Event(), random.Random(seed)
        load = [asyncio.create_task(agent(n, nodes, a.auth, seen, stop, rng))
                for n, a in enumerate(writers)]
        started, struck = time.monotonic(), []
        for fault in faults:
            await asyncio.sleep(fault.after_s)
            print(f"  {time.monotonic() - started:6.1f} s: {fault.kind} n{fault.node} "
                  f"for {fault.lasts_s:.1f} s", file=sys.stderr)
            node = nodes[fault.node]
            served = await stores(live(nodes)[0])
            struck.append(Struck(fault, time.monotonic(), {
                name for name, store in served.items()
                if name.startswith("storage.") and store.get("servedBy") == node.name}))
            await strike(fault, node)
            for each in nodes:
                await until_healthy(each.http, timeout_s=300)
        await asyncio.sleep(BETWEEN_S[1])  # the last node's partitions back
        stop.set()
        await asyncio.gather(*load)
        ended = time.monotonic()
        await every_store_served(nodes)
        return Outcome(await check(nodes, writers, seen), pauses(struck, ended, writers, seen))


async def run(args: argparse.Namespace) -> Outcome:
    prefix = "memgate-bench-faults-"
    with (contextlib.nullcontext(tempfile.mkdtemp(prefix=prefix)) if args.keep
          else tempfile.TemporaryDirectory(prefix=prefix)) as tmp:
        print(f"bench.faults: seed {args.seed}, nodes under {tmp}", file=sys.stderr)
        return await under_faults(Path(tmp), schedule(args.seed, args.faults),
                                  agents=args.agents, seed=args.seed, partitions=args.partitions)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=6)
    parser.add_argument("--agents", type=int, default=6)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the nodes' data and logs")
    args = parser.parse_args()
    outcome = await run(args)
    found = outcome.found
    print(f"| seed {args.seed}, {args.faults} faults, {args.agents} agents | writes |")
    print("|---|---:|")
    for name, count in found.items():
        print(f"| {name} | {count} |")
    print()
    print("| fault | node | its stores' writes paused, s | other stores' writes paused, s |")
    print("|---|---|---:|---:|")
    for pause in outcome.pauses:
        print(f"| {pause.fault.kind} {pause.fault.lasts_s:.0f} s | n{pause.fault.node} | "
              f"{pause.its_stores_s:.1f} | {pause.other_stores_s:.1f} |")
    sys.exit(1 if any(found[name] for name in FAILURES) else 0)


if __name__ == "__main__":
    asyncio.run(main())
