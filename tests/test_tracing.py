"""OpenTelemetry traces of a real `memgate up`: one trace per command across its processes (the
W3C `traceparent` in NATS headers), a span per hop and stage, and nothing personal in any."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import nats

from memgate.contracts import Envelope
from memgate.observe import tracing
from tests.conftest import ADMIN_TOKEN, eventually
from tests.test_metrics import OPERATOR, workspace_agent
from tests.test_processes import memgate_up

Span = dict[str, Any]


def every_trace(traces: Path) -> dict[str, str]:
    """`memgate up` writing every trace it begins to `traces` (the default samples 10%)."""
    return {"MEMGATE_TRACE_DIR": str(traces), "MEMGATE_TRACE_SAMPLE_RATIO": "1"}


def spans(traces: Path) -> list[Span]:
    """Every span every process exported (one JSON object per line, a file per process); a
    line still being written (no newline yet) is left for the next look."""
    return [json.loads(line) for path in sorted(traces.glob("*.jsonl"))
            for line in path.read_text().split("\n")[:-1] if line.strip()]


def process_of(span: Span) -> str:
    return str(span["resource"]["attributes"]["memgate.process"])


def trace_of(every: list[Span], root_name: str) -> list[Span]:
    """The spans of the (last) trace whose root span is named `root_name`."""
    roots = [s for s in every if s["name"] == root_name and s["parent_id"] is None]
    assert roots, f"no trace begins with {root_name!r}: {sorted({s['name'] for s in every})}"
    trace_id = roots[-1]["context"]["trace_id"]
    return [s for s in every if s["context"]["trace_id"] == trace_id]


def seconds(span: Span) -> float:
    return (datetime.fromisoformat(span["end_time"].replace("Z", "+00:00"))
            - datetime.fromisoformat(span["start_time"].replace("Z", "+00:00"))).total_seconds()


def tree(trace: list[Span]) -> str:
    """The trace as an indented tree: name [process] duration."""
    children: dict[str | None, list[Span]] = defaultdict(list)
    for span in trace:
        children[span["parent_id"]].append(span)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in sorted(children[parent], key=lambda s: s["start_time"]):
            lines.append(f"{'  ' * depth}{span['name']} [{process_of(span)}] "
                         f"{seconds(span) * 1000:.2f} ms")
            walk(span["context"]["span_id"], depth + 1)

    walk(None, 0)
    return "\n".join(lines)


def connected(trace: list[Span]) -> None:
    """One root; every other span's parent is in the trace."""
    ids = {s["context"]["span_id"] for s in trace}
    assert [s["parent_id"] for s in trace if s["parent_id"] is None] == [None], tree(trace)
    assert all(s["parent_id"] in ids for s in trace if s["parent_id"] is not None), tree(trace)


async def test_one_trace_spans_the_front_the_store_and_the_index_for_a_remember_and_a_recall(
    tmp_path: Path,
) -> None:
    traces = tmp_path / "traces"
    async with memgate_up(tmp_path / "data", **every_trace(traces)) as up:
        _, _, token = await workspace_agent(up.http)
        agent = {"Authorization": f"Bearer {token}"}
        remembered = await up.http.post("/api/agent/v1/memories/remember", headers=agent,
                                        json={"namespace": "notes", "text": "the lab is in B4"})
        assert remembered.status_code == 200
        recalled = await up.http.post("/api/agent/v1/memories/recall", headers=agent,
                                      json={"query": "where is the lab"})
        assert recalled.status_code == 200
        assert recalled.json()["memories"]

        async def exported() -> bool:  # each process writes its spans in batches
            names = {s["name"] for s in spans(traces)}
            return {"rest remember", "rest recall", "storage commit", "serve mem.cmd.remember",
                    "serve mem.int.index.p0.rank", "serve mem.int.store.p0.rows"} <= names
        await eventually(exported)

        every = spans(traces)
        remember = trace_of(every, "rest remember")
        connected(remember)
        names = {s["name"] for s in remember}
        assert {"send mem.cmd.remember", "serve mem.cmd.remember", "governance",
                "storage commit"} <= names, tree(remember)
        assert {process_of(s) for s in remember} >= {"front", "store"}, tree(remember)
        by_name = {s["name"]: s for s in remember}
        assert process_of(by_name["rest remember"]) == "front"
        assert process_of(by_name["storage commit"]) == "store"
        assert by_name["serve mem.cmd.remember"]["attributes"]["memgate.code"] == "OK"

        recall = trace_of(every, "rest recall")
        connected(recall)
        names = {s["name"] for s in recall}
        assert {"governance", "bm25", "cosine", "fusion", "rows",
                "serve mem.int.index.p0.rank", "serve mem.int.embed.p0.rank",
                "serve mem.int.store.p0.rows"} <= names, tree(recall)
        assert {process_of(s) for s in recall} == {"front", "store", "index"}, tree(recall)
        print("\n" + tree(remember) + "\n\n" + tree(recall))


async def test_an_agents_traceparent_is_continued_and_a_trace_begun_without_one(
    tmp_path: Path,
) -> None:
    """An agent on NATS that sends a `traceparent` header has its trace continued by the
    process that serves the command; one that sends none gets a trace begun there."""
    traces = tmp_path / "traces"
    theirs, their_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with memgate_up(tmp_path / "data", **every_trace(traces)) as up:
        _, _, token = await workspace_agent(up.http)
        login = (await up.http.post("/api/admin/nats-agents", json={"name": "bot"},
                                    headers=OPERATOR)).json()
        nc = await nats.connect(up.nats_url, nkeys_seed_str=login["seed"],
                                inbox_prefix=login["inboxPrefix"])
        try:
            for headers in ({"traceparent": f"00-{theirs}-{their_span}-01"}, None):
                command = Envelope(token=token, body={"namespace": "notes",
                                                      "text": "the lab is in B4"})
                reply = await nc.request("mem.cmd.remember", command.to_json(), timeout=10,
                                         headers=headers)
                assert b'"ok":true' in reply.data
        finally:
            await nc.close()

        async def exported() -> bool:
            return sum(s["name"] == "storage commit" for s in spans(traces)) == 2
        await eventually(exported)
        every = spans(traces)
        continued = [s for s in every if s["context"]["trace_id"] == f"0x{theirs}"]
        served = [s for s in continued if s["name"] == "serve mem.cmd.remember"]
        assert [s["parent_id"] for s in served] == [f"0x{their_span}"], tree(continued)
        assert process_of(served[0]) == "store"
        assert "storage commit" in {s["name"] for s in continued}
        begun = trace_of(every, "serve mem.cmd.remember")
        connected(begun)
        assert begun[0]["context"]["trace_id"] != f"0x{theirs}"


async def test_no_memory_text_token_or_personal_datum_reaches_a_span_or_a_log(
    tmp_path: Path,
) -> None:
    traces = tmp_path / "traces"
    canary = "quetzalcanary"
    email = "ada.lovelace@example.org"
    secret_token = "sk-live-51Hf0CanaryTokenValue"
    async with memgate_up(tmp_path / "data", **every_trace(traces)) as up:
        ws, member, token = await workspace_agent(up.http)
        agent = {"Authorization": f"Bearer {token}"}
        text = f"{canary}: write to {email}, the key is {secret_token}"
        for path, body in (
            ("remember", {"namespace": "notes", "text": text}),
            ("recall", {"query": f"{canary} {email} {secret_token}"}),
            ("remember", {"namespace": email, "text": text}),  # refused: personal data
            ("remember", {"namespace": "notes", "text": text, "citations": ["p-none"]}),
            ("list", {"namespace": "notes"}),
        ):
            await up.http.post(f"/api/agent/v1/memories/{path}", headers=agent, json=body)
        refused = await up.http.post("/api/agent/v1/memories/remember", json={
            "namespace": "notes", "text": text}, headers={"Authorization": f"Bearer {canary}"})
        assert refused.status_code == 401
        mcp = await up.http.post("/mcp", headers={**agent, "Accept": "application/json, "
                                                  "text/event-stream"},
                                 json={"jsonrpc": "2.0", "id": 1, "method": "initialize"})
        assert mcp.status_code in (200, 400, 406)
        assert (await up.http.get("/metrics", headers=OPERATOR)).status_code == 200

        async def exported() -> bool:
            return sum(s["name"] == "rest remember" for s in spans(traces)) >= 3
        await eventually(exported)
        await up.interrupted()  # every process flushes and stops; the log is complete

    exported_text = "\n".join(path.read_text() for path in traces.glob("*.jsonl"))
    assert "rest recall" in exported_text
    logged = up.log.read_text()
    for secret in (canary, email, secret_token, token, member, ADMIN_TOKEN,
                   "ada.lovelace", "Lovelace"):
        assert secret not in exported_text, f"{secret!r} in a span"
        assert secret not in logged, f"{secret!r} in a log line"
    assert ws not in exported_text  # no workspace id in a span either


def test_a_command_not_sampled_is_no_span_at_any_hop_and_says_so_with_one_fixed_header(
    tmp_path: Path,
) -> None:
    """Sampling is decided where a trace begins: a command left out sends the one fixed
    `UNSAMPLED` traceparent on every hop, and a process serving it makes no span, even one
    that samples every trace it begins."""
    stop = tracing.configure("front", otlp_endpoint=None, trace_dir=tmp_path, sample_ratio=0)
    try:
        with tracing.span("rest remember", kind="server"):
            assert tracing.quiet()
            with tracing.span("send mem.cmd.remember", kind="client"):
                assert tracing.headers() == tracing.UNSAMPLED
    finally:
        stop()
    stop = tracing.configure("store", otlp_endpoint=None, trace_dir=tmp_path, sample_ratio=1)
    try:
        with (tracing.served("serve mem.cmd.remember", tracing.UNSAMPLED),
              tracing.span("storage commit")):
            assert tracing.headers() == tracing.UNSAMPLED
        with tracing.served("serve mem.cmd.list", None):  # begun here, and sampled
            assert not tracing.quiet()
            sampled = tracing.headers()
            assert sampled is not None and int(sampled["traceparent"][-2:], 16) & 1
    finally:
        stop()
    assert [s["name"] for s in spans(tmp_path)] == ["serve mem.cmd.list"]
