"""The host's side of memgate (issue 28, findings 12, 14, 15, 16, 17): its processes do not
outlive it, its data directory is its own and private, the command line finds its NATS, each
NATS login may do only what its kind does, and compose runs it locked down."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import yaml

from tests.conftest import ADMIN_TOKEN, Memgate, eventually, free_port
from tests.test_bus_permissions import Violations
from tests.test_processes import alive, children, healthy

OPERATOR = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Up:
    process: asyncio.subprocess.Process
    http: httpx.AsyncClient
    nats_port: int
    log: Path

    async def interrupted(self) -> None:
        self.process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(self.process.wait(), 60)
        assert code == 0, f"memgate up exited {code}:\n{self.log.read_text()[-4000:]}"


def up_command(data_dir: Path, http_port: int) -> list[str]:
    return [sys.executable, "-m", "memgate.adapters", "up", "--data-dir", str(data_dir),
            "--http", f"127.0.0.1:{http_port}"]


def up_environment(nats_port: int, **env: str) -> dict[str, str]:
    return {**os.environ, "MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN,
            "MEMGATE_NATS_PORT": str(nats_port), **env}


def umask_022() -> None:
    os.umask(0o022)  # the usual default: what memgate must not rely on


@asynccontextmanager
async def memgate_up(data_dir: Path, *, nats_port: int | None = None,
                     http_port: int | None = None, **env: str) -> AsyncIterator[Up]:
    """`memgate up` under umask 022, healthy; killed at the end if the test did not stop it."""
    http_port, nats_port = http_port or free_port(), nats_port or free_port()
    log = data_dir.parent / f"memgate-up-{time.monotonic_ns()}.log"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            *up_command(data_dir, http_port), env=up_environment(nats_port, **env),
            stdout=output, stderr=output, preexec_fn=umask_022)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}",
                                     timeout=30) as http:
            up = Up(process, http, nats_port, log)

            async def serving() -> bool:
                assert process.returncode is None, log.read_text()[-4000:]
                return await healthy(http)

            await eventually(serving, timeout=90)
            yield up
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid`, with its command line."""
    found: dict[int, str] = {}
    below = [pid]
    while below:
        for child, cmdline in children(below.pop()).items():
            found[child] = cmdline
            below.append(child)
    return found


def nats_servers_on(data_dir: Path) -> list[int]:
    """The nats-servers whose JetStream store is under `data_dir`."""
    store = str(data_dir / "nats" / "jetstream")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[0].endswith(b"nats-server") and store.encode() in cmdline and alive(
                int(entry.name)):
            found.append(int(entry.name))
    return found


# --- 12: processes that do not outlive memgate up; one memgate per data directory ---


@pytest.mark.timeout(240)
async def test_a_supervisor_killed_outright_takes_its_processes_along_and_the_next_up_serves(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    nats_port, http_port = free_port(), free_port()
    started = time.monotonic()
    async with memgate_up(data, nats_port=nats_port, http_port=http_port) as first:
        first_start = time.monotonic() - started  # this machine's start, at its present load
        left = descendants(first.process.pid)
        assert any("nats-server" in cmdline for cmdline in left.values())
        assert sum("memgate.app.process" in cmdline for cmdline in left.values()) == 3
        killed = time.monotonic()
        first.process.kill()  # an OOM kill: no code of memgate's runs
        await first.process.wait()

        async def all_gone() -> bool:
            return not any(alive(pid) for pid in left)

        await eventually(all_gone, timeout=10)
        gone_after = time.monotonic() - killed

    # the same ports and directory, no manual step
    restarted = time.monotonic()
    async with memgate_up(data, nats_port=nats_port, http_port=http_port) as second:
        healthy_after = time.monotonic() - killed
        # nothing the kill left behind is waited out (a lease, a lock, a port): the next up
        # starts about as fast as the first did (the bound a ratio: CI machines are loaded)
        second_start = time.monotonic() - restarted
        assert second_start < 2 * first_start + 3, \
            f"the next up took {second_start:.1f} s, the first {first_start:.1f} s"
        assert nats_servers_on(data) == [next(pid for pid, cmdline in
                                              descendants(second.process.pid).items()
                                              if "nats-server" in cmdline)]
        await second.interrupted()
    print(f"orphans gone after {gone_after:.2f} s; the next up healthy after "
          f"{healthy_after:.2f} s")


def test_the_parent_death_signal_follows_the_thread_that_started_the_child() -> None:
    """Why memgate starts its children from the loop thread (`bus.lifetime`): a child started
    from a thread that exits is sent its signal then, though the process lives on."""
    import threading

    from memgate.bus.lifetime import die_with_parent

    started: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(target=lambda: started.append(subprocess.Popen(
        ["sleep", "60"], preexec_fn=die_with_parent())))
    thread.start()
    thread.join()
    assert started[0].wait(timeout=10) == -signal.SIGTERM
    here = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent())
    try:
        assert here.poll() is None  # this thread lives: so does its child
    finally:
        here.kill()
        here.wait()


@pytest.mark.timeout(180)
async def test_a_second_memgate_up_on_a_data_directory_in_use_refuses_with_a_clear_message(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with memgate_up(data) as first:
        second = await asyncio.to_thread(
            subprocess.run, up_command(data, free_port()), env=up_environment(free_port()),
            capture_output=True, text=True, timeout=60)
        assert second.returncode == 1, second.stdout + second.stderr
        assert f"already runs on {data}" in second.stderr
        assert f"pid {first.process.pid}" in second.stderr
        assert len(nats_servers_on(data)) == 1  # no second JetStream on the same store
        assert await healthy(first.http)
        await first.interrupted()


# --- 16: files 0600 and directories 0700 whatever the umask; a RAM directory of our own ---


def modes(root: Path) -> dict[str, str]:
    """Every file and directory under `root` (itself included) that is not private."""
    wrong = {}
    for path in [root, *root.rglob("*")]:
        found = path.lstat()
        if stat.S_ISLNK(found.st_mode):
            continue
        want = 0o700 if stat.S_ISDIR(found.st_mode) else 0o600
        if stat.S_IMODE(found.st_mode) != want:
            wrong[str(path.relative_to(root))] = f"{stat.S_IMODE(found.st_mode):04o}"
    return wrong


def ram_directories(data: Path) -> list[Path]:
    return [path for path in Path("/dev/shm").glob(f"memgate-{os.getuid()}/*")
            if (path / "ORIGIN").exists()
            and (path / "ORIGIN").read_text() == str(data.resolve())]


@pytest.mark.timeout(180)
async def test_under_umask_022_every_file_memgate_writes_is_0600_and_every_directory_0700(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "nats").mkdir(parents=True)  # as an older memgate left them, under umask 022
    (data / "nats" / "internal.secret").write_text("made-by-an-older-memgate")
    (data / "users-own-notes.txt").write_text("not memgate's")
    for path, mode in ((data, 0o755), (data / "nats", 0o755),
                       (data / "nats" / "internal.secret", 0o644),
                       (data / "users-own-notes.txt", 0o644)):
        os.chmod(path, mode)
    async with memgate_up(data) as up:
        created = (await up.http.post("/api/admin/workspaces", json={"name": "acme"},
                                      headers=OPERATOR)).json()
        ws = created["workspaceId"]
        owner = {"Authorization": f"Bearer {created['owner']['memberToken']}"}
        await up.http.put(f"/api/w/{ws}/ask-history/settings",
                          json={"agentMemoriesEnabled": True}, headers=owner)
        token = (await up.http.post(f"/api/w/{ws}/credentials", headers=owner, json={
            "name": "bot", "scopes": ["memory:read", "memory:write"]})).json()["token"]
        bearer = {"Authorization": f"Bearer {token}"}
        memories = "/api/agent/v1/memories"
        stored = (await up.http.post(f"{memories}/remember", headers=bearer, json={
            "namespace": "prefs", "text": "jane@example.com reviews on Mondays"})).json()
        assert (await up.http.post(f"{memories}/forget", headers=bearer, json={
            "memoryId": stored["memoryId"]})).status_code == 200
        await up.interrupted()
    expected = {"directory.duckdb", "spaces.duckdb", "sessions.duckdb", "audit"}
    assert expected <= {path.name for path in data.iterdir()}
    assert any((data / "audit").iterdir())
    assert modes(data) == {"users-own-notes.txt": "0644"}  # not memgate's: left as it was
    assert ram_directories(data) and all(modes(path) == {} for path in ram_directories(data))


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from memgate.app import ram

    shm = tmp_path / "shm"
    shm.mkdir(mode=0o1777)
    monkeypatch.setattr(ram, "RAM", shm)
    return shm


def test_a_ram_directory_someone_else_made_or_left_open_is_refused(shm: Path,
                                                                    tmp_path: Path) -> None:
    from memgate.app import ram

    data = tmp_path / "data"
    root = ram.text_index_root(data, "p0", None)
    base = shm / f"memgate-{os.getuid()}"
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)  # made by someone ahead of memgate, open to every user
    with pytest.raises(ram.RamDirectoryError, match="mode 0755"):
        ram.claim(data, root)
    assert not root.exists()
    os.chmod(base, 0o700)
    if os.getuid() == 0:  # only root can give a directory away
        os.chown(base, 12345, 12345)
        with pytest.raises(ram.RamDirectoryError, match="uid 12345"):
            ram.claim(data, root)
        os.chown(base, 0, 0)
    base.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    base.symlink_to(elsewhere)  # a link to where its maker reads
    with pytest.raises(ram.RamDirectoryError, match="not a directory"):
        ram.claim(data, root)
    assert list(elsewhere.iterdir()) == []
    base.unlink()
    ram.claim(data, root)  # memgate's own: used
    assert root.is_dir() and stat.S_IMODE(base.stat().st_mode) == 0o700


# --- 17: each NATS login does only what its kind does; revocation needs no lost message ---


async def test_the_recall_login_reads_storage_but_may_not_remember_forget_or_purge(
        memgate: Memgate) -> None:
    violations = Violations()
    nc = await nats.connect(memgate.nats_url, error_cb=violations.callback,
                            **memgate.bus.login("recall"))
    try:
        for operation in ("remember", "forget", "purge", "reap", "subject", "texts"):
            subject = f"mem.int.store.p0.{operation}"
            await nc.publish(subject, b"{}")
            await violations.wait_for(f'publish to "{subject}"')
        for operation in ("scope", "rows"):  # what recall asks: answered, not refused
            answer = await nc.request(f"mem.int.store.p0.{operation}", b"{}", timeout=5)
            assert json.loads(answer.data)["error"]["code"] == "VALIDATION_ERROR"
        assert not any("scope" in seen or "rows" in seen for seen in violations.seen)
    finally:
        await nc.close()


async def test_no_internal_login_may_delete_purge_or_snapshot_the_event_streams(
        memgate: Memgate) -> None:
    from memgate.bus.logins import ROLES

    for kind in (kind for kind, role in ROLES.items() if role.jetstream):
        violations = Violations()
        nc = await nats.connect(memgate.nats_url, error_cb=violations.callback,
                                **memgate.bus.login(kind))
        try:
            for api in ("STREAM.DELETE.MEM_EVT", "STREAM.PURGE.MEM_EVT",
                        "STREAM.MSG.DELETE.MEM_EVT", "STREAM.SNAPSHOT.MEM_EVT",
                        "CONSUMER.DELETE.MEM_EVT.indexer-p0"):
                subject = f"$JS.API.{api}"
                await nc.publish(subject, b"{}")
                await violations.wait_for(f'publish to "{subject}"')
            assert (await nc.jetstream().stream_info("MEM_EVT")).config.name == "MEM_EVT"
        finally:
            await nc.close()


async def test_a_revocation_takes_effect_for_a_governance_that_missed_its_announcement(
        memgate: Memgate) -> None:
    """A governance's principal cache that never hears `principals.changed` (it was
    reconnecting): the revoked credential is refused within the cache's bound all the same."""
    from memgate.bus.client import BusClient
    from memgate.contracts.errors import UnauthenticatedError
    from memgate.ports.directory import PRINCIPAL_TTL_S, BusDirectory, PrincipalCache
    from memgate.storage.directory import hash_token

    owner = await memgate.workspace()
    created = await memgate.ok("POST", f"/api/w/{owner.workspace_id}/credentials", owner.token,
                               {"name": "agent", "scopes": ["memory:read"]})
    nc = await memgate.internal("governance")  # its own connection: no announcement reaches it
    missed = PrincipalCache(BusDirectory(BusClient(nc, timeout=5)))
    token = hash_token(created["token"])
    assert (await missed.principal(token)).workspace_id == owner.workspace_id
    await memgate.ok("DELETE", f"/api/w/{owner.workspace_id}/credentials/"
                               f"{created['credentialId']}", owner.token)
    revoked = time.monotonic()

    async def refused() -> bool:
        try:
            await missed.principal(token)
        except UnauthenticatedError:
            return True
        return False

    await eventually(refused, timeout=PRINCIPAL_TTL_S + 1)
    assert time.monotonic() - revoked <= PRINCIPAL_TTL_S + 0.5
    assert PRINCIPAL_TTL_S <= 2.0


# --- 14: the command line finds a running memgate's NATS from its data directory ---


@pytest.mark.timeout(180)
async def test_backup_of_a_running_memgate_on_another_nats_port_needs_no_nats_flag(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with memgate_up(data) as up:  # NATS on a free port, not 4222
        await up.http.post("/api/admin/workspaces", json={"name": "acme"}, headers=OPERATOR)
        recorded = data / "run" / "nats.json"
        assert json.loads(recorded.read_text())["url"] == f"nats://127.0.0.1:{up.nats_port}"
        assert stat.S_IMODE(recorded.stat().st_mode) == 0o600
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMGATE_NATS")}
        done = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "memgate.adapters", "backup", "--data-dir", str(data),
            "--out", str(tmp_path / "backup.mgb")],
            env={**env, "MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN}, capture_output=True, text=True,
            timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["rows"] > 0
        await up.interrupted()
    assert not recorded.exists()  # a stopped memgate says nothing


@pytest.mark.timeout(180)
async def test_admin_commands_find_the_http_of_the_memgate_running_on_memgate_data_dir(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with memgate_up(data) as up:  # HTTP on a free port, not 8080
        env = {k: v for k, v in os.environ.items() if k not in ("MEMGATE_URL", "MEMGATE_NATS_URL")}
        done = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "memgate.adapters", "admin", "create-workspace", "acme"],
            env={**env, "MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN, "MEMGATE_DATA_DIR": str(data)},
            capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        workspace = json.loads(done.stdout)["workspaceId"]
        owner = {"Authorization": f"Bearer {json.loads(done.stdout)['owner']['memberToken']}"}
        assert (await up.http.get(f"/api/w/{workspace}/ask-history/settings",
                                  headers=owner)).status_code == 200
        await up.interrupted()


# --- 15: compose runs memgate locked down, with no default operator token ---


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "compose.yaml").read_text()))


def test_compose_publishes_no_nats_on_every_interface_and_has_no_default_operator_token(
        ) -> None:
    for name, service in compose()["services"].items():
        for mapping in service.get("ports", []):
            parts = str(mapping).split(":")
            if parts[-1].split("/")[0] == "4222":
                assert parts[0] == "127.0.0.1", f"{name} publishes NATS as {mapping}"
        assert not str(service.get("image", "")).startswith("nats"), (
            f"{name}: a NATS without memgate's accounts and logins")
        token = service.get("environment", {}).get("MEMGATE_ADMIN_TOKEN")
        if token is not None:  # compose refuses to start without it: no default
            assert re.fullmatch(r"\$\{MEMGATE_ADMIN_TOKEN:\?[^}]+\}", token), token


@pytest.mark.timeout(180)
async def test_memgate_as_compose_runs_it_lets_no_one_on_its_nats_without_a_login(
        tmp_path: Path) -> None:
    service = compose()["services"]["memgate"]
    env = {key: str(value) for key, value in service["environment"].items()
           if key != "MEMGATE_ADMIN_TOKEN"}
    assert env["MEMGATE_NATS_HOST"] == "0.0.0.0"
    async with memgate_up(tmp_path / "data", **env) as up:
        assert any(" -a 0.0.0.0 " in cmdline
                   for cmdline in descendants(up.process.pid).values())  # every interface
        url = f"nats://127.0.0.1:{up.nats_port}"
        for login in ({}, {"user": "memgate", "password": "guess"},
                      {"user": "memgate-adapter", "password": ""}):
            with pytest.raises(Exception, match=r"(?i)authorization"):
                await nats.connect(url, allow_reconnect=False, connect_timeout=5, **login)
        await up.interrupted()


def test_memgate_up_joined_to_a_nats_refuses_to_start_without_an_operator_token(
        tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MEMGATE_ADMIN_TOKEN"}
    done = subprocess.run([*up_command(tmp_path / "data", free_port()), "--nats",
                           f"nats://127.0.0.1:{free_port()}"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "set MEMGATE_ADMIN_TOKEN" in done.stderr
    assert not (tmp_path / "data" / "admin.token").exists()  # none made up
