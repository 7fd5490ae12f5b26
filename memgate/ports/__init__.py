"""The ports actors depend on: small interfaces to other actors, to the bus and to the model.

Each is a `Protocol`; the `Bus…` classes implement them over NATS, `tests/fakes.py` in memory.
"""

from memgate.ports.bus import BatchHandler, Bus, Consumer, Consumers, Publisher, Requester
from memgate.ports.directory import BusDirectory, Directory
from memgate.ports.embedder import Embedder, LoadEmbedder
from memgate.ports.ranking import BusRankers, Rankers
from memgate.ports.registry import BusRegistry, Registry
from memgate.ports.storage import BusStorage, Storage

__all__ = [
    "BatchHandler", "Bus", "Consumer", "Consumers", "Publisher", "Requester",
    "Directory", "Embedder", "LoadEmbedder", "Rankers", "Registry", "Storage",
    "BusDirectory", "BusRankers", "BusRegistry", "BusStorage",
]
