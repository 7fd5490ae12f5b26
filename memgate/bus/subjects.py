"""Every subject and stream name, in one place.

Public subjects (`mem.cmd.*`, `mem.admin.*`) are the front door: commands carry a credential
and governance runs on them. Everything under `mem.int.*` and `mem.evt.*` is internal.
"""

from __future__ import annotations

import zlib
from typing import Final

REMEMBER: Final = "mem.cmd.remember"
RECALL: Final = "mem.cmd.recall"
LIST: Final = "mem.cmd.list"
FORGET: Final = "mem.cmd.forget"
IMPORT: Final = "mem.cmd.import"  # a bulk import of agent memories (up to 1,000 remembers)
# The commands governed beside storage. In a cluster each may also be sent for a partition
# (`partitioned`): to the governance on the node that owns it, whose node a plain command's
# reply names in this header (docs/DECISIONS.md, "An agent's commands go to its partition's
# node").
BESIDE_STORAGE: Final = (REMEMBER, LIST, FORGET, IMPORT)
PARTITION_HEADER: Final = "Memgate-Partition"


def partitioned(command: str, partition: str) -> str:
    """A command of `BESIDE_STORAGE` for `partition` (`mem.cmd.p3.remember`; `*`: any)."""
    return command.replace("mem.cmd.", f"mem.cmd.{partition}.", 1)


def unpartitioned(subject: str) -> str:
    """The command a subject carries, its partition dropped (`mem.cmd.remember`)."""
    parts = subject.split(".")
    return ".".join((*parts[:2], parts[3])) if len(parts) == 4 and parts[1] == "cmd" else subject

ADMIN_PREFIX: Final = "mem.admin"
SPACE_PREFIX: Final = "mem.space"  # memory-space routes (SPEC §4), member token in the envelope

DIRECTORY_PRINCIPAL: Final = "mem.int.dir.principal"
DIRECTORY_NATS_AGENTS: Final = "mem.int.dir.nats_agents"
NATS_RELOAD: Final = "mem.int.nats.reload"
DIRECTORY_OWNER_CHECK: Final = "mem.int.dir.owner_check"
DIRECTORY_MEMBER: Final = "mem.int.dir.member"  # a member token → MemberPrincipal
DIRECTORY_FORGET_MEMBER: Final = "mem.int.dir.forget_member"  # an erasure's last step
DIRECTORY_RETENTION: Final = "mem.int.dir.retention"  # every workspace's retentionDays
# The directory changed a credential, member or workspace: governance forgets its principals.
PRINCIPALS_CHANGED: Final = "mem.int.principals.changed"
REAPER_SWEEP: Final = "mem.int.reaper.sweep"  # purge what retention allows no longer, now

EVENTS_STREAM: Final = "MEM_EVT"
EVENTS_SUBJECTS: Final = "mem.evt.>"
DLQ_STREAM: Final = "MEM_DLQ"
DLQ_SUBJECTS: Final = "mem.dlq.>"


def admin(operation: str) -> str:
    return f"{ADMIN_PREFIX}.{operation}"


class Admin:
    """The admin commands (`mem.admin.*`: the operator's, owners' and members'), each named once
    for the adapter that sends it and the actor that answers it."""

    WORKSPACES_CREATE: Final = admin("workspaces.create")
    SELF_WHOAMI: Final = admin("self.whoami")
    MEMBERS_LIST: Final = admin("members.list")
    MEMBERS_ADD: Final = admin("members.add")
    MEMBERS_PATCH: Final = admin("members.patch")
    CREDENTIALS_LIST: Final = admin("credentials.list")
    CREDENTIALS_CREATE: Final = admin("credentials.create")
    CREDENTIALS_REVOKE: Final = admin("credentials.revoke")
    SETTINGS_GET: Final = admin("settings.get")
    SETTINGS_PUT: Final = admin("settings.put")
    SELF_LIST: Final = admin("self.list")
    SELF_DELETE: Final = admin("self.delete")
    OWNER_PURGE: Final = admin("owner.purge")
    NATS_CREATE: Final = admin("nats.create")
    NATS_REVOKE: Final = admin("nats.revoke")
    REGISTRY_COLLECTIONS_CREATE: Final = admin("registry.collections.create")
    REGISTRY_COLLECTIONS_DELETE: Final = admin("registry.collections.delete")
    REGISTRY_DOCUMENTS_PUT: Final = admin("registry.documents.put")
    REGISTRY_DOCUMENTS_DELETE: Final = admin("registry.documents.delete")
    REGISTRY_CONTEXT_SETS_SAVE: Final = admin("registry.context_sets.save")
    CLUSTER_STATUS: Final = admin("cluster.status")
    AUDIT_VERIFY: Final = admin("audit.verify")
    ERASURE_CREATE: Final = admin("erasure.create")
    ERASURE_VERIFY: Final = admin("erasure.verify")
    ERASURE_DISCOVER: Final = admin("erasure.discover")
    ERASURE_DECIDE: Final = admin("erasure.decide")
    ERASURE_EXECUTE: Final = admin("erasure.execute")
    ERASURE_GET: Final = admin("erasure.get")
    ERASURE_METRICS: Final = admin("erasure.metrics")
    ERASURE_LIST: Final = admin("erasure.list")
    BACKUP_BEGIN: Final = admin("backup.begin")
    BACKUP_PAGE: Final = admin("backup.page")
    BACKUP_END: Final = admin("backup.end")


def space(operation: str) -> str:
    """A public memory-space command: `spaces.*` (spaces actor), `sessions.*` (sessions actor),
    `memories.*` (the mem0 routes' space-memories actor)."""
    return f"{SPACE_PREFIX}.{operation}"


def spaces_internal(operation: str) -> str:
    """The spaces actor's answers to other actors: `access`, `entity` (new: pending), `settle`,
    `entities` (of some namespaces), `scope` (a mem0 filter's namespaces), `llm`, `subject`."""
    return f"mem.int.spaces.{operation}"


def sessions_internal(operation: str) -> str:
    """The sessions actor's answers to other actors (`subject`: erasure's conversation logs)."""
    return f"mem.int.sessions.{operation}"


def keys_internal(operation: str) -> str:
    """The key store's answers (`subject`: a subject's data key, for crypto-shredding)."""
    return f"mem.int.keys.{operation}"


DUMP_PREFIX: Final = "mem.int.dump"


def dump(owner: str, operation: str) -> str:
    """An owner of a DuckDB file reading it for a backup (`begin`, `page`, `end`): `owner` is
    the actor's name (`directory`, `storage.p0`, …); only the keys actor asks."""
    return f"{DUMP_PREFIX}.{owner}.{operation}"


AUDIT_APPEND: Final = "mem.int.audit.append"  # an entry for the audit log (references only)


def space_memories_internal(operation: str) -> str:
    """The space-memories actor's answers to other actors: `extract` (the sessions actor's
    extract_memories strategy)."""
    return f"mem.int.spacemem.{operation}"


def store(partition: str, operation: str) -> str:
    """An operation of the storage actor that owns `partition`."""
    return f"mem.int.store.{partition}.{operation}"


def index(partition: str, operation: str) -> str:
    return f"mem.int.index.{partition}.{operation}"


def embed(partition: str, operation: str) -> str:
    return f"mem.int.embed.{partition}.{operation}"


def embedded(partition: str) -> str:
    """Where a partition's embedder tells its backlog (`EmbedProgress`) to its storage actor."""
    return f"mem.int.embedded.{partition}"


def registry(operation: str) -> str:
    return f"mem.int.registry.{operation}"


def registry_event(event: str) -> str:
    return f"mem.evt.registry.{event}"


def recall_internal() -> str:
    return "mem.int.recall"


def memory_events(partition: str) -> str:
    return f"mem.evt.{partition}.memory"


def dead_letter(durable: str) -> str:
    """Where a durable consumer records the messages it gave up on (ids only)."""
    return f"mem.dlq.{durable}"


REPLICA_PREFIX: Final = "mem.int.replica"


def replica(operation: str) -> str:
    """Between a store's owner and its standbys (`cluster.replication`): `<store>.<op>`."""
    return f"{REPLICA_PREFIX}.{operation}"


def ready(actor: str) -> str:
    return f"mem.int.ready.{actor}"


def partition_of(workspace_id: str, partitions: int) -> str:
    """The storage partition that owns a workspace (stable, so data never moves by itself)."""
    return f"p{zlib.crc32(workspace_id.encode()) % partitions}"
