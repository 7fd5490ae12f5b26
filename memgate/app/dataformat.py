"""The format of a data directory: which layout of files a memgate may open in it.

`DIR/format.json` (`{"format": N}`) names it. Format 0 has no such file: every directory made
before memgate wrote one (releases up to commit 643fde7, 2026-12-06). Format 1 is the same
files, stamped. `memgate up` writes `FORMAT` into a new directory, and brings an older one to
it (`migrate`, after its lock) through `STEPS`, in order: the files the pending steps change are
copied into `DIR/migrating/copy/` first, `DIR/migrating/state.json` records what is done, and a
migration killed half-way resumes at the next start from the step it had reached (each step is
idempotent); the copy goes once the new format is written. A directory newer than `FORMAT` is
refused before anything opens it (`check`): by `memgate up` before its lock, nats-server or
DuckDB, and by the commands that read a directory themselves (backup, export, audit verify,
`memgate actors`, ...).

The next incompatible change adds a `Step` (the format it makes, the files it changes, an
idempotent function) and raises `FORMAT`; if the commands that read a directory themselves can
no longer read the older one as it is, it raises `READS_AS_IS` too.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from memgate.app.datadir import (
    FORMAT_FILE, MIGRATING, OWN_DIRECTORIES, OWN_SUFFIXES, RUN, StartRefusedError,
)

FORMAT = 1  # what this memgate writes and runs on
READS_AS_IS = 0  # the oldest format the commands that read a directory themselves read unmigrated
STATE = "state.json"  # DIR/migrating/state.json: the migration under way (`Migration`)
COPY = "copy"  # DIR/migrating/copy/: the files the steps change, as they were


class FormatError(StartRefusedError):
    """The directory's format is not one this memgate opens; the message is one line, with what
    to do."""


class MigrationError(StartRefusedError):
    """A migration step failed; the directory is left to resume from (the message says where
    the copy is)."""


@dataclass(frozen=True)
class Step:
    """Bring a directory of format `to - 1` to format `to`."""

    to: int
    does: str  # what it does, for the progress output
    touches: tuple[str, ...]  # globs under DIR of the files it changes: copied before any step
    run: Callable[[Path], None]  # idempotent: run again on what it left half-done, it finishes


def _unchanged(data_dir: Path) -> None:
    """Format 1 is format 0's layout: nothing to change but the stamp."""


@dataclass(frozen=True)
class Migration:
    """A migration under way (`DIR/migrating/state.json`)."""

    from_: int
    to: int
    copied: bool = False  # the files the steps change are all in DIR/migrating/copy/
    done: tuple[int, ...] = ()  # the steps done, by the format each makes


STEPS: tuple[Step, ...] = (
    Step(1, "stamp the format (the files stay as they are)", (), _unchanged),
)


def _holds_data(data_dir: Path) -> bool:
    """Whether a memgate kept anything in `data_dir` (its lock and run files aside)."""
    try:
        names = os.listdir(data_dir)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return any(name in OWN_DIRECTORIES - {RUN, MIGRATING} or name.endswith(OWN_SUFFIXES)
               or name == "node.json" for name in names)


def _read_json(path: Path) -> dict[str, Any]:
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


def format_of(data_dir: Path) -> int | None:
    """The directory's format; None if it holds no memgate data (new, or empty)."""
    path = data_dir / FORMAT_FILE
    try:
        found = _read_json(path)["format"]
    except FileNotFoundError:
        return 0 if _holds_data(data_dir) else None
    except (OSError, ValueError, KeyError) as unreadable:
        raise FormatError(f"{path} is unreadable ({type(unreadable).__name__}): "
                          "restore it, or a backup into a new directory") from None
    if not isinstance(found, int) or isinstance(found, bool) or found < 0:
        raise FormatError(f"{path} names no format: restore it, or a backup into a new "
                          "directory")
    return found


def _state(data_dir: Path) -> Migration | None:
    """The migration under way in `data_dir`, if one is."""
    path = data_dir / MIGRATING / STATE
    try:
        value = _read_json(path)
        return Migration(int(value["from"]), int(value["to"]), bool(value["copied"]),
                         tuple(int(done) for done in value["done"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as unreadable:
        raise MigrationError(f"{path} is unreadable ({type(unreadable).__name__}): the files "
                             f"as they were are in {path.parent / COPY}") from None


def check(data_dir: Path, *, migrates: bool = False) -> int | None:
    """The directory's format, if this memgate may open it (reading nothing but its format
    and migration files, writing nothing); else `FormatError`. `memgate up` (`migrates`) opens
    any older one; a command that reads it as it is, those from `READS_AS_IS` on, and none a
    migration left half-done."""
    found = format_of(data_dir)
    state = _state(data_dir)
    newest = found if state is None else max(found or 0, state.to)
    if newest is not None and newest > FORMAT:
        raise FormatError(
            f"{data_dir} is data directory format {newest}, this memgate reads formats up to "
            f"{FORMAT}: upgrade memgate to a release that reads format {newest}, or restore a "
            "backup taken before the upgrade into a new directory")
    if migrates:
        return found
    if state is not None:
        raise FormatError(f"a migration of {data_dir} did not finish: run `memgate up` on it "
                          "to finish it")
    if found is not None and found < READS_AS_IS:
        raise FormatError(f"{data_dir} is data directory format {found}, older than this "
                          f"memgate reads as it is ({READS_AS_IS}): run `memgate up` on it once "
                          "to migrate it")
    return found


def _write_json(path: Path, value: dict[str, Any]) -> None:
    """`path` replaced whole, on disk before this returns (a kill leaves the old or the new)."""
    written = path.with_name(path.name + ".tmp")
    fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(value, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(written, path)
    _sync_directory(path.parent)


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stamp(data_dir: Path, format_: int = FORMAT) -> None:
    """Write the format into `data_dir` (this memgate's: a new one, or one a restore built)."""
    _write_json(data_dir / FORMAT_FILE, {"format": format_})


def _copy(data_dir: Path, steps: list[Step], copy: Path) -> tuple[int, int]:
    """The files `steps` change, copied under `copy` (made anew); (files, bytes)."""
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True, mode=0o700)
    files = size = 0
    for pattern in sorted({glob for step in steps for glob in step.touches}):
        for path in sorted(data_dir.glob(pattern)):
            if not path.is_file() or path.is_relative_to(data_dir / MIGRATING):
                continue
            target = copy / path.relative_to(data_dir)
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            shutil.copy2(path, target)
            with open(target, "rb") as copied:
                os.fsync(copied.fileno())
            files, size = files + 1, size + path.stat().st_size
    return files, size


def _save(data_dir: Path, state: Migration) -> None:
    _write_json(data_dir / MIGRATING / STATE, {"from": state.from_, "to": state.to,
                                               "copied": state.copied, "done": list(state.done)})


def migrate(data_dir: Path, *, say: Callable[[str], None]) -> None:
    """Bring the locked `data_dir` to `FORMAT`: a new directory is stamped; an older one is
    copied (what the steps change), migrated step by step with progress through `say`, then
    stamped; a migration left half-done is resumed where it stopped."""
    found = check(data_dir, migrates=True)
    state = _state(data_dir)
    if state is None:
        if found is None:
            stamp(data_dir)
            return
        if found == FORMAT:
            return
        state = Migration(found, FORMAT)
        (data_dir / MIGRATING).mkdir(exist_ok=True, mode=0o700)
        _save(data_dir, state)
        say(f"migrating {data_dir} from data directory format {found} to {FORMAT}")
    else:
        say(f"resuming the migration of {data_dir} from data directory format {state.from_} "
            f"to {state.to}")
    _finish(data_dir, state, say)
    if state.to < FORMAT:  # begun by an older memgate, to a format before this one's
        migrate(data_dir, say=say)


def _finish(data_dir: Path, state: Migration, say: Callable[[str], None]) -> None:
    copy = data_dir / MIGRATING / COPY
    steps = [step for step in STEPS if state.from_ < step.to <= state.to]
    if not state.copied:
        files, size = _copy(data_dir, steps, copy)
        say(f"copied {files} files ({size / 1e6:.1f} MB) that the steps change into {copy}, "
            "kept until the migration is done")
        state = replace(state, copied=True)
        _save(data_dir, state)
    for number, step in enumerate(steps, 1):
        if step.to in state.done:
            continue
        say(f"step {number}/{len(steps)}: format {step.to}: {step.does}")
        try:
            step.run(data_dir)
        except Exception as failed:
            raise MigrationError(
                f"the migration of {data_dir} to format {step.to} failed "
                f"({type(failed).__name__}: {failed}); the files as they were are in {copy}; "
                "`memgate up` resumes it") from failed
        state = replace(state, done=(*state.done, step.to))
        _save(data_dir, state)
    stamp(data_dir, state.to)
    shutil.rmtree(copy, ignore_errors=True)  # then the marker: killed between, it resumes
    shutil.rmtree(data_dir / MIGRATING)
    say(f"{data_dir} is data directory format {state.to}")


__all__ = ["FORMAT", "READS_AS_IS", "STEPS", "FormatError", "MigrationError", "Step", "check",
           "format_of", "migrate", "stamp"]
