"""A generated fault schedule over three clustered nodes under load, and a checker (issue 47).

    python -m bench.faults [--seed 1] [--faults 6] [--agents 4] [--keep]

Starts three `memgate up --node nN --cluster … --routes …` on loopback (`bench.cluster`), then
`--agents` REST agents remember unique notes through random live nodes, each with an
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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from bench.cluster import Node, three_nodes
from bench.harness import Running, agent_token, process_tree, until_healthy

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


def live(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if n.process is not None and n.process.returncode is None]


async def remember(node: Node, auth: dict[str, str], text: str, key: str) -> httpx.Response:
    return await node.http.post("/api/agent/v1/memories/remember", timeout=TIMEOUT_S,
                                headers={**auth, "Idempotency-Key": key},
                                json={"namespace": NAMESPACE, "text": text})


async def agent(n: int, nodes: list[Node], auth: dict[str, str], seen: Outcomes,
                stop: asyncio.Event, rng: random.Random) -> None:
    i = 0
    while not stop.is_set():
        text, key = f"fault bench agent {n} note {i}", f"faults-{n}-{i}"
        i += 1
        seen.keys[text] = key
        try:
            answer = await remember(rng.choice(live(nodes) or nodes), auth, text, key)
        except (httpx.TransportError, httpx.TimeoutException):
            seen.unknown[text] = key
            await asyncio.sleep(0.2)
            continue
        if answer.status_code == 200:
            seen.acked[text] = answer.json()["memoryId"]
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


async def listed(node: Node, auth: dict[str, str]) -> list[tuple[str, str]]:
    """(text, memory id) of every memory of the namespace, through `node`."""
    found: list[tuple[str, str]] = []
    cursor = None
    while True:
        answer = await node.http.post("/api/agent/v1/memories/list", headers=auth, json={
            "namespace": NAMESPACE, "limit": 100, "cursor": cursor})
        answer.raise_for_status()
        page = answer.json()
        found += [(m["text"], m["memoryId"]) for m in page["memories"]]
        if not (cursor := page.get("nextCursor")):
            return found


async def check(nodes: list[Node], auth: dict[str, str], seen: Outcomes) -> dict[str, int]:
    retried: dict[str, str] = {}
    for text, key in seen.unknown.items():  # asked again with the same key
        with contextlib.suppress(httpx.TransportError, httpx.TimeoutException):
            answer = await remember(nodes[0], auth, text, key)
            if answer.status_code == 200:
                retried[text] = answer.json()["memoryId"]
    views = [await listed(node, auth) for node in nodes]
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


async def under_faults(root: Path, faults: list[Fault], *, agents: int, seed: int,
                       ) -> dict[str, int]:
    """Three nodes under `root`, `agents` agents remembering while `faults` strike one after
    another, then the checker's counts (`FAILURES` must be 0)."""
    async with three_nodes(root) as nodes:
        token = await agent_token(Running(nodes[0].nats_url, "", nodes[0].http,
                                          nodes[0].data_dir))
        auth = {"Authorization": f"Bearer {token}"}
        seen, stop, rng = Outcomes(), asyncio.Event(), random.Random(seed)
        load = [asyncio.create_task(agent(n, nodes, auth, seen, stop, rng))
                for n in range(agents)]
        started = time.monotonic()
        for fault in faults:
            await asyncio.sleep(fault.after_s)
            print(f"  {time.monotonic() - started:6.1f} s: {fault.kind} n{fault.node} "
                  f"for {fault.lasts_s:.1f} s", file=sys.stderr)
            await strike(fault, nodes[fault.node])
            for node in nodes:
                await until_healthy(node.http, timeout_s=300)
        stop.set()
        await asyncio.gather(*load)
        return await check(nodes, auth, seen)


async def run(args: argparse.Namespace) -> dict[str, int]:
    prefix = "memgate-bench-faults-"
    with (contextlib.nullcontext(tempfile.mkdtemp(prefix=prefix)) if args.keep
          else tempfile.TemporaryDirectory(prefix=prefix)) as tmp:
        print(f"bench.faults: seed {args.seed}, nodes under {tmp}", file=sys.stderr)
        return await under_faults(Path(tmp), schedule(args.seed, args.faults),
                                  agents=args.agents, seed=args.seed)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=6)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="keep the nodes' data and logs")
    args = parser.parse_args()
    found = await run(args)
    print(f"| seed {args.seed}, {args.faults} faults, {args.agents} agents | writes |")
    print("|---|---:|")
    for name, count in found.items():
        print(f"| {name} | {count} |")
    sys.exit(1 if any(found[name] for name in FAILURES) else 0)


if __name__ == "__main__":
    asyncio.run(main())
