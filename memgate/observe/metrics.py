"""The Prometheus series of memgate (SPEC §6), recorded where the work happens.

Labels name kinds of things only: commands (the bus subject without `mem.`), transports, error
codes, actors, durables, partitions, files and limits. Never a memory's text, an id of a
workspace, member or end user, a token, or anything else a caller sent.

The series are module-level, as prometheus-client intends: a process-wide registry, like the
`logging` tree. Under `memgate up` each process writes its values into files of the data
directory's run directory (prometheus-client's multiprocess mode, `PROMETHEUS_MULTIPROC_DIR`,
set by the supervisor), and `/metrics` adds them up (`observe.exposition`). Recording is a
counter increment or a histogram observation, cheap even in that mode (docs/DECISIONS.md,
"`/metrics` over every process").
"""

from __future__ import annotations

from functools import cache

from prometheus_client import Counter, Gauge, Histogram

TRANSPORTS = ("rest", "mcp", "nats")
OK = "OK"  # the outcome code of a command that succeeded (failures carry their error code)

# A command answers in milliseconds; a recall with a cold catalog, or a deletion that rewrites
# a file, in up to seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
EMBEDDED_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
REWRITE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

COMMANDS = Counter("memgate_commands", "Commands answered, by command, transport and outcome "
                   "code (OK or the error code)", ["command", "transport", "code"])
COMMAND_SECONDS = Histogram("memgate_command_seconds", "Time to answer a command, as its "
                            "transport's adapter saw it", ["command", "transport"],
                            buckets=LATENCY_BUCKETS)
GROUP_COMMIT_SIZE = Histogram("memgate_group_commit_size", "Remembers committed together in "
                              "one transaction", ["actor"], buckets=GROUP_BUCKETS)
CONSUMER_PENDING = Gauge("memgate_consumer_pending", "Events a durable consumer has yet to "
                         "apply (those in hand included)", ["durable"],
                         multiprocess_mode="mostrecent")
CONSUMER_REDELIVERIES = Counter("memgate_consumer_redeliveries", "Events delivered again to a "
                                "durable consumer (a failed or unacknowledged earlier delivery)",
                                ["durable"])
DEAD_LETTERS = Counter("memgate_dead_letters", "Events a durable consumer gave up on, recorded "
                       "in MEM_DLQ", ["durable"])
EMBEDDING_BACKLOG = Gauge("memgate_embedding_backlog", "Stored memories whose events the "
                          "embedder has yet to apply", ["partition"],
                          multiprocess_mode="mostrecent")
EMBEDDED_SECONDS = Histogram("memgate_embedded_after_seconds", "From a remember's "
                             "acknowledgement to its vector", ["partition"],
                             buckets=EMBEDDED_BUCKETS)
REWRITE_SECONDS = Histogram("memgate_file_rewrite_seconds", "Rewrites of a DuckDB file after "
                            "deletions (storage/compaction.py)", ["file"],
                            buckets=REWRITE_BUCKETS)
RATE_LIMITED = Counter("memgate_rate_limit_refusals", "Requests refused by a rate limit "
                       "(429), by limit", ["limit"])


def command_name(subject: str) -> str:
    """A command's label: its subject without `mem.` (`remember`, `admin.members.add`)."""
    return subject.removeprefix("mem.cmd.").removeprefix("mem.")


@cache
def _children(subject: str, transport: str) -> tuple[Histogram, dict[str, Counter]]:
    command = command_name(subject)
    return COMMAND_SECONDS.labels(command, transport), {OK: COMMANDS.labels(command, transport,
                                                                            OK)}


def command_done(subject: str, transport: str, code: str, seconds: float) -> None:
    """One command answered (labels looked up once per subject and transport)."""
    latency, counters = _children(subject, transport)
    latency.observe(seconds)
    counter = counters.get(code)
    if counter is None:
        counter = counters[code] = COMMANDS.labels(command_name(subject), transport, code)
    counter.inc()


__all__ = [
    "COMMANDS", "COMMAND_SECONDS", "CONSUMER_PENDING", "CONSUMER_REDELIVERIES", "DEAD_LETTERS",
    "EMBEDDED_SECONDS", "EMBEDDING_BACKLOG", "GROUP_COMMIT_SIZE", "OK", "RATE_LIMITED",
    "REWRITE_SECONDS", "TRANSPORTS", "command_done", "command_name",
]
