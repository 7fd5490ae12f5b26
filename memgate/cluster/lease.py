"""Partition ownership through leases in a replicated NATS KV bucket (SPEC §6, "Many machines").

Consensus comes from NATS, never from memgate: a lease is one key of the `MEMGATE_LEASES`
bucket (history 1, every entry expiring `ttl_s` after its last write), won by `create` (which
succeeds only where no live entry is), renewed by `update` naming the revision the holder last
wrote (compare-and-set: refused once anyone else has written the key), and given up by a delete
naming that revision. The bucket is a JetStream stream whose sequence never goes back, so the
revision of the `create` that won a lease is its **epoch**: a later holder's epoch is always
greater. Every write a partition commits names the epoch it was made under; a copy refuses an
older one.

A holder stops serving before its lease can expire anywhere: `valid()` counts `ttl_s - margin_s`
from the moment it *sent* its last successful write (the server's `ttl_s` starts later, when it
stored it), on the monotonic clock, which keeps counting while the process is stopped
(SIGSTOP). A holder that cannot renew in time, or whose renewal is refused, has lost the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from nats.js.client import JetStreamContext
from nats.js.errors import (
    BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from memgate.bus.streams import kv_bucket
from memgate.contracts.errors import UnavailableError
from memgate.tasks import cancelled

log = logging.getLogger("memgate.cluster")

BUCKET = "MEMGATE_LEASES"
# A dead holder's partitions move after at most TTL_S (plus the server's sweep). A holder serves
# for TTL_S - MARGIN_S after each renewal it sent: 8 s outlast the Raft election that follows
# the death of the bucket's leader (4-9 s, DEPENDENCY-NOTES) most of the time, and three late
# renewals, or an event loop held up for 6 s, before it stops.
TTL_S = 10.0
MARGIN_S = 2.0
RENEW_EVERY_S = 2.0


@dataclass(frozen=True)
class Lease:
    """A partition held by `node` since the write of revision `epoch`; `revision` is the
    holder's last write (what its next renewal names)."""

    partition: str
    node: str
    epoch: int
    revision: int
    # what else the holder says of itself (`cluster.ownership`: its host, process and disk)
    about: Mapping[str, str | int] = field(default_factory=dict, compare=False)

    def encode(self) -> bytes:
        return json.dumps({**self.about, "node": self.node, "epoch": self.epoch}).encode()


class LeaseLostError(UnavailableError):
    """This node no longer holds the partition: it must not commit anything more for it."""


async def lease_bucket(js: JetStreamContext, *, replicas: int = 1,
                       ttl_s: float = TTL_S) -> KeyValue:
    """The leases bucket, created on first use (idempotent; `replicas` 3 in a cluster)."""
    return await kv_bucket(js, BUCKET, replicas=replicas, ttl_s=ttl_s)


async def holder(kv: KeyValue, partition: str) -> Lease | None:
    """Who holds `partition` now, by the bucket (None: nobody)."""
    try:
        entry = await kv.get(partition)
    except KeyNotFoundError:  # never held, expired, or given up (a delete marker)
        return None
    if entry.value is None or entry.revision is None:
        return None
    data = json.loads(entry.value)
    node, epoch = str(data.pop("node")), int(data.pop("epoch"))
    # a lease just won names its epoch from its first renewal on: until then it is this entry
    return Lease(partition, node, epoch or entry.revision, entry.revision, data)


async def given_up(kv: KeyValue, partition: str) -> bool:
    """Whether `partition`'s lease was given up (deleted: a clean stop, a process starting
    again, a drain) rather than left to expire (a holder killed or cut off): the marker of a
    delete stays in the bucket for one TTL."""
    try:
        await kv.get(partition)
    except KeyNotFoundError as missing:  # nats-py raises this for a deleted key too, with
        return getattr(missing, "entry", None) is not None  # the marker as its entry
    return False


class PartitionLease:
    """One node's hold on one partition: `acquire`, then `keep` renews it in the background.

    `check()` is what a write path calls before it commits: it raises `LeaseLostError` unless
    the lease is held and cannot have expired. `on_lost` runs once, when the lease is lost;
    `on_step_down`, if given, instead of it when the lease is given up (`step_down`).
    """

    def __init__(self, kv: KeyValue, partition: str, node: str, *, ttl_s: float = TTL_S,
                 margin_s: float = MARGIN_S, renew_every_s: float = RENEW_EVERY_S,
                 on_lost: Callable[[], Awaitable[None]] | None = None,
                 on_step_down: Callable[[], Awaitable[None]] | None = None,
                 about: Mapping[str, str | int] | None = None) -> None:
        assert renew_every_s < ttl_s - margin_s, "renewals must come before the lease ends"
        self._kv = kv
        self.partition = partition
        self.node = node
        self._ttl_s = ttl_s
        self._margin_s = margin_s
        self._renew_every_s = renew_every_s
        self._on_lost = on_lost
        self._on_step_down = on_step_down
        self._about = dict(about or {})
        self.lease: Lease | None = None
        self._valid_until = 0.0
        self._keeper: asyncio.Task[None] | None = None
        self._lost = False

    def valid(self) -> bool:
        return self.lease is not None and not self._lost and time.monotonic() < self._valid_until

    def check(self) -> Lease:
        """The lease a commit is made under; refused once it may have gone to someone else."""
        if not self.valid():
            raise LeaseLostError(f"this node no longer owns partition {self.partition}")
        assert self.lease is not None
        return self.lease

    async def acquire(self, *, replacing: Lease | None = None) -> Lease | None:
        """Win the partition if nobody holds it; None if someone does. `replacing`: a lease
        known to be dead (its holder's process is gone), taken over by compare-and-set."""
        sent = time.monotonic()
        candidate = Lease(self.partition, self.node, 0, 0, self._about)
        try:
            if replacing is None:
                revision = await self._kv.create(self.partition, candidate.encode())
            else:
                revision = await self._kv.update(self.partition, candidate.encode(),
                                                 last=replacing.revision)
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            # KeyNotFoundError: nats-py's create found the key, then read it to see whether it
            # was deleted, and it had expired in between (seen once in CI, as A's lease ran
            # out): not won this time, and the caller asks again
            return None
        # the epoch is the revision that won; the value names it from the next renewal on
        self.lease = Lease(self.partition, self.node, revision, revision, self._about)
        self._valid_until = sent + self._ttl_s - self._margin_s
        self._lost = False
        await self._renew()
        return self.lease

    async def _renew(self) -> None:
        assert self.lease is not None
        sent = time.monotonic()
        if sent >= self._valid_until:  # too late (the process was stopped): never write again
            raise LeaseLostError(f"the lease of {self.partition} ran out before its renewal")
        try:
            revision = await self._kv.update(self.partition, self.lease.encode(),
                                             last=self.lease.revision)
        except KeyWrongLastSequenceError as exc:  # someone else wrote it: fenced
            raise LeaseLostError(f"partition {self.partition} was taken over") from exc
        self.lease = Lease(self.partition, self.node, self.lease.epoch, revision, self._about)
        self._valid_until = sent + self._ttl_s - self._margin_s

    def keep(self) -> None:
        """Renew in the background until `release` or the lease is lost."""
        assert self.lease is not None, "acquire() first"
        self._keeper = asyncio.create_task(self._keep(), name=f"lease-{self.partition}")

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self._renew_every_s)
            try:
                await self._renew()
            except LeaseLostError:
                await self._lose()
                return
            except Exception as exc:  # NATS unreachable: keep trying while the lease lasts
                log.warning("renewing the lease of %s failed: %s", self.partition,
                            type(exc).__name__)
                if time.monotonic() >= self._valid_until:
                    await self._lose()
                    return

    async def _lose(self) -> None:
        if self._lost:
            return
        self._lost = True
        log.error("lost the lease of partition %s (epoch %s): not serving it any more",
                  self.partition, self.lease.epoch if self.lease else None)
        if self._on_lost is not None:
            await self._on_lost()

    async def step_down(self) -> None:
        """Commit nothing more under this lease from now on, give it up, and run
        `on_step_down` (else `on_lost`): a drain, a standby takes the partition over as soon as
        the lease is gone."""
        lease, valid = self.lease, self.valid()
        self._lost = True  # `check()` refuses every commit from here on
        await cancelled(self._keeper)
        if lease is not None and valid:
            with contextlib.suppress(KeyWrongLastSequenceError, BadRequestError):
                await self._kv.delete(self.partition, last=lease.revision)
        log.info("gave up the lease of %s (epoch %s)", self.partition,
                 lease.epoch if lease else None)
        stepped = self._on_step_down or self._on_lost
        if stepped is not None:
            await stepped()

    async def release(self) -> None:
        """Stop renewing and give the partition up at once (a graceful stop)."""
        await cancelled(self._keeper)
        if self.lease is not None and self.valid():
            try:
                await self._kv.delete(self.partition, last=self.lease.revision)
            except (KeyWrongLastSequenceError, BadRequestError):
                # a renewal cancelled in flight may have been written: still ours if it names
                # our epoch (else already someone else's)
                current = await holder(self._kv, self.partition)
                if current is not None and current.epoch == self.lease.epoch:
                    with contextlib.suppress(KeyWrongLastSequenceError, BadRequestError):
                        await self._kv.delete(self.partition, last=current.revision)
        self._lost = True


__all__ = ["BUCKET", "Lease", "LeaseLostError", "PartitionLease", "given_up", "holder",
           "lease_bucket"]
