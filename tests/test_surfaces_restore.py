"""Restore trusts nothing in the file (SPEC §5.4; #28 finding 4): a backup is authenticated by
a MAC under a key kept in the data directory, and even a backup that passes is rebuilt from
memgate's own schema, with no personal row in clear and no file outside the new directory."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import shutil
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from tests.conftest import run_memgate
from tests.test_backup import cli, ok, two_members

Lines = list[dict[str, Any]]


async def backed_up(tmp_path: Path) -> tuple[Path, Lines]:
    """A stopped data directory with two members' memories, and the lines of its backup."""
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        await two_members(memgate)
        data = memgate.settings.data_dir
    out = tmp_path / "backup.jsonl"
    await ok("backup", "--data-dir", str(data), "--out", str(out))
    return data, [json.loads(line) for line in out.read_text().splitlines()]


def written(path: Path, lines: Lines, *, key: bytes | None = None) -> Path:
    """`lines` as a backup file, under a MAC made with `key` (someone holding the directory's
    backup key) or under none; the MAC line of `lines`, if any, is replaced."""
    body = "".join(json.dumps(line, separators=(",", ":")) + "\n"
                   for line in lines if "memgateMac" not in line)
    if key is not None:
        mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
        body += json.dumps({"memgateMac": mac}) + "\n"
    path.write_text(body)
    return path


async def refused(backup: Path, target: Path, keys_from: Path) -> str:
    """Restore `backup`; it must fail with a clear message and leave nothing in `target`."""
    code, out, err = await cli("restore", "--data-dir", str(target), "--from", str(backup),
                               "--keys-from", str(keys_from))
    assert code == 1, (out, err)
    assert "Traceback" not in err and err.startswith("memgate: "), err
    assert empty(target)
    return err


def empty(path: Path) -> bool:
    return not path.exists() or list(path.iterdir()) == []


async def test_a_backup_altered_cut_short_or_made_elsewhere_fails_authentication(
        tmp_path: Path) -> None:
    data, lines = await backed_up(tmp_path)
    assert list(lines[-1]) == ["memgateMac"]
    original = tmp_path / "backup.jsonl"

    workspaces = next(i for i, line in enumerate(lines) if line.get("t") == "workspaces")
    altered = [dict(line) for line in lines]
    altered[workspaces] = {**lines[workspaces], "row": [
        "x" if i == 1 else v for i, v in enumerate(lines[workspaces]["row"])]}
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(original.read_bytes().rsplit(b"\n", 2)[0] + b"\n")
    elsewhere = tmp_path / "elsewhere"  # the same subject keys, another directory's MAC key
    shutil.copytree(data / "keys", elsewhere / "keys")
    (elsewhere / "keys" / "backup.mac").write_bytes(secrets.token_bytes(32))

    for backup, keys_from in ((written(tmp_path / "altered.jsonl", altered), data),
                              (cut, data), (written(tmp_path / "none.jsonl", lines), data),
                              (original, elsewhere)):
        err = await refused(backup, tmp_path / "r" / backup.stem, keys_from)
        assert "fails authentication" in err
    no_key = tmp_path / "no-key"
    shutil.copytree(data / "keys", no_key / "keys", ignore=shutil.ignore_patterns("backup.mac"))
    assert "no backup key" in await refused(original, tmp_path / "r" / "no-key", no_key)

    result = await ok("restore", "--data-dir", str(tmp_path / "r" / "good"), "--from",
                      str(original), "--keys-from", str(data))
    assert result["restored"]["directory.duckdb:members"] >= 2


async def test_even_an_authentic_backup_is_restored_by_memgates_own_schema_and_rules(
        tmp_path: Path) -> None:
    data, lines = await backed_up(tmp_path)
    key = (data / "keys" / "backup.mac").read_bytes()
    manifest, rows = lines[0], lines[1:]
    outside = tmp_path / "written-by-the-backup.csv"

    # DDL, and types spliced into SQL: never executed, the schema is memgate's own
    hostile = {**manifest, "tables": [
        {**t, "ddl": f"COPY (SELECT 1) TO '{outside}'",
         "types": [f"VARCHAR); COPY (SELECT 2) TO '{outside}'; --" for _ in t["types"]]}
        for t in manifest["tables"]]}
    result = await ok("restore", "--data-dir", str(tmp_path / "r" / "ddl"), "--from",
                      str(written(tmp_path / "ddl.jsonl", [hostile, *rows], key=key)),
                      "--keys-from", str(data))
    assert result["restored"]["directory.duckdb:members"] >= 2
    assert not outside.exists()

    # a forged owner in clear, with a token whose hash the forger knows
    members = next(t for t in manifest["tables"] if t["name"] == "members")
    forged = {"member_id": "mb_forged", "workspace_id": "ws_x", "name": "forged",
              "role": "owner", "memory_spaces_enabled": True,
              "token_hash": hashlib.sha256(b"mg_known").hexdigest()}
    clear = {"f": "directory.duckdb", "t": "members",
             "row": [forged[c] for c in members["columns"]]}
    err = await refused(written(tmp_path / "clear.jsonl", [manifest, *rows, clear], key=key),
                        tmp_path / "r" / "clear", data)
    assert "directory.duckdb:members: a row of a personal table in clear" in err

    # a file outside the new directory, a table memgate does not back up, a column it lacks
    escape = {**manifest, "tables": [*manifest["tables"], {**members, "file": "../escape.duckdb"}]}
    unknown = {**manifest, "tables": [*manifest["tables"], {**members, "name": "outbox"}]}
    column = {**manifest, "tables": [{**members, "columns": [*members["columns"], "is_admin"],
                                      "types": [*members["types"], "BOOLEAN"]}]}
    for name, first in (("escape", escape), ("unknown", unknown), ("column", column)):
        err = await refused(written(tmp_path / f"{name}.jsonl", [first, *rows], key=key),
                            tmp_path / "r" / name, data)
        assert "memgate" in err.split(":", 1)[1]  # "…not a file/table memgate backs up…"
    assert not (tmp_path / "r" / "escape.duckdb").exists()

    # a sealed memory row moved into the members table
    memory = next(line for line in rows if line.get("t") == "memories")
    moved = {**memory, "f": "directory.duckdb", "t": "members"}
    err = await refused(written(tmp_path / "moved.jsonl", [manifest, *rows, moved], key=key),
                        tmp_path / "r" / "moved", data)
    assert "a sealed row of another table" in err
