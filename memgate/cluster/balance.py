"""Partitions spread over the nodes (SPEC §6): a node that serves at least two `storage`
partitions fewer than the busiest node takes one of them over, once its standby of it is in
sync (it first copies one, if it keeps no in-sync copy of any: `to_copy`) — at a cluster's
first start (the first node made itself every store's home) and when a node joins or comes
back.

Each node pulls for itself only (no node decides for another, so two never move one partition
at once): it asks the busiest node's owner of a partition to hand it over to this node
(`replication.Primary.drain` naming this node), the way `memgate cluster drain` does, then
waits for the move to settle before it looks again. What the lease and the in-sync record say
is NATS's (KV on a replicated stream): nothing here elects or counts votes. The derived stores
of a partition (its text index and vectors) follow it (`Primary.follow`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable

from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from memgate.bus.streams import kv_bucket
from memgate.cluster.lease import holder, lease_bucket
from memgate.cluster import replication
from memgate.cluster.replication import (
    Drain, Drained, in_sync, standbys_bucket, subject,
)
from memgate.contracts.errors import MemgateError
from memgate.ports.bus import Requester
from memgate.tasks import cancelled

log = logging.getLogger("memgate.cluster")

BALANCE_EVERY_S = 5.0  # how often a node compares its share with the others'
# The nodes an operator drained (`memgate cluster drain`): a drained node takes no partition
# back, though its stores run there as standbys, until `memgate up` starts it again.
DRAINED = "MEMGATE_DRAINED"
SETTLE_S = 15.0  # after asking for a partition, before it looks again


def pick(node: str, held: dict[str, str], in_sync_of: dict[str, list[str]]) -> str | None:
    """The partition `node` should take over now, if any: one the busiest node serves, of which
    `node` keeps an in-sync copy, when the busiest serves at least two more than `node`."""
    theirs = _pulled(node, held, in_sync_of)
    if theirs is None:
        return None
    candidates, place = theirs
    candidates = [name for name in candidates if node in in_sync_of.get(name, [])]
    return candidates[place % len(candidates)] if candidates else None


def to_copy(node: str, held: dict[str, str], in_sync_of: dict[str, list[str]]) -> str | None:
    """The partition `node` should copy first, to take it over: when it should take one but
    keeps an in-sync copy of none the busiest serves (a store keeps the standbys it wants,
    wherever they are)."""
    theirs = _pulled(node, held, in_sync_of)
    if theirs is None:
        return None
    candidates, place = theirs
    if any(node in in_sync_of.get(name, []) for name in candidates):
        return None  # `pick` takes one over at once
    return candidates[place % len(candidates)]


def _pulled(node: str, held: dict[str, str], in_sync_of: dict[str, list[str]],
            ) -> tuple[list[str], int] | None:
    """The partitions of the busiest node, when it serves at least two more than `node`, and
    `node`'s place among the nodes that pull from it (so they ask for different ones)."""
    alive = {node, *held.values(), *(n for nodes in in_sync_of.values() for n in nodes)}
    count = Counter({n: 0 for n in alive})
    count.update(held.values())
    busiest = max(sorted(count), key=lambda n: count[n])
    if count[busiest] - count[node] < 2:
        return None
    pullers = sorted(n for n in alive if count[busiest] - count[n] >= 2)
    return sorted(name for name, owner in held.items() if owner == busiest), \
        pullers.index(node)


async def drained_bucket(js: JetStreamContext, *, replicas: int = 1) -> KeyValue:
    return await kv_bucket(js, DRAINED, replicas=replicas)


async def drained(kv: KeyValue, node: str) -> bool:
    try:
        return (await kv.get(node)).value is not None
    except KeyNotFoundError:
        return False


class Balancer:
    """This node's pull of its share of the partitions `names` (`storage.pN`)."""

    name = "balancer"

    def __init__(self, *, node: str, names: list[str], bus: Requester,
                 js: Callable[[], JetStreamContext], replicas: int = 1,
                 started: bool = True) -> None:
        """`started`: this process is the first of its node's `memgate up` (not one restarted
        after a step-down), so a drain of the node is over."""
        self._ends_drain = started
        self._node = node
        self._names = names
        self._bus = bus
        self._js = js
        self._replicas = replicas
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        await cancelled(self._task)

    async def _run(self) -> None:
        if self._ends_drain:
            await self._end_drain()
        while True:
            await asyncio.sleep(BALANCE_EVERY_S)
            try:
                taken = await self.once()
            except Exception as exc:  # NATS unreachable or a bucket electing: the next look
                log.info("balancing: %s; trying again", type(exc).__name__)
                continue
            if taken is not None:
                await asyncio.sleep(SETTLE_S)

    async def _end_drain(self) -> None:
        """A drain of this node is over: its record goes (NATS may still be electing leaders
        at a cluster's start: tried again until it answers)."""
        while True:
            try:
                await (await drained_bucket(self._js(), replicas=self._replicas)).delete(
                    self._node)
                return
            except Exception as exc:
                log.info("balancing: %s; trying again", type(exc).__name__)
                await asyncio.sleep(1.0)

    async def once(self) -> str | None:
        """Ask for one partition if this node serves too few; the one asked for."""
        js = self._js()
        if await drained(await drained_bucket(js, replicas=self._replicas), self._node):
            return None  # the operator drained it: it stays empty until started again
        leases = await lease_bucket(js, replicas=self._replicas)
        standbys = await standbys_bucket(js, replicas=self._replicas)
        held: dict[str, str] = {}
        epochs: dict[str, int] = {}
        in_sync_of: dict[str, list[str]] = {}
        for name in self._names:
            owner = await holder(leases, name)
            if owner is None:  # moving now: look again once it has landed
                return None
            held[name], epochs[name] = owner.node, owner.epoch
            record = await in_sync(standbys, name)
            if record is not None and record.epoch == owner.epoch:
                in_sync_of[name] = record.nodes
        wanted = pick(self._node, held, in_sync_of)
        if wanted is None:
            if (copy := to_copy(self._node, held, in_sync_of)) is not None and \
                    (standby := replication.standby(copy)) is not None:
                log.info("balancing: copying %s to take it over from %s", copy, held[copy])
                standby.pull(epochs[copy])  # in sync by one of the next looks
            return None
        log.info("balancing: taking %s over from %s", wanted, held[wanted])
        with contextlib.suppress(MemgateError):  # moved or refused meanwhile: look again
            await self._bus.request(subject(wanted, "drain"),
                                    Drain(to=self._node, step_down=True), Drained)
        return wanted


__all__ = ["DRAINED", "Balancer", "drained", "drained_bucket", "pick", "to_copy"]
