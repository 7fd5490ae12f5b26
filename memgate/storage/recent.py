"""What the memory store's single writer knows of its rows without asking DuckDB.

The store is its file's only writer, so it can mirror what it writes: the versions of its
latest commits (every version above a floor seq, exactly), versions it read lately, each
owner's newest seq and how many of its versions cite something. Every write the store makes
updates them after its commit (a supersede, a deletion), so an answer from here is the
answer DuckDB would give; whatever is not known here is read from DuckDB. Texts are the
masked ones the store keeps anyway; a deleted version leaves these maps with its row.

Only the writer changes it, but any thread may read it (the storage actor answers from it on
its event loop): every method holds one lock, and the composite answers (`catalog`, `texts`,
`rows`, `uncited_high`) are each of one instant.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

Owner = tuple[str, str]  # (tenant, subject)

# Versions of the latest commits held (every one above the floor), and older ones read lately.
RECENT = 2048
READ = 8192


@dataclass(slots=True)
class Version:
    """A row of `memories` as committed (its legal hold false: holds are set while stopped)."""

    memory_id: str
    seq: int
    tenant: str
    subject_id: str
    namespace: str
    key: str | None
    collection_id: str | None
    text: str
    created_at: datetime  # naive UTC, as stored
    superseded_at: datetime | None
    citations: str  # JSON
    extras: str | None = None  # JSON: a mem0 memory's metadata (masked), timestamp, expiry

    @property
    def owner(self) -> Owner:
        return self.tenant, self.subject_id


class Recent:
    """Versions by id: every version with a seq above `floor`, and some below it."""

    def __init__(self, floor: int, *, recent: int = RECENT, read: int = READ) -> None:
        self.floor = floor  # every version with a higher seq is in `_above`
        self._above: dict[str, Version] = {}  # seq order (commits come in seq order)
        self._read: OrderedDict[str, Version] = OrderedDict()  # least recently used first
        self._recent_cap = recent
        self._read_cap = read
        self._high: dict[Owner, int] = {}  # owner → its newest seq (0: none)
        self._citing: dict[Owner, int] = {}  # owner → how many of its versions cite something
        self._lock = threading.RLock()

    def get(self, memory_id: str) -> Version | None:
        with self._lock:
            version = self._above.get(memory_id)
            if version is None and (version := self._read.get(memory_id)) is not None:
                self._read.move_to_end(memory_id)
            return version

    def high(self, owner: Owner) -> int | None:
        """The owner's newest seq, if known."""
        with self._lock:
            return self._high.get(owner)

    def citing(self, owner: Owner) -> int | None:
        """How many of the owner's versions cite something, if known."""
        with self._lock:
            return self._citing.get(owner)

    def learn(self, owner: Owner, *, high: int | None = None, citing: int | None = None) -> None:
        """What DuckDB answered (read by the writer, so nothing changed it meanwhile)."""
        with self._lock:
            if high is not None:
                self._high[owner] = high
            if citing is not None:
                self._citing[owner] = citing

    def above(self, owner: Owner, after_seq: int) -> list[Version] | None:
        """The owner's versions above `after_seq`, oldest first; None when some may be below
        the floor (not all held)."""
        with self._lock:
            if after_seq < self.floor:
                return None
            found: list[Version] = []
            for version in reversed(self._above.values()):
                if version.seq <= after_seq:
                    break
                if version.owner == owner:
                    found.append(version)
            found.reverse()
            return found

    def committed(self, versions: Iterable[Version],
                  superseded: Iterable[tuple[str, datetime]]) -> None:
        """A commit's new versions (in seq order, above every held one) and the earlier ones
        it superseded (id, instant)."""
        with self._lock:
            for memory_id, instant in superseded:
                if (version := self.get(memory_id)) is not None:
                    version.superseded_at = instant
            for version in versions:
                self._above[version.memory_id] = version
                owner = version.owner
                self._high[owner] = version.seq  # the file's newest seq, so its owner's too
                if owner in self._citing and version.citations != "[]":
                    self._citing[owner] += 1
            while len(self._above) > self._recent_cap:
                oldest = next(iter(self._above.values()))
                del self._above[oldest.memory_id]
                self.floor = max(self.floor, oldest.seq)
                self._keep(oldest)

    def read(self, versions: Iterable[Version]) -> None:
        """Versions read from DuckDB (current as read)."""
        with self._lock:
            for version in versions:
                if version.memory_id not in self._above:
                    self._keep(version)

    def _keep(self, version: Version) -> None:
        self._read[version.memory_id] = version
        self._read.move_to_end(version.memory_id)
        while len(self._read) > self._read_cap:
            self._read.popitem(last=False)

    def deleted(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """Versions deleted (tenant, subject, id): gone from here, their owners' newest seq and
        citing count read again when next asked."""
        with self._lock:
            for tenant, subject, memory_id in rows:
                self._above.pop(memory_id, None)
                self._read.pop(memory_id, None)
                self._high.pop((tenant, subject), None)
                self._citing.pop((tenant, subject), None)

    def catalog(self, owner: Owner, after_seq: int) -> tuple[int, list[Version]] | None:
        """The owner's newest seq and its versions above `after_seq`; None unless both are
        known."""
        with self._lock:
            high, held = self._high.get(owner), self.above(owner, after_seq)
            return None if high is None or held is None else (high, held)

    def texts(self, owner: Owner, ids: Iterable[str]) -> list[Version] | None:
        """These versions of the owner's, in seq order; None unless each is held (and his)."""
        with self._lock:
            known = [self.get(i) for i in dict.fromkeys(ids)]
        held = [v for v in known if v is not None and v.owner == owner]
        return sorted(held, key=lambda v: v.seq) if len(held) == len(known) else None

    def rows(self, owner: Owner, ids: Iterable[str],
             allowed: Callable[[Version], bool]) -> tuple[list[Version], list[str]]:
        """Those of the held versions among `ids` that are the owner's and `allowed`, and
        the ids not held."""
        found: list[Version] = []
        unknown: list[str] = []
        with self._lock:
            for memory_id in ids:
                if (version := self.get(memory_id)) is None:
                    unknown.append(memory_id)
                elif version.owner == owner and allowed(version):  # another's: never allowed
                    found.append(version)
        return found, unknown

    def uncited_high(self, owner: Owner) -> int | None:
        """The owner's newest seq if it is known and none of its versions cites anything."""
        with self._lock:
            return self._high.get(owner) if self._citing.get(owner) == 0 else None
