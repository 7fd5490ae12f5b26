"""Two builds of memgate on `bench.load --quick`, runs alternated, medians and ratios.

    python -m bench.compare DIR_A DIR_B [--runs 3] [--env-b NAME=VALUE ...] [--out DIR]

DIR_A and DIR_B are checkouts (`git worktree add --detach /tmp/a <commit>`; the same one
twice, with `--env-b`, to compare a setting). Runs A B A B …, each with `PYTHONPATH` on its
checkout, keeps each run's output in `--out`, then prints per scenario the median ops/s and
CPU per command of each build, and B/A: the geometric mean over the saturation scenarios'
throughput and over every scenario's CPU, overall and per run pair.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

Key = tuple[str, ...]


def parse(output: str) -> dict[Key, dict[str, float]]:
    """bench.load's `run 1/1: | via | agents | load | mix | ops/s | … | server CPU ms/op |` rows."""
    rows = {}
    for line in output.splitlines():
        if not line.startswith("run "):
            continue
        cells = [c.strip() for c in line.split("|")[1:-1]]
        rows[tuple(cells[:4])] = {"ops": float(cells[4]), "cpu": float(cells[8])}
    return rows


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def run(checkout: Path, env: dict[str, str], out: Path) -> dict[Key, dict[str, float]]:
    done = subprocess.run([sys.executable, "-m", "bench.load", "--quick"], cwd=checkout,
                          env={**os.environ, **env, "PYTHONPATH": str(checkout)},
                          capture_output=True, text=True, check=True)
    out.write_text(done.stdout)
    return parse(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--env-b", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="memgate-compare-"))
    out.mkdir(parents=True, exist_ok=True)
    env_b = dict(item.split("=", 1) for item in args.env_b)
    runs: dict[str, list[dict[Key, dict[str, float]]]] = {"A": [], "B": []}
    for i in range(1, args.runs + 1):
        for name, checkout, env in (("A", args.a, {}), ("B", args.b, env_b)):
            print(f"run {i}/{args.runs} of {name} ({checkout}) …", file=sys.stderr, flush=True)
            runs[name].append(run(checkout, env, out / f"{name}.{i}.out"))

    def median(name: str, key: Key, field: str) -> float:
        return statistics.median(r[key][field] for r in runs[name] if key in r)

    keys = list(runs["A"][0])
    print("| via | agents | load | mix | A ops/s | B ops/s | B/A | A CPU ms/op | B CPU ms/op |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    for key in keys:
        a, b = median("A", key, "ops"), median("B", key, "ops")
        ca, cb = median("A", key, "cpu"), median("B", key, "cpu")
        print(f"| {' | '.join(key)} | {a:.1f} | {b:.1f} | {b / a:.3f} | {ca:.1f} | {cb:.1f} |")
    saturated = [k for k in keys if k[2] == "saturation"]
    print(f"\nB/A throughput (saturation, medians): "
          f"{geomean([median('B', k, 'ops') / median('A', k, 'ops') for k in saturated]):.3f}; "
          f"CPU per command: "
          f"{geomean([median('B', k, 'cpu') / median('A', k, 'cpu') for k in keys]):.3f}")
    for i, (a_run, b_run) in enumerate(zip(runs["A"], runs["B"], strict=True), 1):
        print(f"run pair {i}: throughput "
              f"{geomean([b_run[k]['ops'] / a_run[k]['ops'] for k in saturated]):.3f}")
    print(f"(each run's output: {out})")


if __name__ == "__main__":
    main()
