"""The JetStream permission matrix on the real `--auth` broker: every role, every stream, every operation.

The server runs exactly the configuration `atmosphere bus-credentials` (and `atmosphere dev
--auth`) writes, and the layout is made by the real provisioner with its own login
(`atmosphere.dispatch.provision`). Then every role, logged in as itself, tries every admin
operation (create, update, delete, purge) and every kind of consumer (push to a foreign
subject, pull, ordered) on every stream and bucket, and reads each by direct get. The server's
answer must be exactly what `EXPECTED` below says (written out by hand, so that it can fail
either way), which is also what `atmosphere.bus.permissions` grants. Afterwards nothing was
changed that the table does not allow.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import SecretStr

from atmosphere.bus import JetStreamLayout, NatsBus, connect, subjects
from atmosphere.bus.permissions import (
    SERVICE_ROLES,
    Credential,
    Role,
    inbox_prefix,
    permissions,
    role_layout,
    write_credentials,
)
from atmosphere.contracts.run.v1.run_pb2 import Metadata, RunEvent, RunSubmission
from atmosphere.dispatch.app import run_queues
from atmosphere.dispatch.provision import provision
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.testing import NatsServer, raw_login
from atmosphere.testing.stack import settings_for

NAMESPACE = "matrix"
PREFIX = "MATRIX_"
FOREIGN = f"{NAMESPACE}.{subjects.tool('search')}"
"""Where a hostile push consumer would deliver: the sandbox's tool calls."""

STREAMS = {
    "runs": PREFIX + subjects.RUNS_STREAM,
    "events": PREFIX + subjects.EVENTS_STREAM,
    "journal": PREFIX + subjects.JOURNAL_STREAM,
    "memory": PREFIX + subjects.MEMORY_LOG_STREAM,
    "governance": PREFIX + subjects.GOVERNANCE_LOG_STREAM,
    "agents": f"KV_{PREFIX}{subjects.AGENTS_BUCKET}",
    "tools": f"KV_{PREFIX}{subjects.TOOLS_BUCKET}",
    "conversations": f"KV_{PREFIX}{subjects.CONVERSATIONS_BUCKET}",
    "completions": f"KV_{PREFIX}{subjects.COMPLETIONS_BUCKET}",
    "results": f"OBJ_{PREFIX}{subjects.TOOL_RESULTS_BUCKET}",
}
ADMIN = ("create", "update", "delete", "purge")
CONSUMERS = ("push-foreign", "push-foreign-durable", "pull", "pull-legacy", "ordered")
EVERY = frozenset(STREAMS)

pytestmark = pytest.mark.asyncio(loop_scope="module")

EXPECTED: dict[Role, dict[str, frozenset[str]]] = {
    # operation -> the streams (keys of STREAMS) where the server lets the role do it
    Role.PROVISIONER: {"create": EVERY, "update": EVERY},
    Role.DISPATCH: {
        "purge": frozenset({"journal", "results"}),
        "read": frozenset({"events", "journal", "agents", "tools", "results"}),
    },
    Role.SANDBOX: {"purge": frozenset({"results"}), "read": frozenset({"tools", "results"})},
    Role.INGRESS: {"read": frozenset({"events", "agents", "tools", "conversations", "completions"})},
    Role.GOVERNANCE: {"read": frozenset({"governance"})},
    Role.MEMORY: {"read": frozenset({"memory"})},
    Role.TAPE: {"read": frozenset({"events", "agents"})},
    Role.OBSERVER: {"read": frozenset({"events"})},
}
"""Everything not listed is refused: no role creates a consumer of any kind, deletes a stream,
or (but for the provisioner) creates or updates one."""


@dataclass(frozen=True)
class Broker:
    url: str
    credentials: dict[Role, Credential]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("matrix")
    files = write_credentials(root / "credentials", namespace=NAMESPACE)  # as `atmosphere bus-credentials`
    server = NatsServer(root / "nats", extra_args=("-c", str(files.server_config))).start()
    try:
        yield Broker(server.url, dict(files.credentials))
    finally:
        server.stop()


def login(broker: Broker, role: Role) -> contextlib.AbstractAsyncContextManager[NatsBus]:
    credential = broker.credentials[role]
    return connect(
        broker.url, name=f"matrix-{role}", namespace=NAMESPACE, user=credential.user, password=credential.password
    )


def dispatch_settings(broker: Broker, role: Role, tmp_path: Path) -> DispatchSettings:
    settings: DispatchSettings = settings_for(
        DispatchSettings, nats_url=broker.url, namespace=NAMESPACE, data_dir=tmp_path
    )
    credential = broker.credentials[role]
    nats_settings = settings.nats.model_copy(
        update={"user": credential.user, "password": SecretStr(credential.password)}
    )
    return settings.model_copy(update={"nats": nats_settings})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def provisioned(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> JetStreamLayout:
    """The layout, made by the provisioner's login, and a message in every stream and bucket."""
    layout = await provision(dispatch_settings(broker, Role.PROVISIONER, tmp_path_factory.mktemp("data")))
    run_id = uuid.uuid4().hex
    async with login(broker, Role.INGRESS) as ingress:
        await ingress.js_publish(subjects.run_submit("echo"), RunSubmission(run_id=run_id, agent="echo"))
        await ingress.kv_put(subjects.CONVERSATIONS_BUCKET, "c1", RunEvent(run_id=run_id))
        await ingress.kv_put(subjects.COMPLETIONS_BUCKET, "k1", RunEvent(run_id=run_id))
    async with login(broker, Role.DISPATCH) as dispatch:
        await dispatch.js_publish(subjects.run_events(run_id), RunEvent(run_id=run_id, seq=1, metadata=Metadata()))
        await dispatch.js_publish(subjects.run_journal(run_id), RunEvent(run_id=run_id))
        await dispatch.kv_put(subjects.AGENTS_BUCKET, "echo", RunEvent(run_id=run_id))
    async with login(broker, Role.SANDBOX) as sandbox:
        await sandbox.kv_put(subjects.TOOLS_BUCKET, "search", RunEvent(run_id=run_id))
        await sandbox.object_put(subjects.TOOL_RESULTS_BUCKET, "result-1", b"x" * 300_000)
    async with login(broker, Role.MEMORY) as memory:
        await memory.js_publish(subjects.memory_log(), RunEvent(run_id=run_id))
    async with login(broker, Role.GOVERNANCE) as governance:
        await governance.js_publish(subjects.governance_log("decision"), RunEvent(run_id=run_id))
    return layout


@dataclass(frozen=True)
class Probe:
    operation: str
    stream: str
    subject: str
    body: dict[str, Any]


async def raw_config(client: Client, stream: str) -> dict[str, Any]:
    answer = await client.request(f"$JS.API.STREAM.INFO.{STREAMS[stream]}", b"", timeout=5)
    return dict(json.loads(answer.data)["config"])


def probes(role: Role, configs: dict[str, dict[str, Any]], inbox: str) -> list[Probe]:
    """One request per operation and stream, as a hostile holder of `role`'s login would send it."""
    made: list[Probe] = []
    name = f"probe-{role}"
    for key, stream in STREAMS.items():
        config = configs[key]
        api = "$JS.API"
        if role is Role.PROVISIONER:
            changed = {**config, "description": "changed by the provisioner"}
        elif key == "governance":
            changed = {**config, "max_msgs": 1}  # the decision log, shrunk to one entry
        elif key == "runs":
            changed = {**config, "subjects": [f"{NAMESPACE}.atmo.hijacked.>"]}  # no run could be queued
        else:
            changed = {**config, "max_age": 1_000_000_000}
        nothing = config["subjects"][0].replace(">", "probe-nothing").replace("*", "probe-nothing")
        filtered = config["subjects"][0].replace(">", "x").replace("*", "x")
        push = {"deliver_subject": FOREIGN, "ack_policy": "none", "deliver_policy": "all"}
        ordered = {
            "deliver_subject": f"{inbox}.ordered",
            "ack_policy": "none",
            "deliver_policy": "all",
            "flow_control": True,
            "idle_heartbeat": 5_000_000_000,
            "mem_storage": True,
            "num_replicas": 1,
        }
        pull = {"ack_policy": "explicit", "filter_subject": filtered}
        made += [
            Probe("create", key, f"{api}.STREAM.CREATE.{stream}", config),
            Probe("update", key, f"{api}.STREAM.UPDATE.{stream}", changed),
            Probe("delete", key, f"{api}.STREAM.DELETE.{stream}", {}),
            Probe("purge", key, f"{api}.STREAM.PURGE.{stream}", {"filter": nothing}),
            Probe("push-foreign", key, f"{api}.CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": push}),
            Probe(
                "push-foreign-durable",
                key,
                f"{api}.CONSUMER.CREATE.{stream}.push-{name}",
                {"stream_name": stream, "config": {**push, "name": f"push-{name}", "durable_name": f"push-{name}"}},
            ),
            Probe(
                "pull",
                key,
                f"{api}.CONSUMER.CREATE.{stream}.pull-{name}.{filtered}",
                {"stream_name": stream, "config": {**pull, "name": f"pull-{name}", "durable_name": f"pull-{name}"}},
            ),
            Probe(
                "pull-legacy",
                key,
                f"{api}.CONSUMER.DURABLE.CREATE.{stream}.legacy-{name}",
                {"stream_name": stream, "config": {**pull, "durable_name": f"legacy-{name}"}},
            ),
            Probe("ordered", key, f"{api}.CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": ordered}),
            Probe("read", key, f"{api}.DIRECT.GET.{stream}", {"seq": 1}),
        ]
    return made


def probe_login(broker: Broker, role: Role, refusals: list[str]) -> contextlib.AbstractAsyncContextManager[Client]:
    return raw_login(broker.url, broker.credentials[role], refusals)


async def outcomes(broker: Broker, role: Role, configs: dict[str, dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(operation, stream) -> "refused" (a permissions violation), "ok", or the server's error."""
    refusals: list[str] = []
    answers: dict[int, Msg] = {}
    async with probe_login(broker, role, refusals) as client:
        inbox = inbox_prefix(broker.credentials[role].user)
        sent = probes(role, configs, inbox)

        async def on_answer(msg: Msg) -> None:
            answers[int(msg.subject.rsplit(".", 1)[1])] = msg

        await client.subscribe(f"{inbox}.probe.*", cb=on_answer)
        # Updates go last, once everything else was answered: JetStream answers API requests in
        # no fixed order, and a create that came after an update of the same stream would find
        # it changed (10058) though the role may do both.
        for phase in (lambda op: op != "update", lambda op: op == "update"):
            for i, probe in enumerate(sent):
                if phase(probe.operation):
                    await client.publish(probe.subject, json.dumps(probe.body).encode(), reply=f"{inbox}.probe.{i}")
            # A second flush leaves after everything sent: the server read (and refused) it all.
            await client.flush()
            await client.flush()
            refused = {
                r.removeprefix('nats: permissions violation for publish to "').removesuffix('"') for r in refusals
            }
            expected_answers = {
                i for i, p in enumerate(sent) if p.subject.lower() not in refused and phase(p.operation)
            }
            for _ in range(100):
                if expected_answers <= answers.keys():
                    break
                await asyncio.sleep(0.05)
    result: dict[tuple[str, str], str] = {}
    for i, probe in enumerate(sent):
        if probe.subject.lower() in refused:
            result[(probe.operation, probe.stream)] = "refused"
            continue
        msg = answers.get(i)
        if msg is None:
            result[(probe.operation, probe.stream)] = "no answer"
        elif msg.headers and ("Status" in msg.headers or "Nats-Sequence" in msg.headers):
            result[(probe.operation, probe.stream)] = "ok"  # a direct get: a message, or its status (404)
        else:
            error = json.loads(msg.data).get("error")
            result[(probe.operation, probe.stream)] = "ok" if error is None else f"error {error.get('err_code')}"
    return result


def allowed(role: Role, operation: str, stream: str) -> bool:
    return stream in EXPECTED[role].get(operation, frozenset())


@pytest.mark.parametrize("role", list(Role))
async def test_each_role_may_do_exactly_what_its_table_allows(
    broker: Broker, provisioned: JetStreamLayout, role: Role
) -> None:
    async with probe_login(broker, Role.PROVISIONER, []) as provisioner:
        configs = {key: await raw_config(provisioner, key) for key in STREAMS}
        before = {key: await stream_state(provisioner, key) for key in STREAMS}
    seen = await outcomes(broker, role, configs)

    granted = permissions(role, namespace=NAMESPACE)
    for (operation, stream), outcome in sorted(seen.items()):
        expected = allowed(role, operation, stream)
        assert (outcome != "refused") == expected, (role, operation, stream, outcome)
        if expected:
            assert outcome == "ok", (role, operation, stream, outcome)
        # The table says the same: what the server refuses is what it does not list.
        subject = next(p.subject for p in probes(role, configs, "x") if (p.operation, p.stream) == (operation, stream))
        assert granted.may_publish(subject) == expected, (role, operation, stream)

    # Nothing changed that the table does not allow: no stream lost a message, none was
    # deleted, no consumer was added, and only the provisioner changed a configuration.
    async with probe_login(broker, Role.PROVISIONER, []) as provisioner:
        for key, stream in STREAMS.items():
            assert await stream_state(provisioner, key) == before[key], key
            after = await raw_config(provisioner, key)
            if role is not Role.PROVISIONER:
                assert after == configs[key], key
            else:
                assert after["description"] == "changed by the provisioner"
                await provisioner.request(
                    f"$JS.API.STREAM.UPDATE.{stream}", json.dumps(configs[key]).encode(), timeout=5
                )


async def stream_state(client: Client, key: str) -> tuple[int, int, int]:
    """Messages, last sequence and consumers of a stream."""
    answer = await client.request(f"$JS.API.STREAM.INFO.{STREAMS[key]}", b"", timeout=5)
    state = json.loads(answer.data)["state"]
    return int(state["messages"]), int(state["last_seq"]), int(state["consumer_count"])


async def test_the_issues_attacks_are_refused_to_every_service_and_the_observer(
    broker: Broker, provisioned: JetStreamLayout
) -> None:
    # The sandbox's login shrank the decision log to one message and moved `ATMO_RUNS` off its
    # subjects; the observer's made a push consumer on `ATMO_EVENTS` delivering to tool calls.
    async with probe_login(broker, Role.PROVISIONER, []) as provisioner:
        configs = {key: await raw_config(provisioner, key) for key in STREAMS}
    for role in (*SERVICE_ROLES, Role.OBSERVER):
        seen = await outcomes(broker, role, configs)
        assert seen[("update", "governance")] == "refused", role
        assert seen[("update", "runs")] == "refused", role
        assert seen[("push-foreign", "events")] == "refused", role
        assert seen[("ordered", "events")] == "refused", role


async def test_every_service_finds_what_it_uses_with_its_own_login(
    broker: Broker, provisioned: JetStreamLayout
) -> None:
    layout = JetStreamLayout(consumers=provisioned.consumers)
    for role in SERVICE_ROLES:
        async with login(broker, role) as bus:
            by = await bus.verify(role_layout(role, layout), timeout=5)
        assert by == broker.credentials[Role.PROVISIONER].user, role


async def test_dispatch_pulls_from_the_provisioned_queue_and_reads_results_without_a_consumer(
    broker: Broker, provisioned: JetStreamLayout, tmp_path: Path
) -> None:
    run_id = uuid.uuid4().hex
    settings = dispatch_settings(broker, Role.DISPATCH, tmp_path)
    async with login(broker, Role.INGRESS) as ingress:
        await ingress.js_publish(subjects.run_submit("probe"), RunSubmission(run_id=run_id, agent="probe"))
    got: asyncio.Queue[str] = asyncio.Queue()

    async def on_run(item: Any) -> None:
        await got.put(item.envelope.message.run_id)

    async with login(broker, Role.DISPATCH) as dispatch:
        worker = run_queues(settings.dispatch)[0]
        async with dispatch.consume(worker, RunSubmission, on_run):
            while (seen := await asyncio.wait_for(got.get(), 10)) != run_id:
                assert seen  # the seeded run comes first
        # A tool result too large for one message, stored by the sandbox, read and removed.
        assert await dispatch.object_get(subjects.TOOL_RESULTS_BUCKET, "result-1") == b"x" * 300_000
        await dispatch.object_delete(subjects.TOOL_RESULTS_BUCKET, "result-1")
        assert await dispatch.object_get(subjects.TOOL_RESULTS_BUCKET, "result-1") is None


async def test_dispatch_refuses_a_run_queue_made_with_other_settings(
    broker: Broker, provisioned: JetStreamLayout, tmp_path: Path
) -> None:
    settings = dispatch_settings(broker, Role.DISPATCH, tmp_path)
    other = settings.dispatch.model_copy(update={"run_ack_wait": settings.dispatch.run_ack_wait + 7})
    async with login(broker, Role.DISPATCH) as dispatch:
        worker = run_queues(other)[0]

        async def never(_item: Any) -> None:
            raise AssertionError

        with pytest.raises(
            Exception, match=r"consumer dispatch of ATMO_RUNS has ack wait .* not .*atmosphere provision"
        ):
            async with dispatch.consume(worker, RunSubmission, never):
                pass
