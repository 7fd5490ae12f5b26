"""A short generated fault schedule over three nodes under load (SPEC §6, "Many machines" and
"Idempotency"; issue 47): `bench.faults` with a fixed seed whose three faults are a kill -9, a
SIGSTOP past the lease and a data directory deleted before its node starts again. The long
schedule is `python -m bench.faults --faults N`."""

from __future__ import annotations

import argparse

import pytest

from bench.faults import FAILURES, run

pytestmark = pytest.mark.timeout(600)


async def test_a_fault_schedule_loses_no_acknowledged_write_and_shows_no_503(
        capsys: pytest.CaptureFixture[str]) -> None:
    found = await run(argparse.Namespace(seed=1, faults=3, agents=2, keep=False))
    assert found["acknowledged"] > 0, found
    assert {name: found[name] for name in FAILURES} == dict.fromkeys(FAILURES, 0), found
