"""Backups, restores and eval exports with crypto-shredding (SPEC §5.4) on the real system:
`memgate backup` of a stopped and of a running directory, a subject's key erased, the older
backup restored into a new directory that `memgate up` serves, and the erased subject's
canary in no byte of the backup (in clear) nor of the restored directory."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from memgate.storage.keys import KeyStore
from tests.conftest import ADMIN_TOKEN, Memgate, run_memgate
from tests.test_erasure import erase, recall, remember
from tests.unit.test_keys import encodings, files_holding

CANARY_A = "zyxcanaryalpha7q"  # member A's: erased
CANARY_B = "quokkabetanote3k"  # member B's: kept


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memgate.adapters", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})})
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def ok(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    code, out, err = await cli(*args, env=env)
    assert code == 0, err
    return dict(json.loads(out.strip().splitlines()[-1]))


async def two_members(memgate: Memgate) -> tuple[str, str, str, str, str]:
    """A workspace, members A and B each with a memory; (workspace, A, B, A's and B's tokens)."""
    owner = await memgate.workspace()
    a, b = await memgate.member(owner, "editor"), await memgate.member(owner, "editor")
    token_a, token_b = await memgate.credential(a), await memgate.credential(b)
    await remember(memgate, token_a, f"member a keeps the word {CANARY_A} in mind")
    await remember(memgate, token_b, f"member b keeps the word {CANARY_B} in mind")
    assert await recall(memgate, token_a, CANARY_A)
    assert await recall(memgate, token_b, CANARY_B)
    return owner.workspace_id, a.member_id, b.member_id, token_a, token_b


def bytes_of(path: Path) -> bytes:
    return path.read_bytes()


async def test_backup_erase_restore_brings_back_everyone_but_the_erased(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        workspace, a, _, token_a, token_b = await two_members(memgate)
        data = memgate.settings.data_dir
    # memgate stopped: the CLI reads the DuckDB files itself
    out = tmp_path / "backup.jsonl"
    written = await ok("backup", "--data-dir", str(data), "--out", str(out))
    assert written["rows"] > 0 and written["sealed"] >= 4  # 2 memories, A, B (+ owner)
    held = bytes_of(out)
    assert CANARY_A.encode() not in held and CANARY_B.encode() not in held  # sealed
    keys = KeyStore(data / "keys")
    key_a = keys.key_for(workspace, a, create=False)
    assert key_a is not None
    assert not any(form in held for form in encodings(key_a))  # no key in the backup
    assert (out.stat().st_mode & 0o777) == 0o600

    assert keys.erase(workspace, a)  # A's erasure (crypto-shredding: the backup's copy dies)
    assert files_holding(data, encodings(key_a)) == []

    restored = tmp_path / "restored"
    result = await ok("restore", "--data-dir", str(restored / "data"), "--from", str(out),
                      "--keys-from", str(data))
    assert result["dropped"] == {"directory.duckdb:members": 1,
                                 "directory.duckdb:credentials": 1,
                                 "partitions/p0/memories.duckdb:memories": 1}
    assert result["announced"] >= 1
    assert files_holding(restored, [CANARY_A.encode()]) == []

    async with AsyncExitStack() as stack:  # `memgate up` on the restored directory
        again = await run_memgate(restored, stack)
        assert await recall(again, token_b, CANARY_B) == [
            f"member b keeps the word {CANARY_B} in mind"]
        refused = await again.admin("POST", "/api/agent/v1/memories/recall", token_a,
                                    {"query": CANARY_A})
        assert refused.status_code == 401  # A's member and credential are gone with A
        assert files_holding(restored, [CANARY_A.encode()]) == []
    assert files_holding(restored, [CANARY_A.encode()]) == []
    verified = await ok("audit", "verify", "--data-dir", str(restored / "data"))
    assert verified["ok"] and verified["entries"] >= 1  # the chain carried over + the restore


async def test_backup_and_export_of_a_running_instance(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        workspace, a, _, _, token_b = await two_members(memgate)
        data = memgate.settings.data_dir
        env = {"MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN}
        out = tmp_path / "live.jsonl"
        written = await ok("backup", "--data-dir", str(data), "--out", str(out),
                           "--nats", memgate.nats_url, env=env)
        assert written["rows"] > 0
        # not backed up: derived or transient tables (idempotency records live 24 h), and an
        # owner that does not answer yet
        assert all(s.endswith((":outbox", ":relayed", ":compaction", ":idempotency",
                               ":idempotent_deletes"))
                   or "sessions" in s
                   for s in written["skipped"]), written["skipped"]
        held = bytes_of(out)
        assert CANARY_A.encode() not in held and CANARY_B.encode() not in held
        lines = [json.loads(line) for line in held.decode().splitlines()]
        memories = [line for line in lines[1:] if line.get("t") == "memories"]
        assert len(memories) == 2 and all("sealed" in line for line in memories)

        refused, _, _ = await cli("backup", "--data-dir", str(data), "--out",
                                  str(tmp_path / "x.jsonl"), "--nats", memgate.nats_url,
                                  env={"MEMGATE_ADMIN_TOKEN": "wrong"})
        assert refused == 1 and not (tmp_path / "x.jsonl").exists()

        export = tmp_path / "eval.jsonl"
        await ok("export", "--data-dir", str(data), "--out", str(export), "--workspace",
                 workspace, "--nats", memgate.nats_url, env=env)
        rows = [json.loads(line) for line in export.read_text().splitlines()]
        assert len(rows) == 2
        assert all(row["derivedFrom"][0] == row["memoryId"] for row in rows)
        assert {row["classification"] for row in rows} == {"personal"}
        assert CANARY_A.encode() not in export.read_bytes()
        code, out_text, _ = await cli("export-read", str(export), "--keys-from", str(data))
        assert code == 0 and CANARY_A in out_text and CANARY_B in out_text

        # the erasure workflow shreds A's key: the export and the backup die for A only
        done = (await erase(memgate, {"memberId": a}, workspace))["done"]
        assert {e["layer"]: e["erased"] for e in done["evidence"]}["backups"] == 1
        code, out_text, err = await cli("export-read", str(export), "--keys-from", str(data))
        assert code == 0 and CANARY_A not in out_text and CANARY_B in out_text
        assert json.loads(err.strip().splitlines()[-1]) == {"rows": 1, "erased": 1}
        result = await ok("restore", "--data-dir", str(tmp_path / "r" / "data"), "--from",
                          str(out), "--keys-from", str(data))
        assert result["dropped"]["partitions/p0/memories.duckdb:memories"] == 1
        assert files_holding(tmp_path / "r", [CANARY_A.encode()]) == []
        assert await recall(memgate, token_b, CANARY_B)
