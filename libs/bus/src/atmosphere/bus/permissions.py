"""Who may use which subject: every role's NATS permissions, and the credentials that carry them.

The one owner of that question. Each service logs in as its own user (`user_name`) whose
permissions come from `permissions(role, namespace=...)`: allow-lists of wire subjects (the
namespace applied) it may publish to and subscribe to, built from `atmosphere.bus.subjects`.
Everything not listed is refused by the server.

What the lists say (every service also answers its own `atmo.svc.<service>.*` and reads only
its own inbox, `inbox_prefix(user)`):

- ingress publishes top-level submissions, the run-id event of what it submits, run control,
  `atmo.conv.closed`, its governance checks and admin, memory's workspace reads, tape reads and
  the services' info; it subscribes to run events and keeps `ATMO_CONVERSATIONS`.
- dispatch publishes every submission (gRPC, coordinators' sub-runs), run events and probes, the
  journal, run control, tool calls (`atmo.tool.*`, `atmo.mem.tool.*`, `atmo.sandbox.>`), memory
  and its governance checks; it serves run control and `atmo.conv.closed`, follows run events
  and pulls runs from the run queue's provisioned consumers.
- sandbox serves `atmo.tool.*` and `atmo.sandbox.>`, and publishes nothing but replies.
- governance serves `atmo.gov.>`; memory serves `atmo.mem.>` and asks `atmo.gov.screen_facts`;
  tape serves `atmo.tape.>` and records `ATMO_EVENTS`. Memory and governance each write and
  apply a log of record of their own (`ATMO_MEMORY`, `ATMO_GOVERNANCE`).
- observer subscribes to run events, reads `ATMO_EVENTS` and asks the tape; nothing else.
- provisioner creates and updates the streams, buckets and the run queue's consumers
  (`atmosphere provision`, a Kubernetes Job); it publishes and reads no message of ours.

Only ingress and dispatch may submit runs; only dispatch may publish run events, with one
exception: a run's first event (seq 1, its run id) is written by whoever submits it
(`runs.submit_run`), so ingress publishes that too. It adds nothing an ingress could not do
already: ingress is what streams a run's events to its client.

JetStream (what nats-server 2.15 enforces, proven by tests/e2e/test_permission_matrix.py): no
service login and not the observer may create, update, delete or purge a stream or bucket, nor
create a consumer of any kind. A subject permission can name the stream and the consumer in
`$JS.API.CONSUMER.CREATE.<stream>.<name>`, but not what the request's body says: whoever may
create a consumer chooses its `deliver_subject` (the server delivers the stream to any subject,
one its creator may not publish to included), and `$JS.API.CONSUMER.CREATE.<stream>`, which
every ordered consumer uses, updates any consumer of that stream named in the body. So the
provisioner makes the run queue's consumers and dispatch only binds to them (info, next,
acknowledge), and every other reader reads stored messages by direct get (`DIRECT.GET`,
`STREAM.MSG.GET`): replays and the replicas of memory, governance and tape alike. Purges are
dispatch's on its own journal (`ATMO_JOURNAL`, which only it writes) and the object bucket's
users' on it (nats-py removes an object's chunks by purging their subject; a bucket's writer
can empty it by a roll-up anyway). What no subject permission closes: a request's reply
subject is not checked, so whoever may ask JetStream for a stored message (or any service for
an answer) may have the answer sent to any subject.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Final

from atmosphere.bus import run_queue, subjects
from atmosphere.bus._jetstream import ConsumerSpec, JetStreamLayout, RequiredLayout

# One owner of how a namespace turns into stream names: the bus itself.
from atmosphere.bus._nats_core import stream_prefix
from atmosphere.bus.runs import MAX_NESTING

__all__ = [
    "AUTH_CONFIG_FILE",
    "PASSWORD_ENV",
    "SERVICE_ROLES",
    "USER_ENV",
    "Credential",
    "CredentialFiles",
    "Permissions",
    "Role",
    "authorization_config",
    "inbox_prefix",
    "new_credentials",
    "permissions",
    "role_layout",
    "server_user",
    "user_name",
    "write_credentials",
]


class Role(StrEnum):
    """Who logs in: one role per service, `observer` for outside readers, `provisioner` for the layout."""

    INGRESS = "ingress"
    DISPATCH = "dispatch"
    SANDBOX = "sandbox"
    GOVERNANCE = "governance"
    MEMORY = "memory"
    TAPE = "tape"
    OBSERVER = "observer"
    """An outside subscriber of run events (`atmosphere tape follow`, examples/followers):
    run events read live or from `ATMO_EVENTS`, and the tape's reads. Nothing else."""
    PROVISIONER = "provisioner"
    """Whoever makes the JetStream layout (`atmosphere provision`, a Kubernetes Job): creates and
    updates the streams, buckets and provisioned consumers; deletes and purges nothing, and
    publishes or reads no message of ours. Never a service's own login."""


SERVICE_ROLES: Final = tuple(role for role in Role if role not in (Role.OBSERVER, Role.PROVISIONER))
"""The roles of the six services (each also the service's name on the bus)."""

AUTH_CONFIG_FILE: Final = "nats-auth.conf"
"""The nats-server configuration file `write_credentials` writes (include it, or pass it with `-c`)."""
USER_ENV: Final = "ATMOSPHERE_NATS__USER"
PASSWORD_ENV: Final = "ATMOSPHERE_NATS__PASSWORD"  # noqa: S105 - a variable name

# Stand-ins that pass `subjects.token` and become wildcards in `_pattern`: the families below
# are built by the functions of `subjects`, never spelled here.
_ONE: Final = "__one__"
_REST: Final = "__rest__"


def _pattern(subject: str) -> str:
    """`subject` with `_ONE` tokens as `*` and a last `_REST` token as `>`."""
    tokens = ["*" if t == _ONE else ">" if t == _REST else t for t in subject.split(".")]
    if ">" in tokens[:-1]:
        msg = f"'>' must be the last token: {subject}"
        raise ValueError(msg)
    return ".".join(tokens)


# Families of our subjects (logical, before the namespace).
_SUBMIT_TOP_LEVEL: Final = subjects.run_submit_level(0)
_SUBMIT_POOLS_TOP_LEVEL: Final = _pattern(subjects.run_submit_level(0, _ONE))
_SUBMIT_ANY: Final = subjects.run_submit_all()
_RUN_EVENTS: Final = subjects.run_events_all()
_RUN_PROBES: Final = subjects.run_probes_all()
_RUN_CONTROL: Final = _pattern(subjects.run_control(_ONE))
_JOURNAL: Final = subjects.run_journal_all()
_TOOLS: Final = _pattern(subjects.tool(_ONE))
_MEMORY_TOOLS: Final = subjects.memory_tools_all()
_SANDBOX_SESSION_TOOLS: Final = _pattern(subjects.sandbox_session_tool(_ONE, _ONE))
_SANDBOX_RELEASE: Final = _pattern(subjects.sandbox_release(_ONE))
_GOVERNANCE: Final = _pattern(subjects.governance(_REST))
_MEMORY: Final = _pattern(subjects.memory(_REST))
_TAPE: Final = _pattern(subjects.tape(_REST))
_SERVICE_INFO: Final = _pattern(subjects.service_info(_ONE))
_CONVERSATION_CLOSED: Final = subjects.conversation_closed()

# The governance operations each caller uses (read from their clients); `admin.*` is ingress's alone.
_DISPATCH_GOVERNANCE: Final = tuple(
    subjects.governance(op) for op in ("admit", "check_tool", "check_output", "run_ended", "screen")
)
_MEMORY_GOVERNANCE: Final = (subjects.governance("screen_facts"),)
_INGRESS_GOVERNANCE: Final = (
    subjects.governance("check"),
    subjects.governance("decisions"),
    _pattern(subjects.governance(f"admin.{_REST}")),
)
# Ingress reads a conversation's workspace (files, plan) for the console; it writes nothing.
_INGRESS_MEMORY: Final = tuple(subjects.memory(op) for op in ("files.list", "files.read", "plan.get"))

_JS_API: Final = "$JS.API"


def _covers(allow: str, subject: str) -> bool:
    """Whether the allow-list entry `allow` covers `subject` (itself possibly a wildcard)."""
    a_tokens, s_tokens = allow.split("."), subject.split(".")
    for i, a in enumerate(a_tokens):
        if a == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens) or s_tokens[i] == ">" or (a != "*" and (a != s_tokens[i] or s_tokens[i] == "*")):
            return False
    return len(a_tokens) == len(s_tokens)


@dataclass(frozen=True, slots=True)
class Permissions:
    """What one user may do: the wire subjects (NATS wildcards) it may publish to and subscribe to."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    responds: bool
    """It answers requests: it may publish one reply to the reply subject of each it received."""

    def may_publish(self, wire_subject: str) -> bool:
        """Whether the server lets this user publish to `wire_subject` (not counting replies)."""
        return any(_covers(allow, wire_subject) for allow in self.publish)

    def may_subscribe(self, wire_subject: str) -> bool:
        """Whether the server lets this user subscribe to `wire_subject` (a wildcard: one entry covers it all)."""
        return any(_covers(allow, wire_subject) for allow in self.subscribe)

    def server_config(self) -> dict[str, object]:
        """The `permissions` map of a nats-server user."""
        config: dict[str, object] = {
            "publish": {"allow": list(self.publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }
        if self.responds:
            config["allow_responses"] = True
        return config


def user_name(role: Role, namespace: str = "") -> str:
    """The user a role logs in as: `atmo-<role>`, after `<namespace>.` when there is one."""
    subjects.validate_namespace(namespace)
    return f"{namespace}.atmo-{role}" if namespace else f"atmo-{role}"


def inbox_prefix(user: str) -> str:
    """Where `user`'s connection gets its replies: `_INBOX_<user>` (dots as `_`).

    A user of its own inbox reads no one else's replies, JetStream deliveries included (the
    events an ordered consumer replays arrive in an inbox).
    """
    return "_INBOX_" + re.sub(r"[^A-Za-z0-9_\-]", "_", user)


@dataclass(frozen=True, slots=True)
class _Wire:
    """Logical names to the names on the wire, in one namespace."""

    namespace: str

    def subject(self, logical: str) -> str:
        return f"{self.namespace}.{logical}" if self.namespace else logical

    def stream(self, name: str) -> str:
        return stream_prefix(self.namespace) + name


class _Grants:
    """A role's allow-lists as they are built: one method per kind of use of the bus.

    Beside the wire subjects it records which streams, buckets and consumers (logical names)
    the role uses: a service checks at start that those exist (`role_layout`).
    """

    def __init__(self, wire: _Wire) -> None:
        self._wire = wire
        # Ordered sets: the rendered lists read in the order the grants were made.
        # Account info, and which stream captures a subject: a publisher that got no answer asks
        # it to tell a stream without a leader (retried) from no stream at all. Both read names only.
        self._publish: dict[str, None] = {f"{_JS_API}.INFO": None, f"{_JS_API}.STREAM.NAMES": None}
        self._subscribe: dict[str, None] = {}
        self._responds = False
        self.streams: dict[str, None] = {}
        self.buckets: dict[str, None] = {}
        self.object_buckets: dict[str, None] = {}
        self.consumers: dict[tuple[str, str], None] = {}
        self.pool_consumers: dict[str, None] = {}
        """Streams on which every runtime pool's worker consumers are the role's (their names vary)."""

    def _pub(self, *wire_subjects: str) -> None:
        self._publish.update(dict.fromkeys(wire_subjects))

    def _api(self, *operations: str) -> None:
        self._pub(*(f"{_JS_API}.{op}" for op in operations))

    def send(self, *logical: str) -> None:
        """Publish, request, or publish to JetStream on these subjects."""
        self._pub(*(self._wire.subject(s) for s in logical))

    def receive(self, *logical: str) -> None:
        """Subscribe to these subjects."""
        self._subscribe.update(dict.fromkeys(self._wire.subject(s) for s in logical))

    def serve(self, *logical: str) -> None:
        """Answer requests on these subjects."""
        self.receive(*logical)
        self._responds = True

    def provision(self, layout: JetStreamLayout) -> None:
        """Create, update and inspect every stream, bucket and provisioned consumer of `layout`.

        A consumer only by its name and filter (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`,
        which the server checks against the request): the provisioner makes the layout's
        consumers and no other. Nothing is deleted or purged.
        """
        names = [
            *(self._wire.stream(s.name) for s in layout.streams()),
            *(f"KV_{self._wire.stream(b.name)}" for b in layout.buckets()),
            *(f"OBJ_{self._wire.stream(b.name)}" for b in layout.object_buckets()),
        ]
        for name in names:
            self._api(f"STREAM.CREATE.{name}", f"STREAM.UPDATE.{name}", f"STREAM.INFO.{name}")
        for consumer in layout.consumers:
            stream = self._wire.stream(consumer.stream)
            self._api(
                f"CONSUMER.CREATE.{stream}.{consumer.durable}.{self._wire.subject(consumer.filter_subject)}",
                f"CONSUMER.INFO.{stream}.{consumer.durable}",
            )

    def _read(self, stream: str) -> None:
        """A stream's stored messages by subject or sequence: by direct get, which creates nothing."""
        self._api(
            f"STREAM.INFO.{stream}",
            f"STREAM.MSG.GET.{stream}",
            f"DIRECT.GET.{stream}",
            f"DIRECT.GET.{stream}.>",
        )

    def read_stream(self, stream: str) -> None:
        """Read `stream` (the last message of a subject, replays)."""
        self.streams[stream] = None
        self._read(self._wire.stream(stream))

    def follow(self, stream: str, filter_subject: str) -> None:
        """Apply `stream` in order as a replica does: read it, and hear of new messages as they are stored."""
        self.read_stream(stream)
        self.receive(filter_subject)

    def bind(self, *consumers: ConsumerSpec) -> None:
        """Pull from provisioned durable consumers: inspect, fetch, acknowledge; never create or change one."""
        for consumer in consumers:
            stream = self._wire.stream(consumer.stream)
            self.streams[consumer.stream] = None
            self.consumers[(consumer.stream, consumer.durable)] = None
            self._api(
                f"STREAM.INFO.{stream}",
                f"CONSUMER.INFO.{stream}.{consumer.durable}",
                f"CONSUMER.MSG.NEXT.{stream}.{consumer.durable}",
            )
            self._pub(f"$JS.ACK.{stream}.{consumer.durable}.>")

    def bind_pools(self) -> None:
        """Pull from every runtime pool's worker consumers (`run_queue.durable_name(level, pool)`).

        Pools are named by the runtimes an app pins agents to, so their consumers cannot be
        listed here: any consumer of `ATMO_RUNS` may be bound, which grants nothing more, since
        every consumer of that stream is a dispatch worker consumer (the provisioner makes no other).
        """
        stream = self._wire.stream(subjects.RUNS_STREAM)
        self.streams[subjects.RUNS_STREAM] = None
        self.pool_consumers[subjects.RUNS_STREAM] = None
        self._api(f"STREAM.INFO.{stream}", f"CONSUMER.INFO.{stream}.*", f"CONSUMER.MSG.NEXT.{stream}.*")
        self._pub(f"$JS.ACK.{stream}.*.>")

    def provision_pools(self) -> None:
        """Make any runtime pool's worker consumers: any name, but only with a pool queue's filter."""
        stream = self._wire.stream(subjects.RUNS_STREAM)
        for level in range(MAX_NESTING + 1):
            pool_filter = self._wire.subject(_pattern(subjects.run_submit_level(level, _ONE)))
            self._api(f"CONSUMER.CREATE.{stream}.*.{pool_filter}", f"CONSUMER.INFO.{stream}.*")

    def purge(self, stream: str) -> None:
        """Remove messages of `stream` (by subject)."""
        self._api(f"STREAM.PURGE.{self._wire.stream(stream)}")

    def read_bucket(self, bucket: str) -> None:
        """Read keys and values of a key-value bucket."""
        self.buckets[bucket] = None
        self._read(f"KV_{self._wire.stream(bucket)}")

    def write_bucket(self, bucket: str) -> None:
        """Read, put and delete keys of a key-value bucket."""
        self.read_bucket(bucket)
        self._pub(f"$KV.{self._wire.stream(bucket)}.>")

    def use_objects(self, bucket: str) -> None:
        """Put, read and delete objects of an object bucket (a put looks up and replaces, too)."""
        self.object_buckets[bucket] = None
        self._read(f"OBJ_{self._wire.stream(bucket)}")
        # nats-py removes an object's chunks (a delete, a replaced or failed put) by purging
        # their subject; a writer of the bucket could empty it by a roll-up all the same.
        self._api(f"STREAM.PURGE.OBJ_{self._wire.stream(bucket)}")
        self._pub(f"$O.{self._wire.stream(bucket)}.>")

    def build(self, user: str) -> Permissions:
        """The permissions, with `user`'s own inbox (replies, JetStream deliveries)."""
        subscribe = {**self._subscribe, f"{inbox_prefix(user)}.>": None}
        return Permissions(publish=tuple(self._publish), subscribe=tuple(subscribe), responds=self._responds)


def _as_service(g: _Grants, role: Role) -> None:
    """What every service does: answer its health and info."""
    g.serve(subjects.service_health(role), subjects.service_info(role))


def _ingress(g: _Grants) -> None:
    g.send(_SUBMIT_TOP_LEVEL, _SUBMIT_POOLS_TOP_LEVEL, _RUN_EVENTS, _RUN_CONTROL, _CONVERSATION_CLOSED, _TAPE)
    g.send(_SERVICE_INFO)
    g.send(*_INGRESS_GOVERNANCE, *_INGRESS_MEMORY)
    g.receive(_RUN_EVENTS)
    g.read_stream(subjects.EVENTS_STREAM)
    g.read_bucket(subjects.AGENTS_BUCKET)
    g.read_bucket(subjects.TOOLS_BUCKET)
    # Which replica announced which conversation: shared by every ingress replica.
    g.write_bucket(subjects.CONVERSATIONS_BUCKET)
    # Which run an OpenAI completion started, so that its retry attaches to it on any replica.
    g.write_bucket(subjects.COMPLETIONS_BUCKET)


def _dispatch(g: _Grants) -> None:
    g.send(_SUBMIT_ANY, _RUN_EVENTS, _RUN_PROBES, _RUN_CONTROL, _JOURNAL)
    g.send(_TOOLS, _MEMORY_TOOLS, _SANDBOX_SESSION_TOOLS, _SANDBOX_RELEASE, _MEMORY, *_DISPATCH_GOVERNANCE)
    g.serve(_RUN_CONTROL, _CONVERSATION_CLOSED)
    g.receive(_RUN_EVENTS)
    g.bind(*run_queue.consumers())
    g.bind_pools()
    g.read_stream(subjects.EVENTS_STREAM)
    g.read_stream(subjects.JOURNAL_STREAM)
    # A run that succeeded removes its journal; only dispatch writes `ATMO_JOURNAL`.
    g.purge(subjects.JOURNAL_STREAM)
    g.write_bucket(subjects.AGENTS_BUCKET)
    g.read_bucket(subjects.TOOLS_BUCKET)
    g.use_objects(subjects.TOOL_RESULTS_BUCKET)


def _sandbox(g: _Grants) -> None:
    g.serve(_TOOLS, _SANDBOX_SESSION_TOOLS, _SANDBOX_RELEASE)
    g.write_bucket(subjects.TOOLS_BUCKET)
    g.use_objects(subjects.TOOL_RESULTS_BUCKET)


def _governance(g: _Grants) -> None:
    g.serve(_GOVERNANCE)
    # Its log of record: every replica writes to it and applies all of it.
    g.send(subjects.governance_log_all())
    g.follow(subjects.GOVERNANCE_LOG_STREAM, subjects.governance_log_all())


def _memory(g: _Grants) -> None:
    g.serve(_MEMORY)
    g.send(*_MEMORY_GOVERNANCE)
    # Its log of record: every replica writes to it and applies all of it.
    g.send(subjects.memory_log())
    g.follow(subjects.MEMORY_LOG_STREAM, subjects.memory_log())


def _tape(g: _Grants) -> None:
    g.serve(_TAPE)
    # Every replica records the whole of `ATMO_EVENTS` by reading it (it polls: no subscription).
    g.read_stream(subjects.EVENTS_STREAM)
    g.read_bucket(subjects.AGENTS_BUCKET)


def _observer(g: _Grants) -> None:
    g.receive(_RUN_EVENTS)
    g.read_stream(subjects.EVENTS_STREAM)
    g.send(_TAPE)


def _provisioner(g: _Grants) -> None:
    # The layout every service expects, whatever its limits (they are not part of a subject).
    g.provision(JetStreamLayout(consumers=run_queue.consumers()))
    g.provision_pools()


_ROLES: Final = {
    Role.INGRESS: _ingress,
    Role.DISPATCH: _dispatch,
    Role.SANDBOX: _sandbox,
    Role.GOVERNANCE: _governance,
    Role.MEMORY: _memory,
    Role.TAPE: _tape,
    Role.OBSERVER: _observer,
    Role.PROVISIONER: _provisioner,
}


def _grants(role: Role, namespace: str) -> _Grants:
    g = _Grants(_Wire(subjects.validate_namespace(namespace)))
    if role in SERVICE_ROLES:
        _as_service(g, role)
    _ROLES[role](g)
    return g


def permissions(role: Role, *, namespace: str = "", user: str | None = None) -> Permissions:
    """What `role` may publish and subscribe to in `namespace`, logged in as `user` (default: `user_name`)."""
    return _grants(role, namespace).build(user_name(role, namespace) if user is None else user)


def role_layout(role: Role, layout: JetStreamLayout) -> RequiredLayout:
    """The part of `layout` that `role` uses: what a service checks exists before it starts.

    Its streams, buckets and object buckets, and the provisioned consumers it binds to (the
    provisioner's: the whole layout).
    """
    whole = layout.required()
    if role is Role.PROVISIONER:
        return whole
    g = _grants(role, "")
    return RequiredLayout(
        streams=tuple(s for s in whole.streams if s in g.streams),
        buckets=tuple(b for b in whole.buckets if b in g.buckets),
        object_buckets=tuple(b for b in whole.object_buckets if b in g.object_buckets),
        consumers=tuple(
            c for c in whole.consumers if (c.stream, c.durable) in g.consumers or c.stream in g.pool_consumers
        ),
    )


@dataclass(frozen=True, slots=True)
class Credential:
    """One role's login."""

    role: Role
    user: str
    password: str = field(repr=False)

    def env(self) -> dict[str, str]:
        """The service settings that log in with it."""
        return {USER_ENV: self.user, PASSWORD_ENV: self.password}


def new_credentials(*, namespace: str = "", roles: Iterable[Role] = tuple(Role)) -> dict[Role, Credential]:
    """A fresh random password for every role (256 bits each)."""
    return {role: Credential(role, user_name(role, namespace), secrets.token_urlsafe(32)) for role in roles}


def server_user(credential: Credential, *, namespace: str = "") -> dict[str, object]:
    """One entry of a nats-server `authorization.users` list: the login and its permissions."""
    granted = permissions(credential.role, namespace=namespace, user=credential.user)
    return {"user": credential.user, "password": credential.password, "permissions": granted.server_config()}


def authorization_config(
    credentials: Iterable[Credential], *, namespace: str = "", extra_users: Sequence[Mapping[str, object]] = ()
) -> str:
    """A nats-server `authorization { users = [...] }` block (its map in JSON, which the config syntax accepts).

    `extra_users` are added as given (e.g. an operator's own user without restrictions).
    Passwords are in plain text: keep the file private (`write_credentials` makes it 0600).
    """
    users = [server_user(c, namespace=namespace) for c in credentials] + [dict(u) for u in extra_users]
    names = [str(u.get("user")) for u in users]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        msg = f"users listed twice: {duplicates}"
        raise ValueError(msg)
    return "authorization: " + json.dumps({"users": users}, indent=2) + "\n"


@dataclass(frozen=True, slots=True)
class CredentialFiles:
    """What `write_credentials` wrote."""

    server_config: Path
    """The nats-server configuration with every role's user (`nats-server -c`, or `include`)."""
    env_files: Mapping[Role, Path]
    """`<role>.env` per role: the `ATMOSPHERE_NATS__USER` and `__PASSWORD` lines of its service."""
    credentials: Mapping[Role, Credential]


def write_credentials(directory: Path, *, namespace: str = "") -> CredentialFiles:
    """Make fresh credentials for every role and write them into `directory` (each file 0600).

    `<directory>/nats-auth.conf` is the server's side, `<directory>/<role>.env` each service's.
    Every call makes new passwords: restart the server and the services together.
    """
    credentials = new_credentials(namespace=namespace)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    server_config = directory / AUTH_CONFIG_FILE
    _write_private(server_config, authorization_config(credentials.values(), namespace=namespace))
    env_files: dict[Role, Path] = {}
    for role, credential in credentials.items():
        env_files[role] = directory / f"{role}.env"
        _write_private(env_files[role], "".join(f"{k}={v}\n" for k, v in credential.env().items()))
    return CredentialFiles(server_config=server_config, env_files=env_files, credentials=credentials)


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by its owner only from the first byte, replacing it whole."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a temp file left by a crash keeps its mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(temp, path)
