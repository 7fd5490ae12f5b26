"""What `memgate up` runs in its children, and the environment it gives them (`app/layout`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memgate.app.layout import FRONT, child_environment, groups
from memgate.app.settings import Settings
from memgate.bus import subjects

pytestmark = pytest.mark.unit


def test_children_get_the_settings_and_one_blas_thread(tmp_path: Path) -> None:
    env = child_environment({"PATH": "/bin"}, Settings(data_dir=tmp_path, workers=3))
    assert env["PATH"] == "/bin"
    assert env["MEMGATE_WORKERS"] == "3"
    assert env["MEMGATE_DATA_DIR"] == str(tmp_path.resolve())
    assert env["MEMGATE_EMBEDDING_COMPUTE"] == "int8"
    assert env["OPENBLAS_NUM_THREADS"] == "1"  # numpy's spinning BLAS threads


def test_a_blas_setting_of_the_users_stays(tmp_path: Path) -> None:
    env = child_environment({"OPENBLAS_NUM_THREADS": "4"}, Settings(data_dir=tmp_path))
    assert env["OPENBLAS_NUM_THREADS"] == "4"


def test_children_ask_for_huge_pages_and_keep_the_users_tunables(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert child_environment({}, settings)["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    mine = "glibc.malloc.arena_max=2"
    assert (child_environment({"GLIBC_TUNABLES": mine}, settings)["GLIBC_TUNABLES"]
            == f"{mine}:glibc.malloc.hugetlb=1")
    off = "glibc.malloc.hugetlb=0"
    assert child_environment({"GLIBC_TUNABLES": off}, settings)["GLIBC_TUNABLES"] == off


def test_each_public_command_is_taken_from_the_bus_by_one_group_only(tmp_path: Path) -> None:
    layout = {g.name: g for g in groups(Settings(data_dir=tmp_path))}
    assert layout["store"].governs == {subjects.REMEMBER, subjects.LIST, subjects.FORGET,
                                       subjects.IMPORT}
    assert layout[FRONT].governs == {subjects.RECALL}  # beside recall
    assert all("governance" in layout[name].actors for name in ("store", FRONT))
    assert "governance" not in layout["index"].actors
