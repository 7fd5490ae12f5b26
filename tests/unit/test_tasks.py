"""`tasks.cancelled`: a background task's end, even one that swallowed its cancellation."""

from __future__ import annotations

import asyncio

import pytest

from memgate.tasks import cancelled

pytestmark = pytest.mark.unit


async def test_a_task_that_swallows_its_cancellation_is_cancelled_again_until_it_ends() -> None:
    """What Python 3.11's `wait_for` can do to a request cancelled as its answer arrives
    (gh-86296): the loop around it catches the request's error and goes on."""
    swallowed = 0

    async def renewing() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # as if the request had answered: the loop goes on

    task = asyncio.create_task(renewing())
    await asyncio.sleep(0.02)
    async with asyncio.timeout(5):
        await cancelled(task, recancel_s=0.05)
    assert task.cancelled() and swallowed == 1


async def test_tasks_not_started_or_already_ended_are_fine() -> None:
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)
    await cancelled(None, done)
