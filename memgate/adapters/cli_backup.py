"""`memgate backup`, `restore`, `export`, `export-read`, `audit verify` (SPEC §5.4, §5.5);
the work is in `memgate.app.backup`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memgate.app.datadir import nats_of
from memgate.app.logins import internal_logins
from memgate.app.settings import Settings
from memgate.bus.logins import ADAPTER, inbox_prefix
from memgate.contracts.errors import MemgateError

if TYPE_CHECKING:
    from memgate.app import backup as work

DataDir = Annotated[Path, typer.Option(help="the data directory (of memgate up)")]
Nats = Annotated[str | None, typer.Option(
    "--nats", help="the NATS of the memgate running on the directory "
                   "(env MEMGATE_NATS_URL; default: where that memgate said, DIR/run/nats.json)")]
CONNECT_TIMEOUT_S = 10.0
PAGE_TIMEOUT_S = 120.0  # a page of a large table, read and sealed


def readable(data_dir: Path, *, migrates: bool = False) -> None:
    """Refuse, in one line and before opening anything, a directory this memgate does not read
    as it is (a newer format, or a migration left half-done), or, for `memgate up`
    (`migrates`), a newer one (`app.dataformat`)."""
    from memgate.app.dataformat import check
    from memgate.app.datadir import StartRefusedError

    try:
        check(data_dir, migrates=migrates)
    except StartRefusedError as refused:
        typer.echo(f"memgate: {refused}", err=True)
        raise typer.Exit(1) from None


def _operator(data_dir: Path, token: str | None) -> str:
    if token:
        return token
    path = data_dir / "admin.token"
    if path.exists():
        return path.read_text().strip()
    raise typer.BadParameter("the operator token: MEMGATE_ADMIN_TOKEN, or DIR/admin.token",
                             param_hint="MEMGATE_ADMIN_TOKEN")


async def _dump(data_dir: Path, out: Path, *, mode: str, workspace: str | None,
                nats_url: str | None, token: str | None) -> work.Written:
    from memgate.app import backup as work  # DuckDB and NATS: for these commands only
    from memgate.bus import BusClient

    key = work.mac_key(data_dir) if mode == "backup" else None

    if not work.is_running(data_dir):
        try:
            return await work.write_backup(
                work.LocalDumper(data_dir, mode=mode, workspace=workspace), out,
                mac_key=key, audit_root=data_dir / "audit", mode=mode)
        except work.RunningError:
            pass  # it started meanwhile
    settings = Settings(data_dir=data_dir)
    login = internal_logins(settings)["adapter"]
    url = nats_of(data_dir, nats_url or settings.nats_url, port=settings.nats_port)
    client = await BusClient.connect(url, name="memgate-backup", timeout=PAGE_TIMEOUT_S,
                                     connect_timeout=CONNECT_TIMEOUT_S, user=login.user,
                                     password=login.password,
                                     inbox_prefix=inbox_prefix(ADAPTER))
    try:
        return await work.write_backup(
            work.BusDumper(client, _operator(data_dir, token), mode=mode, workspace=workspace),
            out, mac_key=key, audit_root=data_dir / "audit", mode=mode)
    finally:
        await client.close()


def _run_dump(data_dir: Path, out: Path, *, mode: str, workspace: str | None,
              nats_url: str | None, token: str | None) -> work.Written:
    readable(data_dir)
    if not (data_dir / "directory.duckdb").exists():
        raise typer.BadParameter(f"no memgate data in {data_dir}", param_hint="--data-dir")
    try:
        return asyncio.run(_dump(data_dir, out, mode=mode, workspace=workspace,
                                 nats_url=nats_url, token=token))
    except TimeoutError:  # the URL may hold a password: not echoed
        typer.echo("memgate: memgate runs on the directory, but its NATS does not answer "
                   "(give --nats)", err=True)
        raise typer.Exit(1) from None
    except MemgateError as failure:
        typer.echo(f"memgate: {failure.code.value}: {failure}", err=True)
        raise typer.Exit(1) from None


def command(app: typer.Typer, operator: Any) -> None:
    """Add the commands to `app`; `operator()` is the operator token from the environment."""
    audit = typer.Typer(help="The hash-chained audit log (SPEC §5.5).", no_args_is_help=True)
    app.add_typer(audit, name="audit")

    @app.command("backup")
    def backup(data_dir: DataDir, out: Annotated[Path, typer.Option(help="the backup file")],
               nats_url: Nats = None) -> None:
        """Back up a data directory, stopped or running: personal data sealed under each
        subject's key (kept in DIR/keys, never in the backup)."""
        written = _run_dump(data_dir, out, mode="backup", workspace=None, nats_url=nats_url,
                            token=operator())
        typer.echo(json.dumps({"out": str(out), "rows": sum(written.tables.values()),
                               "sealed": written.sealed, "auditEntries": written.audit_entries,
                               "skipped": written.skipped}))

    @app.command("restore")
    def restore(data_dir: Annotated[Path, typer.Option(help="the new data directory")],
                from_: Annotated[Path, typer.Option("--from", help="the backup file")],
                keys_from: Annotated[Path, typer.Option(
                    help="the live data directory whose keys open the backup")]) -> None:
        """Rebuild a new data directory from a backup made by --keys-from (its MAC is checked
        first): rows of erased subjects (key gone) are dropped; then `memgate up --data-dir`
        it."""
        from memgate.app import backup as work

        readable(keys_from)
        try:
            result = work.restore(from_, data_dir, keys_from)
        except (FileExistsError, ValueError) as refused:
            typer.echo(f"memgate: {refused}", err=True)
            raise typer.Exit(1) from None
        typer.echo(json.dumps({"restored": result.restored, "dropped": result.dropped,
                               "announced": result.announced}))

    @app.command("export")
    def export(data_dir: DataDir, out: Annotated[Path, typer.Option(help="the JSON-lines file")],
               workspace: Annotated[str | None, typer.Option(help="one workspace only")] = None,
               nats_url: Nats = None) -> None:
        """Export memories as an eval dataset: ids, derivedFrom, classification in clear, the
        text sealed under its subject's key (unreadable once the subject is erased)."""
        written = _run_dump(data_dir, out, mode="export", workspace=workspace,
                            nats_url=nats_url, token=operator())
        typer.echo(json.dumps({"out": str(out), "rows": sum(written.tables.values())}))

    @app.command("export-read")
    def export_read(file: Path, keys_from: Annotated[Path, typer.Option(
            help="the live data directory whose keys open the export")]) -> None:
        """Print an export's rows with their text (JSON lines); erased subjects' rows are
        unreadable and left out."""
        from memgate.app import backup as work

        readable(keys_from)
        rows, gone = work.read_export(file, keys_from)
        for row in rows:
            typer.echo(json.dumps(row, ensure_ascii=False))
        typer.echo(json.dumps({"rows": len(rows), "erased": gone}), err=True)

    @audit.command("verify")
    def verify(data_dir: DataDir) -> None:
        """Check the audit log's hash chain: exit 0 if intact, 1 naming the first bad entry."""
        from memgate.app import backup as work

        readable(data_dir)
        result = work.verify_audit(data_dir)
        if result.broken is None:
            typer.echo(json.dumps({"ok": True, "entries": result.entries, "head": result.head}))
            return
        typer.echo(json.dumps({"ok": False, "line": result.broken.line,
                               "seq": result.broken.seq, "reason": result.broken.reason,
                               "intactEntries": result.entries}))
        raise typer.Exit(1)
