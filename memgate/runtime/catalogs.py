"""The owners' catalogs an indexer or embedder keeps in memory (`storage.catalog.Catalog`,
or anything that says how far it is loaded)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from memgate.contracts.internal import Owner

KEPT = 256  # owners whose catalogs stay in memory (as the indexer's open indexes)


class Loaded(Protocol):
    """A catalog as the cache sees it: loaded yet, and up to which of the owner's seqs."""

    loaded: bool
    seq: int


Catalog = TypeVar("Catalog", bound=Loaded)


class Catalogs(Generic[Catalog]):
    """At most `kept` owners' catalogs, the least recently caught up dropped first, each with
    a lock under which it is caught up with storage (one load per owner at a time)."""

    def __init__(self, make: Callable[[], Catalog], *, kept: int = KEPT) -> None:
        self._make = make
        self._kept = kept
        self._held: OrderedDict[Owner, Catalog] = OrderedDict()
        self._locks: defaultdict[Owner, asyncio.Lock] = defaultdict(asyncio.Lock)

    def get(self, owner: Owner) -> Catalog | None:
        return self._held.get(owner)

    def current(self, owner: Owner, min_seq: int) -> Catalog | None:
        """The owner's catalog if it is loaded and holds every version up to `min_seq`."""
        catalog = self._held.get(owner)
        if catalog is not None and catalog.loaded and catalog.seq >= min_seq:
            return catalog
        return None

    def lock(self, owner: Owner) -> asyncio.Lock:
        return self._locks[owner]

    def of(self, owner: Owner) -> Catalog:
        """The owner's catalog, a new empty one if none is held."""
        if (catalog := self._held.get(owner)) is None:
            catalog = self._held[owner] = self._make()
        return catalog

    def used(self, owner: Owner) -> None:
        """The owner's catalog was just caught up: the last to be dropped."""
        self._held.move_to_end(owner)
        while len(self._held) > self._kept:
            self._held.popitem(last=False)


__all__ = ["Catalogs", "Loaded"]
