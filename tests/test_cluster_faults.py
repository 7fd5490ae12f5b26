"""A generated fault schedule over three `memgate up` nodes under load (issue 47), the short
one CI runs (`python -m bench.faults` runs longer ones): seeded, one of each fault, one node
at a time (a majority always stays: JetStream's quorum):

- kill -9 of a node's whole process tree, started again on its disk;
- SIGSTOP of a node's tree past its leases, then SIGCONT;
- kill -9, the node's data directory deleted, started again empty.

Four REST agents, each in a workspace of its own, remember under idempotency keys
through random live nodes all along. Once
every node is healthy again, `bench.faults.check` lists the memories through every node:
every acknowledged write listed exactly once through every node, with the id it was answered;
no write answered 503 visible; a write that timed out or answered 504 visible at most once,
and its retry with the same key answers the memory listed; the nodes' listings equal."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.faults import FAILURES, KINDS, schedule, under_faults

pytestmark = pytest.mark.timeout(420)

SEED = 1  # its three faults: a kill, a stop, a wipe (the test checks it)


async def test_a_fault_schedule_loses_no_acknowledged_write_and_shows_no_refused_one(
        tmp_path: Path) -> None:
    faults = schedule(SEED, len(KINDS))
    assert {fault.kind for fault in faults} == set(KINDS)

    found = (await under_faults(tmp_path, faults, agents=4, seed=SEED)).found

    assert found["acknowledged"] > 100
    assert {name: found[name] for name in FAILURES} == dict.fromkeys(FAILURES, 0), found
    assert found["other answers"] == 0, found
