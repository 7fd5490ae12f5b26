"""An in-sync standby for every store: no acknowledged write depends on one disk (SPEC §6).

The owner of a store (`storage.pN`, `embedder.pN`, the directory, registry, spaces, sessions,
erasure) records, on its writer's thread, every statement that changes its DuckDB files
(`Recording`, the connection `compaction` opens in a clustered process) and, after each job of
that thread, ships what committed to its standbys over core NATS request/reply (`Primary`): the
statements with their parameters, in commit order, and a marker where a file was rewritten
after a deletion. The job's caller is answered only once every in-sync standby has applied
them, its rewrites included: a forget is gone from every copy's bytes when it is answered
(SPEC §5.4). Memory text travels in these requests only, never in a JetStream stream.

Every batch names the lease epoch it was made under and its sequence number; a standby refuses
another epoch and any gap. A standby that does not answer in time is recorded out of sync in the
`MEMGATE_STANDBYS` bucket (by the owner, before it answers anyone), and may not be promoted.

A standby (`Standby`, on every other node of a clustered `memgate up`) answers a batch once its
files hold it. The copy its disk holds when its process starts is in sync if the store's record
still names this node, whether the process stopped or was killed; any other copy is kept,
unserved, until another node serves the store (it may be the newest one left), then deleted.
While the owner keeps fewer in-sync standbys than `Settings.standbys` (or to take the store
over, `cluster.balance`), a standby joins: the owner checkpoints and copies its files (between two
jobs of its thread), the standby fetches them in pages, and the owner sends the batches that
committed meanwhile before it records the standby in sync. When the lease is gone (its owner
dead or cut off: it fenced itself first) an in-sync standby moves the store's home to its own
disk by compare-and-set (one winner) and starts the actor there, on the copy; the others copy
the store again from it, as many as it keeps.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any, TypeVar

import duckdb
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import Field

from memgate.bus import subjects
from memgate.bus.streams import kv_bucket
from memgate.bus.replies import Endpoint
from memgate.cluster.lease import PartitionLease, given_up, holder, lease_bucket
from memgate.contracts.base import Contract
from memgate.contracts.cluster import Lag, StandbyLag
from memgate.contracts.errors import (
    ConflictError, MemgateError, OutcomeUnknownError, UnavailableError,
)
from memgate.ports.bus import Requester
from memgate.tasks import cancelled

log = logging.getLogger("memgate.cluster")
R = TypeVar("R")

STANDBYS = "MEMGATE_STANDBYS"
CHUNK = 256 * 1024  # bytes of a file per page of a full copy
APPLY_TIMEOUT_S = 3.0  # a standby that has not applied a batch by then leaves the in-sync set
WATCH_EVERY_S = 0.5  # how often a standby looks at its owner's lease and its own record
FOLLOW_EVERY_S = 2.0  # how often a rebuilt store looks where its partition is
HANDOVER_S = 3.0  # how long the standby a drain names has to take the store over alone
RESTART_S = 12.0  # how long a process that gave its leases up has to claim them back
KEPT_CHECK_S = 15.0  # how long a copy kept across a restart waits to read its store's record
WAITING_AT_MOST = 10_000  # batches kept for a joining standby that has not said it is ready
# The statements that change nothing in the file, as DuckDB's own parser types them (a `WITH …
# DELETE` is a DELETE): not shipped. Any other type is (a read shipped costs a re-run, a write
# missed a copy that differs).
_READS = frozenset({
    duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN, duckdb.StatementType.PRAGMA,
    duckdb.StatementType.SET, duckdb.StatementType.CALL, duckdb.StatementType.ATTACH,
    duckdb.StatementType.DETACH, duckdb.StatementType.TRANSACTION})

_FILES = {"directory": ("directory.duckdb",), "registry": ("registry.duckdb",),
          "spaces": ("spaces.duckdb",), "sessions": ("sessions.duckdb",),
          "erasure": ("erasure.duckdb",), "keys": ("keys/keys.json",),
          "audit": ("audit/audit.log", "audit/audit.head")}


def files_of(name: str) -> tuple[str, ...]:
    """The files of a store, relative to the data directory; () for one not replicated."""
    kind, _, partition = name.partition(".")
    if kind == "storage":
        return (f"partitions/{partition}/memories.duckdb",)
    if kind == "embedder":
        return (f"partitions/{partition}/vectors.duckdb",)
    return _FILES.get(name, ())


def rebuilt(name: str) -> bool:
    """A store rebuilt where its partition moves, never copied: the Tantivy indexes (in RAM,
    made in seconds). The vectors are copied: made again they cost minutes of the model's
    time (docs/DECISIONS.md, "The vectors travel with the replica")."""
    return name.startswith("indexer.")


def follows(name: str) -> str | None:
    """The partition a derived store moves with (`storage.pN` for `indexer.pN` and
    `embedder.pN`): it is served where its memories are."""
    kind, _, partition = name.partition(".")
    return f"storage.{partition}" if kind in ("indexer", "embedder") else None


def movable(name: str) -> bool:
    return bool(files_of(name)) or rebuilt(name)


def subject(name: str, operation: str) -> str:
    return subjects.replica(f"{name}.{operation}")


# --- recording, on the owner's writer thread ------------------------------------------------

_root: Path | None = None  # the data directory, once this process records (`record_under`)
_local = threading.local()  # .units: what the running job committed; .tx: its open transaction;
# .quorum: what its first write asks (`writing`)
# (file, its statements); (file, None): the file was rewritten; (file, {"data": base64,
# "append": bool}): bytes written to a file that is not a database (the keys, the audit log)
Unit = tuple[str, list[tuple[str, list[Any]]] | dict[str, Any] | None]


def record_under(data_dir: Path) -> None:
    """From now on, the files this process opens under `data_dir` record their writes."""
    global _root
    _root = data_dir.resolve()


def recording() -> bool:
    return _root is not None


def _relative(path: Path) -> str | None:
    if _root is None:
        return None
    try:
        return path.resolve().relative_to(_root).as_posix()
    except ValueError:
        return None


class Recording:
    """A DuckDB connection that also notes, for the job running on this thread, each write
    it commits. Everything else is the connection's own."""

    def __init__(self, db: duckdb.DuckDBPyConnection, file: str) -> None:
        self.raw = db
        self._file = file

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.raw, attribute)

    def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> Any:
        writes = _writes(sql)
        if writes:
            writing()
        result = self.raw.execute(sql, parameters) if parameters is not None else \
            self.raw.execute(sql)
        if writes:
            self._noted([(sql, list(parameters or []))])
        return result

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        writes = _writes(sql)
        if writes:
            writing()
        result = self.raw.executemany(sql, rows)
        if writes:
            self._noted([(sql, list(row)) for row in rows])
        return result

    def _noted(self, statements: list[tuple[str, list[Any]]]) -> None:
        tx = getattr(_local, "tx", None)
        if tx is not None:
            tx.extend(statements)
        else:
            _committed((self._file, statements))

    def begin(self) -> Any:
        _local.tx = []
        return self.raw.begin()

    def commit(self) -> Any:
        result = self.raw.commit()
        tx, _local.tx = getattr(_local, "tx", None), None
        if tx:
            _committed((self._file, tx))
        return result

    def rollback(self) -> Any:
        _local.tx = None
        return self.raw.rollback()


@functools.lru_cache(maxsize=1024)  # the stores' statements are constants: parsed once each
def _writes(sql: str) -> bool:
    return any(statement.type not in _READS for statement in duckdb.extract_statements(sql))


def _committed(unit: Unit) -> None:
    units = getattr(_local, "units", None)
    if units is None:  # opening the file, before anyone can copy it
        log.debug("a write to %s outside its owner's jobs is not shipped", unit[0])
        return
    units.append(unit)


def opened(db: duckdb.DuckDBPyConnection, path: Path) -> duckdb.DuckDBPyConnection:
    """`db` as the store uses it: recording, when this process records and `path` is a file
    of the data directory."""
    file = _relative(path)
    if file is None:
        return db
    return Recording(db, file)  # type: ignore[return-value]  # a connection in all it does


def raw(db: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    return getattr(db, "raw", db)


def rewritten(path: Path) -> None:
    """`compaction.rewrite` replaced the file: the standbys rewrite theirs at the same point."""
    file = _relative(path)
    if file is not None and getattr(_local, "units", None) is not None:
        _local.units.append((file, None))


def wrote(path: Path, data: bytes, *, append: bool = False) -> None:
    """The file at `path` (not a database) was written whole, or `data` appended to it: the
    standbys write theirs at the same point."""
    file = _relative(path)
    if file is not None and getattr(_local, "units", None) is not None:
        _local.units.append((file, {"data": base64.b64encode(data).decode(), "append": append}))


def journaled(fn: Callable[..., R], *args: object, quorum: Callable[[], None] | None = None,
              ) -> tuple[R | None, BaseException | None, list[Unit]]:
    """Run `fn` on this (the writer's) thread: its outcome, and the writes it committed.
    `quorum` is asked before its first write (`writing`)."""
    _local.units, _local.tx, _local.quorum = [], None, quorum
    try:
        return fn(*args), None, _local.units
    except BaseException as exc:  # what committed before it raised is shipped all the same
        return None, exc, _local.units
    finally:
        units = _local.units
        _local.units = _local.quorum = None
        del units


def writing() -> None:
    """Before a write of the running job: `UnavailableError`, nothing written, while its
    store's owner keeps fewer standbys in sync than its quorum (`Primary`). Once a write
    passed, the job's later writes do too: a job is refused before it writes, not half way."""
    quorum = getattr(_local, "quorum", None)
    if quorum is not None:
        quorum()
        _local.quorum = None


# --- applying, on a standby's thread ---------------------------------------------------------

MERGED_AT_MOST = 64  # statements made one by `merged`
# what an INSERT made one with another may not hold (a conflict or a query between its rows)
_NOT_MERGED = ("ON CONFLICT", "RETURNING", " FROM ", " WHERE ")


def _rows(sql: str) -> tuple[str, str] | None:
    """An INSERT of literal rows (`INSERT INTO t … VALUES (?, …)`): what comes before VALUES,
    and the rows."""
    head, found, rows = sql.partition(" VALUES ")
    if not found or not head.lstrip().upper().startswith("INSERT INTO") or any(
            word in rows.upper() for word in ("SELECT", *_NOT_MERGED)):
        return None
    return head, rows


def _unnested(sql: str, parameters: list[Any]) -> bool:
    """An INSERT of columns (`INSERT INTO t SELECT unnest(?), …`), every parameter one of
    them: the rows of two such are their lists end to end."""
    upper = sql.upper()
    return (upper.lstrip().startswith("INSERT INTO") and " SELECT " in upper
            and not any(word in upper for word in _NOT_MERGED)
            and sql.count("?") == upper.count("UNNEST(?") == len(parameters)
            and all(isinstance(p, list) for p in parameters))


def merged(statements: Sequence[tuple[str, list[Any]]]) -> list[tuple[str, list[Any]]]:
    """The statements, consecutive INSERTs of one text into one table made one (at most
    `MERGED_AT_MOST`): the same rows in the same order. A standby applies what a tenth of a
    second brought at once, mostly one remember's rows after another, and DuckDB takes many
    rows in one statement for a fraction of as many statements (16 rows of `memories`: 4.0
    against 14.6 ms; docs/DECISIONS.md, "A standby makes a run of INSERTs one statement")."""
    out: list[tuple[str, list[Any]]] = []
    same: list[tuple[str, list[Any]]] = []  # the run of one text being made one

    def close() -> None:
        if len(same) == 1:
            out.append(same[0])
        elif same:
            sql, first = same[0]
            if (rows := _rows(sql)) is not None:
                head, values = rows
                out.append((f"{head} VALUES {', '.join([values] * len(same))}",
                            [value for _, parameters in same for value in parameters]))
            else:  # unnested: each column's lists end to end
                out.append((sql, [[v for _, parameters in same for v in parameters[column]]
                                  for column in range(len(first))]))
        same.clear()

    for sql, parameters in statements:
        if same and (sql != same[0][0] or len(same) >= MERGED_AT_MOST):
            close()
        if _rows(sql) is not None or _unnested(sql, parameters):
            same.append((sql, parameters))
        else:
            close()
            out.append((sql, parameters))
    close()
    return out


def _execute(db: duckdb.DuckDBPyConnection, statements: Sequence[tuple[str, list[Any]]]) -> None:
    for sql, parameters in merged(statements):
        db.execute(sql, parameters) if parameters else db.execute(sql)


# --- encoding ---------------------------------------------------------------------------------

def _tagged(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"$t": "dt", "v": value.isoformat()}
    if isinstance(value, date):
        return {"$t": "d", "v": value.isoformat()}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$t": "b", "v": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"a parameter of type {type(value).__name__} cannot be replicated")


def _untagged(value: dict[str, Any]) -> Any:
    tag = value.get("$t")
    if tag is None or len(value) != 2:
        return value
    if tag == "dt":
        return datetime.fromisoformat(value["v"])
    if tag == "d":
        return date.fromisoformat(value["v"])
    return base64.b64decode(value["v"])


def encode_batch(epoch: int, seq: int, units: Sequence[Unit]) -> bytes:
    return json.dumps({"epoch": epoch, "seq": seq, "units": units}, default=_tagged,
                      separators=(",", ":")).encode()


def decode_batch(payload: bytes) -> tuple[int, int, list[Unit]]:
    data = json.loads(payload, object_hook=_untagged)
    return int(data["epoch"]), int(data["seq"]), [(u[0], u[1]) for u in data["units"]]


# --- the messages -----------------------------------------------------------------------------

class Applied(Contract):
    seq: int


class Join(Contract):
    node: str
    home: dict[str, str]  # its disk, as `cluster.ownership` names homes
    # a node that pulls the store over (`cluster.balance`): taken beyond the standbys wanted
    wanted: bool = False


class Drain(Contract):
    """Move the store's home to an in-sync standby (`to`, or the first); with `step_down`,
    also give its lease up (the store stops alone, a standby of it runs in its place, and
    the new home's standby takes the store over)."""

    to: str | None = None
    step_down: bool = True


class Drained(Contract):
    """A drained store's new home: the node whose standby takes it over."""

    to: str


class CopiedFile(Contract):
    file: str
    size: int


class Joined(Contract):
    snapshot: str
    epoch: int
    seq: int
    files: list[CopiedFile]


class Page(Contract):
    snapshot: str
    file: str
    offset: int


class PageData(Contract):
    data: str  # base64
    last: bool


class Ready(Contract):
    node: str
    snapshot: str


class InSync(Contract):
    """The standbys of a store that have applied every batch its owner acknowledged (the
    `MEMGATE_STANDBYS` record, one per store, written by its owner only): `nodes` are sent
    each batch; `kept` were, until the owner lost its last in-sync standby. An owner with none
    acknowledges nothing (`Primary._has_quorum`), so they still hold every acknowledged write
    and may be promoted, until a standby is in sync again."""

    epoch: int
    nodes: list[str]
    kept: list[str] = Field(default_factory=list)
    # the disk (`Disk.disk`) of each node named: a node started again on an empty data
    # directory is not the one named (a store that never wrote a file has none to tell them by)
    disks: dict[str, str] = Field(default_factory=dict)

    def names(self, node: str, disk: str) -> bool:
        """Whether this record says `node`'s copy on `disk` holds every acknowledged write
        (a record written before disks were named: the node alone)."""
        return node in (*self.nodes, *self.kept) and self.disks.get(node, disk) == disk


async def standbys_bucket(js: JetStreamContext, *, replicas: int = 1) -> KeyValue:
    return await kv_bucket(js, STANDBYS, replicas=replicas)


async def in_sync(kv: KeyValue, name: str) -> InSync | None:
    """The standbys `name`'s owner last recorded in sync, and its epoch (None: no record)."""
    try:
        entry = await kv.get(name)
    except KeyNotFoundError:
        return None
    return None if entry.value is None else InSync.model_validate_json(entry.value)


# --- the owner's side -------------------------------------------------------------------------

@dataclass
class _Follower:
    node: str
    home: dict[str, str]
    after: int  # the batches up to this seq are in its copy
    waiting: list[bytes] | None = field(default_factory=list)  # None: in sync, sent at once
    snapshot: Path | None = None
    wanted: bool = False  # joined to take the store over, beyond the standbys wanted


class Primary:
    """The owner's side of one store: numbers its writer's batches, ships them to the
    standbys in order, and copies the store for a standby that joins."""

    def __init__(self, name: str, *, lease: PartitionLease, bus: Requester, kv: KeyValue,
                 homes: KeyValue, data_dir: Path, standbys: int = 1,
                 timeout_s: float = APPLY_TIMEOUT_S) -> None:
        self.name = name
        self._standbys = standbys
        # the in-sync standbys a write needs (with this copy, two of a store's three): none
        # for a derived store, made again from its partition if lost
        self._quorum = 0 if follows(name) is not None else min(standbys, 1)
        self._lease = lease
        self._bus = bus
        self._kv = kv
        self._homes = homes
        self._root = data_dir.resolve()
        self._run = _writers.get(name)  # a call on the store's writer thread, not shipped
        self._timeout_s = timeout_s
        self._numbered = 0  # the last seq given, on the writer's thread
        self._shipped = 0  # the last seq shipped, on the event loop
        self._turn = asyncio.Condition()
        self._followers: dict[str, _Follower] = {}
        self._in_sync: set[str] = set()
        self._recorded: set[str] | None = None  # what the record says (None: not yet written)
        self._kept: set[str] = set()  # and whom it keeps (`InSync.kept`)
        self._disks: dict[str, str] = {}  # the disks of those it names
        self._revision: int | None = None  # the record's revision this owner last wrote
        self._recording = asyncio.Lock()  # one write of the record at a time
        self._draining = asyncio.Lock()  # an operator's drain and `follow`'s, one at a time

    @property
    def epoch(self) -> int:
        lease = self._lease.lease
        return 0 if lease is None else lease.epoch

    def journal(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., R], *args: object,
                ) -> tuple[R | None, BaseException | None, Future[None] | None]:
        """On the writer's thread: run `fn`, number what it committed (so in commit order) and
        hand it to the event loop to ship. `committed` waits for that, on the loop."""
        result, exc, units = journaled(fn, *args, quorum=self._has_quorum)
        if not units:
            return result, exc, None
        self._numbered += 1
        return result, exc, asyncio.run_coroutine_threadsafe(
            self.ship(self._numbered, units), loop)

    def _has_quorum(self) -> None:
        if len(self._in_sync) < self._quorum:
            raise UnavailableError("no other node holds this store's copy in sync yet: nothing "
                                   "was written; try again", {"store": self.name})

    async def committed(self, outcome: tuple[R | None, BaseException | None,
                                             Future[None] | None]) -> R:
        """The call's result once every in-sync standby applied what it committed."""
        result, exc, shipped = outcome
        if shipped is not None:
            try:
                await asyncio.wrap_future(shipped)
            except MemgateError as unconfirmed:
                # committed here, its copies not confirmed: kept while this owner lives, gone
                # if a standby without it is promoted. Not a 503, which says "not written".
                raise OutcomeUnknownError("written here, but its copies could not be "
                                          "confirmed", {"store": self.name}) from unconfirmed
        if exc is not None:
            raise exc
        return result  # type: ignore[return-value]  # None only where `fn` returned it

    async def ship(self, seq: int, units: list[Unit]) -> None:
        """Batch `seq` applied by every in-sync standby (after all before it), or those that
        did not apply it recorded out of sync; `UnavailableError` if that record failed, or if
        fewer than the quorum applied it (it is on this disk only)."""
        async with self._turn:
            await self._turn.wait_for(lambda: self._shipped == seq - 1)
            try:
                if units:
                    await self._send(seq, encode_batch(self.epoch, seq, units))
            finally:
                self._shipped = seq
                self._turn.notify_all()

    async def _send(self, seq: int, batch: bytes) -> None:
        now = []
        for follower in list(self._followers.values()):
            if seq <= follower.after:
                continue
            if follower.waiting is not None:
                follower.waiting.append(batch)
                if len(follower.waiting) > WAITING_AT_MOST:  # it never came back for them
                    self._drop(follower.node)
            else:
                now.append(follower)
        now = [f for f in now if f.node in self._followers]
        results = await asyncio.gather(*(self._apply(f.node, batch) for f in now),
                                       return_exceptions=True)
        for follower, result in zip(now, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("standby %s of %s did not apply batch %s (%s): out of sync",
                            follower.node, self.name, seq, type(result).__name__)
                self._drop(follower.node)
        await self._record_out()
        applied = sum(not isinstance(result, BaseException) for result in results)
        if applied < self._quorum:  # on this disk only: `committed` answers 504, not 200
            raise UnavailableError("no standby applied the write", {"store": self.name})

    async def _apply(self, node: str, batch: bytes) -> None:
        await self._bus.request(subject(self.name, f"apply.{node}"), batch, Applied,
                                timeout=self._timeout_s)

    async def lag(self, payload: bytes) -> Lag:
        """Each standby: in sync or not, and the batches it does not hold yet (for the
        operator's view)."""
        return Lag(standbys=[StandbyLag(
            node=f.node, in_sync=f.node in self._in_sync,
            behind=self._numbered - (f.after if f.waiting is not None else self._shipped))
            for f in sorted(self._followers.values(), key=lambda f: f.node)])

    def _drop(self, node: str) -> None:
        follower = self._followers.pop(node, None)
        if follower is not None and follower.snapshot is not None:
            shutil.rmtree(follower.snapshot, ignore_errors=True)
        self._in_sync.discard(node)

    async def _record_out(self) -> None:
        """The record no longer names a standby that left the in-sync set: before anyone is
        answered, so an out-of-date copy is never promoted."""
        try:
            async with self._recording:
                if self._recorded is not None and self._recorded <= self._in_sync:
                    return
                await self._put_record()
        except Exception as exc:
            raise UnavailableError("a standby left the in-sync set and that could not be "
                                   "recorded", {"store": self.name}) from exc

    async def settle(self, home: dict[str, str]) -> None:
        """At the start of its epoch: the store's home is this owner's disk (a standby that
        lost the race to serve it may have named its own), and no standby is in sync yet."""
        entry = await self._homes.get(self.name)
        if entry.value is None or dict(json.loads(entry.value)) != home:
            self._lease.check()
            await self._homes.update(self.name, json.dumps(home).encode(), last=entry.revision)
        await self.record()

    async def record(self) -> None:
        """Write the in-sync set (at the start of an epoch: none yet)."""
        async with self._recording:
            await self._put_record()

    async def _put_record(self) -> None:
        """The record written, one write at a time: what a write says is what it wrote (two
        interleaved, a standby dropped could be named again). Each on this owner's last, by
        compare-and-set: a record another owner wrote since is never overwritten
        (`KeyWrongLastSequenceError`). The epoch's first is put over a former owner's."""
        self._lease.check()  # only the owner writes it
        nodes = set(self._in_sync)
        kept = set() if nodes or not self._quorum else (self._recorded or set()) | self._kept
        disks = {**self._disks, **{f.node: f.home.get("disk", "") for f in
                                   self._followers.values()}}
        disks = {node: disks[node] for node in sorted(nodes | kept) if node in disks}
        value = InSync(epoch=self.epoch, nodes=sorted(nodes), kept=sorted(kept),
                       disks=disks).to_json()
        if self._revision is None:
            self._revision = await self._kv.put(self.name, value)
        else:
            self._revision = await self._kv.update(self.name, value, last=self._revision)
        self._recorded, self._kept, self._disks = nodes, kept, disks

    # a standby joining: its copy, its pages, then in sync

    def endpoints(self) -> list[Endpoint]:
        if rebuilt(self.name):
            return [Endpoint(subject(self.name, "drain"), self.drain)]
        return [Endpoint(subject(self.name, "join"), self.join),
                Endpoint(subject(self.name, "drain"), self.drain),
                Endpoint(subject(self.name, "lag"), self.lag),
                Endpoint(subject(self.name, "page"), self.page, max_workers=4),
                Endpoint(subject(self.name, "ready"), self.ready)]

    async def join(self, payload: bytes) -> Joined:
        request = Join.model_validate_json(payload)
        self._drop(request.node)
        await self._record_out()
        self._refuse_beyond(request.node, wanted=request.wanted)
        snapshot = self._root / "replicas" / "outgoing" / uuid.uuid4().hex
        if self._run is None:
            raise ConflictError("this store is rebuilt, not copied", {"store": self.name})
        files, seq = await self._run(lambda: self._copy(request, snapshot))
        return Joined(snapshot=snapshot.name, epoch=self.epoch, seq=seq, files=files)

    def _copy(self, joining: Join, snapshot: Path) -> tuple[list[CopiedFile], int]:
        """On the writer's thread, between two jobs: the files as of batch `seq`."""
        from memgate.storage import compaction  # the files' owner

        files = []
        for file in files_of(self.name):
            source = self._root / file
            if not source.exists():
                continue
            compaction.checkpoint(source)
            target = snapshot / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            files.append(CopiedFile(file=file, size=target.stat().st_size))
        # numbered after the copy: every batch after `seq` is not in it
        seq = self._numbered
        self._followers[joining.node] = _Follower(joining.node, joining.home, after=seq,
                                                  snapshot=snapshot, wanted=joining.wanted)
        return files, seq

    def _refuse_beyond(self, node: str, *, wanted: bool) -> None:
        """A store keeps the standbys it wants in sync and no more (each costs every write a
        copy), but for a node that pulls it over; a derived store is copied by its
        partition's standbys only (`Standby._wanted`), each of them."""
        if not wanted and follows(self.name) is None and \
                len(self._in_sync - {node}) >= self._standbys:
            raise ConflictError("the store has the standbys it keeps in sync",
                                {"store": self.name})

    async def page(self, payload: bytes) -> PageData:
        request = Page.model_validate_json(payload)
        follower = next((f for f in self._followers.values()
                         if f.snapshot is not None and f.snapshot.name == request.snapshot), None)
        if follower is None or follower.snapshot is None or request.file not in files_of(self.name):
            raise ConflictError("no such copy: join again")
        path = follower.snapshot / request.file
        with path.open("rb") as f:
            f.seek(request.offset)
            data = f.read(CHUNK)
        return PageData(data=base64.b64encode(data).decode(),
                        last=request.offset + len(data) >= path.stat().st_size)

    async def ready(self, payload: bytes) -> InSync:
        request = Ready.model_validate_json(payload)
        follower = self._followers.get(request.node)
        if follower is None or follower.snapshot is None or \
                follower.snapshot.name != request.snapshot or follower.waiting is None:
            raise ConflictError("no such copy: join again")
        try:
            self._refuse_beyond(request.node, wanted=follower.wanted)
        except ConflictError:
            self._drop(request.node)
            raise
        while follower.waiting:  # what committed since the copy, in order
            batch = follower.waiting.pop(0)
            try:
                await self._apply(request.node, batch)
            except Exception as exc:
                self._drop(request.node)
                raise UnavailableError("the standby did not apply what followed its copy") from exc
        follower.waiting = None  # from here on each batch is sent as it commits
        shutil.rmtree(follower.snapshot, ignore_errors=True)
        follower.snapshot = None
        self._in_sync.add(request.node)
        await self.record()
        log.info("standby %s of %s is in sync (epoch %s)", request.node, self.name, self.epoch)
        return InSync(epoch=self.epoch, nodes=sorted(self._in_sync))


    async def drain(self, payload: bytes) -> Drained:
        """Hand the store over: its home moves to an in-sync standby (once: asked again, it
        stays where it went), then, with `step_down`, this process commits nothing more for
        it and stops it alone, a standby of it in its place (`PartitionLease.step_down`); the
        new home's standby takes the store over once the lease is gone. A drain moves every
        home of a node first and steps down after, so a standby started by one step-down
        finds none of the others homed here."""
        request = Drain.model_validate_json(payload or b"{}")
        async with self._draining:  # the second finds the home moved by the first
            entry = await self._homes.get(self.name)
            home = dict(json.loads(entry.value or b"{}"))
            if home.get("node") in (None, self._lease.node):
                node, home = await self._successor(request.to)
                self._lease.check()
                await self._homes.update(self.name, json.dumps(home).encode(),
                                         last=entry.revision)
                log.info("draining %s to %s", self.name, node)
        if request.step_down:
            asyncio.get_running_loop().call_soon(  # after the answer has gone
                lambda: asyncio.ensure_future(self._lease.step_down()))
        return Drained(to=home["node"])

    async def follow(self) -> None:
        """A rebuilt store moves where its partition moved (a balance, or a standby that took
        the partition over while this process lived): its home follows, then it steps down."""
        partition = follows(self.name)
        if partition is None:
            return
        while True:
            await asyncio.sleep(FOLLOW_EVERY_S)
            try:
                entry = await self._homes.get(partition)
                node = dict(json.loads(entry.value or b"{}")).get("node")
                if node not in (None, self._lease.node) and self._lease.valid():
                    log.info("%s follows %s to %s", self.name, partition, node)
                    await self.drain(Drain(step_down=True).to_json())
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS electing a leader: the next look will do
                log.info("%s: %s; looking again", self.name, type(exc).__name__)

    async def _successor(self, to: str | None = None) -> tuple[str, dict[str, str]]:
        """Where a drained store goes: an in-sync standby (`to`, if named), or for a rebuilt
        store the home of its partition."""
        partition = follows(self.name)
        if partition is not None:
            entry = await self._homes.get(partition)
            home = dict(json.loads(entry.value or b"{}"))
            if home.get("node") in (None, self._lease.node):
                raise ConflictError(f"{partition} is still on this node: drain it first",
                                    {"store": self.name})
            return home["node"], home
        candidates = sorted(n for n in self._in_sync if n in self._followers
                            and to in (None, n))
        if not candidates:
            raise ConflictError("no standby is in sync: draining would leave no copy",
                                {"store": self.name})
        target = self._followers[candidates[0]]
        return target.node, target.home


_primaries: dict[str, Primary] = {}
_standbys: dict[str, Standby] = {}
_writers: dict[str, Callable[[Callable[[], Any]], Awaitable[Any]]] = {}


def writer(name: str, run: Callable[[Callable[[], Any]], Awaitable[Any]]) -> None:
    """The writer thread of `name` (`runtime.actor.Serial`): where its owner copies it."""
    _writers[name] = run


def primary(name: str) -> Primary | None:
    return _primaries.get(name)


def standby(name: str) -> Standby | None:
    """This process's standby of `name`, if it runs one."""
    return _standbys.get(name)


def serve(p: Primary) -> None:
    _primaries[p.name] = p


def retire(name: str) -> None:
    _primaries.pop(name, None)


async def standby_lag(bus: Requester, name: str, *, timeout_s: float = 1.0,
                      ) -> list[StandbyLag] | None:
    """What the owner of `name` says of its standbys' lag; None: a store not copied, or no
    owner answered in time."""
    if not files_of(name):
        return None
    try:
        lag = await bus.request(subject(name, "lag"), b"", Lag, timeout=timeout_s)
    except MemgateError:
        return None
    return lag.standbys


# --- the standby's side ------------------------------------------------------------------------

class Standby:
    """A copy of another node's store on this disk, kept in sync, promoted when its owner is
    gone. `become` starts the store's actor in this process, on the copy."""

    def __init__(self, name: str, *, node: str, bus: Requester, js: Callable[[], JetStreamContext],
                 data_dir: Path, become: Callable[[], Awaitable[None]],
                 disk_home: dict[str, str], replicas: int = 1, standbys: int = 1,
                 stale: Sequence[Path] = ()) -> None:
        self.name = f"standby.{name}"
        self.store = name
        self._node = node
        self._bus = bus
        self._js = js
        self._root = data_dir.resolve()
        self._become = become
        self._home = disk_home
        self._replicas = replicas
        self._standbys = standbys  # in sync per store, as its owner keeps them
        self._pulling: int | None = None  # the owner's epoch this node pulls the store over in
        self._copied = False  # files of the store on this disk (a copy, whole or partial)
        self._stale = tuple(stale)  # what else to delete (a rebuilt store's files)
        self._db: dict[str, duckdb.DuckDBPyConnection] = {}
        self._epoch = 0
        self._seq = 0
        self._task: asyncio.Task[None] | None = None
        self._thread = _Thread(self.name)
        self._pending: list[Unit] = []  # received in order, waiting for the apply before them
        self._applying = asyncio.Lock()

    def endpoints(self) -> list[Endpoint]:
        if rebuilt(self.store):
            return []
        return [Endpoint(subject(self.store, f"apply.{self._node}"), self.apply)]

    async def start(self) -> None:
        mark = await self._thread(self._take_mark)
        if rebuilt(self.store):
            await self._discard()  # made again wherever it is served: nothing to keep
        else:  # kept, unserved, until `_check_kept` and `_watch` say what it is
            self._copied = any(path.exists() for path in self._paths())
        _standbys[self.store] = self
        self._task = asyncio.create_task(self._follow(mark), name=self.name)

    def resume(self) -> None:
        """This process serves the store no more (it handed it over after this standby
        promoted it): follow its new owner again, from whatever copy its files are."""
        if self._task is not None and not self._task.done():
            return
        _standbys[self.store] = self
        self._epoch, self._pulling = 0, None
        self._copied = any(path.exists() for path in self._paths())
        self._task = asyncio.create_task(self._follow(None), name=self.name)

    def pull(self, epoch: int) -> None:
        """Copy the store (beyond the standbys its owner keeps) to take it over from the owner
        of `epoch` (`cluster.balance`)."""
        self._pulling = epoch

    async def stop(self) -> None:
        """A copy in step is left with every batch it answered for applied and marked so, its
        owner may go on shipping to it when this process starts again (`_check_kept`)."""
        if _standbys.get(self.store) is self:
            del _standbys[self.store]
        epoch, self._epoch = self._epoch, 0  # from here on every batch is refused
        await cancelled(self._task)
        in_step = bool(epoch) and self._copied and not rebuilt(self.store)
        if in_step:
            try:
                await self.drained()
            except Exception:
                in_step = False
        self._pending.clear()
        await self._thread(self._close)
        if in_step:
            await self._thread(self._mark, epoch, self._seq)
        self._thread.shutdown()

    def _mark_path(self) -> Path:
        return self._root / "replicas" / "kept" / f"{self.store}.json"

    def _mark(self, epoch: int, seq: int) -> None:
        path = self._mark_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, json.dumps({"epoch": epoch, "seq": seq}).encode(), append=False)

    def _take_mark(self) -> tuple[int, int] | None:
        """The mark a stop left, read once (a later start without a stop finds none)."""
        path = self._mark_path()
        try:
            mark = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        finally:
            path.unlink(missing_ok=True)
        return int(mark["epoch"]), int(mark["seq"])

    async def _check_kept(self, mark: tuple[int, int] | None) -> None:
        """A copy this disk held when this process started is in sync if the store's record
        still names this node: its files hold every batch the owner acknowledged (a standby
        answers once they do; a batch sent to a process that is gone fails, and the owner
        records it out of sync before it answers anyone). Then it may be promoted at once,
        should its owner be gone too, whether this node's process stopped cleanly or was
        killed outright. `mark` (epoch, batch) is where a clean stop left it: its owner may
        go on shipping to it; without it, the next batch is refused and it copies the store
        again. Any other copy is kept, unserved and never promoted, until another node serves
        the store (`_watch` deletes it then): it may be the newest one left, its owner's disk
        lost (issue 47: a restarted standby deleted the last copy of a store)."""
        if rebuilt(self.store):
            return
        record: InSync | None = None
        deadline = time.monotonic() + KEPT_CHECK_S
        while True:
            try:
                record = await in_sync(await standbys_bucket(self._js(), replicas=self._replicas),
                                       self.store)
                break
            except Exception as exc:
                if time.monotonic() > deadline:
                    log.info("%s: its record could not be read (%s)", self.name, _reason(exc))
                    break
                await asyncio.sleep(WATCH_EVERY_S)
        disk = self._home.get("disk", "")
        if record is None or not record.names(self._node, disk) or \
                not (self._copied or record.disks.get(self._node) == disk):
            if self._copied:
                log.info("%s: a copy not in sync is kept, unserved, until another node "
                         "serves the store", self.name)
            return
        self._copied = True  # its files, none if the store never wrote one
        await self._thread(self._open)
        self._epoch = record.epoch
        self._seq = mark[1] if mark is not None and mark[0] == record.epoch else -1
        log.info("%s: kept its copy, in sync with its owner (epoch %s, batch %s)", self.name,
                 self._epoch, self._seq)

    async def _discard(self) -> None:
        """The copy deleted, with what was received for it and not yet applied."""
        async with self._applying:
            self._pending.clear()
            await self._thread(self._delete)

    def _paths(self) -> list[Path]:
        return [self._root / file for file in files_of(self.store)]

    def _close(self) -> None:
        for db in self._db.values():
            with contextlib.suppress(duckdb.Error):
                db.close()
        self._db.clear()

    def _delete(self) -> None:
        self._close()
        self._epoch, self._seq = 0, 0
        self._copied = False
        self._mark_path().unlink(missing_ok=True)
        for path in self._paths():
            for stale in (path, path.with_name(path.name + ".wal"),
                          path.with_name(path.name + ".compact"),
                          path.with_name(path.name + ".copy")):
                stale.unlink(missing_ok=True)
        for stale in self._stale:
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)

    async def apply(self, payload: bytes) -> Applied:
        """A batch received in order, answered once it is in this copy's files: what the owner
        acknowledges is on every in-sync standby's disk, and a standby killed outright keeps
        it. Batches that arrive while one is applied are applied together after it (one
        transaction per file), each answered then."""
        epoch, seq, units = decode_batch(payload)
        if not self._epoch or epoch != self._epoch or seq != self._seq + 1:
            self._epoch = 0  # out of step: it copies the store again
            raise ConflictError("this standby is not in step: it copies the store again",
                                {"store": self.store})
        self._seq = seq
        self._pending.extend(units)
        await self.drained()
        if self._epoch != epoch:  # it failed, in this apply or in one that took this batch
            raise ConflictError("this standby could not apply the batch: it copies the store "
                                "again", {"store": self.store})
        return Applied(seq=seq)

    async def drained(self) -> None:
        """Every batch received so far applied to the files; out of step if one failed."""
        async with self._applying:
            while self._pending:
                units, self._pending = self._pending, []
                try:
                    await self._thread(self._apply, units)
                except BaseException as exc:
                    self._epoch = 0  # the next batch is refused: it copies the store again
                    self._pending.clear()
                    log.warning("%s: %d units could not be applied (%s)", self.name,
                                len(units), _reason(exc))
                    raise

    def _apply(self, units: list[Unit]) -> None:
        """The units in order; the statements of consecutive units on one file in one
        transaction (each was a transaction of its own on the owner), as few as `merged`
        makes them."""
        from memgate.storage import compaction

        open_tx: duckdb.DuckDBPyConnection | None = None
        run: list[tuple[str, list[Any]]] = []  # the open transaction's statements, not yet run
        try:
            for file, statements in units:
                db = self._db.get(file)
                if open_tx is not None and (db is not open_tx or not isinstance(statements,
                                                                                  list)):
                    _execute(open_tx, run)
                    open_tx.commit()
                    open_tx, run = None, []
                if isinstance(statements, dict):
                    _write(self._root / file, base64.b64decode(statements["data"]),
                           append=bool(statements["append"]))
                    continue
                if db is None:
                    self._db[file] = db = compaction.plain(self._root / file)
                if statements is None:
                    self._db[file] = compaction.rewrite(db, self._root / file, standby=True)
                    continue
                if open_tx is None:
                    db.begin()
                    open_tx = db
                run.extend(statements)
            if open_tx is not None:
                _execute(open_tx, run)
                open_tx.commit()
        except BaseException:
            if open_tx is not None:
                open_tx.rollback()
            raise

    async def _follow(self, mark: tuple[int, int] | None) -> None:
        """Join, then watch: promote when the owner is gone, copy again when out of step."""
        await self._check_kept(mark)
        while True:
            try:
                if await self._watch():
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("%s: %s; trying again", self.name, _reason(exc))
                await asyncio.sleep(1.0)

    async def _watch(self) -> bool:
        js = self._js()
        leases = await lease_bucket(js, replicas=self._replicas)
        standbys = await standbys_bucket(js, replicas=self._replicas)
        unowned_since: float | None = None  # since when nobody holds the lease
        released = False  # and whether its holder gave it up rather than let it expire
        while True:
            owner = await holder(leases, self.store)
            if rebuilt(self.store):  # nothing to copy: it moves with its partition
                if owner is None and await self._promote():
                    return True
                await asyncio.sleep(WATCH_EVERY_S)
                continue
            record = await in_sync(standbys, self.store)
            current = record if record is not None and self._epoch and \
                record.epoch == self._epoch else None
            synced = current is not None and self._node in current.nodes
            # or holding every acknowledged write since its owner lost its last standby
            whole = current is not None and self._node in (*current.nodes, *current.kept)
            if owner is None:
                if unowned_since is None:
                    unowned_since = time.monotonic()
                    released = await given_up(leases, self.store)
                if follows(self.store) is not None:  # derived: made again if not in sync
                    if await self._promote(stale=not synced):
                        return True
                elif whole and await self._next(record, unowned_since, released) and \
                        await self._promote():
                    return True
            else:
                unowned_since = None
                if owner.node != self._node and (owner.epoch != self._epoch or not synced):
                    if self._copied:
                        await self._discard()  # another owner, or left: a copy from scratch
                    if await self._wanted(owner.epoch, record, standbys):
                        await self._join(pulling=self._pulling == owner.epoch)
            await asyncio.sleep(WATCH_EVERY_S)

    async def _wanted(self, epoch: int, record: InSync | None, standbys: KeyValue) -> bool:
        """Whether this node copies the store (served under `epoch`) now: to take it over;
        where its partition has an in-sync standby, for a derived store; else while its owner
        keeps fewer in-sync standbys than it wants."""
        if self._pulling == epoch:
            return True
        partition = follows(self.store)
        if partition is not None:
            kept = await in_sync(standbys, partition)
            return kept is not None and self._node in kept.nodes
        return record is None or record.epoch != epoch or \
            len(set(record.nodes) - {self._node}) < self._standbys

    async def _next(self, record: InSync | None, unowned_since: float, released: bool) -> bool:
        """Whether this standby may take the store over now. A drain names the standby it
        hands over to (the home it moved), which goes first; a lease given up by its home's
        own process (it starts again, and claims its stores back) is left to that process for
        `RESTART_S`; any other in-sync standby takes over once that time has passed (that one
        may be gone too). A lease that expired (its holder killed or cut off) is taken at once."""
        from memgate.cluster.ownership import home_of, homes_bucket

        home = await home_of(await homes_bucket(self._js(), replicas=self._replicas), self.store)
        if home is None or home == self._home:
            return True
        waited = time.monotonic() - unowned_since
        if record is not None and home.get("node") in record.nodes:
            return waited >= HANDOVER_S
        return not released or waited >= RESTART_S

    async def _join(self, *, pulling: bool = False) -> None:
        self._copied = True
        joined = await self._bus.request(subject(self.store, "join"),
                                         Join(node=self._node, home=self._home,
                                              wanted=pulling), Joined)
        for copied in joined.files:
            await self._fetch(joined.snapshot, copied)
        await self._thread(self._open)
        self._epoch, self._seq = joined.epoch, joined.seq
        await self._bus.request(subject(self.store, "ready"),
                                Ready(node=self._node, snapshot=joined.snapshot), InSync)
        log.info("%s: in sync with its owner (epoch %s, batch %s)", self.name, joined.epoch,
                 self._seq)

    async def _fetch(self, snapshot: str, copied: CopiedFile) -> None:
        target = self._root / copied.file
        partial = target.with_name(target.name + ".copy")
        target.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("wb") as out:
            offset = 0
            while True:
                page = await self._bus.request(
                    subject(self.store, "page"),
                    Page(snapshot=snapshot, file=copied.file, offset=offset), PageData)
                data = base64.b64decode(page.data)
                out.write(data)
                offset += len(data)
                if page.last:
                    break
            out.flush()
            os.fsync(out.fileno())
        target.with_name(target.name + ".wal").unlink(missing_ok=True)
        os.replace(partial, target)

    def _open(self) -> None:
        from memgate.storage import compaction

        for path in self._paths():
            if path.exists() and path.suffix == ".duckdb":
                self._db[path.relative_to(self._root).as_posix()] = compaction.plain(path)

    async def _promote(self, *, stale: bool = False) -> bool:
        """This copy becomes the store: its home moved here (one winner), then its actor
        started on it (`stale`: on none, the copy deleted first: a derived store is made
        again). False: another node won, or must first (a derived store moves only with its
        partition)."""
        from memgate.cluster.ownership import home_of, homes_bucket

        homes = await homes_bucket(self._js(), replicas=self._replicas)
        partition = follows(self.store)
        if partition is not None and await home_of(homes, partition) != self._home:
            return False
        if await holder(await lease_bucket(self._js(), replicas=self._replicas),
                        self.store) is not None:
            return False  # served again meanwhile (its owner's process came back)
        if not stale:
            try:
                await self.drained()  # every batch it answered for, in its files
            except Exception:
                return False
        try:
            entry = await homes.get(self.store)
            if entry.value is None or dict(json.loads(entry.value)) != self._home:
                await homes.update(self.store, json.dumps(self._home).encode(),
                                   last=entry.revision)
        except KeyNotFoundError:
            await homes.create(self.store, json.dumps(self._home).encode())
        except KeyWrongLastSequenceError:
            return False
        if stale:
            await self._discard()
        await self._thread(self._close)
        log.warning("%s: its owner is gone; serving it on this node", self.store)
        try:
            await self._become()
        except Exception as exc:  # undone (`become` is all or nothing): the next look tries
            # again, on the same copy, unless another node took the lease meanwhile
            log.warning("%s: could not serve it here (%s)", self.store, type(exc).__name__)
            return False
        self._epoch, self._copied = 0, False  # the store's files now: no copy to keep
        return True


def _reason(exc: BaseException) -> str:
    """For a log line: the class, and the message of memgate's own errors (a database's may
    quote the values of a statement)."""
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, MemgateError) else \
        type(exc).__name__


def _write(path: Path, data: bytes, *, append: bool) -> None:
    """A standby's copy of a write to a plain file: appended, or replaced whole (renamed over
    it, so no old byte stays in any file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if append:
        with path.open("ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return
    tmp = path.with_name(f".{path.name}.replica")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class _Thread:
    """One thread for a standby's files (its own: the store it copies has no writer here)."""

    def __init__(self, name: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def __call__(self, fn: Callable[..., R], *args: object) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


__all__ = ["STANDBYS", "Drain", "Drained", "InSync", "Primary", "Recording", "Standby", "files_of",
           "follows", "in_sync", "journaled", "movable", "opened", "primary", "raw", "record_under",
           "recording", "rebuilt", "retire", "rewritten", "serve", "standby", "standby_lag",
           "standbys_bucket", "wrote"]
