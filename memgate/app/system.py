"""Assembling a memgate process: every actor started and stopped in order, each kind of actor
on a NATS login of its own (`bus.logins`)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Collection, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any

from memgate.actors.audit import AuditActor
from memgate.actors.cluster import ClusterActor
from memgate.actors.directory import DirectoryActor
from memgate.actors.embedder import EmbedderActor
from memgate.actors.erasure import ErasureActor
from memgate.actors.governance import GovernanceActor
from memgate.actors.indexer import IndexerActor
from memgate.actors.keys import KeysActor
from memgate.actors.nats_authority import NatsAuthorityActor
from memgate.actors.reaper import ReaperActor
from memgate.actors.recall import RecallActor
from memgate.actors.registry import RegistryActor
from memgate.actors.sessions import SessionsActor
from memgate.actors.space_memories import SpaceMemoriesActor
from memgate.actors.spaces import SpacesActor
from memgate.actors.storage import StorageActor
from memgate.app import ram
from memgate.app.logins import internal_logins
from memgate.app.settings import Settings
from memgate.cluster import replication
from memgate.cluster.ownership import (
    Disk, OwnedElsewhereError, Ownership, home_of, homes_bucket, owned, single_writers,
    until_jetstream_answers,
)
from memgate.cluster.lease import holder, lease_bucket
from memgate.cluster.balance import Balancer
from memgate.cluster.replication import Standby
from memgate.bus import EmbeddedNats, NatsRouter, subjects
from memgate.bus.replies import Handler
from memgate.bus.connections import KindConnections, NatsBroker
from memgate.bus.logins import ADAPTER, PUBLIC_COMMANDS, ROLES, inbox_prefix, kind_of
from memgate.bus.server import ClusterSpec, Login, server_config
from memgate.policy import llm_origins
from memgate.policy.lifecycle import Rules
from memgate.ports.bus import Requester
from memgate.ports.llm import HttpChat
from memgate.runtime.actor import Actor, answered, routed
from memgate.storage import Limits
from memgate.storage.quotas import Quota
from memgate.tasks import cancelled

log = logging.getLogger("memgate")


def admin_token(settings: Settings) -> str:
    """The operator token: `MEMGATE_ADMIN_TOKEN`, else one generated at first start and kept."""
    if settings.admin_token is not None:
        return settings.admin_token.get_secret_value()
    path = settings.data_dir / "admin.token"
    if not path.exists():
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32))
        print(f"memgate: generated an operator token; it is in {path}")
    return path.read_text().strip()


def build_actors(settings: Settings, kinds: KindConnections, *, nats_authority: bool = False,
                 wanted: Callable[[str], bool] = lambda name: True,
                 governs: Collection[str] = PUBLIC_COMMANDS) -> list[Actor]:
    """The actors `wanted` (by name; all by default), each talking to the bus over its kind's
    connection (`kinds`); nothing is made for the others (no model file, no RAM directory).
    `nats_authority`: this process runs the embedded server and its nats-authority. When recall
    is wanted, governance and space-memories ask it in process (`BusClient(local=…)`), and
    governance hands remembers, lists and forgets to a storage of this process the same way.
    `governs`: the public commands governance takes from the bus (`app.layout`)."""
    data = settings.data_dir
    bus, publisher = kinds.client, kinds.publisher
    model = cache(settings.compute_model)  # onnxruntime: the processes that run the model only
    recall = RecallActor.on_bus(
        bus("recall"), partitions=settings.partitions, window=settings.recall_window,
        rrf_k=settings.recall_rrf_k, cosine_deadline_ms=settings.recall_cosine_deadline_ms,
        bm25_deadline_ms=settings.recall_bm25_deadline_ms, depth=settings.recall_depth,
        depth_bm25=settings.recall_depth_bm25, weights=settings.recall_weights(),
        sequence=settings.recall_sequence(), model=model(),
        tokenizer=settings.embedding_tokenizer,
        batch=settings.embedding_batch) if wanted("recall") else None

    recalls = answered([recall] if recall is not None else [])

    def asks(kind: str) -> Requester:
        """The requests of an actor that asks recall: answered in process when recall runs
        here, else over the bus."""
        return bus(kind, local=recalls)

    def storage(partition: str) -> StorageActor:
        return StorageActor(partition=partition,
                            path=data / "partitions" / partition / "memories.duckdb",
                            publisher=publisher("storage"), bus=bus("storage"),
                            partitions=settings.partitions,
                            embedding_backlog=settings.embedding_backlog,
                            limits=Limits(settings.limit_remembers_per_hour,
                                          settings.limit_versions_per_member,
                                          settings.limit_imports_per_hour))

    storages = {p: storage(p) for p in settings.partition_names() if wanted(f"storage.{p}")}

    def governance() -> Actor:
        local = recalls | answered(storages.values())
        return GovernanceActor.on_bus(bus("governance", local=local),
                                      partitions=settings.partitions, serves=governs,
                                      names_partitions=bool(settings.routes) and not
                                      set(governs).isdisjoint(subjects.BESIDE_STORAGE),
                                      admin_token=lambda: admin_token(settings))

    def partition_governance(partition: str) -> Actor:
        """In a cluster: the agents' commands sent for a partition this process owns."""
        return GovernanceActor.on_bus(
            bus("governance", local=answered([storages[partition]])),
            partitions=settings.partitions, serves=subjects.BESIDE_STORAGE, partition=partition,
            admin_token=lambda: admin_token(settings))

    def indexer(partition: str) -> Actor:
        root = settings.text_index(partition)
        ram.claim(data, root)
        return IndexerActor(partition=partition, root=root, bus=bus("indexer"))

    def embedder(partition: str) -> Actor:
        return EmbedderActor(partition=partition,
                             path=data / "partitions" / partition / "vectors.duckdb",
                             model=model(), tokenizer=settings.embedding_tokenizer,
                             bus=bus("embedder"), batch=settings.embedding_batch,
                             tells=settings.embedding_backlog > 0)

    makers: dict[str, Callable[[], Actor]] = {
        "governance": governance,
        "space-memories": lambda: SpaceMemoriesActor.on_bus(
            asks("space-memories"), partitions=settings.partitions,
            chat=HttpChat(timeout_s=settings.mem0_llm_timeout_s, allowed=partial(
                llm_origins.allowed, origins=settings.allowed_llm_origins())),
            extract_timeout_s=settings.mem0_extract_llm_timeout_s),
        **_singles(settings, kinds, nats_authority=nats_authority),
    }
    for partition in settings.partition_names():
        makers |= {
            f"storage.{partition}": partial(storages.__getitem__, partition),
            f"indexer.{partition}": partial(indexer, partition),
            f"embedder.{partition}": partial(embedder, partition),
        }
    beside = [partition_governance(p) for p in storages] if settings.routes else []
    return [*([recall] if recall is not None else []),
            *(make() for name, make in makers.items() if wanted(name)), *beside]


def _singles(settings: Settings, kinds: KindConnections, *,
             nats_authority: bool) -> dict[str, Callable[[], Actor]]:
    """The makers of the actors one of which runs in a cluster: the stores besides the
    partitions', the operator's cluster view and the reaper."""
    data = settings.data_dir
    bus, publisher = kinds.client, kinds.publisher
    return {
        "directory": lambda: DirectoryActor(
            path=data / "directory.duckdb", admin_token=lambda: admin_token(settings),
            bus=bus("directory"), partitions=settings.partitions,
            nats_authority=nats_authority),
        "cluster": lambda: ClusterActor(
            js=lambda: kinds.jetstream("cluster"), bus=bus("cluster"),
            admin_token=lambda: admin_token(settings),
            names=single_writers(settings.partition_names())),
        "registry": lambda: RegistryActor(path=data / "registry.duckdb", bus=bus("registry"),
                                          publisher=publisher("registry")),
        "reaper": lambda: ReaperActor(bus=bus("reaper"), partitions=settings.partitions,
                                      interval_s=settings.reaper_interval_s),
        "keys": lambda: KeysActor(root=data / "keys", bus=bus("keys"),
                                  admin_token=lambda: admin_token(settings),
                                  partitions=settings.partition_names()),
        "audit": lambda: AuditActor(root=data / "audit", bus=bus("audit"),
                                    admin_token=lambda: admin_token(settings)),
        "erasure": lambda: ErasureActor(path=data / "erasure.duckdb", bus=bus("erasure"),
                                        admin_token=lambda: admin_token(settings),
                                        partitions=settings.partitions),
        "spaces": lambda: SpacesActor(path=data / "spaces.duckdb", bus=bus("spaces"),
                                      partitions=settings.partitions,
                                      llm_models=settings.spaces_llm_models,
                                      llm_origins=settings.allowed_llm_origins(),
                                      quota=Quota("spaces", settings.limit_spaces_per_member,
                                                  settings.limit_spaces_per_hour)),
        "sessions": lambda: SessionsActor(
            path=data / "sessions.duckdb", bus=bus("sessions"),
            rules=Rules(never_enabled=settings.sessions_never_enabled,
                        max_ttl_s=settings.sessions_max_ttl_s),
            interval_s=settings.lifecycle_interval_s, retry_s=settings.lifecycle_retry_s,
            retry_max_s=settings.lifecycle_retry_max_s,
            extract_timeout_s=settings.lifecycle_extract_timeout_s,
            purge_after_s=settings.sessions_purge_after_s,
            quotas=(Quota("sessions", settings.limit_sessions_per_member,
                          settings.limit_sessions_per_hour),
                    Quota("events", settings.limit_events_per_member,
                          settings.limit_events_per_hour))),
    }


STATELESS = ("cluster", "governance", "reaper", "recall", "space-memories")


def actor_names(settings: Settings) -> list[str]:
    """The readiness subjects `/healthz` checks, one per actor."""
    names = [*STATELESS, *single_writers(settings.partition_names())]
    return [subjects.ready(name) for name in names]


def store_names(settings: Settings) -> list[str]:
    """Of those, the stores a cluster serves wherever their owners are: once every one was
    ready, a node's `/healthz` speaks for that node, and a store without an owner makes the
    cluster degraded (its view says so), not this node unready. None alone: one node is all."""
    if not settings.routes:
        return []
    return [subjects.ready(name) for name in single_writers(settings.partition_names())]


@dataclass(frozen=True)
class Bus:
    """Where the actors' NATS is, and how each kind of internal client logs in to it."""

    url: str
    logins: Mapping[str, dict[str, Any]]  # kind → nats.connect options (user, password, ...)
    # The public commands an actor of this process answers (`start_actors` adds them): the
    # adapters of this process send them to it without the trips through the server.
    here: dict[str, Handler] = field(default_factory=dict, compare=False)

    @property
    def options(self) -> dict[str, Any]:
        """How the REST and MCP adapters log in."""
        return self.login(ADAPTER)

    def login(self, kind: str) -> dict[str, Any]:
        return dict(self.logins[kind])


def external_bus(settings: Settings, url: str) -> Bus:
    """An operator's NATS: every kind uses the one login given (`MEMGATE_NATS_USER`,
    `MEMGATE_NATS_PASSWORD`), replies on `_INBOX_MG_<kind>.>`."""
    options: dict[str, Any] = {}
    if settings.nats_password is not None:
        options = {"user": settings.nats_user,
                   "password": settings.nats_password.get_secret_value()}
    return Bus(url, {kind: {**options, "inbox_prefix": inbox_prefix(kind)} for kind in ROLES})


def internal_bus(url: str, logins: Mapping[str, Login]) -> Bus:
    """The embedded server: each kind logs in as its own least-privileged user."""
    return Bus(url, {kind: {"user": login.user, "password": login.password,
                            "inbox_prefix": inbox_prefix(kind)}
                     for kind, login in logins.items()})


async def start_server(settings: Settings, stack: AsyncExitStack, *,
                       inherit: tuple[int, ...] = ()) -> tuple[EmbeddedNats, Bus]:
    """The embedded, locked-down nats-server (holding the descriptors `inherit`); `stack`
    stops it."""
    logins = internal_logins(settings)
    cluster = None
    if settings.cluster is not None:  # one server of a NATS cluster, named after this node
        cluster = ClusterSpec(Disk.of(settings.data_dir, settings.node).node, settings.cluster,
                              tuple(settings.routes))
    server = await stack.enter_async_context(EmbeddedNats(
        settings.data_dir / "nats", host=settings.nats_host, port=settings.nats_port,
        config=server_config(list(logins.values()), []), inherit=inherit, cluster=cluster))
    return server, internal_bus(server.url, logins)


async def start_system(settings: Settings, stack: AsyncExitStack, *,
                       skip: frozenset[str] = frozenset(),
                       only: frozenset[str] | None = None, inherit: tuple[int, ...] = (),
                       on_lost: Callable[[], Awaitable[None]] | None = None) -> Bus:
    """The embedded, locked-down nats-server (unless `nats_url` is set) and every actor, all in
    this process.

    Joined to an external NATS, every kind uses the one login given (`external_bus`); the
    operator grants it what the actors of this process need. That is also how a process joins
    the embedded server of another: with the login of the one kind it runs."""
    if settings.nats_url is not None:
        bus = external_bus(settings, settings.nats_url)
        await start_actors(settings, bus, stack, skip=skip, only=only, on_lost=on_lost)
        return bus
    server, bus = await start_server(settings, stack, inherit=inherit)
    await start_actors(settings, bus, stack, skip=skip, server=server,
                       logins=list(internal_logins(settings).values()), on_lost=on_lost)
    return bus


STOP_WITHIN_S = 45.0


async def stop_together(actors: list[Actor | Standby]) -> None:
    """Every actor's stop at once, each bounded (`STOP_WITHIN_S`): a stop that waits on
    something that never comes is named in the log and cut short, not left to hang the
    process's exit."""
    results = await asyncio.gather(*(asyncio.wait_for(actor.stop(), STOP_WITHIN_S)
                                     for actor in actors), return_exceptions=True)
    for actor, result in zip(actors, results, strict=True):
        if isinstance(result, TimeoutError):
            log.error("%s did not stop within %.0f s: cut short", actor.name, STOP_WITHIN_S)
        elif isinstance(result, Exception):
            log.error("%s did not stop cleanly: %s", actor.name, type(result).__name__)


# Starts of a process in a cluster, while a store it was to own is taken meanwhile elsewhere.
TAKEN_ATTEMPTS = 5


async def start_taking_turns(settings: Settings, bus: Bus, stack: AsyncExitStack, *,
                             attempts: int = TAKEN_ATTEMPTS,
                             **options: Any) -> NatsAuthorityActor | None:
    """`start_actors`, started again when, in a cluster, a store this process was to own was
    taken by another node between reading where it lives and claiming it (every node started
    together, another's standby promoted): then it keeps a standby of that store instead.
    Before, the process failed its start, and with it the whole node (the restart of every
    node in `tests/test_cluster_erased_bytes.py`, one run in four under load)."""
    async with AsyncExitStack() as trying:  # what a refused start started, stopped
        try:
            started = await start_actors(settings, bus, trying, root=stack, **options)
        except OwnedElsewhereError as taken:
            if not settings.routes or attempts <= 1:
                raise
            log.info("%s: starting again", taken)
        else:
            stack.push_async_exit(trying.pop_all())
            return started
    return await start_taking_turns(settings, bus, stack, attempts=attempts - 1, **options)


async def start_actors(settings: Settings, bus: Bus, stack: AsyncExitStack, *,
                       skip: frozenset[str] = frozenset(), only: frozenset[str] | None = None,
                       server: EmbeddedNats | None = None,
                       logins: list[Login] | None = None,
                       governs: Collection[str] = PUBLIC_COMMANDS,
                       on_lost: Callable[[], Awaitable[None]] | None = None,
                       balance: bool = False,
                       root: AsyncExitStack | None = None) -> NatsAuthorityActor | None:
    """Start the actors of this process (`only` those, and none in `skip`); `stack` stops them;
    governance takes the public commands `governs` from the bus. The single-writer actors are
    claimed first (`cluster.ownership`: else `OwnedElsewhereError`); `on_lost` runs if this
    process loses one of them, which from then on commits nothing. With `balance`, in a
    cluster, this process also pulls its node's share of the partitions (`cluster.balance`).
    A store handed over (a drain) stops alone, and a standby of it follows its new owner
    (`_Serving.hand_over`), until `root` (the process's stack; `stack` by default) closes.

    With `server` (the embedded one), the nats-authority keeps its users: `logins` and the
    agents the directory knows. It is returned; it has loaded those agents if the directory runs
    here too, else its owner calls `sync()` once the directory listens."""
    elsewhere: set[str] = set()  # stores another node owns: a standby of each runs here
    root = root or stack

    def wanted(name: str) -> bool:
        return name not in skip and name not in elsewhere and (only is None or name in only)

    kinds = KindConnections(bus, timeout=settings.request_timeout_s,
                            replicas=settings.stream_replicas())
    standbys: list[Standby] = []
    disk = Disk.of(settings.data_dir, settings.node)

    async def become(name: str) -> None:
        # all or nothing: a start that fails half way (JetStream electing leaders after a
        # kill) stops what it started and gives its lease up, so the store is not left
        # claimed with nothing serving it and no standby copying it
        async with AsyncExitStack() as attempt:
            await start_actors(settings, bus, attempt, only=frozenset({name}), server=server,
                               logins=logins, governs=governs, on_lost=on_lost, root=root)
            root.push_async_exit(attempt.pop_all())

    if settings.routes:  # clustered: every store has a standby on each other node (which
        # copies it if its owner wants one more: `Settings.standbys`)
        replication.record_under(settings.data_dir)
        stores = [name for name in single_writers(settings.partition_names())
                  if wanted(name) and replication.movable(name)]
        elsewhere |= await _homed_elsewhere(settings, kinds, stack, disk, stores)
        standbys = [_standby(settings, kinds, disk, name, partial(become, name))
                    for name in sorted(elsewhere)]
    actors = build_actors(settings, kinds, nats_authority=server is not None, wanted=wanted,
                          governs=governs)
    authority = None
    if server is not None:
        authority = NatsAuthorityActor(server=server, bus=kinds.client("nats-authority"),
                                       logins=logins or [])
        if wanted(authority.name):
            actors.append(authority)
    for kind in dict.fromkeys([*(kind_of(actor.name) for actor in actors),
                               *(kind_of(standby.store) for standby in standbys)]):
        await kinds.connect(kind, stack)
    ownership = None
    serving = _Serving(settings, kinds, root, disk, become, on_lost)
    if claimed := [actor.name for actor in actors if owned(actor.name)]:
        ownership = Ownership(kinds.jetstream(kind_of(claimed[0])), disk,
                              replicas=settings.stream_replicas(), ttl_s=settings.lease_ttl_s,
                              on_lost=on_lost,
                              on_step_down=serving.hand_over if settings.routes else None)
        serving.ownership = ownership
        stack.push_async_callback(ownership.release)  # once the actors have stopped
        await ownership.claim(claimed)
    serving.started = await _start_together(stack, [*actors, *standbys])
    serving.actors = actors
    # a broker per store in a cluster (a store handed over stops alone), per kind alone
    routers: list[tuple[str, str | None, NatsRouter]] = [
        (kind_of(actor.name), _stops_with(actor) if settings.routes else None, actor.router())
        for actor in actors]
    routers += [(kind_of(s.store), None, routed(s.endpoints())) for s in standbys]
    if settings.routes and ownership is not None:  # the owner's side: it ships to standbys
        routers += await _primaries(settings, kinds, stack, ownership, claimed,
                                    serving.following)
    if settings.routes and balance:
        await _balance(settings, kinds, stack, [
            name for name in single_writers(settings.partition_names())
            if name.startswith("storage.") and (name in claimed or name in elsewhere)])
    for actor in actors:
        if isinstance(actor, GovernanceActor) and actor.partition is None:
            # the adapters of this process ask it here; in a cluster, every command: NATS
            # hands a queue group's request to any node's member alike, so a remember sent
            # to the `store`'s governance was mostly governed on another node than its
            # partition's (docs/DECISIONS.md, "A cluster's REST and MCP adapters govern
            # every command in process")
            bus.here.update(actor.handlers() if settings.routes else answered([actor]))
    serving.brokers = await _serve(kinds, stack, routers,
                                   graceful_timeout=settings.request_timeout_s)
    if authority is not None and {"directory", authority.name}.isdisjoint(skip) and only is None:
        await authority.sync()
    log.info("actors started on %s", bus.url)
    return authority


async def _start_together(stack: AsyncExitStack,
                          everyone: list[Actor | Standby]) -> list[Actor | Standby]:
    """Every actor started at once: each opens its files or loads its model on threads of its
    own, and none serves or asks another before the brokers start (`_serve`). Stopped together
    too, after their brokers (nothing reaches them any more) and before their connections
    close: each lets its consumers finish the batch in hand, and one after another would add
    those waits up."""
    started: list[Actor | Standby] = []
    stack.push_async_callback(stop_together, started)

    async def start(actor: Actor | Standby) -> None:
        await actor.start()
        started.append(actor)

    outcomes = await asyncio.gather(*(start(actor) for actor in everyone),
                                    return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return started  # what `stop_together` stops: one handed over leaves it (`_Serving`)


async def _serve(kinds: KindConnections, stack: AsyncExitStack,
                 routers: list[tuple[str, str | None, NatsRouter]], *,
                 graceful_timeout: float) -> dict[tuple[str, str | None], NatsBroker]:
    """One broker per kind of connection and store it stops with (None: the process) serves
    its routers until `stack` closes (or the store is handed over: `_Serving`)."""
    brokers: dict[tuple[str, str | None], NatsBroker] = {}
    for kind, store, router in routers:
        if (kind, store) not in brokers:
            brokers[kind, store] = kinds.broker(kind, graceful_timeout=graceful_timeout)
        brokers[kind, store].include_router(router)
    for broker in brokers.values():
        await broker.start()
        stack.push_async_callback(broker.stop)
        await broker.connection.flush()  # its subscriptions are known to the server from here on
    return brokers


def _stops_with(actor: Actor) -> str | None:
    """The store a clustered actor stops with when that store is handed over: its own, or
    for a partition's governance its partition's (None: it lives as long as its process)."""
    if isinstance(actor, GovernanceActor) and actor.partition is not None:
        return f"storage.{actor.partition}"
    return actor.name if owned(actor.name) and replication.movable(actor.name) else None


@dataclass
class _Serving:
    """What a clustered process serves of each store, so that a store handed over (a drain,
    a rebuilt store following its partition: `PartitionLease.step_down`) stops alone: the
    other stores of the process serve on, and none of them pauses."""

    settings: Settings
    kinds: KindConnections
    root: AsyncExitStack
    disk: Disk
    become: Callable[[str], Awaitable[None]]
    on_lost: Callable[[], Awaitable[None]] | None = None
    ownership: Ownership | None = None
    actors: list[Actor] = field(default_factory=list)
    started: list[Actor | Standby] = field(default_factory=list)
    brokers: dict[tuple[str, str | None], NatsBroker] = field(default_factory=dict)
    following: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    async def hand_over(self, name: str) -> None:
        """`name`'s lease was given up: its brokers stop (nothing reaches its actor any more),
        then its actor and its owner's side; then a standby of it follows the new owner (the
        one that promoted it here, or a new one), as a process started again would."""
        for key in [key for key in self.brokers if key[1] == name]:
            await self.brokers.pop(key).stop()
        for actor in [a for a in self.actors if _stops_with(a) == name]:
            self.kinds.withdraw([endpoint.subject for endpoint in actor.endpoints()])
            self.actors.remove(actor)
            if actor in self.started:
                self.started.remove(actor)
                await stop_together([actor])
        await cancelled(self.following.pop(name, None))
        replication.retire(name)
        if self.ownership is not None:
            self.ownership.forget(name)
        try:
            await self._follow(name)
        except Exception as exc:  # JetStream unanswering: the process starts again instead
            log.error("%s: handed over, no standby of it here (%s): starting again", name,
                      type(exc).__name__)
            if self.on_lost is not None:
                await self.on_lost()
            return
        log.info("%s: handed over; a standby of it follows its new owner", name)

    async def _follow(self, name: str) -> None:
        """A standby of `name` in this process follows its new owner: the one that promoted it
        here, or a new one."""
        standby = replication.standby(name)
        if standby is not None:
            standby.resume()
            return
        standby = _standby(self.settings, self.kinds, self.disk, name,
                           partial(self.become, name))
        await standby.start()
        self.root.push_async_callback(stop_together, [standby])
        await _serve(self.kinds, self.root, [(kind_of(name), None, routed(standby.endpoints()))],
                     graceful_timeout=self.settings.request_timeout_s)


def _standby(settings: Settings, kinds: KindConnections, disk: Disk, name: str,
             become: Callable[[], Awaitable[None]]) -> Standby:
    """The standby of a store another node owns; `become` starts its actor here."""
    kind = kind_of(name)
    return Standby(name, node=disk.node, bus=kinds.client(kind),
                   js=partial(kinds.jetstream, kind), data_dir=settings.data_dir,
                   become=become, disk_home=disk.home(), replicas=settings.stream_replicas(),
                   standbys=settings.standbys, stale=_derived(settings, name))


async def _primaries(settings: Settings, kinds: KindConnections, stack: AsyncExitStack,
                     ownership: Ownership, claimed: list[str],
                     following: dict[str, asyncio.Task[None]],
                     ) -> list[tuple[str, str | None, NatsRouter]]:
    """The owner's side of each store claimed here that standbys copy: its routes, and its
    `follow` running (in `following`) until `stack` closes."""
    routers: list[tuple[str, str | None, NatsRouter]] = []
    for name in claimed:
        if replication.movable(name):
            primary = await _primary(settings, kinds, ownership, name)
            stack.callback(replication.retire, name)
            routers.append((kind_of(name), name, routed(primary.endpoints())))
            following[name] = asyncio.create_task(primary.follow(), name=f"follow-{name}")
            stack.push_async_callback(cancelled, following[name])
    return routers


async def _balance(settings: Settings, kinds: KindConnections, stack: AsyncExitStack,
                   partitions: list[str]) -> None:
    """This node pulls its share of `partitions` (`cluster.balance`) until `stack` closes."""
    if not partitions:
        return
    balancer = Balancer(node=Disk.of(settings.data_dir, settings.node).node, names=partitions,
                        bus=kinds.client("storage"), js=partial(kinds.jetstream, "storage"),
                        replicas=settings.stream_replicas(), started=not settings.restarts)
    await balancer.start()
    stack.push_async_callback(balancer.stop)

async def _homed_elsewhere(settings: Settings, kinds: KindConnections, stack: AsyncExitStack,
                           disk: Disk, names: list[str]) -> set[str]:
    """Those of `names` whose files another disk keeps (`cluster.ownership`), or that another
    node serves now (its standby there took over while this node's process was stopped)."""
    if not names:
        return set()
    kind = kind_of(names[0])
    await kinds.connect(kind, stack)

    async def read() -> set[str]:
        js = kinds.jetstream(kind)
        homes = await homes_bucket(js, replicas=settings.stream_replicas())
        leases = await lease_bucket(js, replicas=settings.stream_replicas(),
                                    ttl_s=settings.lease_ttl_s)
        found = set()
        for name in names:
            home, owner = await home_of(homes, name), await holder(leases, name)
            if home not in (None, disk.home()) or (owner is not None and owner.node != disk.node):
                found.add(name)
        return found

    return await until_jetstream_answers(read)


def _derived(settings: Settings, name: str) -> list[Path]:
    """What a rebuilt store leaves on a disk that no longer serves it: deleted."""
    partition = name.partition(".")[2]
    return [settings.text_index(partition)] if replication.rebuilt(name) else []


async def _primary(settings: Settings, kinds: KindConnections, ownership: Ownership,
                   name: str) -> replication.Primary:
    """`name`'s owner side, serving from here on: each commit applied by its standbys."""
    kind = kind_of(name)
    kv = await until_jetstream_answers(partial(
        replication.standbys_bucket, kinds.jetstream(kind), replicas=settings.stream_replicas()))
    homes = await until_jetstream_answers(partial(
        homes_bucket, kinds.jetstream(kind), replicas=settings.stream_replicas()))
    primary = replication.Primary(name, lease=ownership.leases[name], bus=kinds.client(kind),
                                  kv=kv, homes=homes, data_dir=settings.data_dir,
                                  standbys=settings.standbys,
                                  timeout_s=settings.request_timeout_s / 2)
    # its home here, no standby in sync yet
    await until_jetstream_answers(partial(primary.settle,
                                          Disk.of(settings.data_dir, settings.node).home()))
    replication.serve(primary)
    return primary
