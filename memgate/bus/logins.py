"""What each kind of memgate process may do on the embedded bus: least privilege (SPEC §6).

Every actor kind, and the REST/MCP adapter, logs in as a user of its own. A user may publish
only the requests its kind makes (and answer the requests it receives: `allow_responses`),
subscribe only to the subjects its kind serves and to its own reply inbox, and reach JetStream
only if its kind reads or writes the events stream.

Replies go to the inboxes of the kinds that call it, named in the permissions: the dynamic
`allow_responses` grant does not survive a configuration reload (measured, nats-server 2.15.1:
a reply sent after a reload was refused), and the server reloads whenever agents change.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterable
from typing import Final

from memgate.bus import subjects

PUBLIC_COMMANDS: Final = (subjects.REMEMBER, subjects.RECALL, subjects.LIST, subjects.FORGET,
                          subjects.IMPORT)
ANY: Final = "*"  # any partition
# The public commands an agent may also send for its partition (`subjects.partitioned`).
PARTITIONED_COMMANDS: Final = tuple(subjects.partitioned(command, ANY)
                                    for command in subjects.BESIDE_STORAGE)

# Where the responses to the agents' commands go: the server maps each to the caller's account.
SERVICE_REPLIES: Final = "_R_.>"
# The JetStream API and the acknowledgements of messages a pull consumer was handed.
JETSTREAM: Final = ("$JS.API.>", "$JS.ACK.>")
DEAD_LETTERS: Final = subjects.dead_letter(ANY)  # where consumers record what they gave up on
# What no kind does to a stream, though the JetStream API allows it to those that use JetStream:
# destroy or rewrite what it holds (delete, purge, a message's deletion, a restore), copy it out
# whole (a snapshot), or change the cluster.
JETSTREAM_DENIED: Final = tuple(f"$JS.API.{api}" for api in (
    "STREAM.DELETE.>", "STREAM.PURGE.>", "STREAM.MSG.DELETE.>", "STREAM.RESTORE.>",
    "STREAM.SNAPSHOT.>", "STREAM.PEER.REMOVE.>", "STREAM.LEADER.STEPDOWN.>",
    "CONSUMER.DELETE.>", "ACCOUNT.PURGE.>", "SERVER.REMOVE", "META.LEADER.STEPDOWN"))


# What a single-writer kind needs to claim its actors (`cluster.ownership`) and keep standbys of
# them (`cluster.replication`): the leases, homes, standbys and drained nodes' buckets, and
# nothing else of JetStream unless its role says so.
OWNERSHIP: Final = tuple(grant for bucket in ("MEMGATE_LEASES", "MEMGATE_HOMES",
                                              "MEMGATE_STANDBYS", "MEMGATE_DRAINED")
                   for grant in (
    f"$KV.{bucket}.>", f"$JS.API.STREAM.INFO.KV_{bucket}", f"$JS.API.STREAM.CREATE.KV_{bucket}",
    f"$JS.API.STREAM.UPDATE.KV_{bucket}", f"$JS.API.STREAM.MSG.GET.KV_{bucket}",
    f"$JS.API.DIRECT.GET.KV_{bucket}.>"))


@dataclass(frozen=True)
class Role:
    """The subjects one kind may publish and subscribe to."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    callers: tuple[str, ...] = ()  # the kinds whose requests it answers (beyond readiness)
    jetstream: bool = False
    owns: bool = False  # a single-writer kind: claims its actors through leases

    def permissions(self, kind: str) -> dict[str, object]:
        """nats-server `permissions` for a user of this role (`kind`), its replies on its own
        inbox. A kind that owns its stores also talks to its own kind on other nodes: an owner
        and its standbys (`subjects.replica`)."""
        own_inbox = inbox_prefix(kind)
        answers = {*self.callers, ADAPTER} if self.subscribe else set()  # readiness: adapter
        replies = [f"{inbox_prefix(caller)}.>" for caller in sorted(answers)]
        replicas = (subjects.replica(f"{kind}.>"),) if self.owns else ()
        publish = [*self.publish, *replies, *(JETSTREAM if self.jetstream else ()),
                   *(OWNERSHIP if self.owns else ()),
                   *((*replicas, f"{own_inbox}.>") if self.owns else ())]
        allowed: dict[str, object] = {"allow": publish}
        if self.jetstream or self.owns:
            allowed["deny"] = list(JETSTREAM_DENIED)
        return {"publish": allowed,
                "subscribe": {"allow": [*self.subscribe, f"{own_inbox}.>", *replicas]},
                "allow_responses": True}


def _ready(kind: str, partitioned: bool = False) -> str:
    return subjects.ready(f"{kind}.{ANY}" if partitioned else kind)


ADAPTER: Final = "adapter"
RECALL_READS: Final = ("scope", "rows")  # the storage operations recall asks

ROLES: Final[dict[str, Role]] = {
    "governance": Role(
        publish=(subjects.DIRECTORY_PRINCIPAL, subjects.DIRECTORY_MEMBER,  # the operator's import
                 subjects.registry("scope"), subjects.registry("check_remember"),
                 subjects.registry("verify"),
                 *(subjects.store(ANY, op) for op in ("remember", "list", "forget", "import")),
                 subjects.recall_internal(), SERVICE_REPLIES),
        subscribe=(*PUBLIC_COMMANDS, *PARTITIONED_COMMANDS, subjects.PRINCIPALS_CHANGED,
                   _ready("governance"), _ready("governance", partitioned=True))),
    "directory": Role(
        publish=(subjects.NATS_RELOAD, subjects.PRINCIPALS_CHANGED, subjects.registry("scope"),
                 subjects.REAPER_SWEEP,
                 *(subjects.store(ANY, op) for op in ("list", "purge"))),
        subscribe=("mem.int.dir.>", _ready("directory"), subjects.dump("directory", ">"),
                   *(subjects.admin(f"{group}.>") for group in (
                       "workspaces", "members", "credentials", "settings", "self", "owner",
                       "nats"))),
        callers=("governance", "registry", "nats-authority", "spaces", "erasure", "reaper",
                 "keys"), owns=True),
    "registry": Role(
        publish=(subjects.DIRECTORY_OWNER_CHECK, subjects.registry_event(">")),
        subscribe=(subjects.admin("registry.>"), subjects.registry(">"), _ready("registry"),
                   subjects.dump("registry", ">")),
        callers=("governance", "recall", "directory", "keys"), jetstream=True, owns=True),
    "recall": Role(
        # recall reads from storage (`ports.storage.BusStorage.recall_scope`, `.rows`), never
        # writes: no remember, forget, purge, reap or erasure of any partition
        publish=(*(subjects.store(ANY, op) for op in RECALL_READS), subjects.index(ANY, "rank"),
                 subjects.embed(ANY, "rank"), subjects.registry("verify")),
        subscribe=(subjects.recall_internal(), _ready("recall")),
        callers=("governance", "space-memories")),
    "storage": Role(
        publish=(subjects.memory_events(ANY), DEAD_LETTERS),
        subscribe=(subjects.store(ANY, ANY), _ready("storage", partitioned=True),
                   subjects.embedded(ANY),
                   subjects.dump(f"storage.{ANY}", ">")),
        callers=("governance", "recall", "directory", "indexer", "embedder", "spaces",
                 "erasure", "reaper", "keys", "space-memories"),
        jetstream=True, owns=True),
    "indexer": Role(
        publish=(subjects.store(ANY, "texts"), subjects.store(ANY, "catalog"), DEAD_LETTERS),
        subscribe=(subjects.index(ANY, ANY), _ready("indexer", partitioned=True)),
        callers=("recall", "erasure"), jetstream=True, owns=True),
    "embedder": Role(
        publish=(subjects.store(ANY, "texts"), subjects.store(ANY, "catalog"), DEAD_LETTERS,
                 subjects.embedded(ANY)),
        subscribe=(subjects.embed(ANY, ANY), _ready("embedder", partitioned=True)),
        callers=("recall", "erasure"), jetstream=True, owns=True),
    "spaces": Role(
        publish=(subjects.DIRECTORY_MEMBER, subjects.store(ANY, "purge"),
                 subjects.sessions_internal("space_deleted")),
        subscribe=(subjects.space("spaces.>"), subjects.space("shares.>"),
                   subjects.spaces_internal(">"), _ready("spaces"), subjects.dump("spaces", ">")),
        callers=("erasure", "sessions", "keys", "space-memories"), owns=True),
    "sessions": Role(
        publish=(subjects.spaces_internal("access"), subjects.space_memories_internal("extract")),
        subscribe=(subjects.space("sessions.>"), subjects.sessions_internal(">"),
                   _ready("sessions"), subjects.dump("sessions", ">")),
        callers=("erasure", "spaces", "keys"), owns=True),
    "space-memories": Role(  # the mem0-compatible API: stateless, like governance
        publish=(*(subjects.spaces_internal(op)
                   for op in ("access", "entity", "settle", "entities", "scope", "llm")),
                 *(subjects.store(ANY, op)  # import: `memgate import mem0`
                   for op in ("remember", "remember_all", "list", "forget", "import")),
                 subjects.spaces_internal("profiles.*"),  # user profiles (ports.profiles)
                 subjects.recall_internal()),
        subscribe=(subjects.space("memories.>"), subjects.space_memories_internal(">"),
                   _ready("space-memories")),
        callers=("sessions",)),
    "erasure": Role(
        publish=(subjects.DIRECTORY_MEMBER, subjects.DIRECTORY_FORGET_MEMBER,
                 subjects.spaces_internal("subject"),
                 subjects.store(ANY, "subject"), subjects.index(ANY, "drop"),
                 subjects.embed(ANY, "drop"), subjects.sessions_internal("subject"),
                 subjects.keys_internal("subject"), subjects.AUDIT_APPEND),
        subscribe=(subjects.admin("erasure.>"), _ready("erasure")), owns=True),
    "reaper": Role(  # retention: asks, never reads or writes a store itself
        publish=(subjects.DIRECTORY_RETENTION, subjects.store(ANY, "reap")),
        subscribe=(subjects.REAPER_SWEEP, _ready("reaper")),
        callers=("directory",)),
    "keys": Role(  # data keys (crypto-shredding); seals what backups and exports carry out
        publish=(f"{subjects.DUMP_PREFIX}.>", subjects.AUDIT_APPEND),
        subscribe=(subjects.keys_internal(">"), subjects.admin("backup.>"), _ready("keys")),
        callers=("erasure",), owns=True),
    "audit": Role(  # the hash-chained audit log: memory deletions (events) and appends
        publish=(DEAD_LETTERS,),
        subscribe=(subjects.AUDIT_APPEND, subjects.admin("audit.verify"), _ready("audit")),
        callers=("keys", "erasure"), jetstream=True, owns=True),
    "nats-authority": Role(
        publish=(subjects.DIRECTORY_NATS_AGENTS,),
        subscribe=(subjects.NATS_RELOAD, _ready("nats-authority")),
        callers=("directory",)),
    "cluster": Role(  # the operator's view of the leases and homes: reads them, nothing more;
        # and asks each store's owner its standbys' lag
        publish=(*(grant for bucket in ("MEMGATE_LEASES", "MEMGATE_HOMES",
                                        "MEMGATE_STANDBYS") for grant in (
            f"$JS.API.STREAM.INFO.KV_{bucket}", f"$JS.API.STREAM.MSG.GET.KV_{bucket}",
            f"$JS.API.DIRECT.GET.KV_{bucket}.>")),
            subjects.replica(f"{ANY}.lag"), subjects.replica(f"{ANY}.{ANY}.lag")),
        subscribe=(subjects.admin("cluster.>"), _ready("cluster"))),
    ADAPTER: Role(  # REST and MCP: the front door, the admin commands and readiness probes
        publish=(*PUBLIC_COMMANDS, subjects.admin(">"), subjects.space(">"),
                 subjects.ready(">")),
        subscribe=()),
}


def kind_of(actor_name: str) -> str:
    """The kind of an actor (`storage.p0` → `storage`)."""
    return actor_name.split(".", 1)[0]


PARTITIONED: Final = ("storage", "indexer", "embedder")  # one actor of each per partition
# The single-writer actors that are not partitioned: the directory, registry, spaces, ...
SINGLE_WRITERS: Final = frozenset(
    kind for kind, role in ROLES.items() if role.owns and kind not in PARTITIONED)


def owned(actor_name: str) -> bool:
    """Whether an actor writes files only one process may write (its role `owns`)."""
    role = ROLES.get(kind_of(actor_name))
    return role is not None and role.owns


def single_writers(partitions: Iterable[str]) -> list[str]:
    """Every single-writer actor of a deployment with these partitions, by name: where the
    process layout, the cluster view and the ownership claims start from."""
    return [*sorted(SINGLE_WRITERS),
            *(f"{kind}.{partition}" for partition in partitions for kind in PARTITIONED)]


def inbox_prefix(kind: str) -> str:
    """Where a kind's replies come: its own prefix, so no kind reads another's replies."""
    return f"_INBOX_MG_{kind.replace('-', '_')}"


def agent_permissions(inbox_prefix: str) -> dict[str, object]:
    """An agent may send the public commands and read replies on its own inbox, nothing more."""
    return {"publish": {"allow": [*PUBLIC_COMMANDS, *PARTITIONED_COMMANDS]},
            "subscribe": {"allow": [f"{inbox_prefix}.>"]}}
