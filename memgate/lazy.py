"""Names a package exports but imports only when first asked for (PEP 562).

The `memgate` command line's admin commands are HTTP clients: they need the settings, not NATS,
faststream or the actors, which `memgate`, `memgate.bus` and `memgate.app` export."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from sys import modules
from typing import Any


def exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's `__getattr__`: each name in `where` is imported from the module named there
    when first asked for; anything else is not an attribute (a submodule is then imported)."""

    def attribute(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        setattr(modules[package], name, value)  # found directly from now on
        return value

    return attribute
