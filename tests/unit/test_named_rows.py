"""A store reads its rows by the columns' names (`storage.named`): a table whose columns stand in
another order than the row's fields (a column added by a later release, a file rewritten)
still reads each value into its own field."""

from __future__ import annotations

import duckdb
import pytest

from memgate.storage.directory import MemberRow
from memgate.storage.named import named

pytestmark = pytest.mark.unit


def test_a_row_is_read_by_its_columns_names_whatever_their_order() -> None:
    db = duckdb.connect()
    db.execute("CREATE TABLE members (memory_spaces_enabled BOOLEAN, token_hash VARCHAR, "
               "role VARCHAR, name VARCHAR, workspace_id VARCHAR, member_id VARCHAR)")
    db.execute("INSERT INTO members VALUES (true, 'h', 'owner', 'Ada', 'ws_1', 'mb_1')")

    rows = named(MemberRow, db.execute("SELECT * FROM members"), name=str.upper)

    assert rows == [MemberRow(member_id="mb_1", workspace_id="ws_1", name="ADA", role="owner",
                              token_hash="h", memory_spaces_enabled=True)]
