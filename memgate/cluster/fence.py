"""The leases this process writes under: `check()` before a commit refuses it once any of them
may have gone to someone else (`cluster.lease`). A process with no lease (a test's store, the
command line) is never fenced."""

from __future__ import annotations

from memgate.cluster.lease import PartitionLease

_held: set[PartitionLease] = set()


def hold(lease: PartitionLease) -> None:
    _held.add(lease)


def drop(lease: PartitionLease) -> None:
    _held.discard(lease)


def held() -> tuple[PartitionLease, ...]:
    return tuple(_held)


def node() -> str | None:
    """The node this process serves its leases as (None without a lease): what erasure evidence
    names."""
    return next((lease.node for lease in _held), None)


def check() -> None:
    """Raise `LeaseLostError` if a lease of this process is lost or may have run out."""
    for lease in tuple(_held):
        lease.check()


__all__ = ["check", "drop", "hold", "held", "node"]
