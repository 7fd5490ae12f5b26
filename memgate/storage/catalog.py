"""One owner's memory versions as columns in memory, for filtering recall in each channel.

The indexer and the embedder each keep one per owner they rank for, loaded from storage on first
use (metadata only, never text) and brought up to date by seq (`CatalogRows` above the last seq
applied). A recall's filters become a boolean mask over the rows, evaluated with numpy: current
at `as_of`, legal holds out, namespace, collection, context set, and an operator's window.

A version's `superseded_at` is set by storage when a newer version of the same key arrives; the
catalog derives it the same way from the newer row, so catching up never re-reads old rows.
With `dim`, each row also holds a vector (the embedder's contiguous matrix, aligned with the rows).
The embedder also marks the rows that are conversation turns, with their speakers (read from the
texts it embeds; codes here, the names case-folded) and priors, for the conversation channel's
smoothed cosine, speaker bonus and prior.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from memgate.contracts.internal import CatalogRows, Neighbours, RecallFilters

NEVER = np.iinfo(np.int64).max  # superseded_at of a version that is still current
# A neighbour lookup looks this many places each way at most: versions the filters leave out
# (superseded, other collections) are skipped, but never a whole namespace per result.
NEIGHBOUR_REACH = 64
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(instant: datetime) -> int:
    """Microseconds since the epoch (aware instants; naive ones are read as UTC)."""
    aware = instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)
    delta = aware - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass
class _Columns:
    seq: np.ndarray
    created: np.ndarray
    superseded: np.ndarray
    namespace: np.ndarray
    collection: np.ndarray
    hold: np.ndarray
    embedded: np.ndarray
    speaker: np.ndarray  # 0: not a turn (or not known to be one)
    prior: np.ndarray  # a turn's prior (`policy.context.turn`); 0 for any other memory
    vectors: np.ndarray | None

    @classmethod
    def empty(cls, capacity: int, dim: int | None) -> _Columns:
        return cls(seq=np.zeros(capacity, np.int64), created=np.zeros(capacity, np.int64),
                   superseded=np.full(capacity, NEVER, np.int64),
                   namespace=np.zeros(capacity, np.int32), collection=np.zeros(capacity, np.int32),
                   hold=np.zeros(capacity, bool), embedded=np.zeros(capacity, bool),
                   speaker=np.zeros(capacity, np.int32), prior=np.zeros(capacity, np.float32),
                   vectors=None if dim is None else np.zeros((capacity, dim), np.float32))

    def names(self) -> list[str]:
        return ["seq", "created", "superseded", "namespace", "collection", "hold", "embedded",
                "speaker", "prior"]


class Catalog:
    """An owner's versions (live in storage as far as this catalog knows), as numpy columns."""

    def __init__(self, *, dim: int | None = None) -> None:
        self.seq = 0  # the owner's highest seq applied: the catalog holds every version up to it
        self.loaded = False  # set once the first load from storage has been applied
        self._dim = dim
        self._ids: list[str] = []
        self._row: dict[str, int] = {}
        self._live_keys: dict[tuple[str, str], str] = {}  # (namespace, key) → current version
        self._keys: dict[str, tuple[str, str]] = {}  # memory id → its (namespace, key)
        self._codes: dict[str | None, int] = {None: 0}  # namespace and collection names → codes
        self._speakers: dict[str, int] = {}  # case-folded speaker names → codes (from 1)
        self._next_speaker = 1
        self._n = 0
        self._c = _Columns.empty(64, dim)
        # Per namespace code, its rows in seq order; a row's place in it (the sequence window).
        self._sequence: dict[int, list[int]] = {}
        self._place: list[int] = []

    def __len__(self) -> int:
        return self._n

    def __contains__(self, memory_id: str) -> bool:
        return memory_id in self._row

    @property
    def ids(self) -> list[str]:
        return self._ids

    def _code(self, name: str | None) -> int:
        return self._codes.setdefault(name, len(self._codes))

    def _grow(self, needed: int) -> None:
        capacity = len(self._c.seq)
        if needed <= capacity:
            return
        while capacity < needed:
            capacity *= 2
        bigger = _Columns.empty(capacity, self._dim)
        for name in self._c.names():
            getattr(bigger, name)[: self._n] = getattr(self._c, name)[: self._n]
        if self._c.vectors is not None and bigger.vectors is not None:
            bigger.vectors[: self._n] = self._c.vectors[: self._n]
        self._c = bigger

    def apply(self, rows: CatalogRows, *, advance: bool = True) -> list[str]:
        """Add the versions storage reported (oldest first; already known ones are updated);
        the ids that were new. Without `advance`, `seq` stays: the caller raises it once it
        has done what being caught up promises (the indexer: their texts indexed)."""
        self._grow(self._n + len(rows.memory_ids))
        c = self._c
        added = []
        for i, memory_id in enumerate(rows.memory_ids):
            created = micros(rows.created_at[i])
            superseded = rows.superseded_at[i]
            row = self._row.get(memory_id)
            if row is None:
                row = self._row[memory_id] = self._n
                self._ids.append(memory_id)
                self._n += 1
                added.append(memory_id)
            c.seq[row] = rows.seqs[i]
            c.created[row] = created
            c.superseded[row] = NEVER if superseded is None else micros(superseded)
            if row == len(self._place):
                self._place.append(self._enter(self._code(rows.namespaces[i]), row))
            c.namespace[row] = self._code(rows.namespaces[i])
            c.collection[row] = self._code(rows.collection_ids[i])
            c.hold[row] = rows.legal_hold[i]
            key = rows.keys[i]
            if key is not None:
                self._supersede((rows.namespaces[i], key), memory_id, created, superseded is None)
        if advance:
            self.seq = max(self.seq, rows.high_seq)
        return added

    def _enter(self, namespace: int, row: int) -> int:
        """Append a new row to its namespace's sequence (storage reports versions oldest first;
        one that is not is placed by seq, and the places after it shift)."""
        sequence = self._sequence.setdefault(namespace, [])
        seq = self._c.seq[row]
        if sequence and self._c.seq[sequence[-1]] > seq:
            sequence.append(row)
            sequence.sort(key=lambda r: int(self._c.seq[r]))
            for place, other in enumerate(sequence):
                if other < len(self._place):
                    self._place[other] = place
            return sequence.index(row)
        sequence.append(row)
        return len(sequence) - 1

    def _supersede(self, key: tuple[str, str], memory_id: str, created: int, live: bool) -> None:
        """As storage does: a new version of a key ends the current one at its creation."""
        self._keys[memory_id] = key
        if not live:
            return
        previous = self._live_keys.get(key)
        if previous is not None and previous != memory_id and previous in self._row:
            row = self._row[previous]
            if self._c.created[row] < created:
                self._c.superseded[row] = min(int(self._c.superseded[row]), created)
            else:  # the known one is the newer: this one is already over
                self._c.superseded[self._row[memory_id]] = self._c.created[row]
                return
        self._live_keys[key] = memory_id

    def remove(self, memory_ids: list[str]) -> None:
        """Drop deleted versions (the rows are compacted; vectors stay aligned)."""
        gone = [self._row[i] for i in memory_ids if i in self._row]
        if not gone:
            return
        keep = np.ones(self._n, bool)
        keep[gone] = False
        fresh = _Columns.empty(max(64, len(self._c.seq)), self._dim)
        kept = int(keep.sum())
        for name in self._c.names():
            getattr(fresh, name)[:kept] = getattr(self._c, name)[: self._n][keep]
        if self._c.vectors is not None and fresh.vectors is not None:
            fresh.vectors[:kept] = self._c.vectors[: self._n][keep]
        self._c, self._n = fresh, kept
        self._ids = [i for i, k in zip(self._ids, keep, strict=True) if k]
        self._row = {memory_id: row for row, memory_id in enumerate(self._ids)}
        self._sequence, self._place = {}, []
        for row in np.argsort(self._c.seq[:kept], kind="stable"):
            sequence = self._sequence.setdefault(int(self._c.namespace[row]), [])
            sequence.append(int(row))
        self._place = [0] * kept
        for sequence in self._sequence.values():
            for place, row in enumerate(sequence):
                self._place[row] = place
        for memory_id in memory_ids:
            key = self._keys.pop(memory_id, None)
            if key is not None and self._live_keys.get(key) == memory_id:
                del self._live_keys[key]
        spoken = set(np.unique(self._c.speaker[:kept]).tolist())  # a name no turn has goes
        self._speakers = {name: code for name, code in self._speakers.items() if code in spoken}

    def current(self) -> np.ndarray:
        """A boolean mask over the rows: the versions not superseded."""
        current: np.ndarray = self._c.superseded[: self._n] == NEVER
        return current

    def allowed(self, filters: RecallFilters, exclude: Collection[str] = ()) -> np.ndarray:
        """A boolean mask over the rows: the versions the filters let recall rank."""
        n, c = self._n, self._c
        instant = micros(filters.as_of or datetime.now(UTC))
        mask = ~c.hold[:n] & (c.created[:n] <= instant) & (c.superseded[:n] > instant)
        if filters.namespace is not None:
            mask &= c.namespace[:n] == self._codes.get(filters.namespace, -1)
        if filters.collection_id is not None:
            mask &= c.collection[:n] == self._codes.get(filters.collection_id, -1)
        if filters.collection_ids is not None:
            codes = [self._codes[i] for i in filters.collection_ids if i in self._codes]
            mask &= np.isin(c.collection[:n], np.asarray(codes, np.int32))
        if filters.namespaces is not None:
            codes = [self._codes[i] for i in filters.namespaces if i in self._codes]
            mask &= np.isin(c.namespace[:n], np.asarray(codes, np.int32))
        if filters.memory_ids is not None:
            chosen = np.zeros(n, bool)
            chosen[[r for i in filters.memory_ids if (r := self._row.get(i)) is not None]] = True
            mask &= chosen
        for memory_id in exclude:
            row = self._row.get(memory_id)
            if row is not None:
                mask[row] = False
        if filters.window is not None and int(mask.sum()) > filters.window:
            rows = np.flatnonzero(mask)
            newest = rows[np.argsort(c.seq[rows])[-filters.window:]]
            mask = np.zeros(n, bool)
            mask[newest] = True
        return mask

    def neighbours(self, memory_ids: Collection[str], mask: np.ndarray, width: int,
                   ) -> dict[str, Neighbours]:
        """For each of `memory_ids`, the `width` allowed versions remembered just before it and
        just after it in its namespace (by seq, nearest first). Each lookup
        walks out from the version's place, skipping the versions the mask leaves out (within
        `NEIGHBOUR_REACH` places, so that the relation stays symmetric)."""
        found: dict[str, Neighbours] = {}
        if width <= 0:
            return found
        for memory_id in memory_ids:
            row = self._row.get(memory_id)
            if row is None:
                continue
            sequence = self._sequence[int(self._c.namespace[row])]
            place = self._place[row]
            sides: tuple[list[str], list[str]] = ([], [])
            for side, step in zip(sides, (-1, 1), strict=True):
                at = place + step
                while (0 <= at < len(sequence) and len(side) < width
                       and abs(at - place) <= NEIGHBOUR_REACH):
                    if mask[sequence[at]]:
                        side.append(self._ids[sequence[at]])
                    at += step
            found[memory_id] = Neighbours(before=sides[0], after=sides[1])
        return found

    # --- vectors (a catalog made with `dim`) ---

    def unembedded(self, *, up_to: int | None = None,
                   among: np.ndarray | None = None) -> list[str]:
        """The versions that have no vector yet (those whose seq is at most `up_to`, those
        `among` a mask over the rows)."""
        lacking = ~self._c.embedded[: self._n]
        if up_to is not None:
            lacking &= self._c.seq[: self._n] <= up_to
        if among is not None:
            lacking &= among
        return [self._ids[row] for row in np.flatnonzero(lacking)]

    def created(self, memory_ids: list[str]) -> np.ndarray:
        """When the versions it holds among these were created (µs since the epoch)."""
        rows = [row for memory_id in memory_ids if (row := self._row.get(memory_id)) is not None]
        return self._c.created[np.asarray(rows, np.int64)]

    def lacking(self, memory_ids: list[str]) -> list[bool]:
        """For each id, whether the catalog holds it without a vector."""
        rows = [self._row.get(memory_id) for memory_id in memory_ids]
        return [row is not None and not self._c.embedded[row] for row in rows]

    def embedded(self, memory_ids: list[str]) -> list[bool]:
        """For each id, whether the catalog holds it with its vector."""
        rows = [self._row.get(memory_id) for memory_id in memory_ids]
        return [row is not None and bool(self._c.embedded[row]) for row in rows]

    def set_vectors(self, memory_ids: list[str], matrix: np.ndarray) -> None:
        assert self._c.vectors is not None, "a catalog without vectors"
        for memory_id, vector in zip(memory_ids, matrix, strict=True):
            row = self._row.get(memory_id)
            if row is not None:
                self._c.vectors[row] = vector
                self._c.embedded[row] = True

    def nearest(self, query: np.ndarray, mask: np.ndarray, depth: int) -> list[str]:
        """The `depth` allowed rows with vectors most similar to `query` (normalised), best
        first: one matrix-vector product over the owner's rows."""
        return self.best(self.similarities(query), mask, depth)

    def similarities(self, query: np.ndarray) -> np.ndarray:
        """Every row's cosine similarity to `query` (normalised; rows without vectors: 0)."""
        assert self._c.vectors is not None, "a catalog without vectors"
        scores: np.ndarray = self._c.vectors[: self._n] @ query
        return scores

    def best(self, scores: np.ndarray, mask: np.ndarray, depth: int) -> list[str]:
        """The `depth` rows with the highest `scores` among the allowed ones with vectors."""
        return [memory_id for memory_id, _ in self.best_scored(scores, mask, depth)]

    def best_scored(self, scores: np.ndarray, mask: np.ndarray,
                    depth: int) -> list[tuple[str, float]]:
        """As `best`, with their scores."""
        n = self._n
        eligible = mask & self._c.embedded[:n]
        count = int(eligible.sum())
        if count == 0 or depth <= 0:
            return []
        scores = np.where(eligible, scores, -np.inf)
        k = min(depth, count)
        top = np.argpartition(-scores, k - 1)[:k] if k < n else np.arange(n)
        top = top[np.argsort(-scores[top], kind="stable")]
        top = top[eligible[top]]
        ids = self._ids
        return list(zip([ids[row] for row in top.tolist()], scores[top].tolist(), strict=True))

    # --- conversation turns (the embedder's catalog) ---

    def set_turns(self, turns: Mapping[str, tuple[str, float] | None]) -> None:
        """Mark rows as turns, each with its (speaker, prior) (None: not a turn)."""
        for memory_id, turn in turns.items():
            row = self._row.get(memory_id)
            if row is not None:
                name, prior = turn or (None, 0.0)
                if name is not None and name not in self._speakers:
                    self._speakers[name] = self._next_speaker
                    self._next_speaker += 1
                self._c.speaker[row] = 0 if name is None else self._speakers[name]
                self._c.prior[row] = prior

    def priors(self) -> np.ndarray:
        """The rows' priors (0 for a memory that is not a turn)."""
        priors: np.ndarray = self._c.prior[: self._n]
        return priors

    def turns(self) -> np.ndarray:
        """A boolean mask over the rows: the conversation turns."""
        turns: np.ndarray = self._c.speaker[: self._n] > 0
        return turns

    def named(self, query: str) -> np.ndarray:
        """A boolean mask over the rows: the turns whose speaker `query` names."""
        folded = query.lower()
        codes = [code for name, code in self._speakers.items() if name in folded]
        named: np.ndarray = np.isin(self._c.speaker[: self._n], np.asarray(codes, np.int32))
        return named

    def smoothed(self, scores: np.ndarray, mask: np.ndarray,
                 smooth: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """`scores` of the allowed turns with vectors, `smooth`ed along each namespace's turns
        in seq order (`policy.context.smooth`); every other row -inf."""
        eligible = mask & self._c.embedded[: self._n] & self.turns()
        smoothed = np.full(self._n, -np.inf, np.float32)
        for sequence in self._sequence.values():
            rows = np.asarray(sequence, np.int64)
            rows = rows[eligible[rows]]
            if len(rows):
                smoothed[rows] = smooth(scores[rows])
        return smoothed
