"""An unexpected error is logged with where it happened, never with what it was about."""

from __future__ import annotations

import logging

import pytest

from memgate.contracts.errors import InternalError
from memgate.storage import MemoryStore, Remember
from tests.conftest import Memgate

SECRET = "zebracorn-7f3a-the-vault-code-is-4711"


async def test_an_internal_error_logs_its_traceback_but_not_the_memory_text(
        memgate: Memgate, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def broken_remember(self: MemoryStore, items: list[Remember], *args: object) -> None:
        raise RuntimeError(f"could not store {items[0].text!r}")

    monkeypatch.setattr(MemoryStore, "_remember_all", broken_remember)
    agent = await memgate.new_agent("bus")
    with caplog.at_level(logging.ERROR, logger="memgate"), pytest.raises(InternalError):
        await agent.remember("notes", f"remember this: {SECRET}")
    await agent.close()

    logged = caplog.text
    assert "builtins.RuntimeError" in logged
    assert 'test_error_logs.py", line' in logged and "in broken_remember" in logged
    assert "memgate/actors/storage.py" in logged  # the frames of the real path
    assert SECRET not in logged
    assert "vault" not in logged
