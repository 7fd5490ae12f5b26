"""Assembling a memgate process: every actor on one broker, started and stopped in order."""

from __future__ import annotations

import logging
import secrets
from contextlib import AsyncExitStack

import nats
from faststream.nats import NatsBroker

from actors.directory import DirectoryActor
from actors.embedder import EmbedderActor
from actors.governance import GovernanceActor
from actors.indexer import IndexerActor
from actors.recall import RecallActor
from actors.runtime import Actor
from actors.settings import Settings
from actors.storage import StorageActor
from bus import BusClient, subjects
from bus.streams import EventPublisher
from storage.directory import hash_token

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
        DirectoryActor(path=data / "directory.duckdb", admin_token_hash=hash_token(admin_token(settings))),
        GovernanceActor(bus=bus, partitions=settings.partitions),
        RecallActor(bus=bus, partitions=settings.partitions, window=settings.recall_window,
                    rrf_k=settings.recall_rrf_k,
                    cosine_deadline_ms=settings.recall_cosine_deadline_ms,
                    model=settings.model_path(), tokenizer=settings.embedding_tokenizer,
                    batch=settings.embedding_batch),
    ]
    for partition in settings.partition_names():
        root = data / "partitions" / partition
        actors += [
            StorageActor(partition=partition, path=root / "memories.duckdb", publisher=publisher),
            IndexerActor(partition=partition, root=root / "text-index", bus=bus),
            EmbedderActor(partition=partition, path=root / "vectors.duckdb",
                          model=settings.model_path(), tokenizer=settings.embedding_tokenizer,
                          bus=bus, batch=settings.embedding_batch),
        ]
    return actors


def actor_names(settings: Settings) -> list[str]:
    """The readiness subjects `/healthz` checks, one per actor."""
    names = ["directory", "governance", "recall"]
    for partition in settings.partition_names():
        names += [f"storage.{partition}", f"indexer.{partition}", f"embedder.{partition}"]
    return [subjects.ready(name) for name in names]


async def start_actors(settings: Settings, nats_url: str, stack: AsyncExitStack,
                       *, skip: frozenset[str] = frozenset()) -> None:
    """Start every actor of this process but those named in `skip`; `stack` stops them."""
    nc = await nats.connect(nats_url, name="memgate-actors")
    stack.push_async_callback(nc.drain)
    bus = BusClient(nc, timeout=settings.request_timeout_s)
    broker = NatsBroker(nats_url, logger=None, graceful_timeout=settings.request_timeout_s)
    for actor in build_actors(settings, bus, EventPublisher(nc)):
        if actor.name in skip:
            continue
        await actor.start()
        stack.push_async_callback(actor.stop)
        broker.include_router(actor.router())
    await broker.start()
    stack.push_async_callback(broker.stop)
    log.info("actors started on %s", nats_url)


