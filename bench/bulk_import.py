"""Bulk import: memories acknowledged per second over REST (1,000-item requests), then the
embedding backlog's drain rate, compared with the model's own batched throughput measured in
the same run (issue 45: drain ≥ 90% of it).

    python -m bench.bulk_import [--memories 20000] [--runs 3] [--in-flight 2]

Each run starts `memgate up` (bench.harness), imports `--memories` distinct texts with one
credential, `--in-flight` requests at a time, and times the last acknowledgement; the
embedder's backlog (`memgate_embedding_backlog` in /metrics) is printed while it drains, and
the drain rate is the memories embedded from the first request to the embedder's consumer
idle. Before the import and after the drain, memgate idle, the same texts (a sample of
`--model-sample`) are embedded directly with memgate's model as its embedder runs it
(`OnnxEmbedder`, `EVENT_BATCH` texts a call, `MODEL_THREADS`, a niced thread): the model's rate
is the mean of the two. Medians of the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from bench.harness import ADMIN, Running, agent_token, consumers_idle, memgate_up

BATCH = 1000  # items per import request (the most one takes)
WORDS = ("tea", "coffee", "meeting", "deadline", "berlin", "lisbon", "project", "invoice",
         "customer", "renewal", "python", "rust", "budget", "quarter", "release", "roadmap",
         "design", "review", "holiday", "flight", "hotel", "dentist", "birthday", "gift",
         "garden", "running", "marathon", "piano", "novel", "recipe", "allergy", "vegan")


@dataclass
class Run:
    acknowledged_per_s: float
    embedded_per_s: float
    model_per_s: float

    @property
    def ratio(self) -> float:
        return self.embedded_per_s / self.model_per_s


def texts(count: int, seed: int) -> list[str]:
    """Distinct memory-like texts of 8 to 40 words."""
    rng = random.Random(seed)
    return [f"Fact {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
            for i in range(count)]


async def series(http: httpx.AsyncClient) -> dict[str, float]:
    """From /metrics, summed over the partitions: the embedding backlog (events the embedder
    has yet to apply, `memgate_embedding_backlog`) and the versions embedded so far (the count
    of `memgate_embedded_after_seconds`)."""
    try:
        exposition = (await http.get("/metrics", headers={
            "Authorization": f"Bearer {ADMIN}"})).text
    except httpx.HTTPError:
        return {}
    found: dict[str, float] = {}
    for line in exposition.splitlines():
        for name, short in (("memgate_embedding_backlog", "backlog"),
                            ("memgate_embedded_after_seconds_count", "embedded")):
            if line.startswith(name):
                found[short] = found.get(short, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


async def progress(http: httpx.AsyncClient, started: float, done: asyncio.Event) -> None:
    """The backlog in the console, every two seconds, until `done`."""
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), 2.0)
        except TimeoutError:
            now = await series(http)
            print(f"    {time.perf_counter() - started:6.1f} s  embedding backlog "
                  f"{now.get('backlog', 0):,.0f} events, {now.get('embedded', 0):,.0f} "
                  "embedded", flush=True)


async def import_all(running: Running, token: str, corpus: list[str], in_flight: int) -> float:
    """Seconds from the first request sent to the last one acknowledged."""
    batches = [corpus[at:at + BATCH] for at in range(0, len(corpus), BATCH)]
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for batch in batches:
        queue.put_nowait(batch)
    headers = {"Authorization": f"Bearer {token}"}

    async def worker() -> None:
        while not queue.empty():
            batch = queue.get_nowait()
            response = await running.http.post(
                "/api/agent/v1/memories/import", headers=headers,
                json={"items": [{"namespace": "imported", "text": t} for t in batch]})
            response.raise_for_status()
            if refused := response.json()["refused"]:
                raise RuntimeError(f"{len(refused)} refused: {refused[0]['error']}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return time.perf_counter() - started


def model_rate(corpus: list[str], sample: int) -> float:
    """Texts per second of memgate's model embedding `sample` of them as its embedder does:
    `EVENT_BATCH` a call, `MODEL_THREADS` threads, on a thread niced as its model thread is
    (`Serial(background=True)`): on a machine shared with other work, a niced thread gets
    less of a core than the benchmark's own would, and the drain would be compared with a
    rate the embedder was never given."""
    from memgate.actors.embedder import EVENT_BATCH, MODEL_THREADS
    from memgate.app.settings import Settings
    from memgate.embedding.model import OnnxEmbedder
    from memgate.runtime.actor import _lower_priority

    settings = Settings()
    model = OnnxEmbedder(settings.compute_model(), settings.embedding_tokenizer,
                         threads=MODEL_THREADS)
    chosen = corpus[:sample]

    def run() -> float:
        model.embed(chosen[:EVENT_BATCH])  # warm
        started = time.perf_counter()
        for at in range(0, len(chosen), EVENT_BATCH):
            model.embed(chosen[at:at + EVENT_BATCH])
        return len(chosen) / (time.perf_counter() - started)

    with ThreadPoolExecutor(1, initializer=_lower_priority) as niced:
        return niced.submit(run).result()


async def one_run(number: int, memories: int, in_flight: int, sample: int) -> Run:
    corpus = texts(memories, seed=number)
    async with memgate_up(MEMGATE_LIMIT_IMPORTS_PER_HOUR="100000000") as running:
        token = await agent_token(running)
        before = await asyncio.to_thread(model_rate, corpus, sample)  # memgate idle
        done = asyncio.Event()
        started = time.perf_counter()
        watching = asyncio.create_task(progress(running.http, started, done))
        acknowledged_s = await import_all(running, token, corpus, in_flight)
        print(f"  run {number}: {memories} acknowledged in {acknowledged_s:.1f} s "
              f"({memories / acknowledged_s:,.0f}/s)", flush=True)
        await consumers_idle(running, ("embedder-p0",))
        drained_s = time.perf_counter() - started
        done.set()
        await watching
        print(f"  run {number}: embedded {memories} in {drained_s:.1f} s "
              f"({memories / drained_s:,.0f}/s); now {await series(running.http)}",
              flush=True)
        after = await asyncio.to_thread(model_rate, corpus, sample)
        model = (before + after) / 2  # the machine's other load drifts over a run
        print(f"  run {number}: the model alone, {sample} texts: {before:,.0f}/s before the "
              f"import, {after:,.0f}/s after the drain", flush=True)
    return Run(memories / acknowledged_s, memories / drained_s, model)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=2)
    parser.add_argument("--model-sample", type=int, default=4_000)
    args = parser.parse_args()
    runs = [await one_run(n + 1, args.memories, args.in_flight,
                          min(args.model_sample, args.memories))
            for n in range(args.runs)]
    print(f"\nbulk import: {args.memories:,} memories in {BATCH:,}-item REST requests, "
          f"{args.in_flight} in flight; {args.runs} runs")
    print(f"{'':30} {'median':>10} {'runs':>30}")
    for name, values in (
            ("acknowledged/s", [r.acknowledged_per_s for r in runs]),
            ("embedded/s (backlog drain)", [r.embedded_per_s for r in runs]),
            ("model alone, batched/s", [r.model_per_s for r in runs]),
            ("drain / model", [r.ratio for r in runs])):
        shown = "  ".join(f"{v:,.2f}" if v < 10 else f"{v:,.0f}" for v in values)
        median = statistics.median(values)
        print(f"{name:30} {median:>10,.2f} {shown:>30}" if median < 10 else
              f"{name:30} {median:>10,.0f} {shown:>30}")


if __name__ == "__main__":
    asyncio.run(main())
