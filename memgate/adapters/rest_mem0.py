"""REST routes: the mem0-compatible routes under /memory/{spaceId} (SPEC §4.4). Bus clients only."""

from __future__ import annotations

from fastapi import APIRouter

from memgate.adapters.routing import Mark, Send


def router(send: Send, mark: Mark) -> APIRouter:
    return APIRouter()  # routes are added here
