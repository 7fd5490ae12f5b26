"""One DuckDB transaction: committed when the block ends, rolled back if it raises."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb


@contextmanager
def transaction(db: duckdb.DuckDBPyConnection) -> Iterator[None]:
    db.begin()
    try:
        yield
    except BaseException:
        db.rollback()
        raise
    db.commit()
