"""What an operator sees of the cluster (SPEC §6): each store's home and owner."""

from __future__ import annotations

from pydantic import Field

from memgate.contracts.base import Contract


class StoreOwner(Contract):
    """One single-writer actor: the node that keeps its files, the one serving it (None:
    nobody now) and the epoch it serves under."""

    name: str
    home: str | None = None
    served_by: str | None = None
    epoch: int | None = None
    # the nodes whose copy has every write its owner acknowledged
    in_sync: list[str] = Field(default_factory=list)


class ClusterStatus(Contract):
    nodes: list[str]  # every node named as a home or an owner
    stores: list[StoreOwner]


__all__ = ["ClusterStatus", "StoreOwner"]
