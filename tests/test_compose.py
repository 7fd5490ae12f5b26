"""compose.yaml is for users with a container engine; here it must parse and name real commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from memgate.app.settings import Settings
from memgate.bus import nats_server_binary

ROOT = Path(__file__).resolve().parent.parent


def options(command: list[str]) -> list[str]:
    return [arg for arg in command if arg.startswith("-")]


def test_compose_parses_and_its_command_lines_exist() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"memgate"}  # its NATS is memgate's embedded, locked-down server

    memgate = services["memgate"]["command"]
    assert memgate[:2] == ["memgate", "up"]
    help_text = subprocess.run([sys.executable, "-m", "memgate.adapters", "up", "--help"],
                               capture_output=True, text=True, check=True).stdout
    for option in options(memgate):
        assert option in help_text, option
    assert "--nats" not in memgate
    assert nats_server_binary().exists()  # what the image runs as its NATS
    assert set(services["memgate"]["environment"]) <= {
        f"MEMGATE_{name.upper()}" for name in Settings.model_fields}


def test_the_container_has_room_for_the_text_indexes_in_ram() -> None:
    """The indexes live in /dev/shm (`app/ram.py`); an engine gives it 64 MB unless told."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    size = compose["services"]["memgate"]["shm_size"]
    assert size.endswith("gb") and float(size[:-2]) >= 1
