"""Bus clients that face the outside: REST, MCP and the `memgate` command line.

`create_app` is imported when asked for, so the command line's admin commands, which need neither
FastAPI nor the MCP SDK, do not load them (`memgate admin --help`: 3.1 -> 1.7 s)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memgate.adapters.rest import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from memgate.adapters.rest import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
