"""Bus clients that face the outside: REST, MCP and the `memgate` command line.

`create_app` is imported when asked for (`memgate.lazy`), so the command line's admin commands,
which need neither FastAPI nor the MCP SDK, do not load them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memgate.lazy import exports

if TYPE_CHECKING:
    from memgate.adapters.rest import create_app

__all__ = ["create_app"]
__getattr__ = exports(__name__, {"create_app": "memgate.adapters.rest"})
