"""The leases this process writes under: `check()` before a commit refuses it once the lease of
the store it writes may have gone to someone else (`cluster.lease`). A process with no lease (a
test's store, the command line) is never fenced.

Which store a commit writes is the store whose writer thread runs it (`writing`, set by
`runtime.actor.Serial` for each call): a store handed over (a drain's step-down) fences its own
commits, not those of the other stores of its process."""

from __future__ import annotations

import threading

from memgate.cluster.lease import PartitionLease

_held: set[PartitionLease] = set()
_thread = threading.local()


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


def writing(store: str | None) -> None:
    """This thread's calls write `store` from now on (a writer thread's name: the store's, or
    the store's followed by `.` and a part, `indexer.p0.commit`)."""
    _thread.store = store


def check() -> None:
    """Raise `LeaseLostError` if the lease of the store this thread writes is lost or may have
    run out; on a thread that names no store, if any lease of this process is."""
    store = getattr(_thread, "store", None)
    for lease in tuple(_held):
        if store is None or store == lease.partition or \
                store.startswith(f"{lease.partition}."):
            lease.check()


__all__ = ["check", "drop", "hold", "held", "node", "writing"]
