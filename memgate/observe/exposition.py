"""`/metrics`: the Prometheus text of every process of this memgate, added up.

Under `memgate up` every process records into files of `DIR/run/metrics`
(prometheus-client's multiprocess mode: `PROMETHEUS_MULTIPROC_DIR`, which the supervisor sets
for its children after emptying the directory, `fresh`); the front reads them all at a scrape
and sums each series over the processes (counters and histograms; a gauge takes the value last
set). So the view is the node's: every process of this data directory, those restarted since
included (a counter keeps what the process it replaced had counted). Without that variable
(one process: `--single-process`, tests) it is this process's own registry.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

FILES_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST


def directory(data_dir: Path) -> Path:
    """Where the processes of a `memgate up` on `data_dir` keep their values."""
    return data_dir / "run" / "metrics"


def fresh(path: Path) -> Path:
    """Empty `path` (what a previous run left is not this run's) and make it, private."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, mode=0o700)
    return path


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def gauges(values: Mapping[str, tuple[str, float]]) -> list[Metric]:
    """Gauges known only at a scrape (name → (help, value)), with no labels."""
    families: list[Metric] = []
    for name, (documentation, value) in values.items():
        family = GaugeMetricFamily(name, documentation)
        family.add_metric([], value)
        families.append(family)
    return families


def labelled(name: str, documentation: str, label: str,
             values: Mapping[str, float]) -> Metric:
    """A gauge known only at a scrape, one series per value of `label`."""
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for value_of_label, value in values.items():
        family.add_metric([value_of_label], value)
    return family


def exposition(extra: list[Metric]) -> bytes:
    """The text format of every process's series (or this one's), then `extra`."""
    files = os.environ.get(FILES_VARIABLE)
    if files:
        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry, path=files)  # type: ignore[no-untyped-call]
        text = generate_latest(registry)
    else:
        text = generate_latest(REGISTRY)
    scraped = CollectorRegistry(auto_describe=False)
    scraped.register(_Families(extra))
    return text + generate_latest(scraped)


__all__ = ["CONTENT_TYPE", "FILES_VARIABLE", "Metric", "directory", "exposition", "fresh", "gauges",
           "labelled"]
