"""How long one query's embedding takes beside a busy event loop, by GIL switch interval.

    .venv/bin/python -m bench.gil_handoff [--samples 300]

The recall actor embeds queries on a worker thread; each ONNX run and tokenizer call gives the
GIL up and takes it back, and a busy event loop thread (here: a Python loop) holds it until the
switch interval asks it to let go. Prints p50/p99 per interval, idle and beside the busy thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from memgate.app.settings import Settings
from memgate.embedding import OnnxEmbedder
from memgate.runtime.actor import GIL_SWITCH_S

INTERVALS = (0.005, 0.001, GIL_SWITCH_S)


def timed(embedder: OnnxEmbedder, samples: int, *, busy: bool) -> tuple[float, float]:
    """p50 and p99 (ms) of embedding one query, with or without a busy Python thread."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=spin)
    if busy:
        spinner.start()
    took = []
    for _ in range(samples):
        started = time.perf_counter()
        embedder.embed(["budget review numbers"])
        took.append((time.perf_counter() - started) * 1000)
    stop.set()
    if busy:
        spinner.join()
    took.sort()
    return statistics.median(took), took[min(len(took) - 1, round(0.99 * (len(took) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    settings = Settings()
    embedder = OnnxEmbedder(settings.compute_model(), settings.embedding_tokenizer, threads=1)
    embedder.embed(["warm up"])
    print("| switch interval | idle p50 / p99 ms | beside a busy loop p50 / p99 ms |")
    print("|---:|---:|---:|")
    for interval in INTERVALS:
        sys.setswitchinterval(interval)
        idle, busy = timed(embedder, args.samples, busy=False), timed(embedder, args.samples,
                                                                      busy=True)
        print(f"| {interval * 1000:g} ms | {idle[0]:.2f} / {idle[1]:.2f} | "
              f"{busy[0]:.2f} / {busy[1]:.2f} |")


if __name__ == "__main__":
    main()
