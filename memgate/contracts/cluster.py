"""What an operator sees of the cluster (SPEC §6): each store's home and owner."""

from __future__ import annotations

from pydantic import Field

from memgate.contracts.base import Contract


class StandbyLag(Contract):
    """A standby of a store, as its owner sees it: in sync (its files hold every batch the
    owner acknowledged), and the batches it does not hold yet (a joining standby: those
    committed since its copy)."""

    node: str
    in_sync: bool
    behind: int


class Lag(Contract):
    standbys: list[StandbyLag]


class StoreOwner(Contract):
    """One single-writer actor: the node that keeps its files, the one serving it (None:
    nobody now) and the epoch it serves under."""

    name: str
    home: str | None = None
    served_by: str | None = None
    epoch: int | None = None
    process: str | None = None  # the serving process, `host:pid`
    # the nodes whose copy has every write its owner acknowledged
    in_sync: list[str] = Field(default_factory=list)
    # the nodes whose copy has every acknowledged write though no batch reaches it now: the
    # owner lost its last in-sync standby and takes no write until one is in sync again; one
    # of them is promoted should the owner be lost too
    kept: list[str] = Field(default_factory=list)
    # each standby's replication lag, as its owner answered (None: it did not, or one node)
    standbys: list[StandbyLag] | None = None


class ServerState(Contract):
    """One node's NATS server as JetStream sees it (a peer of the leases bucket's stream): up
    (the leader, or a replica current with it), or not (offline, or behind: dead, stopped,
    cut off)."""

    name: str
    up: bool
    leader: bool = False


class ClusterStatus(Contract):
    nodes: list[str]  # every node named as a home or an owner
    stores: list[StoreOwner]
    servers: list[ServerState] = Field(default_factory=list)  # each node's NATS server
    # what could not be read just now (a bucket whose leader is being elected, say): the rest
    # of the view is shown without it, never an error
    degraded: list[str] = Field(default_factory=list)


__all__ = ["ClusterStatus", "Lag", "ServerState", "StandbyLag", "StoreOwner"]
