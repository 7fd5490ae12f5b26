"""The audit log (SPEC §5.5): hash-chained, references only; `memgate audit verify` finds
every kind of tampering and names the first bad entry; the audit actor logs what storage
deletes and what other actors append."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memgate.storage.audit import AuditEntry, AuditLog, verify
from tests.conftest import Memgate, eventually
from tests.test_backup import cli
from tests.test_erasure import recall, remember

CANARY = "auditcanaryxq9"


def written(root: Path, entries: int = 5) -> Path:
    log = AuditLog(root, now=lambda: datetime(2025, 1, 1, tzinfo=UTC))
    for n in range(entries):
        log.append(AuditEntry(action="memories_deleted", actor="storage.p0", tenant="ws_1",
                              subject_id=f"mb_{n}", layer="memory_store",
                              record_ids=(f"m{n}",)))
    return root / "audit.log"


def edit(lines: list[bytes]) -> list[bytes]:
    entry = json.loads(lines[2])
    entry["count"] = 7
    return [*lines[:2], json.dumps(entry, sort_keys=True, separators=(",", ":")).encode(),
            *lines[3:]]


def edit_and_rehash(lines: list[bytes]) -> list[bytes]:
    """An editor who also recomputes the edited entry's own hash: the next entry's prev breaks."""
    from memgate.storage.audit import canonical, entry_hash
    entry = json.loads(lines[2])
    entry["recordIds"] = ["forged"]
    entry["hash"] = entry_hash(entry)
    return [*lines[:2], canonical(entry), *lines[3:]]


TAMPERING: dict[str, tuple[Callable[[list[bytes]], list[bytes]], int]] = {
    "edited entry": (edit, 3),
    "edited and rehashed entry": (edit_and_rehash, 4),
    "deleted entry": (lambda lines: [*lines[:2], *lines[3:]], 3),
    "reordered entries": (lambda lines: [lines[0], lines[2], lines[1], *lines[3:]], 2),
    "truncated middle": (lambda lines: [lines[0], *lines[3:]], 2),
    "truncated end": (lambda lines: lines[:3], 4),
    "entry appended without the chain": (lambda lines: [*lines, lines[1]], 6),
}


def test_an_intact_log_verifies(tmp_path: Path) -> None:
    written(tmp_path / "audit")
    result = verify(tmp_path / "audit")
    assert result.ok and result.entries == 5
    assert verify(tmp_path / "none").ok  # no log yet: nothing to break


@pytest.mark.parametrize("kind", list(TAMPERING))
def test_each_kind_of_tampering_is_found_at_its_first_bad_entry(tmp_path: Path,
                                                                kind: str) -> None:
    path = written(tmp_path / "audit")
    tamper, first_bad = TAMPERING[kind]
    path.write_bytes(b"\n".join(tamper(path.read_bytes().splitlines())) + b"\n")
    result = verify(tmp_path / "audit")
    assert result.broken is not None, kind
    assert result.broken.line == first_bad, (kind, result.broken)


async def test_memgate_audit_verify_exits_non_zero_naming_the_entry(tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = written(data / "audit")
    code, out, _ = await cli("audit", "verify", "--data-dir", str(data))
    assert code == 0 and json.loads(out)["entries"] == 5
    path.write_bytes(b"\n".join(edit(path.read_bytes().splitlines())) + b"\n")
    code, out, _ = await cli("audit", "verify", "--data-dir", str(data))
    report = json.loads(out)
    assert code == 1 and report["ok"] is False and report["line"] == 3 and report["seq"] == 3


def test_appends_continue_the_chain_after_a_restart_and_a_torn_line(tmp_path: Path) -> None:
    path = written(tmp_path / "audit", 2)
    with path.open("ab") as f:
        f.write(b'{"seq":3,"torn')  # a crash in mid-write: never acknowledged
    AuditLog(tmp_path / "audit").append(AuditEntry(action="restore", actor="cli"))
    result = verify(tmp_path / "audit")
    assert result.ok and result.entries == 3


async def test_deletions_are_logged_by_reference_only(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    token = await memgate.credential(owner)
    for n in range(2):
        await remember(memgate, token, f"the word {CANARY} number {n}")
    assert await recall(memgate, token, CANARY)
    listed = await memgate.ok("POST", "/api/agent/v1/memories/list", token, {})
    ids = sorted(m["memoryId"] for m in listed["memories"])
    await memgate.ok("POST", "/api/agent/v1/memories/forget", token, {"memoryId": ids[0]})
    await memgate.ok("POST", "/api/agent/v1/memories/forget", token, {"memoryId": ids[1]})
    root = memgate.settings.data_dir / "audit"

    def deleted() -> list[dict[str, object]]:
        log = root / "audit.log"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_bytes().splitlines()
                if json.loads(line)["action"] == "memories_deleted"]

    async def both() -> bool:  # logged, and the head written after the log
        return len(deleted()) == 2 and verify(root).ok

    await eventually(both)
    entries = deleted()
    assert [e["recordIds"] for e in entries] == [[ids[0]], [ids[1]]]
    assert all(e["tenant"] == owner.workspace_id and e["subjectId"] == owner.member_id
               and e["layer"] == "memory_store" and e["actor"] == "storage.p0"
               for e in entries)
    held = (root / "audit.log").read_bytes()
    assert CANARY.encode() not in held and b"acme" not in held  # no content, no names
    assert verify(root).ok
