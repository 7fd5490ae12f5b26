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
    # their NATS is memgate's embedded, locked-down server
    assert set(services) == {"memgate", "node1", "node2", "node3"}

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


def test_the_cluster_profile_is_three_nodes_with_a_volume_each_routed_to_one_another() -> None:
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    nodes = {name: services[name] for name in ("node1", "node2", "node3")}
    help_text = subprocess.run([sys.executable, "-m", "memgate.adapters", "up", "--help"],
                               capture_output=True, text=True, check=True).stdout
    volumes, routes = set(), set()
    for name, service in nodes.items():
        assert service["profiles"] == ["cluster"]  # `docker compose up` alone: one node
        command = service["command"]
        assert command[:2] == ["memgate", "up"]
        for option in options(command):
            assert option in help_text, option
        assert command[command.index("--node") + 1] == name
        port = command[command.index("--cluster") + 1].rsplit(":", 1)[1]
        assert f"nats://{name}:{port}" in command[command.index("--routes") + 1].split(",")
        routes.add(command[command.index("--routes") + 1])
        volumes.add(service["volumes"][0].split(":")[0])
        assert service["environment"]["MEMGATE_ADMIN_TOKEN"].startswith("${MEMGATE_ADMIN_TOKEN:?")
        assert float(service["shm_size"][:-2]) >= 1
    assert len(routes) == 1 and len(volumes) == 3  # one cluster, a disk per node
    assert Settings(routes=next(iter(routes)).split(",")).stream_replicas() == 3


def test_the_container_has_room_for_the_text_indexes_in_ram() -> None:
    """The indexes live in /dev/shm (`app/ram.py`); an engine gives it 64 MB unless told."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    size = compose["services"]["memgate"]["shm_size"]
    assert size.endswith("gb") and float(size[:-2]) >= 1


def test_routes_naming_the_two_other_nodes_or_all_three_both_keep_three_copies() -> None:
    """NATS's usual form names the other nodes only; memgate's compose file names all three.
    Either is a cluster of three: every stream and bucket keeps three copies."""
    others = ["nats://10.0.0.2:6222", "nats://10.0.0.3:6222"]
    assert Settings(cluster="10.0.0.1:6222", routes=others).stream_replicas() == 3
    every = ["nats://10.0.0.1:6222", *others]
    assert Settings(cluster="10.0.0.1:6222", routes=every).stream_replicas() == 3
    assert Settings(cluster="10.0.0.1:6222", routes=others[:1]).stream_replicas() == 1
    assert Settings(cluster="10.0.0.1:6222", routes=[]).stream_replicas() == 1
