"""Where the Tantivy indexes live (`app/ram.py`): a RAM directory per data directory, removed
once its data directory is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from memgate.app import ram
from memgate.app.settings import Settings

pytestmark = pytest.mark.unit


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(ram, "RAM", tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    return tmp_path / "shm"


def test_each_data_directory_has_its_own_ram_directory(shm: Path, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    root = ram.text_index_root(one, "p0", None)
    assert shm in root.parents and root.name == "p0"
    assert ram.text_index_root(two, "p0", None).parent != root.parent
    assert ram.text_index_root(one, "p1", None).parent == root.parent
    configured = tmp_path / "indexes"
    assert ram.text_index_root(one, "p0", configured) == configured / "p0"
    assert Settings(data_dir=one).text_index("p0") == root


def test_without_a_ram_disk_the_indexes_stay_under_the_data_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ram, "RAM", tmp_path / "none")
    data = tmp_path / "data"
    assert ram.text_index_root(data, "p0", None) == data / "partitions" / "p0" / "text-index"
    ram.claim(data, data / "partitions" / "p0" / "text-index")  # nothing to claim
    assert not (tmp_path / "none").exists()


def test_a_ram_directory_goes_once_its_data_directory_is_gone(shm: Path, tmp_path: Path) -> None:
    kept, gone = tmp_path / "kept", tmp_path / "gone"
    kept.mkdir()
    gone.mkdir()
    kept_root = ram.text_index_root(kept, "p0", None)
    gone_root = ram.text_index_root(gone, "p0", None)
    ram.claim(kept, kept_root)
    ram.claim(gone, gone_root)
    (gone_root / "owner").mkdir()
    assert (gone_root.parent / ram.ORIGIN).read_text() == str(gone.resolve())
    gone.rmdir()
    ram.claim(kept, kept_root)  # the next start
    assert kept_root.is_dir()
    assert not gone_root.parent.exists()
    base = kept_root.parent.parent
    assert base.stat().st_mode & 0o777 == 0o700  # private to the user: masked memory words
