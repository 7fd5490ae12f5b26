"""The layer table of docs/packages.md and the import-linter contracts that keep it
(`.importlinter`, run by `make check`) say the same."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.name for p in (ROOT / "memgate").iterdir()
                  if (p / "__init__.py").exists())
EVERYONES = {"observe"}  # every package may import it (docs/packages.md)


def table() -> dict[str, set[str]]:
    """Each package's "May import:" line in docs/packages.md, as the memgate packages it names."""
    text = (ROOT / "docs" / "packages.md").read_text()
    allowed = {}
    for package, body in re.findall(r"^## `memgate/(\w+)/`\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        line = re.search(r"^May import: (.*)$", body, re.M)
        assert line is not None, f"docs/packages.md says nothing of what {package} may import"
        allowed[package] = {name for name in re.findall(r"\w+", line.group(1))
                            if name in PACKAGES}
    return allowed


def contracts() -> dict[str, set[str]]:
    """Each contract's package, and the memgate packages it does not forbid."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    allowed = {}
    for section in config.sections():
        if not section.startswith("importlinter:contract:"):
            continue
        contract = config[section]
        assert contract["type"] == "forbidden"
        source = contract["source_modules"].strip().removeprefix("memgate.")
        forbidden = {m.strip().removeprefix("memgate.")
                     for m in contract["forbidden_modules"].split()}
        allowed[source] = set(PACKAGES) - forbidden - {source} - EVERYONES
    return allowed


def test_every_package_with_a_rule_in_the_table_has_the_same_rule_as_a_contract() -> None:
    written, kept = table(), contracts()
    ruled = {package for package in written if package not in {"app"}}  # app: everything
    assert ruled == set(kept), "a package whose table rule no contract keeps, or the reverse"
    for package in ruled:
        assert written[package] - EVERYONES == kept[package], package
