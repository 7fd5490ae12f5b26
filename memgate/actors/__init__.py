"""The actors of memgate, one per module. `memgate.app` assembles them into processes."""

from memgate.actors.directory import DirectoryActor
from memgate.actors.embedder import EmbedderActor
from memgate.actors.governance import GovernanceActor
from memgate.actors.indexer import IndexerActor
from memgate.actors.nats_authority import NatsAuthorityActor
from memgate.actors.recall import RecallActor
from memgate.actors.registry import RegistryActor
from memgate.actors.storage import StorageActor

__all__ = [
    "DirectoryActor", "EmbedderActor", "GovernanceActor", "IndexerActor", "NatsAuthorityActor",
    "RecallActor", "RegistryActor", "StorageActor",
]
