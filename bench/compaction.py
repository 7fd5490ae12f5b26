"""What "deleted means gone" costs: remember and forget latency around the partition file's
rewrite after deletions (memgate/storage/compaction.py), on `memgate up`.

    python -m bench.compaction [--sizes 1000 10000] [--samples 200]

For each size N: load N memories for one member (8 in flight) and wait for the indexer and
embedder; then time sequential remembers (no deletion anywhere), sequential forgets by id (each
answered after the rewrite), remembers while another client forgets one memory every 100 ms,
and a burst of 64 forgets sent at once (they share rewrites). Also the file's size.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from bench.harness import HEADER, agent_token, consumers_idle, memgate_up, row
from bench.latency import note, timed


async def run(size: int, samples: int) -> list[str]:
    rng = random.Random(size)
    lines: list[str] = []
    async with memgate_up() as running:
        token = await agent_token(running)
        async with await running.agent(token) as agent, await running.agent(token) as other:
            gate = asyncio.Semaphore(8)
            ids: list[str] = []

            async def load(i: int) -> None:
                async with gate:
                    ids.append((await agent.remember(f"ns{i % 5}", note(rng, i))).memory_id)

            await asyncio.gather(*(load(i) for i in range(size)))
            await consumers_idle(running)
            path = running.data_dir / "partitions/p0/memories.duckdb"
            lines.append(f"N={size}: memories.duckdb {path.stat().st_size / 1e6:.1f} MB")
            lines.append(HEADER)
            for _ in range(20):
                await agent.remember("warm", note(rng, 0))
            lines.append(row("remember (no deletions)",
                             await timed(lambda: agent.remember("bench", note(rng, 0)), samples)))
            rng.shuffle(ids)
            victims = iter(ids)
            forgets = max(20, samples // 4)
            lines.append(row("forget by id (after the rewrite)",
                             await timed(lambda: agent.forget(memory_id=next(victims)),
                                         forgets)))
            await consumers_idle(running)
            stop = asyncio.Event()

            async def forgetting() -> None:
                while not stop.is_set():
                    await other.forget(memory_id=next(victims))
                    await asyncio.sleep(0.1)

            background = asyncio.create_task(forgetting())
            try:
                lines.append(row("remember, a forget every 100 ms",
                                 await timed(lambda: agent.remember("bench", note(rng, 0)),
                                             samples)))
            finally:
                stop.set()
                await background
            await consumers_idle(running)
            burst = [next(victims) for _ in range(64)]
            started = time.perf_counter()
            await asyncio.gather(*(agent.forget(memory_id=i) for i in burst))
            lines.append(f"64 forgets at once: all answered in "
                         f"{(time.perf_counter() - started) * 1000:.0f} ms")
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    for size in args.sizes:
        print(f"loading {size} memories ...", flush=True)
        print("\n".join(await run(size, args.samples)), flush=True)
        print()


if __name__ == "__main__":
    asyncio.run(main())
