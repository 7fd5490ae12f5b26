"""Assembling a memgate process: every actor on one broker, started and stopped in order."""

from __future__ import annotations

import logging
import secrets
from contextlib import AsyncExitStack
from pathlib import Path

import nats
from faststream.nats import NatsBroker

from actors.directory import DirectoryActor
from actors.governance import GovernanceActor
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
    ]
    for partition in settings.partition_names():
        root = data / "partitions" / partition
        actors.append(StorageActor(partition=partition, path=root / "memories.duckdb",
                                   publisher=publisher))
    return actors


def actor_names(settings: Settings) -> list[str]:
    """The readiness subjects `/healthz` checks, one per actor."""
    names = ["directory", "governance"]
    for partition in settings.partition_names():
        names += [f"storage.{partition}"]
    return [subjects.ready(name) for name in names]


async def start_actors(settings: Settings, nats_url: str, stack: AsyncExitStack) -> None:
    """Start every actor of this process; `stack` stops them (broker drained first)."""
    nc = await nats.connect(nats_url, name="memgate-actors")
    stack.push_async_callback(nc.drain)
    bus = BusClient(nc, timeout=settings.request_timeout_s)
    broker = NatsBroker(nats_url, logger=None, graceful_timeout=settings.request_timeout_s)
    for actor in build_actors(settings, bus, EventPublisher(nc)):
        await actor.start()
        stack.push_async_callback(actor.stop)
        broker.include_router(actor.router())
    await broker.start()
    stack.push_async_callback(broker.stop)
    log.info("actors started on %s", nats_url)


