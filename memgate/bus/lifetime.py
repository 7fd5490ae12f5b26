"""A child process that does not outlive its parent: Linux's parent-death signal.

`memgate up` killed outright (an OOM kill, a container runtime's SIGKILL) runs no code of its
own, so nothing it does on the way out can stop its children: the kernel must. A child started
with `preexec_fn=die_with_parent()` is sent SIGTERM (it then stops as when asked: nats-server
flushes JetStream, an actor process drains) the moment its parent goes.

The kernel sends it when the *thread* that forked the child exits, not the process: start
children from a thread that lives as long as the process (memgate's asyncio loop, which runs
on the main thread and forks `asyncio.create_subprocess_exec`'s children itself).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel send the child `sig` when this process's calling
    thread exits; None off Linux (where nothing equivalent is set)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not after

    def in_child() -> None:
        if prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent:  # the parent died between the fork and the prctl
            os.kill(os.getpid(), sig)

    return in_child


__all__ = ["die_with_parent"]


def alive(pid: int) -> bool:
    """Whether process `pid` runs: one that exited is not, though its parent has not reaped it
    (a zombie, which `kill(pid, 0)` still finds: a container's PID 1 often reaps nobody)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # exited, not yet reaped
