"""The only package that speaks NATS: subjects, replies, the embedded server and the clients."""

from memgate.bus import subjects
from memgate.bus.client import BusClient, MemgateClient
from memgate.bus.replies import (
    NatsRouter, decode_reply, ok_bytes, parse, replying, validation_failure,
)
from memgate.bus.server import EmbeddedNats, nats_server_binary
from memgate.bus.serving import RoutesBroker

__all__ = [
    "BusClient", "EmbeddedNats", "NatsRouter", "MemgateClient", "decode_reply",
    "RoutesBroker", "nats_server_binary", "ok_bytes", "parse", "replying", "subjects",
    "validation_failure",
]
