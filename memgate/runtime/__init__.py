"""What every actor shares: the `Actor` protocol, a serial worker thread, readiness."""

from memgate.runtime.actor import Actor, Serial, partition_of, ready_route

__all__ = ["Actor", "Serial", "partition_of", "ready_route"]
