"""The actors of memgate, one per module, and how a process assembles them."""

from actors.settings import Settings
from actors.system import Bus, actor_names, start_actors, start_system

__all__ = ["Bus", "Settings", "actor_names", "start_actors", "start_system"]
