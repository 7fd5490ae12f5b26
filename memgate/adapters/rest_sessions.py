"""REST routes: sessions and events of memory spaces (SPEC §4.2, §4.3). Bus clients only."""

from __future__ import annotations

from fastapi import APIRouter

from memgate.adapters.routing import Mark, Send


def router(send: Send, mark: Mark) -> APIRouter:
    return APIRouter()  # routes are added here
