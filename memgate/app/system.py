"""Assembling a memgate process: every actor on one broker, started and stopped in order."""

from __future__ import annotations

import logging
import secrets
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import nats
from faststream.nats import NatsBroker
from faststream.security import SASLPlaintext

from memgate.actors.directory import DirectoryActor
from memgate.actors.embedder import EmbedderActor
from memgate.actors.governance import GovernanceActor
from memgate.actors.indexer import IndexerActor
from memgate.actors.nats_authority import NatsAuthorityActor
from memgate.actors.recall import RecallActor
from memgate.actors.registry import RegistryActor
from memgate.actors.storage import StorageActor
from memgate.app.settings import Settings
from memgate.bus import BusClient, EmbeddedNats, subjects
from memgate.bus.server import render_config
from memgate.bus.streams import EventPublisher
from memgate.runtime.actor import Actor
from memgate.storage import Limits

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


def build_actors(settings: Settings, bus: BusClient, publisher: EventPublisher) -> list[Actor]:
    data = settings.data_dir
    actors: list[Actor] = [
        DirectoryActor(path=data / "directory.duckdb",
                       admin_token=lambda: admin_token(settings), bus=bus,
                       partitions=settings.partitions),
        GovernanceActor.on_bus(bus, partitions=settings.partitions),
        RegistryActor(path=data / "registry.duckdb", bus=bus, publisher=publisher),
        RecallActor.on_bus(bus, partitions=settings.partitions, window=settings.recall_window,
                           rrf_k=settings.recall_rrf_k,
                           cosine_deadline_ms=settings.recall_cosine_deadline_ms,
                           bm25_deadline_ms=settings.recall_bm25_deadline_ms,
                           model=settings.model_path(), tokenizer=settings.embedding_tokenizer,
                           batch=settings.embedding_batch),
    ]
    for partition in settings.partition_names():
        root = data / "partitions" / partition
        actors += [
            StorageActor(partition=partition, path=root / "memories.duckdb", publisher=publisher,
                         bus=bus, partitions=settings.partitions,
                         limits=Limits(settings.limit_remembers_per_hour,
                                       settings.limit_versions_per_member)),
            IndexerActor(partition=partition, root=root / "text-index", bus=bus),
            EmbedderActor(partition=partition, path=root / "vectors.duckdb",
                          model=settings.model_path(), tokenizer=settings.embedding_tokenizer,
                          bus=bus, batch=settings.embedding_batch),
        ]
    return actors


def actor_names(settings: Settings) -> list[str]:
    """The readiness subjects `/healthz` checks, one per actor."""
    names = ["directory", "governance", "recall", "registry"]
    for partition in settings.partition_names():
        names += [f"storage.{partition}", f"indexer.{partition}", f"embedder.{partition}"]
    return [subjects.ready(name) for name in names]


@dataclass(frozen=True)
class Bus:
    """Where the actors' NATS is, and how internal clients (actors, adapters) log in to it."""

    url: str
    options: dict[str, Any]


def _internal_password(settings: Settings) -> str:
    if settings.nats_password is not None:
        return settings.nats_password.get_secret_value()
    path = settings.data_dir / "nats" / "internal.secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32))
    return path.read_text().strip()


async def start_system(settings: Settings, stack: AsyncExitStack, *,
                       skip: frozenset[str] = frozenset(),
                       only: frozenset[str] | None = None) -> Bus:
    """The embedded, locked-down nats-server (unless `nats_url` is set) and every actor."""
    if settings.nats_url is not None:
        options: dict[str, Any] = {}
        if settings.nats_password is not None:
            options = {"user": settings.nats_user,
                       "password": settings.nats_password.get_secret_value()}
        bus = Bus(settings.nats_url, options)
        await start_actors(settings, bus, stack, skip=skip, only=only)
        return bus
    password = _internal_password(settings)
    server = await stack.enter_async_context(EmbeddedNats(
        settings.data_dir / "nats", port=settings.nats_port,
        config=render_config(settings.nats_user, password, [])))
    bus = Bus(server.url, {"user": settings.nats_user, "password": password})
    await start_actors(settings, bus, stack, skip=skip, server=server)
    return bus


async def start_actors(settings: Settings, bus: Bus, stack: AsyncExitStack, *,
                       skip: frozenset[str] = frozenset(), only: frozenset[str] | None = None,
                       server: EmbeddedNats | None = None) -> None:
    """Start the actors of this process (`only` those, and none in `skip`); `stack` stops them."""
    nc = await nats.connect(bus.url, name="memgate-actors", **bus.options)
    stack.push_async_callback(nc.drain)
    client = BusClient(nc, timeout=settings.request_timeout_s)
    security = (SASLPlaintext(username=bus.options["user"], password=bus.options["password"])
                if "user" in bus.options else None)
    broker = NatsBroker(bus.url, logger=None, graceful_timeout=settings.request_timeout_s,
                        security=security)
    actors = build_actors(settings, client, EventPublisher(nc))
    authority = None
    if server is not None:
        authority = NatsAuthorityActor(server=server, bus=client, user=settings.nats_user,
                                       password=bus.options["password"])
        actors.append(authority)
    for actor in actors:
        if actor.name in skip or (only is not None and actor.name not in only):
            continue
        await actor.start()
        stack.push_async_callback(actor.stop)
        broker.include_router(actor.router())
    await broker.start()
    stack.push_async_callback(broker.stop)
    await broker.connection.flush()  # every subscription is known to the server from here on
    if authority is not None and "directory" not in skip and only is None:
        await authority.sync()
    log.info("actors started on %s", bus.url)
