"""One writer for each store: the single-writer actors claim their names before they serve
(SPEC §6, "Many machines").

Each single-writer actor (`storage.pN`, `indexer.pN`, `embedder.pN` and the directory, registry,
spaces, sessions, erasure, keys and audit) is owned through a lease of its own name
(`cluster.lease`), and has a **home**: the node and disk (data directory) that keep its files,
recorded once, by compare-and-set, in the `MEMGATE_HOMES` bucket (no expiry). A process claims
an actor only on its home; a second claimant while the lease is held is refused with
`OwnedElsewhereError`, whatever the process layout: there are never two writers of one file, and
a process never serves a store from a disk that does not hold it (an empty data directory, a
node that is not its home) as if it were the one. Until standbys are kept in sync, an actor's
home does not move: when its node is down, its commands wait for it.

A process that lost a lease (stopped past it, cut off from NATS, fenced by a takeover) commits
nothing more: `fence.check()` runs before every commit, and its `on_lost` stops the process,
whose supervisor starts it again. A lease whose holder died on this host (its process is gone:
a crash, a kill -9) is taken over at once, by compare-and-set with the next epoch, instead of
waiting out its expiry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar
from pathlib import Path

import nats.errors
from nats.js.client import JetStreamContext
from nats.js.errors import (
    KeyNotFoundError, KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from memgate.bus.lifetime import alive
from memgate.bus.logins import SINGLE_WRITERS, owned, single_writers
from memgate.bus.streams import kv_bucket, raise_replicas, until_jetstream_answers
from memgate.cluster import fence
from memgate.cluster.lease import (
    BUCKET, MARGIN_S, RENEW_EVERY_S, TTL_S, Lease, PartitionLease, holder, lease_bucket,
)
from memgate.contracts.errors import UnavailableError

log = logging.getLogger("memgate.cluster")
T = TypeVar("T")

HOMES = "MEMGATE_HOMES"
NODE_FILE = "node.json"  # in the data directory: this disk's id, and the node it belongs to
HOME_TRIES, HOME_RETRY_S = 60, 0.5  # a home made elsewhere, read on a replica catching up
CLAIM_ATTEMPTS = 5  # a lease that expires between a refused create and the read that follows


class OwnedElsewhereError(UnavailableError):
    """Another process holds the lease, or another disk keeps the files; the message says which."""


@dataclass(frozen=True)
class Disk:
    """This node and its data directory, as the leases and homes name them."""

    node: str
    disk: str  # made once per data directory: a directory made afresh is another disk
    host: str
    pid: int

    @classmethod
    def of(cls, data_dir: Path, node: str | None) -> Disk:
        """This process's disk: `DIR/node.json`, written on first use. `node` (the setting)
        must match a name recorded before; by default the host's name, kept from then on."""
        path = data_dir / NODE_FILE
        host = socket.gethostname()
        if path.exists():
            recorded = json.loads(path.read_text())
            if node is not None and node != recorded["node"]:
                raise OwnedElsewhereError(
                    f"the data directory {data_dir} belongs to node {recorded['node']!r}, not "
                    f"{node!r}: start it with --node {recorded['node']}, or use another "
                    "directory for a new node")
            return cls(recorded["node"], recorded["disk"], host, os.getpid())
        data_dir.mkdir(parents=True, exist_ok=True)
        disk = cls(node or host, uuid.uuid4().hex, host, os.getpid())
        # the processes of one `memgate up` start together: the first to link its file wins,
        # and the others read that one (one disk id per data directory)
        tmp = path.with_name(f"{NODE_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"node": disk.node, "disk": disk.disk}))
        try:
            os.link(tmp, path)
        except FileExistsError:
            return cls.of(data_dir, node)
        finally:
            tmp.unlink(missing_ok=True)
        return disk

    def home(self) -> dict[str, str]:
        return {"node": self.node, "disk": self.disk}

    def about(self) -> dict[str, str | int]:
        return {"disk": self.disk, "host": self.host, "pid": self.pid}

    def held_by_a_dead_process_here(self, lease: Lease) -> bool:
        """The holder ran on this host, on this disk, and its process is gone."""
        pid = lease.about.get("pid")
        if (lease.about.get("host"), lease.about.get("disk")) != (self.host, self.disk):
            return False
        if not isinstance(pid, int) or pid == self.pid:
            return False
        return not alive(pid)


async def homes_bucket(js: JetStreamContext, *, replicas: int = 1) -> KeyValue:
    return await kv_bucket(js, HOMES, replicas=replicas)


async def make_home(kv: KeyValue, name: str, disk: Disk) -> dict[str, str]:
    """The home of `name`: `disk`'s if it had none (first come, by compare-and-set)."""
    for _ in range(HOME_TRIES):
        home = await home_of(kv, name)
        if home is not None:
            return home
        try:
            await kv.create(name, json.dumps(disk.home()).encode())
            return disk.home()
        # another node made it its home just now, and the replica read may not show it yet
        # (nats-py's create reads the key again, and a lagging replica says "not found")
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            await asyncio.sleep(HOME_RETRY_S)
    raise UnavailableError(f"the home of {name} could not be read")


async def settle_homes(js: JetStreamContext, disk: Disk, names: Iterable[str], *,
                       replicas: int) -> list[str]:
    """At a node's start: the home of each of `names` that has none becomes this disk; the names
    homed elsewhere are returned (that node runs them)."""
    async def settle() -> list[str]:
        homes = await homes_bucket(js, replicas=replicas)
        return [name for name in names if await make_home(homes, name, disk) != disk.home()]

    return await until_jetstream_answers(settle)


async def home_of(kv: KeyValue, name: str) -> dict[str, str] | None:
    try:
        entry = await kv.get(name)
    except KeyNotFoundError:
        return None
    return None if entry.value is None else dict(json.loads(entry.value))


@dataclass(frozen=True)
class Owned:
    """One single-writer actor as the cluster sees it: its home, and its lease (None: nobody
    serves it now)."""

    name: str
    home: str
    owner: Lease | None


async def cluster_status(js: JetStreamContext) -> list[Owned]:
    """Every single-writer actor that has a home, by name."""
    homes, leases = await homes_bucket(js), await lease_bucket(js)
    try:
        names = sorted(await homes.keys())
    except nats.js.errors.NoKeysError:
        return []
    return [Owned(name, (await home_of(homes, name) or {}).get("node", "?"),
                  await holder(leases, name)) for name in names]


class Ownership:
    """The leases of one process: `claim` its single-writer actors before they serve, `release`
    them once they have stopped."""

    def __init__(self, js: JetStreamContext, disk: Disk, *, replicas: int = 1,
                 ttl_s: float = TTL_S, on_lost: Callable[[], Awaitable[None]] | None = None,
                 on_step_down: Callable[[str], Awaitable[None]] | None = None) -> None:
        self._js = js
        self._disk = disk
        self._replicas = replicas
        self._ttl_s = ttl_s
        self._margin_s = min(MARGIN_S, ttl_s / 5)
        self._renew_s = min(RENEW_EVERY_S, ttl_s / 5)
        self._on_lost = on_lost
        self._on_step_down = on_step_down
        self.leases: dict[str, PartitionLease] = {}
        self._buckets: tuple[KeyValue, KeyValue] | None = None

    async def claim(self, names: Iterable[str]) -> None:
        """Own every one of `names`, or raise `OwnedElsewhereError` (holding none of them)."""
        try:
            for name in names:
                await until_jetstream_answers(partial(self._claim, name))
        except BaseException:
            await self.release()
            raise

    async def _claim(self, name: str) -> None:
        if self._buckets is None:
            leases = await lease_bucket(self._js, replicas=self._replicas, ttl_s=self._ttl_s)
            homes = await homes_bucket(self._js, replicas=self._replicas)
            for bucket in (BUCKET, HOMES):  # made by a cluster of fewer nodes
                await raise_replicas(self._js, f"KV_{bucket}", self._replicas)
            self._buckets = leases, homes
        leases, homes = self._buckets
        await self._home(homes, name)
        lease = PartitionLease(leases, name, self._disk.node, ttl_s=self._ttl_s,
                               margin_s=self._margin_s, renew_every_s=self._renew_s,
                               on_lost=self._lost, about=self._disk.about(),
                               on_step_down=None if self._on_step_down is None else
                               partial(self._on_step_down, name))
        await self._acquire(leases, lease)
        self.leases[name] = lease
        fence.hold(lease)
        lease.keep()

    async def _home(self, homes: KeyValue, name: str) -> None:
        home = await make_home(homes, name, self._disk)
        if home != self._disk.home():
            where = (f"on another data directory of node {home['node']!r}"
                     if home.get("node") == self._disk.node else f"on node {home.get('node')!r}")
            raise OwnedElsewhereError(f"{name} keeps its files {where}; this node may not "
                                      "serve it")

    async def _acquire(self, leases: KeyValue, lease: PartitionLease) -> None:
        for _ in range(CLAIM_ATTEMPTS):
            if await lease.acquire() is not None:
                return
            current = await holder(leases, lease.partition)
            if current is None:
                continue  # it expired, or was given up, since the create was refused
            ours = dict(current.about) == self._disk.about()  # a create whose answer was lost
            if not ours and not self._disk.held_by_a_dead_process_here(current):
                raise OwnedElsewhereError(
                    f"{lease.partition} is owned by another process (node {current.node!r}, "
                    f"epoch {current.epoch}): a second owner is refused")
            if await lease.acquire(replacing=current) is not None:
                log.info("took over %s from a process that died (epoch %s -> %s)",
                         lease.partition, current.epoch, lease.lease and lease.lease.epoch)
                return
        raise OwnedElsewhereError(f"{lease.partition}: could not win its lease")

    async def _lost(self) -> None:
        if self._on_lost is not None:
            await self._on_lost()

    def forget(self, name: str) -> None:
        """`name`'s lease, given up (`PartitionLease.step_down`), no longer this process's."""
        lease = self.leases.pop(name, None)
        if lease is not None:
            fence.drop(lease)

    async def release(self) -> None:
        for lease in self.leases.values():
            fence.drop(lease)
            try:
                await lease.release()
            except Exception as exc:  # NATS gone: the lease runs out by itself
                log.warning("could not give up %s: %s", lease.partition, type(exc).__name__)
        self.leases.clear()


__all__ = ["HOMES", "SINGLE_WRITERS", "Disk", "Owned", "OwnedElsewhereError", "Ownership",
           "cluster_status", "home_of", "homes_bucket", "make_home", "owned", "settle_homes",
           "single_writers", "until_jetstream_answers"]
