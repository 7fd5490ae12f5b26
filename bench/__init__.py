"""Benchmarks: `python -m bench.latency`, `python -m bench.quality` (or `make bench`)."""
