"""`memgate admin erase`: one erasure request through every stage (SPEC §5.3), with progress.

The same REST calls an operator's tooling makes, in order: intake, identity verification,
discovery (a table of counts per layer), the decision, execution (a progress bar over the
layers, then the evidence)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

BASE = "/api/admin/erasure-requests"
POLL_S = 0.2


def _table(title: str, rows: list[tuple[str, str, str]], columns: tuple[str, str, str],
           ) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table


def run(client: httpx.Client, console: Console, *, workspace: str, subject: dict[str, str],
        method: str, verified_by: str, holds: list[str], reason: str) -> dict[str, Any]:
    def call(verb: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        response = client.request(verb, path, json=body)
        if response.is_error:
            console.print(response.json())
            raise typer.Exit(1)
        return dict(response.json())

    created = call("POST", BASE, {"workspaceId": workspace, "subject": subject})
    request = f"{BASE}/{created['requestId']}"
    console.print(f"request {created['requestId']} received, due {created['dueAt']}")
    call("POST", f"{request}/verify", {"method": method, "verifiedBy": verified_by})
    found = call("POST", f"{request}/discover")["discovery"]
    console.print(_table("discovery", [(layer, str(count), "held" if layer in holds else "")
                                       for layer, count in found.items()],
                         ("layer", "records", "decision")))
    call("POST", f"{request}/decide", {"holds": holds, "reason": reason})
    call("POST", f"{request}/execute")
    started = time.monotonic()
    layers = len([layer for layer in found if layer not in holds])
    with Progress(TextColumn("erasing"), BarColumn(), TextColumn("{task.completed}/{task.total} "
                  "layers"), TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("erase", total=layers)
        view = call("GET", request)
        while view["status"] == "executing":
            progress.update(task, completed=len(view["evidence"]))
            time.sleep(POLL_S)
            view = call("GET", request)
        progress.update(task, completed=len(view["evidence"]))
    console.print(_table(f"evidence ({view['status']}, {time.monotonic() - started:.1f} s)",
                         [(e["layer"], str(e["erased"]), e["how"]) for e in view["evidence"]],
                         ("layer", "erased", "how")))
    if view["status"] != "completed":
        raise typer.Exit(1)
    return view


def command(admin: typer.Typer, base_url: Any, operator: Any) -> None:
    """Register `erase` on the `admin` command group."""

    @admin.command("erase")
    def erase(workspace: str,
              member: Annotated[str | None, typer.Option(help="a member id")] = None,
              external_id: Annotated[str | None, typer.Option(
                  help="an end user's id (mem0 user_id, session participant)")] = None,
              method: Annotated[str, typer.Option(help="how identity was verified")] = "",
              verified_by: Annotated[str, typer.Option(help="who verified it")] = "",
              hold: Annotated[list[str] | None, typer.Option(
                  help="a layer kept by a legal hold (repeat)")] = None,
              reason: str = "no exception applies",
              url: Annotated[str | None, typer.Option(help="memgate's HTTP address")] = None,
              ) -> None:
        """Erase a subject (operator token): every stage, with progress and evidence."""
        if (member is None) == (external_id is None) or not method or not verified_by:
            raise typer.BadParameter("give --member or --external-id, --method and "
                                     "--verified-by")
        subject = {"memberId": member} if member else {"externalId": external_id or ""}
        with httpx.Client(base_url=url or base_url(),
                          headers={"Authorization": f"Bearer {operator()}"},
                          timeout=60) as client:
            run(client, Console(), workspace=workspace, subject=subject, method=method,
                verified_by=verified_by, holds=hold or [], reason=reason)
