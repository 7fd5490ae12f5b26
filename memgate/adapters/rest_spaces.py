"""REST routes: memory spaces and sharing (SPEC §4.1, §4.5). Bus clients only."""

from __future__ import annotations

from fastapi import APIRouter

from memgate.adapters.routing import Mark, Send


def router(send: Send, mark: Mark) -> APIRouter:
    return APIRouter()  # routes are added here
