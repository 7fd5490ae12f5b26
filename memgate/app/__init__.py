"""Process assembly: the one `Settings` object, which actors run where, and `memgate up`."""

from memgate.app.settings import Settings
from memgate.app.system import Bus, actor_names, start_actors, start_system

__all__ = ["Bus", "Settings", "actor_names", "start_actors", "start_system"]
