"""CPU per request/reply round trip in the *serving* process, by how the subject is served.

    python -m bench.bus_overhead [--requests 3000] [--repeats 3]

One nats-server (`EmbeddedNats`); for each way of serving, a child process answers
`bench.echo` with the same `replying` handler (a small contract parsed and sent back), and this
process sends it requests from 1 or 16 concurrent requesters. The child's own CPU
(`time.process_time`, read over a control subject before and after) is divided by the number of
requests; medians of the repeats. Ways of serving:

- `faststream`: a faststream subscriber, our `NatsRouter` + `replying` on a plain `NatsBroker`
  (as every actor was served before the raw reply subscriptions);
- `raw`: nats-py `nc.subscribe(subject, queue=..., cb=...)` answering with `msg.respond(...)`;
- `memgate`: the broker `KindConnections.broker` builds, as `memgate up` serves actors now.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

from memgate.bus import EmbeddedNats, NatsRouter, parse, replying
from memgate.bus.connections import KindConnections, NatsBroker
from memgate.bus.replies import reply_to
from memgate.contracts.internal import Ready

SUBJECT = "bench.echo"
CPU = "bench.cpu"
QUEUE = "bench"
MODES = ("faststream", "raw", "memgate")
# (concurrent requesters, the subscriber's max_workers)
SHAPES = ((1, 1), (16, 1), (16, 64))
PAYLOAD = Ready(actor="bench-" + "x" * 80).to_json()


async def echo(payload: bytes) -> Ready:
    return parse(Ready, payload)


class Bench:
    """`Logins` for an open server (no users)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def login(self, kind: str) -> dict[str, Any]:
        return {}


async def serve(mode: str, url: str, workers: int) -> None:
    """The child: serve `SUBJECT` the `mode` way, `CPU` (its process time) on a side
    connection, until stdin closes."""
    side = await nats.connect(url)

    async def cpu(msg: Any) -> None:
        await msg.respond(repr(time.process_time()).encode())

    await side.subscribe(CPU, cb=cpu)
    router = NatsRouter()
    router.subscriber(SUBJECT, queue=QUEUE, max_workers=workers)(replying(echo))
    broker: NatsBroker | None = None
    nc = None
    if mode == "raw":
        nc = await nats.connect(url)

        async def answer(msg: Any) -> None:
            await msg.respond(await reply_to(echo, msg.data, msg.subject))

        await nc.subscribe(SUBJECT, queue=QUEUE, cb=answer)
        await nc.flush()
    else:
        if mode == "faststream":
            broker = NatsBroker(url, logger=None, apply_types=False, graceful_timeout=5.0)
        else:
            broker = KindConnections(Bench(url), timeout=5.0).broker("bench",
                                                                     graceful_timeout=5.0)
        broker.include_router(router)
        await broker.start()
        await broker.connection.flush()
    await side.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    if broker is not None:
        await broker.stop()
    if nc is not None:
        await nc.drain()
    await side.drain()


async def cpu_of(nc: Any) -> float:
    return float((await nc.request(CPU, b"", timeout=5.0)).data)


async def load(nc: Any, requests: int, requesters: int) -> None:
    async def requester(count: int) -> None:
        for _ in range(count):
            await nc.request(SUBJECT, PAYLOAD, timeout=10.0)

    share, rest = divmod(requests, requesters)
    await asyncio.gather(*(requester(share + (i < rest)) for i in range(requesters)))


async def measure(url: str, mode: str, workers: int, requesters: int, requests: int,
                  repeats: int) -> tuple[float, float]:
    """Median µs of serving CPU per request, and median requests/s."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.bus_overhead", "--serve", mode, "--url", url,
        "--workers", str(workers), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert child.stdout is not None and child.stdin is not None
    try:
        line = await child.stdout.readline()
        assert line.strip() == b"ready", line
        nc = await nats.connect(url)
        try:
            await load(nc, 300, requesters)  # warm up
            costs, rates = [], []
            for _ in range(repeats):
                before, start = await cpu_of(nc), time.perf_counter()
                await load(nc, requests, requesters)
                wall, after = time.perf_counter() - start, await cpu_of(nc)
                costs.append((after - before) / requests * 1e6)
                rates.append(requests / wall)
            return statistics.median(costs), statistics.median(rates)
        finally:
            await nc.drain()
    finally:
        child.stdin.close()
        await asyncio.wait_for(child.wait(), 30)


async def main(requests: int, repeats: int, modes: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with EmbeddedNats(Path(tmp)) as server:
            print(f"serving CPU per request/reply round trip, {requests} requests, "
                  f"median of {repeats}")
            print(f"{'mode':<11} {'requesters':>10} {'max_workers':>11} "
                  f"{'CPU µs/msg':>11} {'msgs/s':>8}")
            results: dict[tuple[str, int, int], float] = {}
            for requesters, workers in SHAPES:
                for mode in modes:
                    cost, rate = await measure(server.url, mode, workers, requesters, requests,
                                               repeats)
                    results[mode, requesters, workers] = cost
                    print(f"{mode:<11} {requesters:>10} {workers:>11} {cost:>11.1f} "
                          f"{rate:>8.0f}", flush=True)
            if "faststream" in modes:
                for mode in modes:
                    if mode == "faststream":
                        continue
                    saved = [1 - results[mode, r, w] / results["faststream", r, w]
                             for r, w in SHAPES]
                    print(f"{mode} saves " + ", ".join(
                        f"{s:.0%} ({r} req, {w} workers)"
                        for s, (r, w) in zip(saved, SHAPES, strict=True))
                          + " of faststream's serving CPU per message")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.url, args.workers))
    else:
        asyncio.run(main(args.requests, args.repeats, args.modes))
