"""One writer per store (SPEC §6, `cluster.ownership`): a second process for a store that is
owned is refused, and a process that lost its lease commits nothing more, on real nats-servers,
real `memgate up` processes and real DuckDB files."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import nats
import pytest

from memgate.app.logins import internal_logins
from memgate.app.settings import Settings
from memgate.bus.logins import inbox_prefix
from memgate.contracts.errors import MemgateError
from memgate.cluster.lease import PartitionLease, holder, lease_bucket
from tests.conftest import Memgate, close_nats, eventually
from tests.test_processes import alive, group_pid, healthy, memgate_up, new_agent

pytestmark = pytest.mark.timeout(180)

LEASE_TTL_S = 3.0


async def actors_process(memgate: Memgate, data_dir: Path) -> tuple[int, str]:
    """`memgate actors --only storage.p0` on the memgate's NATS, with storage's login: its exit
    status and what it said."""
    login = memgate.bus.login("storage")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memgate.adapters", "actors", "--only", "storage.p0",
        "--nats", memgate.nats_url, "--data-dir", str(data_dir),
        env={**os.environ, "MEMGATE_NATS_USER": login["user"],
             "MEMGATE_NATS_PASSWORD": login["password"]},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, (out + err).decode()


async def test_a_second_process_for_an_owned_store_is_refused(memgate: Memgate,
                                                              tmp_path: Path) -> None:
    agent = await memgate.new_agent("bus")
    stored = await agent.remember("n", "the first owner keeps this")
    # on the owner's own disk, beside it: the lease is held by a live process
    code, said = await actors_process(memgate, memgate.settings.data_dir)
    assert code == 1, said
    assert "storage.p0 is owned by another process" in said
    # on a disk of its own: not the store's home either
    code, said = await actors_process(memgate, tmp_path / "elsewhere")
    assert code == 1, said
    assert "storage.p0 keeps its files on another data directory" in said
    assert not (tmp_path / "elsewhere" / "partitions").exists()  # it opened no store
    # the owner still serves, alone
    assert [m.memory_id for m in (await agent.list()).memories] == [stored.memory_id]
    again = await agent.remember("n", "and this")
    assert {m.memory_id for m in (await agent.list()).memories} == {stored.memory_id,
                                                                    again.memory_id}


async def test_a_stopped_owner_whose_lease_was_taken_commits_nothing_and_serves_again(
        tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with memgate_up(data_dir, MEMGATE_LEASE_TTL_S=str(LEASE_TTL_S)) as up:
        agent = await new_agent(up, up.http)
        kept = await agent.remember("n", "written while the store owned its lease")
        login = internal_logins(Settings(data_dir=data_dir))["storage"]
        nc = await nats.connect(up.nats_url, user=login.user, password=login.password,
                                inbox_prefix=inbox_prefix("storage"))
        try:
            kv = await lease_bucket(nc.jetstream())
            owner = await holder(kv, "storage.p0")
            assert owner is not None
            store = group_pid(up, "store")
            assert store is not None
            os.kill(store, signal.SIGSTOP)
            stopped_at = time.monotonic()
            intruder = PartitionLease(kv, "storage.p0", "intruder", ttl_s=LEASE_TTL_S,
                                      margin_s=0.6, renew_every_s=0.5)
            while await intruder.acquire() is None:  # once the stopped owner's lease ran out
                assert time.monotonic() - stopped_at < 30, "the lease never expired"
                await asyncio.sleep(0.1)
            intruder.keep()
            assert intruder.lease is not None and intruder.lease.epoch > owner.epoch
            # a remember reaches the stopped store process: it is handled once it runs again
            late = asyncio.create_task(agent.remember("n", "CANARY-after-the-lease-was-lost"))
            await asyncio.sleep(0.5)
            os.kill(store, signal.SIGCONT)
            with pytest.raises((MemgateError, TimeoutError)):  # refused, or never answered
                await late
            await eventually(lambda: _dead(store), timeout=30)  # it stopped serving
            await asyncio.sleep(2)  # its restarts are refused while the intruder holds it
            assert not await healthy(up.http)
            await intruder.release()
            await eventually(lambda: healthy(up.http), timeout=60)
            listed = await agent.list()
            assert [m.memory_id for m in listed.memories] == [kept.memory_id]
            for path in (data_dir / "partitions").rglob("*"):
                if path.is_file():
                    assert b"CANARY-after-the-lease-was-lost" not in path.read_bytes(), path
            taken = await holder(kv, "storage.p0")
            assert taken is not None and taken.epoch > intruder.lease.epoch
            assert "lost the lease of partition storage.p0" in up.log.read_text()
        finally:
            await close_nats(nc)
        await agent.close()
        await up.interrupted()


async def _dead(pid: int) -> bool:
    return not alive(pid)


def test_a_lease_held_by_a_process_that_exited_unreaped_is_taken_over(tmp_path: Path) -> None:
    """A container whose PID 1 reaps nobody keeps a killed holder as a zombie: it has exited,
    so its lease is free (found by CI: the next `memgate up` after a kill -9 was refused)."""
    import subprocess

    from memgate.cluster.lease import Lease
    from memgate.cluster.ownership import Disk

    disk = Disk.of(tmp_path, "n1")
    exited = subprocess.Popen(["true"])
    try:
        while alive(exited.pid):
            time.sleep(0.01)
        lease = Lease("directory", "n1", 1, 1, about={**disk.about(), "pid": exited.pid})
        assert disk.held_by_a_dead_process_here(lease)
        living = Lease("directory", "n1", 1, 1, about={**disk.about(), "pid": os.getppid()})
        assert not disk.held_by_a_dead_process_here(living)
    finally:
        exited.wait()


def _disk_of(data_dir: str, ids: multiprocessing.Queue[str]) -> None:
    from memgate.cluster.ownership import Disk

    ids.put(Disk.of(Path(data_dir), None).disk)


def test_the_processes_of_one_memgate_starting_together_agree_on_one_disk(
        tmp_path: Path) -> None:
    """`DIR/node.json` is made once: processes that start together on a new data directory
    read one disk id (the supervisor's children did race here: one failed to start)."""
    for attempt in range(10):
        data_dir = tmp_path / str(attempt)
        ids: multiprocessing.Queue[str] = multiprocessing.Queue()
        processes = [multiprocessing.Process(target=_disk_of, args=(str(data_dir), ids))
                     for _ in range(4)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(30)
        assert [p.exitcode for p in processes] == [0] * 4
        assert len({ids.get(timeout=5) for _ in processes}) == 1
