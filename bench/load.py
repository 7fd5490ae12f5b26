"""Load benchmark (issue 9): many agents at once, over the bus and over REST.

    .venv/bin/python -m bench.load --quick        # 1 and 8 agents, 5 s per scenario (~4 min)
    .venv/bin/python -m bench.load                # the whole matrix (~10 min on 2 cores today)
    .venv/bin/python -m bench.load --runs 3       # what the closing note quotes: medians of 3 runs
    .venv/bin/python -m bench.load --memories 5000 --agents 1 --mixes recall \
        --transports bus --loads closed --no-target          # recall at 5,000 memories per member
    .venv/bin/python -m bench.load --workers 4    # passed to `memgate up` as MEMGATE_WORKERS
    make load ARGS=--quick                        # the same, through the Makefile

`memgate up` starts with its defaults (`bench.harness.memgate_up`, which only lifts the remember
limits per credential and member). Every agent is a member of one workspace with its own
credential (memory:read, memory:write) and its own NATS NKey login (`POST /api/admin/nats-agents`);
each is preloaded with `--memories` memories (concurrent remembers over the bus) on a `memgate up`
of its own per agent count and run (rows do not rank over what other rows remembered), then the
benchmark waits until every consumer of the events stream is idle, as it does again after every
scenario ("drain s").

Scenarios: agents (1, 8, 32, 64) × mix (remember only, recall only, 70/30 recall/remember) × load
(saturation = closed loop: every agent sends its next command when the previous one returns;
`--rate` = open loop: that many commands/s in all, round-robin over the agents, on a fixed schedule
whatever the replies, latency counted from the scheduled instant so queueing is not hidden, and
commands beyond `--max-in-flight` unanswered ones shed) × transport (`MemgateClient` on the bus,
REST with the agent's token, sent with aiohttp: the benchmark shares the server's cores, and
httpx spent ~7 ms of CPU per request at 32 clients against aiohttp's ~0.3). Then the issue's
target line: 50 agents, 70/30, at saturation and at `--target-rate` (150/s); and (issue 28) the
same open loop right after a `--burst`-second saturation burst, with no drain between them (the
embedding backlog, index commits and rewrites of the burst still running): what is measured is
the open loop only.

Per scenario: ops/s (successful commands / time from the start to the last reply), p50/p99 per
command (of every reply, failures included), errors by code (`MemgateError.code` on the bus, the
JSON body's `error.code` over REST; `SHED` = dropped by the benchmark, never sent), CPU of the
`memgate up` process tree per command (utime+stime+cutime+cstime of it and every descendant,
nats-server included, from /proc, from the start of the scenario until the events stream is
drained, so the background indexing and embedding of its remembers count) and of this process,
and acknowledgement → embedded: one remember at a time (at most one a second, `--probe-every`) is
followed by its agent polling `recall(text, namespace)` (10 ms apart at first, growing to 200 ms)
until the memory comes back with a cosine rank (`Ranks.cosine`: the vector channel has it). That
figure is an upper bound, late by at most one poll interval plus one recall; the polls add a few
recalls a second to the server's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
import httpx
import nats.errors

from bench.harness import ADMIN, Running, events_idle, memgate_up, percentile, process_tree
from bench.latency import WORDS, note
from bench.load_report import Kind, Result, Scenario, Transport, median_of, table, targets
from memgate import MemgateClient, MemgateError, RecallResult

RECALL_SHARE = {"remember": 0.0, "recall": 1.0, "mix": 0.7}
TRANSPORT_ERRORS = (aiohttp.ClientError, nats.errors.Error, TimeoutError, OSError)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Tally:
    """What one scenario observed, as it runs."""

    latencies_ms: dict[Kind, list[float]] = field(
        default_factory=lambda: {"remember": [], "recall": []})
    errors: Counter[str] = field(default_factory=Counter)
    ok: int = 0
    last_reply: float = 0.0


class OpError(Exception):
    """A REST failure, with memgate's error code (or the HTTP status when there is none)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Ops(Protocol):
    """The two commands the benchmark sends, as one agent over one transport."""

    async def remember(self, namespace: str, text: str) -> str: ...

    async def recall(self, query: str, namespace: str | None = None) -> RecallResult: ...


class BusOps:
    """An agent's commands through `MemgateClient` (its own NATS login)."""

    def __init__(self, client: MemgateClient) -> None:
        self._client = client

    async def remember(self, namespace: str, text: str) -> str:
        return (await self._client.remember(namespace, text)).memory_id

    async def recall(self, query: str, namespace: str | None = None) -> RecallResult:
        return await self._client.recall(query, namespace=namespace)


class RestOps:
    """An agent's commands over REST, with its credential as the bearer token."""

    def __init__(self, http: aiohttp.ClientSession, token: str) -> None:
        self._http = http
        self._auth = {"Authorization": f"Bearer {token}"}

    async def _post(self, op: str, body: dict[str, str]) -> bytes:
        async with self._http.post(f"/api/agent/v1/memories/{op}", json=body,
                                   headers=self._auth) as response:
            content = await response.read()
        if response.ok:
            return content
        try:
            code = str(json.loads(content)["error"]["code"])
        except (ValueError, KeyError, TypeError):  # not memgate's error shape
            code = f"HTTP {response.status}"
        raise OpError(code)

    async def remember(self, namespace: str, text: str) -> str:
        reply = await self._post("remember", {"namespace": namespace, "text": text})
        return str(json.loads(reply)["memoryId"])

    async def recall(self, query: str, namespace: str | None = None) -> RecallResult:
        body = {"query": query} if namespace is None else {"query": query, "namespace": namespace}
        return RecallResult.model_validate_json(await self._post("recall", body))


@dataclass
class Agent:
    """One member with its own credential and NATS login, reachable over both transports."""

    index: int
    bus: BusOps
    rest: RestOps
    rng: random.Random

    def ops(self, transport: Transport) -> Ops:
        return self.bus if transport == "bus" else self.rest


# --- setting up: members, credentials, logins, memories ---


async def admin_post(http: httpx.AsyncClient, path: str, token: str,
                     body: dict[str, object]) -> dict[str, object]:
    response = await http.post(path, json=body, headers={"Authorization": f"Bearer {token}"})
    response.raise_for_status()
    reply: dict[str, object] = response.json()
    return reply


@dataclass(frozen=True)
class Login:
    """What one agent is given: a memgate credential and a NATS NKey login."""

    token: str
    nats_seed: str
    inbox_prefix: str


async def enrol(running: Running, count: int) -> list[Login]:
    """`count` editors of one workspace (agent memories on), each with a token and an NKey."""
    created = await admin_post(running.http, "/api/admin/workspaces", ADMIN, {"name": "load"})
    ws, owner = str(created["workspaceId"]), created["owner"]
    assert isinstance(owner, dict)
    response = await running.http.put(
        f"/api/w/{ws}/ask-history/settings", json={"agentMemoriesEnabled": True},
        headers={"Authorization": f"Bearer {owner['memberToken']}"})
    response.raise_for_status()
    gate = asyncio.Semaphore(8)

    async def one(index: int) -> Login:
        async with gate:
            member = await admin_post(running.http, f"/api/w/{ws}/members",
                                      str(owner["memberToken"]),
                                      {"name": f"agent {index}", "role": "editor"})
            credential = await admin_post(
                running.http, f"/api/w/{ws}/credentials", str(member["memberToken"]),
                {"name": "load", "scopes": ["memory:read", "memory:write"]})
            nkey = await admin_post(running.http, "/api/admin/nats-agents", ADMIN,
                                    {"name": f"agent {index}"})
        return Login(str(credential["token"]), str(nkey["seed"]), str(nkey["inboxPrefix"]))

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def connect(running: Running, logins: Sequence[Login], http: aiohttp.ClientSession,
                  stack: AsyncExitStack) -> tuple[list[Agent], Counter[str]]:
    """An `Agent` per login, its bus connection closed with `stack`; and the connection errors
    nats-py reported (it retries by itself, e.g. while the server applies new logins)."""
    errors: Counter[str] = Counter()

    async def count(exc: Exception) -> None:
        errors[type(exc).__name__] += 1

    async def one(index: int, login: Login) -> Agent:
        client = await MemgateClient.connect(
            running.nats_url, login.token, nats_seed=login.nats_seed,
            inbox_prefix=login.inbox_prefix, error_cb=count)
        stack.push_async_callback(client.close)
        return Agent(index, BusOps(client), RestOps(http, login.token), random.Random(index))

    agents = [await one(i, login) for i, login in enumerate(logins)]
    return agents, errors


async def preload(agents: Sequence[Agent], per_agent: int, in_flight: int) -> float:
    """Remembers `per_agent` memories for every agent over the bus; returns remembers/s."""
    gate = asyncio.Semaphore(in_flight)

    async def one(agent: Agent, i: int) -> None:
        async with gate:
            await agent.bus.remember(f"ns{i % 5}", note(agent.rng, i))

    started = time.perf_counter()
    await asyncio.gather(*(one(a, i) for i in range(per_agent) for a in agents))
    return len(agents) * per_agent / (time.perf_counter() - started)


# --- measuring: CPU, embedding lag, the reference embedding time ---


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and every live descendant, with their reaped children."""
    return sum(sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
               for fields in process_tree(root).values()) / CLOCK_TICKS


class EmbedProbe:
    """Follows one acknowledged remember at a time until recall ranks it by cosine.

    Its polls are recalls too: they add to the server's CPU (not to the command count).
    `every_s=None` turns it off.
    """

    def __init__(self, every_s: float | None, give_up_s: float = 60.0) -> None:
        self.lags_ms: list[float] = []
        self.polls = self.gave_up = 0
        self._every_s, self._give_up_s = every_s, give_up_s
        self._task: asyncio.Task[None] | None = None
        self._next = 0.0

    def offer(self, ops: Ops, memory_id: str, namespace: str, text: str, acked: float) -> None:
        busy = self._task is not None and not self._task.done()
        if self._every_s is None or busy or acked < self._next:
            return
        self._task = asyncio.create_task(self._follow(ops, memory_id, namespace, text, acked))

    async def _follow(self, ops: Ops, memory_id: str, namespace: str, text: str,
                      acked: float) -> None:
        interval = 0.01
        while time.perf_counter() - acked < self._give_up_s:
            self.polls += 1
            try:
                found = await ops.recall(text, namespace=namespace)
            except (MemgateError, OpError, *TRANSPORT_ERRORS):
                found = RecallResult(memories=[])
            if any(m.memory_id == memory_id and m.ranks.cosine is not None
                   for m in found.memories):
                self.lags_ms.append((time.perf_counter() - acked) * 1000)
                break
            await asyncio.sleep(interval)  # a poll interval, part of the measurement
            interval = min(interval * 1.5, 0.2)
        else:
            self.gave_up += 1
        self._next = time.perf_counter() + (self._every_s or 0.0)

    async def finish(self) -> None:
        if self._task is not None:
            await self._task


def embed_one_ms(samples: int = 200, *, compute: str = "int8", threads: int = 1,
                 gap_s: float = 0.0, notes: bool = False) -> float | None:
    """p50 of the shipped model embedding one query, in this process, before memgate starts:
    as the recall actor runs it (int8 compute, one thread), or as the file is (`compute="float"`,
    `threads=0`: every core). With `gap_s`, each query after that long idle, as a lone agent's
    recall meets the model (on our 2-core VM a 5 ms pause about doubles the next run's time).
    `notes`: the benchmark's remembered texts instead of queries, as the embedder runs them."""
    try:
        from memgate.app.settings import Settings
        from memgate.embedding import OnnxEmbedder
    except ImportError:
        return None
    settings = Settings(embedding_compute=compute)
    embedder = OnnxEmbedder(settings.compute_model(), settings.embedding_tokenizer,
                            threads=threads)
    rng = random.Random(0)
    timings = []
    for i in range(samples + 20):
        text = note(rng, i) if notes else " ".join(rng.sample(WORDS, 3))
        time.sleep(gap_s)
        started = time.perf_counter()
        embedder.embed([text])
        if i >= 20:  # warm-up
            timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


# --- driving load ---


async def one_op(agent: Agent, scenario: Scenario, tally: Tally, probe: EmbedProbe,
                 started: float) -> None:
    """One command by `agent`, its latency counted from `started` (the scheduled instant)."""
    ops = agent.ops(scenario.transport)
    kind: Kind = "recall" if agent.rng.random() < RECALL_SHARE[scenario.mix] else "remember"
    try:
        if kind == "recall":
            await ops.recall(" ".join(agent.rng.sample(WORDS, 3)))
        else:
            namespace = f"ns{agent.rng.randrange(5)}"
            text = note(agent.rng, agent.rng.randrange(10**9))
            memory_id = await ops.remember(namespace, text)
            probe.offer(ops, memory_id, namespace, text, time.perf_counter())
    except (MemgateError, OpError) as exc:
        tally.errors[str(exc.code)] += 1
    except TRANSPORT_ERRORS as exc:
        tally.errors[type(exc).__name__] += 1
    else:
        tally.ok += 1
    tally.last_reply = time.perf_counter()
    tally.latencies_ms[kind].append((tally.last_reply - started) * 1000)


async def closed_loop(agents: Sequence[Agent], scenario: Scenario, tally: Tally,
                      probe: EmbedProbe, until: float) -> None:
    async def agent_loop(agent: Agent) -> None:
        while time.perf_counter() < until:
            await one_op(agent, scenario, tally, probe, time.perf_counter())

    await asyncio.gather(*(agent_loop(a) for a in agents))


async def open_loop(agents: Sequence[Agent], scenario: Scenario, tally: Tally,
                    probe: EmbedProbe, until: float, max_in_flight: int) -> None:
    """Commands at `scenario.rate`/s in all, round-robin over the agents, whatever the replies."""
    start, in_flight = time.perf_counter(), set[asyncio.Task[None]]()
    for i in range(int((until - start) * scenario.rate)):
        due = start + i / scenario.rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))  # the offered schedule
        if len(in_flight) >= max_in_flight:
            tally.errors["SHED"] += 1
            continue
        task = asyncio.create_task(one_op(agents[i % len(agents)], scenario, tally, probe, due))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.wait(in_flight)


@dataclass(frozen=True)
class Knobs:
    """How every scenario runs."""

    duration_s: float
    max_in_flight: int  # open loop: commands beyond this many unanswered ones are shed
    probe_every_s: float | None  # ack → embedded sampling; None: off
    burst_s: float = 20.0  # after-burst: seconds of saturation before the open loop


async def run_scenario(running: Running, agents: Sequence[Agent], scenario: Scenario,
                       knobs: Knobs) -> Result:
    assert running.pid is not None
    tally, probe = Tally(), EmbedProbe(knobs.probe_every_s)
    server_cpu, client_cpu = tree_cpu_s(running.pid), time.process_time()
    started = time.perf_counter()
    until, chosen = started + knobs.duration_s, agents[:scenario.agents]
    if scenario.load == "closed":
        await closed_loop(chosen, scenario, tally, probe, until)
    elif scenario.load == "after-burst":
        burst_until = started + knobs.burst_s
        await closed_loop(chosen, scenario, Tally(), EmbedProbe(None), burst_until)
        server_cpu, client_cpu = tree_cpu_s(running.pid), time.process_time()
        started, until = time.perf_counter(), time.perf_counter() + knobs.duration_s
        await open_loop(chosen, scenario, tally, probe, until, knobs.max_in_flight)
    else:
        await open_loop(chosen, scenario, tally, probe, until, knobs.max_in_flight)
    await probe.finish()
    client_cpu = time.process_time() - client_cpu
    drain_s = await events_idle(running)
    server_cpu = tree_cpu_s(running.pid) - server_cpu
    replies = max(1, sum(len(v) for v in tally.latencies_ms.values()))
    return Result(
        scenario=scenario,
        ops_per_s=tally.ok / max(1e-9, tally.last_reply - started),
        p50_ms={k: percentile(v, 50) for k, v in tally.latencies_ms.items() if v},
        p99_ms={k: percentile(v, 99) for k, v in tally.latencies_ms.items() if v},
        errors=dict(tally.errors),
        server_cpu_ms_per_op=server_cpu * 1000 / replies,
        client_cpu_ms_per_op=client_cpu * 1000 / replies,
        embedded_p50_ms=statistics.median(probe.lags_ms) if probe.lags_ms else None,
        embedded_samples=len(probe.lags_ms),
        embedded_gave_up=probe.gave_up,
        probe_polls=probe.polls,
        drain_s=drain_s,
    )


# --- the command line ---


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    matrix = [Scenario(n, mix, load, transport, args.rate)
              for n in args.agents for load in args.loads for mix in args.mixes
              for transport in args.transports]
    if args.target:
        matrix += [Scenario(50, "mix", load, transport, args.target_rate)
                   for load in ("closed", "open", "after-burst") for transport in ("bus", "rest")]
    return matrix


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="1 and 8 agents, 5 s per scenario, no 50-agent target line")
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--mixes", nargs="+", choices=list(RECALL_SHARE),
                        default=list(RECALL_SHARE))
    parser.add_argument("--loads", nargs="+", choices=["closed", "open", "after-burst"],
                        default=["closed", "open"])
    parser.add_argument("--transports", nargs="+", choices=["bus", "rest"],
                        default=["bus", "rest"])
    parser.add_argument("--target", action=argparse.BooleanOptionalAction, default=True,
                        help="add the 50-agent 70/30 scenarios of the issue's target line")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per scenario")
    parser.add_argument("--rate", type=float, default=150.0, help="open loop: commands/s in all")
    parser.add_argument("--target-rate", type=float, default=150.0)
    parser.add_argument("--memories", type=int, default=50, help="preloaded per agent")
    parser.add_argument("--runs", type=int, default=1, help="the table shows medians")
    parser.add_argument("--burst", type=float, default=20.0,
                        help="after-burst: seconds of saturation before the open loop")
    parser.add_argument("--max-in-flight", type=int, default=128,
                        help="open loop: shed commands beyond this many unanswered ones")
    parser.add_argument("--probe-every", type=float, default=1.0,
                        help="seconds between ack → embedded samples (0: no probe)")
    parser.add_argument("--workers", type=int, default=None,
                        help="MEMGATE_WORKERS for `memgate up` (default: its own)")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.duration, args.target = [1, 8], 5.0, False
    return args


async def fresh_instance(block: list[Scenario], args: argparse.Namespace, knobs: Knobs,
                         overrides: dict[str, str]) -> list[Result]:
    """The scenarios of one agent count, in order, on a `memgate up` of their own (so a row
    does not rank over what the scenarios of other agent counts remembered)."""
    async with AsyncExitStack() as stack:
        running = await stack.enter_async_context(memgate_up(**overrides))
        http = await stack.enter_async_context(aiohttp.ClientSession(
            running.http_url, timeout=aiohttp.ClientTimeout(total=30),
            connector=aiohttp.TCPConnector(limit=args.max_in_flight + 64)))
        logins = await enrol(running, block[0].agents)
        agents, connect_errors = await connect(running, logins, http, stack)
        rate = await preload(agents, args.memories, in_flight=64)
        drained = await events_idle(running)
        print(f"{len(agents)} agents ({sum(connect_errors.values())} NATS connection retries) × "
              f"{args.memories} memories preloaded at {rate:.0f} remembers/s on a fresh memgate "
              f"up; events drained {drained:.1f} s later", flush=True)
        for agent in agents:  # open every connection before measuring
            await agent.bus.recall("warm up")
            await agent.rest.recall("warm up")
        return [await run_scenario(running, agents, scenario, knobs) for scenario in block]


async def main() -> None:
    args = parse_args()
    plan = scenarios(args)
    knobs = Knobs(args.duration, args.max_in_flight, args.probe_every or None, args.burst)
    embed_ms = embed_one_ms()
    idle_ms = embed_one_ms(gap_s=0.005)
    note_ms = embed_one_ms(notes=True)
    float_ms = embed_one_ms(compute="float", threads=0)

    def shown(ms: float | None) -> str:
        return "?" if ms is None else f"{ms:.1f}"

    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} before starting; "
          f"the shipped model embeds one query in {shown(embed_ms)} ms as memgate runs it (int8 "
          f"compute, one thread; {shown(idle_ms)} ms after 5 ms idle), {shown(float_ms)} ms "
          f"in float on every core; one remembered note in {shown(note_ms)} ms (p50, in this "
          "process)")
    overrides = {} if args.workers is None else {"MEMGATE_WORKERS": str(args.workers)}
    runs: dict[Scenario, list[Result]] = {s: [] for s in plan}
    blocks: dict[int, list[Scenario]] = {}
    for scenario in plan:
        blocks.setdefault(scenario.agents, []).append(scenario)
    for run in range(args.runs):
        for block in blocks.values():
            for scenario, result in zip(block, await fresh_instance(block, args, knobs, overrides),
                                        strict=True):
                runs[scenario].append(result)
                print(f"run {run + 1}/{args.runs}: {table([result]).splitlines()[-1]}",
                      flush=True)
    medians = [median_of(r) for r in runs.values()]
    print(f"\n{args.runs} run(s), medians; {args.duration:.0f} s per scenario; "
          f"a fresh memgate up per agent count and run, {args.memories} memories per agent "
          "before its first scenario; "
          f"load average {os.getloadavg()[0]:.2f} at the end\n")
    print(table(medians))
    print()
    print(targets(medians, embed_ms, note_ms, args.memories, args.target_rate))


if __name__ == "__main__":
    asyncio.run(main())
