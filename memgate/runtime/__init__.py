"""What every actor shares: its lifecycle and endpoints (`ActorBase`), a serial worker thread,
readiness."""

from memgate.runtime.actor import (
    Actor, ActorBase, Endpoint, Opened, Serial, answered, readiness,
)

__all__ = ["Actor", "ActorBase", "Endpoint", "Opened", "Serial", "answered",
           "readiness"]
