"""Rows read by their columns' names: a store's row type takes a query's columns (or its
aliases) as keywords, so a column added, dropped or reordered cannot shift a value into
another field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import duckdb

T = TypeVar("T")


def named(kind: Callable[..., T], result: duckdb.DuckDBPyConnection,
          **convert: Callable[[Any], Any]) -> list[T]:
    """Each row of `result` (an executed query) as `kind(column=value, ...)`, `convert`
    applied to the columns it names."""
    columns = [column[0] for column in result.description or ()]
    rows = []
    for values in result.fetchall():
        row = dict(zip(columns, values, strict=True))
        for column, change in convert.items():
            row[column] = change(row[column])
        rows.append(kind(**row))
    return rows
