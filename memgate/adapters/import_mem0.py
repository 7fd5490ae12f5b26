"""`memgate import mem0`: a mem0 store's memories into a memory space, over the REST API.

Two sources: a mem0 open-source store, read through the `mem0ai` package itself
(`Memory.from_config` with the store's own config, a JSON or YAML file; `memgate[mem0]`), or
a mem0 platform export (a JSON file of mem0 memories: a list, or an object holding one under
`memories`, `results` or `data`). Each memory goes to `POST /memory/{spaceId}/v1/import/`
with its mem0 id, who it is about, metadata, categories and timestamps; the space masks and
checks it like an add. A memory whose id the space holds already is skipped, so the same
command run again (after a kill, or a stop on a refusal) stores nothing twice. The report
counts what was imported, skipped and refused (by code and field: never a memory's text).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import pydantic
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

BATCH = 100  # memories a request carries (the route takes up to 500)
LIST_MAX = 10_000_000  # memories read from a mem0 store at most
CALL_TIMEOUT_S = 120.0  # one batch: masking and one storage transaction
ENTITY_FIELDS = ("user_id", "agent_id", "run_id")
KEPT = ("id", "memory", *ENTITY_FIELDS, "metadata", "categories", "created_at", "updated_at",
        "expiration_date")
EXPORT_KEYS = ("memories", "results", "data")
LIMITS = ("AGENT_MEMORY_RATE_LIMITED", "AGENT_MEMORY_FULL")  # refusals that stop an import


class SourceError(Exception):
    """The source cannot be read (a message for the user, no memory text)."""


@dataclass
class Report:
    imported: int = 0
    skipped: int = 0
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)  # (code, field)
    stopped: str | None = None  # why the import stopped before the end

    def table(self) -> Table:
        table = Table("outcome", "count", "reason", title="mem0 import")
        table.add_row("imported", str(self.imported), "")
        table.add_row("skipped", str(self.skipped), "already in the space")
        for (code, where), count in sorted(self.refused.items()):
            table.add_row("refused", str(count), f"{code} {where}".strip())
        return table


def _kept(memory: dict[str, Any]) -> dict[str, Any]:
    """What the import sends of a mem0 memory (mem0's own fields, as it shows them)."""
    return {k: memory[k] for k in KEPT if memory.get(k) is not None}


def _load(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as error:
        raise SourceError(f"cannot read {path}: {error.strerror}") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            raise SourceError(f"{path} is not YAML") from None
    try:
        return json.loads(text)
    except ValueError:
        raise SourceError(f"{path} is not JSON") from None


def exported(path: Path) -> list[dict[str, Any]]:
    """The memories of a mem0 platform export (or of a saved get_all answer)."""
    found = _load(path)
    for _ in range(2):  # e.g. {"data": {"memories": [...]}}
        if isinstance(found, dict):
            found = next((found[k] for k in EXPORT_KEYS if isinstance(found.get(k), list | dict)),
                         found)
    if not isinstance(found, list):
        raise SourceError(f"{path} holds no list of mem0 memories "
                          f"(a list, or one under {', '.join(EXPORT_KEYS)})")
    return [_kept(m) for m in found if isinstance(m, dict)]


def _from_oss(memory: dict[str, Any]) -> dict[str, Any]:
    """An open-source memory as `get_all` shows it: it has no categories of its own, so a
    `categories` list in its metadata is taken as them (and kept in the metadata too)."""
    kept = _kept(memory)
    metadata = memory.get("metadata")
    categories = metadata.get("categories") if isinstance(metadata, dict) else None
    if isinstance(categories, list) and all(isinstance(c, str) for c in categories):
        kept["categories"] = categories
    return kept


def _groups(payloads: Iterator[dict[str, Any]]) -> list[tuple[str, str]]:
    """One get_all filter per user (else agent, else run) that the store's memories name."""
    groups: set[tuple[str, str]] = set()
    for payload in payloads:
        for name in ENTITY_FIELDS:
            if isinstance(payload.get(name), str):
                groups.add((name, payload[name]))
                break
    return sorted(groups)


def _reason(error: Exception) -> str:
    """Why mem0 refused, without the values of the config (they may hold API keys)."""
    if isinstance(error, pydantic.ValidationError):
        return "; ".join(f"{'.'.join(str(part) for part in problem['loc'])}: {problem['msg']}"
                         for problem in error.errors(include_input=False, include_url=False))
    return f"{type(error).__name__}: {error}"


def stored(config_path: Path) -> tuple[list[dict[str, Any]], int]:
    """The memories of a mem0 open-source store, through `mem0ai` itself: its vector store's
    listing names the users, agents and runs, `Memory.get_all` gives each one's memories as
    mem0 shows them (expired ones left out, as mem0 hides them); and how many of the listing
    get_all did not show."""
    config = _load(config_path)
    if not isinstance(config, dict):
        raise SourceError(f"{config_path} is not a mem0 config (an object)")
    os.environ["MEM0_TELEMETRY"] = "False"  # before mem0 is imported: nothing leaves
    try:
        from mem0 import Memory
    except ImportError:
        raise SourceError("reading a mem0 store needs mem0ai: pip install 'memgate[mem0]'",
                          ) from None
    quiet = logging.getLogger("mem0")
    level, quiet.level = quiet.level, logging.CRITICAL  # its error log echoes the config's keys
    try:
        memory = Memory.from_config(config)
    except Exception as error:  # mem0's own: a bad config, a store another process holds
        raise SourceError(f"mem0 cannot open the store: {_reason(error)}") from None
    finally:
        quiet.setLevel(level)
    try:
        listed = memory.vector_store.list(top_k=LIST_MAX)
        rows = listed[0] if listed and isinstance(listed[0], list | tuple) else listed
        seen: set[str] = set()
        memories: list[dict[str, Any]] = []
        for name, value in _groups(row.payload or {} for row in rows):
            for found in memory.get_all(filters={name: value}, top_k=LIST_MAX)["results"]:
                if found["id"] not in seen:
                    seen.add(found["id"])
                    memories.append(_from_oss(found))
        return memories, len({str(row.id) for row in rows} - seen)
    finally:
        close = getattr(getattr(memory.vector_store, "client", None), "close", None)
        if callable(close):
            close()  # a local store's lock


def _counted(report: Report, outcomes: Sequence[dict[str, Any]]) -> None:
    """The outcomes added to the report; one refused by a limit stops the import (what it
    refused is stored by a later run)."""
    for outcome in outcomes:
        status = outcome.get("status")
        if status == "imported":
            report.imported += 1
        elif status == "skipped":
            report.skipped += 1
        else:
            where = re.sub(r"^memories\.\d+\.", "", str(outcome.get("field") or ""))
            report.refused[(str(outcome.get("code")), where)] += 1
            if outcome.get("code") in LIMITS and report.stopped is None:
                retry = outcome.get("retry_after_seconds")
                report.stopped = str(outcome["code"]) + (
                    f" (retry after {retry} s)" if retry is not None else "")


def _stop_reason(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
    except ValueError:
        return f"HTTP {response.status_code}"
    reason = f"{error.get('code', response.status_code)}: {error.get('message', '')}"
    retry = error.get("details", {}).get("retryAfterSeconds")
    return reason + (f" (retry after {retry} s)" if retry is not None else "")


def run(memories: list[dict[str, Any]], client: httpx.Client, space: str, console: Console,
        *, batch: int = BATCH) -> Report:
    """Each batch sent in turn, with a progress bar; stops at the first refused request."""
    report = Report()
    path = f"/memory/{space}/v1/import/"
    with Progress(TextColumn("importing"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("import", total=len(memories))
        for start in range(0, len(memories), batch):
            chunk = memories[start:start + batch]
            response = client.post(path, json={"memories": chunk})
            if response.is_error:
                report.stopped = _stop_reason(response)
                break
            _counted(report, response.json()["results"])
            progress.update(task, advance=len(chunk))
            if report.stopped is not None:
                break
    return report


def _space(client: httpx.Client, console: Console, space: str | None) -> str:
    if space is not None:
        return space
    response = client.post("/memory/spaces", json={"description": "imported from mem0"})
    if response.is_error:
        raise SourceError(f"cannot create a memory space: {_stop_reason(response)}")
    created = str(response.json()["id"])
    console.print(f"memory space {created} created; to resume, run again with --space {created}",
                  soft_wrap=True)
    return created


def command(app: typer.Typer, base_url: Callable[[str | None], str],
            member: Callable[[str | None], str | None]) -> None:
    """`memgate import mem0` on the CLI."""
    imports = typer.Typer(help="Bring memories from elsewhere into memgate.",
                          no_args_is_help=True)
    app.add_typer(imports, name="import")

    @imports.command("mem0")
    def import_mem0(
        config: Annotated[Path | None, typer.Option(
            help="a mem0 open-source store: its Memory.from_config config (JSON or YAML)")] = None,
        export: Annotated[Path | None, typer.Option(
            help="a mem0 platform export (JSON)")] = None,
        space: Annotated[str | None, typer.Option(
            help="the memory space to import into (default: a new one)")] = None,
        token: Annotated[str | None, typer.Option(
            help="a member token, an owner of the space (env MEMGATE_TOKEN)")] = None,
        url: Annotated[str | None, typer.Option(
            help="memgate's HTTP address (env MEMGATE_URL)")] = None,
        batch: Annotated[int, typer.Option(min=1, max=500, help="memories a request")] = BATCH,
    ) -> None:
        """Import a mem0 store's memories into a memory space, keeping their ids, users,
        agents, runs, metadata, categories and timestamps; run again to resume."""
        if (config is None) == (export is None):
            raise typer.BadParameter("give --config or --export", param_hint="--config")
        console = Console()
        try:
            source = config or export
            assert source is not None
            memories, hidden = stored(source) if config is not None else (exported(source), 0)
        except SourceError as error:
            typer.echo(f"memgate import: {error}", err=True)
            raise typer.Exit(1) from None
        console.print(f"{len(memories)} memories read from mem0" + (
            f" ({hidden} more in the store that mem0 does not show: expired)" if hidden else ""),
            soft_wrap=True)
        caller = member(token)
        headers = {"Authorization": f"Bearer {caller}"} if caller else {}
        with httpx.Client(base_url=base_url(url).rstrip("/"), headers=headers,
                          timeout=CALL_TIMEOUT_S) as client:
            try:
                target = _space(client, console, space)
            except SourceError as error:
                typer.echo(f"memgate import: {error}", err=True)
                raise typer.Exit(1) from None
            report = run(memories, client, target, console, batch=batch)
        console.print(report.table())
        if report.stopped is not None:
            console.print(f"stopped: {report.stopped}; run the same command again (with "
                          f"--space {target}) to go on", soft_wrap=True)
            raise typer.Exit(1)
