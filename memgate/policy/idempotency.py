"""Idempotency keys (SPEC §6, "Idempotency keys"): what a retry sends again, made into what a
write keeps.

A caller's key may be anything, personal data included: only its SHA-256 is kept (`digest`).
A write whose answer is something new (a mem0 add's memories, a space, a session) keeps no
record of its own: the new thing's id is made from the member, the key's SHA-256 and its place
(`keyed`, `keyed_id`), so a retry finds what the first stored and answers with it; another
member's key, or another key, never makes the same id.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping

from memgate.contracts.errors import ValidationFailedError
from memgate.contracts.memory import IDEMPOTENCY_KEY_MAX

PARAM = "idempotencyKey"  # where a command's key travels beside its body (REST: the header)
_KEYED = uuid.UUID("5d1c2a7e-3f0b-4c59-9a8e-6b2f4e7d1a30")


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def key_hash(params: Mapping[str, str]) -> str | None:
    """The SHA-256 of a command's key (`PARAM`), checked like a body's; None without one."""
    key = params.get(PARAM)
    if key is None:
        return None
    if not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX:
        raise ValidationFailedError(f"an Idempotency-Key holds 1 to {IDEMPOTENCY_KEY_MAX} "
                                    "characters", {"field": "Idempotency-Key"})
    return digest(key)


def keyed(*scope: str) -> str:
    """A UUID (hex) made from `scope`: the same for the same scope, on every node."""
    return uuid.uuid5(_KEYED, ":".join(scope)).hex


def keyed_id(prefix: str, *scope: str) -> str:
    """`keyed`, shaped like the ids made at random for the same things (`<prefix>_<20 hex>`)."""
    return f"{prefix}_{keyed(*scope)[:20]}"


__all__ = ["PARAM", "digest", "key_hash", "keyed", "keyed_id"]
