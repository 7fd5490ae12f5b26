"""memgate installs as one package, `memgate`, typed, beside an agent project's own folders."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

AGENT = """
import pathlib

import storage  # the agent project's own package, not memgate's
from memgate import MemgateClient, NotFoundError
from memgate.storage import Filters
import memgate.actors, memgate.adapters, memgate.app

assert storage.FOREIGN
assert "site-packages" in memgate.actors.__file__, memgate.actors.__file__
assert (pathlib.Path(memgate.__file__).parent / "py.typed").is_file()
assert (pathlib.Path(memgate.__file__).parent / "embedding/models/minilm/tokenizer.json").is_file()
print(MemgateClient.__name__, NotFoundError.__name__, Filters.__name__)
"""

TYPED_AGENT = """
from memgate import MemgateClient, RecallResult

async def first_text(memory: MemgateClient) -> str:
    result: RecallResult = await memory.recall("which weekday?")
    return result.memories[0].text
"""


def _agent_project(tmp_path: Path) -> Path:
    """A project with folders named like memgate's parts; `storage` is a real package of its own."""
    project = tmp_path / "agent"
    for name in ("storage", "actors", "bus", "contracts", "adapters"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text("FOREIGN = True\n")
    return project


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with `pip install .` (not editable); dependencies come from the test venv."""
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = Path(subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        text=True).strip())
    # Dependencies only: a plain path entry does not run the test venv's editable-install hook.
    (purelib / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--no-deps", str(ROOT)], check=True, timeout=300)
    return python


def test_pip_install_puts_one_top_level_package_into_site_packages(installed: Path) -> None:
    purelib = Path(subprocess.check_output(
        [installed, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        text=True).strip())
    top = sorted(p.name for p in purelib.iterdir()
                 if not p.name.endswith((".dist-info", ".pth")) and p.name != "__pycache__")
    assert top == ["memgate"]


def test_an_agent_with_its_own_storage_package_imports_memgate(installed: Path,
                                                               tmp_path: Path) -> None:
    project = _agent_project(tmp_path)
    done = subprocess.run([installed, "-c", AGENT], cwd=project, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["MemgateClient", "NotFoundError", "Filters"]


def test_the_editable_install_ignores_an_agent_projects_folders(tmp_path: Path) -> None:
    project = _agent_project(tmp_path)
    script = AGENT.replace('assert "site-packages" in memgate.actors.__file__, '
                           'memgate.actors.__file__', "")
    done = subprocess.run([sys.executable, "-c", script], cwd=project, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_an_agents_type_checker_sees_the_client_typed(installed: Path, tmp_path: Path) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(TYPED_AGENT)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--python-executable", str(installed), str(agent)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_admin_command_line_loads_neither_nats_nor_the_actors() -> None:
    """An admin command is an HTTP client: importing the command line, the settings and the
    agent's contracts leaves NATS, faststream, the actors, FastAPI and the MCP SDK unloaded, and
    the client is still there when asked for."""
    probe = ("import sys, memgate.adapters.cli\n"
             "heavy = ['nats', 'faststream', 'memgate.actors', 'memgate.app.system', 'fastapi',"
             " 'mcp', 'duckdb', 'onnxruntime']\n"
             "print([name for name in heavy if name in sys.modules])\n"
             "from memgate import MemgateClient\n"
             "print(MemgateClient.__module__, 'nats' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.splitlines()
    assert out == ["[]", "memgate.bus.client True"]
