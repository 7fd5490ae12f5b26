"""The only package that speaks NATS: subjects, replies, the embedded server and the clients.

Its names are imported when asked for (`memgate.lazy`): `memgate.bus.logins` alone loads
neither nats-py nor faststream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memgate.lazy import exports

if TYPE_CHECKING:
    from memgate.bus import subjects
    from memgate.bus.client import BusClient, MemgateClient
    from memgate.bus.replies import (
        NatsRouter, decode_reply, hearing, ok_bytes, parse, replying, validation_failure,
    )
    from memgate.bus.server import EmbeddedNats, nats_server_binary
    from memgate.bus.serving import RoutesBroker

__all__ = [
    "BusClient", "EmbeddedNats", "NatsRouter", "MemgateClient", "decode_reply", "hearing",
    "RoutesBroker", "nats_server_binary", "ok_bytes", "parse", "replying", "subjects",
    "validation_failure",
]
__getattr__ = exports(__name__, {
    **dict.fromkeys(["BusClient", "MemgateClient"], "memgate.bus.client"),
    **dict.fromkeys(["NatsRouter", "decode_reply", "hearing", "ok_bytes", "parse", "replying",
                     "validation_failure"], "memgate.bus.replies"),
    **dict.fromkeys(["EmbeddedNats", "nats_server_binary"], "memgate.bus.server"),
    "RoutesBroker": "memgate.bus.serving"})
