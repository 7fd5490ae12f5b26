"""Process assembly: the one `Settings` object, which actors run where, and `memgate up`.

Its names are imported when asked for: the settings alone do not load the actors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memgate.lazy import exports

if TYPE_CHECKING:
    from memgate.app.settings import Settings
    from memgate.app.system import Bus, actor_names, start_actors, start_system

__all__ = ["Bus", "Settings", "actor_names", "start_actors", "start_system"]
__getattr__ = exports(__name__, {
    "Settings": "memgate.app.settings", **dict.fromkeys(
        ["Bus", "actor_names", "start_actors", "start_system"], "memgate.app.system")})
