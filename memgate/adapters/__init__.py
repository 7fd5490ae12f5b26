"""Bus clients that face the outside: REST, MCP and the `memgate` command line."""

from memgate.adapters.rest import create_app

__all__ = ["create_app"]
