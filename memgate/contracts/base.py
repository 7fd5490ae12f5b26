"""The base of every contract: frozen, closed, camelCase on the wire."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Contract(BaseModel):
    """A frozen value object; JSON field names are camelCase, Python names snake_case."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


def as_utc(value: datetime | None) -> datetime | None:
    """Naive instants are read as UTC; aware ones are converted to UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


__all__ = ["Contract", "as_utc"]
