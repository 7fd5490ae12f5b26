"""Which actors run in which process of `memgate up`: the process groups (SPEC §6).

Each DuckDB file and Tantivy directory has exactly one owner: the `store` group holds every
single writer of DuckDB (directory, registry, storage.pN) except the vectors, which the
embedder of the `index` group owns beside its partition's Tantivy index. The stateless `front`
group (REST + governance + recall, which governance asks in process: `BusClient(local=…)`) runs
`workers` processes, sharing their queue groups and one listening socket. Governance runs in
the `store` group too, where it takes the agents' remembers, lists and forgets from the bus and
hands them to storage in process; the `front`'s takes recall, from the bus and from its REST
and MCP adapters, which send the other commands over the bus. The nats-authority stays in the
supervisor, which owns the embedded server it reconfigures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from memgate.app.settings import Settings
from memgate.bus import subjects
from memgate.bus.logins import PUBLIC_COMMANDS, kind_of, single_writers

FRONT = "front"
# An agent's remember, list and forget are governed beside storage, which governance then asks
# in process: two trips through nats-server fewer than from the `front` (docs/DECISIONS.md, "An
# agent's remember, list and forget are governed beside storage"). Recall is governed beside
# recall, in the `front`.
BESIDE_STORAGE = frozenset(subjects.BESIDE_STORAGE)
INDEXING = frozenset({"indexer", "embedder"})  # the `index` group's kinds
HUGE_PAGES = "glibc.malloc.hugetlb=1"


@dataclass(frozen=True)
class Group:
    """One kind of child process: the actors it runs, and how many copies of it."""

    name: str
    actors: frozenset[str]
    stateless: bool = False  # any number may run: `Settings.workers` of them
    rest: bool = False  # serves the REST adapter on the listening socket the supervisor holds
    # the public commands its governance takes (from the bus and from its REST and MCP adapters,
    # which send the others over the bus)
    governs: frozenset[str] = frozenset()

    def replicas(self, settings: Settings) -> int:
        return settings.workers if self.stateless else 1


def groups(settings: Settings) -> list[Group]:
    """The groups; the front door (last) starts once the others serve and stops first, so
    the commands in flight still find every actor while it drains. In a cluster, a group
    whose actors all live on other nodes is left out."""
    return [group for group in _groups(settings) if group.actors]


def _groups(settings: Settings) -> list[Group]:
    # those homed on another node of the cluster are left out
    writers = set(single_writers(settings.partition_names())) - set(settings.elsewhere)
    indexing = {name for name in writers if kind_of(name) in INDEXING}
    return [
        Group("store", frozenset({"reaper", "governance", *(writers - indexing)}),
              governs=BESIDE_STORAGE),
        Group("index", frozenset(indexing)),
        Group(FRONT, frozenset({"governance", "space-memories", "recall", "cluster"}),
              stateless=True,
              rest=True, governs=frozenset(PUBLIC_COMMANDS) - BESIDE_STORAGE),
    ]


def group_named(settings: Settings, name: str) -> Group:
    for group in groups(settings):
        if group.name == name:
            return group
    raise ValueError(f"no process group {name!r}")


def child_environment(base: dict[str, str], settings: Settings) -> dict[str, str]:
    """The environment of a child process: `base` with `settings` written over it as the
    `MEMGATE_*` variables the child reads back (unset optional values removed), so every
    process of one `memgate up` runs with the same settings."""
    env = dict(base)
    # numpy's OpenBLAS runs a product on every core, then its threads spin waiting for the next
    # one, which costs far more CPU than the product (docs/DECISIONS.md, "One BLAS thread per
    # process"). The actors' products are small; one thread each (a value set by the user stays).
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    # glibc's malloc asks for transparent huge pages for what it maps: the model's weights, read
    # by every run, then take a few TLB entries instead of thousands, and a run that follows
    # other work costs less (docs/DECISIONS.md, "The children ask for transparent huge pages").
    # Other C libraries ignore it; a user's value stays.
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" not in tunables:
        env["GLIBC_TUNABLES"] = ":".join(filter(None, (tunables, HUGE_PAGES)))
    for name, value in settings.model_dump().items():
        key = f"MEMGATE_{name.upper()}"
        if value is None:
            env.pop(key, None)
        elif isinstance(value, SecretStr):
            env[key] = value.get_secret_value()
        elif isinstance(value, Path):
            env[key] = str(value.resolve())
        elif isinstance(value, list | dict):  # complex fields are read back as JSON
            env[key] = json.dumps(value, default=str)
        else:
            env[key] = str(value)
    return env


__all__ = ["FRONT", "Group", "child_environment", "group_named", "groups"]
