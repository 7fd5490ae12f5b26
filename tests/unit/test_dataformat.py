"""A data directory's format (`app/dataformat.py`): stamped when new, an older one migrated step
by step after a copy of what the steps change, a killed migration resumed, a newer one refused
before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memgate.app import dataformat
from memgate.app.dataformat import FormatError, Step

pytestmark = pytest.mark.unit


class Killed(BaseException):
    """What a kill -9 leaves: the step stopped where it was, nothing after it ran."""


def listing(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def format_0(tmp_path: Path) -> Path:
    """A directory as a memgate before formats left it (its files, no format.json)."""
    data = tmp_path / "data"
    (data / "partitions" / "p0").mkdir(parents=True)
    (data / "directory.duckdb").write_bytes(b"rows")
    (data / "partitions" / "p0" / "memories.duckdb").write_bytes(b"memories")
    return data


def written_format(data: Path) -> int:
    return int(json.loads((data / "format.json").read_text())["format"])


def test_a_new_directory_is_stamped_with_this_format_silently(tmp_path: Path) -> None:
    said: list[str] = []
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / ".lock").write_text("1\n")  # what `memgate up` wrote before
    dataformat.migrate(tmp_path / "data", say=said.append)
    assert written_format(tmp_path / "data") == dataformat.FORMAT == 1
    assert said == []


def test_a_directory_without_a_format_is_format_0_and_migrated_with_progress(
        tmp_path: Path) -> None:
    data = format_0(tmp_path)
    before = listing(data)
    said: list[str] = []
    assert dataformat.check(data) == 0  # read as it is by the offline commands
    dataformat.migrate(data, say=said.append)
    assert said == [f"migrating {data} from data directory format 0 to 1",
                    f"copied 0 files (0.0 MB) that the steps change into {data}/migrating/copy, "
                    "kept until the migration is done",
                    "step 1/1: format 1: stamp the format (the files stay as they are)",
                    f"{data} is data directory format 1"]
    assert written_format(data) == 1
    assert listing(data) == {**before, "format.json": listing(data)["format.json"]}
    stamped, again = listing(data), list[str]()
    dataformat.migrate(data, say=again.append)
    assert again == [] and listing(data) == stamped  # migrated once


def test_a_newer_directory_is_refused_in_one_line_and_nothing_is_written(
        tmp_path: Path) -> None:
    data = format_0(tmp_path)
    (data / "format.json").write_text('{"format": 2}')
    before = listing(data)
    for migrates in (True, False):
        with pytest.raises(FormatError) as refused:
            dataformat.check(data, migrates=migrates)
        assert str(refused.value) == (
            f"{data} is data directory format 2, this memgate reads formats up to 1: upgrade "
            "memgate to a release that reads format 2, or restore a backup taken before the "
            "upgrade into a new directory")
    with pytest.raises(FormatError):
        dataformat.migrate(data, say=print)
    assert listing(data) == before


def test_a_migration_begun_by_a_newer_memgate_is_refused(tmp_path: Path) -> None:
    data = format_0(tmp_path)
    (data / "migrating").mkdir()
    (data / "migrating" / "state.json").write_text(
        '{"from": 1, "to": 2, "copied": true, "done": []}')
    with pytest.raises(FormatError, match="is data directory format 2"):
        dataformat.check(data, migrates=True)


@pytest.mark.parametrize("text", ["{", "[1]", '{"format": "1"}', '{"format": -1}', "{}"])
def test_an_unreadable_format_file_is_refused(tmp_path: Path, text: str) -> None:
    data = format_0(tmp_path)
    (data / "format.json").write_text(text)
    with pytest.raises(FormatError, match=r"format\.json"):
        dataformat.check(data, migrates=True)


def test_a_killed_migration_resumes_from_its_step_and_the_copy_is_kept_until_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = format_0(tmp_path)
    ran: list[int] = []

    def widen(directory: Path) -> None:  # idempotent: rewrites the file whole
        ran.append(2)
        (directory / "directory.duckdb").write_bytes(b"rows, wider")
        if ran.count(2) == 1:
            raise Killed

    def stamp_only(directory: Path) -> None:
        ran.append(1)

    monkeypatch.setattr(dataformat, "FORMAT", 2)
    monkeypatch.setattr(dataformat, "STEPS", (
        Step(1, "stamp", (), stamp_only), Step(2, "widen", ("*.duckdb",), widen)))
    with pytest.raises(Killed):
        dataformat.migrate(data, say=print)
    assert (data / "migrating" / "copy" / "directory.duckdb").read_bytes() == b"rows"
    assert json.loads((data / "migrating" / "state.json").read_text()) == {
        "from": 0, "to": 2, "copied": True, "done": [1]}
    assert not (data / "format.json").exists()
    with pytest.raises(FormatError, match="did not finish"):
        dataformat.check(data)  # the offline commands wait for `memgate up` to finish it

    said: list[str] = []
    dataformat.migrate(data, say=said.append)
    assert ran == [1, 2, 2]  # the killed step again, the one done not
    assert said[0] == f"resuming the migration of {data} from data directory format 0 to 2"
    assert said[1:] == ["step 2/2: format 2: widen", f"{data} is data directory format 2"]
    assert written_format(data) == 2
    assert (data / "directory.duckdb").read_bytes() == b"rows, wider"
    assert not (data / "migrating").exists()


def test_a_failed_step_leaves_the_migration_to_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = format_0(tmp_path)

    def fails(directory: Path) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(dataformat, "FORMAT", 2)
    monkeypatch.setattr(dataformat, "STEPS", (
        *dataformat.STEPS, Step(2, "fail", ("partitions/*/*.duckdb",), fails)))
    with pytest.raises(dataformat.MigrationError, match="disk full") as failed:
        dataformat.migrate(data, say=print)
    assert f"{data}/migrating/copy" in str(failed.value)
    assert (data / "migrating" / "copy" / "partitions" / "p0" / "memories.duckdb").exists()
