"""What a memgate keeps in its data directory besides its data: the lock that makes it the
directory's one memgate, where its NATS and HTTP listen (`run/*.json`, for the command line), and
modes private to the user whatever the umask.

The lock is an `flock` on `DIR/.lock`, taken by `memgate up` before anything else and held by
every process of it (the supervisor passes the descriptor to its nats-server and its children):
the directory is free again only once the last of them is gone, so a `memgate up` after a
kill -9 waits for the orphans' drain (they die with their parent, `bus.lifetime`) instead
of sharing the JetStream store or the DuckDB files with them.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from memgate.bus.lifetime import alive

LOCK = ".lock"
RUN = "run"  # run/nats.json, run/http.json: where a running memgate listens
FORMAT_FILE = "format.json"  # the directory's format (`app.dataformat`)
MIGRATING = "migrating"  # a migration under way, and the copy of what it changes
# After a kill -9, how long the processes of the memgate that was killed may take to stop
# (they drain as on Ctrl-C; ~1 s when idle) before a new `memgate up` gives up.
ORPHANS_WAIT_S = 20.0
ORPHANS_POLL_S = 0.05
PRIVATE_UMASK = 0o077  # files 0600, directories 0700


class StartRefusedError(RuntimeError):
    """`memgate up` will not start as configured; the message says why and what to do."""


class DataDirError(StartRefusedError):
    """The data directory cannot be used (another memgate runs on it); the message says why."""


def private_files() -> None:
    """Everything this process (and its children) creates: for the user only."""
    os.umask(PRIVATE_UMASK)


# What memgate keeps at the top of a data directory (anything else there is the user's own).
OWN_DIRECTORIES = frozenset({"audit", "keys", "nats", "partitions", RUN, MIGRATING})
OWN_SUFFIXES = (".duckdb", ".duckdb.wal", ".token", ".tmp")


def make_private(data_dir: Path) -> None:
    """`data_dir` 0700, and what memgate keeps in it 0700 (directories) and 0600 (files) through,
    whoever made it under whatever umask (an older memgate); files of the user's own in it are
    left as they are (`data_dir` 0700 already keeps others out). Links are not followed."""
    os.chmod(data_dir, 0o700)
    for entry in os.scandir(data_dir):
        if entry.is_symlink():
            continue
        if entry.is_dir() and entry.name in OWN_DIRECTORIES:
            for root, dirs, files in os.walk(entry.path):
                os.chmod(root, 0o700)
                for name in files:
                    path = os.path.join(root, name)
                    if not os.path.islink(path):
                        os.chmod(path, 0o600)
                dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        elif entry.is_file() and (entry.name in (LOCK, FORMAT_FILE)
                                  or entry.name.endswith(OWN_SUFFIXES)):
            os.chmod(entry.path, 0o600)


def _holder(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or "x")
    except ValueError:
        return None


def lock(data_dir: Path, *, wait_s: float = ORPHANS_WAIT_S) -> int:
    """Lock `data_dir` for this memgate (creating it); the descriptor, held for the life of the
    process (never closed: its exit releases the lock). A memgate that runs on it: refused at
    once; one that was killed: its processes are waited for up to `wait_s`."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(data_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = _holder(fd)
            if holder is not None and alive(holder):
                os.close(fd)
                raise DataDirError(f"memgate (pid {holder}) already runs on {data_dir}; "
                                   "stop it first, or give another --data-dir") from None
            if time.monotonic() > deadline:
                os.close(fd)
                raise DataDirError(
                    f"the processes of a memgate that ran on {data_dir} (pid {holder}, gone) "
                    f"did not stop within {wait_s:.0f} s and still hold it") from None
            time.sleep(ORPHANS_POLL_S)  # flock has no timeout; the orphans are draining
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def is_locked(data_dir: Path) -> bool:
    """Whether a memgate holds `data_dir` now (from another process than the holder)."""
    try:
        fd = os.open(data_dir / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _run_file(data_dir: Path, what: str) -> Path:
    return data_dir / RUN / f"{what}.json"


def record(data_dir: Path, what: str, url: str) -> Path:
    """Say where this memgate's `what` (`nats`, `http`) listens, no login in it:
    `DIR/run/<what>.json`, 0600."""
    path = _run_file(data_dir, what)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    written = path.with_suffix(".tmp")
    fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"url": _without_userinfo(url), "pid": os.getpid()}, out)
    os.replace(written, path)
    return path


def forget(data_dir: Path, what: str) -> None:
    _run_file(data_dir, what).unlink(missing_ok=True)


def running(data_dir: Path, what: str) -> str | None:
    """Where the `what` of the memgate running on `data_dir` listens; None if none runs (a
    file left by a memgate that was killed says nothing: the directory's lock is free)."""
    if not is_locked(data_dir):
        return None
    try:
        url = json.loads(_run_file(data_dir, what).read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return url if isinstance(url, str) else None


def running_nats(data_dir: Path) -> str | None:
    return running(data_dir, "nats")


def nats_of(data_dir: Path, given: str | None = None, *, port: int = 4222) -> str:
    """The NATS a command for the memgate on `data_dir` connects to: `given` (`--nats`, or
    `MEMGATE_NATS_URL`), else where the memgate running on it said its NATS listens, else the
    embedded server's default address (`port`: `MEMGATE_NATS_PORT`)."""
    return given or running(data_dir, "nats") or f"nats://127.0.0.1:{port}"


def http_of(data_dir: Path, given: str | None = None) -> str:
    """memgate's HTTP address for a command: `given` (`--url`, `MEMGATE_URL`), else where the
    memgate running on `data_dir` serves, else the default `http://127.0.0.1:8080`."""
    return given or running(data_dir, "http") or "http://127.0.0.1:8080"


__all__ = ["DataDirError", "StartRefusedError", "forget", "http_of", "is_locked", "lock",
           "make_private", "nats_of", "private_files", "record", "running", "running_nats"]
