"""One DuckDB transaction: committed when the block ends, rolled back if it raises, and never
committed by a process that lost its lease on the store (`cluster.fence`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from memgate.cluster import fence


@contextmanager
def transaction(db: duckdb.DuckDBPyConnection) -> Iterator[None]:
    db.begin()
    try:
        yield
    except BaseException:
        db.rollback()
        raise
    try:
        fence.check()
    except BaseException:
        db.rollback()
        raise
    db.commit()
