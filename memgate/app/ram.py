"""Where the Tantivy indexes live: in RAM (`/dev/shm`) unless `MEMGATE_TEXT_INDEX_DIR` says.

A text index is derived data: storage holds every text, and the indexer's catch-up indexes
whatever an owner's index lacks before it ranks for it, so an index lost (a reboot empties
`/dev/shm`) is rebuilt on first use. On disk, each commit that makes added documents searchable
fsyncs a segment, mostly the kernel's work, paid on a recall's path when the owner remembered
since (read-your-writes); in RAM it costs a fraction (docs/DECISIONS.md, "Text indexes in RAM").

Each data directory has its own RAM directory (`/dev/shm/memgate-<uid>/<hash of its path>`,
private to the user), which records the data directory it belongs to; one whose data directory
no longer exists is removed when memgate next starts. `/dev/shm` is writable by every user, so
`memgate-<uid>` may have been made by someone else, ahead of memgate: it is used only if it is a
directory (not a link) of this user with mode 0700, else refused (`RamDirectoryError`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from pathlib import Path

RAM = Path("/dev/shm")
ORIGIN = "ORIGIN"  # the data directory a RAM directory belongs to


class RamDirectoryError(RuntimeError):
    """The RAM directory is not private to this user; the message says what to do."""


def ram_base() -> Path | None:
    """This user's directory of RAM indexes, or None where there is no writable `/dev/shm`."""
    if not (RAM.is_dir() and os.access(RAM, os.W_OK | os.X_OK)):
        return None
    return RAM / f"memgate-{os.getuid()}"


def text_index_root(data_dir: Path, partition: str, configured: Path | None) -> Path:
    """The directory of one partition's Tantivy indexes."""
    if configured is not None:
        return configured / partition
    base = ram_base()
    if base is None:
        return data_dir / "partitions" / partition / "text-index"
    origin = str(data_dir.resolve())
    return base / hashlib.sha256(origin.encode()).hexdigest()[:16] / partition


def private_base() -> Path | None:
    """This user's directory of RAM indexes, created if need be, once checked private (else
    `RamDirectoryError`); None where there is no `/dev/shm`."""
    base = ram_base()
    if base is None:
        return None
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    found = os.lstat(base)
    if (not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid()
            or stat.S_IMODE(found.st_mode) != 0o700):
        kind = "a directory" if stat.S_ISDIR(found.st_mode) else "not a directory"
        raise RamDirectoryError(
            f"{base} is {kind} of uid {found.st_uid} with mode "
            f"{stat.S_IMODE(found.st_mode):04o}, not a directory of uid {os.getuid()} with mode "
            "0700: the text indexes hold words of the memories; remove it, or set "
            "MEMGATE_TEXT_INDEX_DIR")
    return base


def claim(data_dir: Path, root: Path) -> None:
    """Create the partition's RAM directory `root` for `data_dir`, recording its owner, and
    remove the RAM directories of data directories that are gone."""
    base = ram_base()
    if base is None or base not in root.parents:
        return
    private_base()
    for stale in base.iterdir():
        try:
            origin = (stale / ORIGIN).read_text()
        except OSError:
            continue  # being created right now, or not ours
        if not Path(origin).exists():
            shutil.rmtree(stale, ignore_errors=True)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    (root.parent / ORIGIN).write_text(str(data_dir.resolve()))
