"""Per-service credentials on a real nats-server: who gets in, and what the server refuses each role."""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.js import api as js_api

from atmosphere.bus import (
    BusError,
    ConnectError,
    JetStreamLayout,
    LayoutNotProvisionedError,
    NatsBus,
    connect,
    run_queue,
    subjects,
)
from atmosphere.bus.permissions import (
    SERVICE_ROLES,
    Credential,
    Role,
    authorization_config,
    inbox_prefix,
    new_credentials,
    permissions,
    role_layout,
    user_name,
)
from atmosphere.bus.runs import follow_run
from atmosphere.contracts.common.v1.service_pb2 import HealthCheckRequest
from atmosphere.contracts.run.v1.run_pb2 import Complete, Metadata, RunEvent, RunSubmission, TextDelta
from atmosphere.testing import NatsServer, raw_login

HARNESS_USER = "harness"
"""A user without restrictions, for what the test itself sets up and checks."""


@dataclass(frozen=True)
class Secured:
    url: str
    namespace: str
    credentials: dict[Role, Credential]
    harness_password: str

    def wire(self, subject: str) -> str:
        return f"{self.namespace}.{subject}"

    def stream(self, name: str) -> str:
        return f"{self.namespace.upper()}_{name}"


def write_config(path: Path, credentials: dict[Role, Credential], namespace: str, harness_password: str) -> Path:
    harness = {"user": HARNESS_USER, "password": harness_password}
    path.write_text(authorization_config(credentials.values(), namespace=namespace, extra_users=[harness]))
    return path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("nats-auth")
    namespace = f"t{uuid.uuid4().hex[:10]}"
    credentials = new_credentials(namespace=namespace)
    harness_password = secrets.token_urlsafe(16)
    config = write_config(root / "auth.conf", credentials, namespace, harness_password)
    server = NatsServer(root / "nats", extra_args=("-c", str(config))).start()
    try:
        yield Secured(server.url, namespace, credentials, harness_password)
    finally:
        server.stop()


def as_role(secured: Secured, role: Role) -> contextlib.AbstractAsyncContextManager[NatsBus]:
    credential = secured.credentials[role]
    return connect(
        secured.url,
        name=f"test-{role}",
        namespace=secured.namespace,
        user=credential.user,
        password=credential.password,
    )


@pytest.fixture
async def harness(secured: Secured) -> AsyncIterator[NatsBus]:
    async with connect(
        secured.url, name="harness", namespace=secured.namespace, user=HARNESS_USER, password=secured.harness_password
    ) as bus:
        await bus.provision(JetStreamLayout(consumers=run_queue.consumers()))
        yield bus


async def test_a_client_without_credentials_is_refused_at_connect(secured: Secured) -> None:
    # At once, not after the connect timeout: the error names the refusal.
    with pytest.raises(ConnectError, match="refused a client without credentials: authorization violation"):
        async with connect(secured.url, name="anonymous", connect_timeout=60):
            pass
    # A plain NATS client (an outside subscriber) is refused the same way.
    client = Client()
    try:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await client.connect(secured.url, allow_reconnect=False, connect_timeout=5, error_cb=_quiet)
    finally:
        await client.close()  # nats-py leaves the refused socket open otherwise


async def _quiet(_exc: Exception) -> None:
    return None


async def test_a_wrong_password_is_refused_naming_the_user(secured: Secured) -> None:
    user = secured.credentials[Role.DISPATCH].user
    with pytest.raises(ConnectError, match=rf"refused user '{user}': authorization violation"):
        async with connect(secured.url, name="wrong", user=user, password="not-the-password", connect_timeout=60):
            pass
    # Another role's password does not open this user either.
    with pytest.raises(ConnectError, match="authorization violation"):
        async with connect(
            secured.url, name="swap", user=user, password=secured.credentials[Role.INGRESS].password, connect_timeout=60
        ):
            pass


def publish_probes(secured: Secured) -> list[str]:
    """One subject of every kind the system uses, on the wire."""
    ours = [
        subjects.run_submit("echo"),
        subjects.run_submit("echo", level=1),
        subjects.run_events("r1"),
        subjects.run_probe("r1"),
        subjects.run_control("r1"),
        subjects.run_journal("r1"),
        subjects.tool("search"),
        subjects.memory_tool("write_todos"),
        subjects.sandbox_session_tool("i1", "code_exec"),
        subjects.sandbox_release("i1"),
        subjects.governance("admit"),
        subjects.governance("check_tool"),
        subjects.governance("screen_facts"),
        subjects.governance("check"),
        subjects.governance("decisions"),
        subjects.governance("admin.reload"),
        subjects.memory("history.load"),
        subjects.memory("files.read"),
        subjects.conversation_closed(),
        subjects.tape("runs"),
        subjects.service_info("dispatch"),
        subjects.service_health("dispatch"),
        subjects.memory_log(),
        subjects.governance_log("decision"),
    ]
    jetstream: list[str] = []
    for name in (
        subjects.RUNS_STREAM,
        subjects.EVENTS_STREAM,
        subjects.JOURNAL_STREAM,
        subjects.MEMORY_LOG_STREAM,
        subjects.GOVERNANCE_LOG_STREAM,
    ):
        stream = secured.stream(name)
        jetstream += [
            f"$JS.API.CONSUMER.CREATE.{stream}",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.probe",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.probe",
            f"$JS.API.STREAM.MSG.GET.{stream}",
            f"$JS.API.STREAM.DELETE.{stream}",
            f"$JS.API.STREAM.INFO.{stream}",
            f"$JS.ACK.{stream}.probe.1.1.1.1.1",
        ]
    jetstream += [
        f"$JS.API.STREAM.PURGE.{secured.stream(subjects.EVENTS_STREAM)}",
        f"$JS.API.STREAM.PURGE.{secured.stream(subjects.JOURNAL_STREAM)}",
        f"$KV.{secured.stream(subjects.AGENTS_BUCKET)}.probe",
        f"$KV.{secured.stream(subjects.TOOLS_BUCKET)}.probe",
        f"$O.{secured.stream(subjects.TOOL_RESULTS_BUCKET)}.M.probe",
        f"{inbox_prefix(user_name(Role.INGRESS, secured.namespace))}.stolen",
    ]
    return [secured.wire(s) for s in ours] + jetstream


def subscribe_probes(secured: Secured) -> list[str]:
    ours = [
        subjects.run_events_all(),
        subjects.run_events("r1"),
        subjects.run_control("r1"),
        subjects.run_submit_all(),
        subjects.tool("search"),
        subjects.sandbox_session_tool("i1", "code_exec"),
        subjects.memory("history.load"),
        subjects.memory_tool("write_todos"),
        subjects.governance("admit"),
        subjects.tape("runs"),
        subjects.conversation_closed(),
        subjects.memory_log(),
        subjects.governance_log_all(),
        *(subjects.service_health(role) for role in SERVICE_ROLES),
    ]
    inboxes = [f"{inbox_prefix(user_name(role, secured.namespace))}.x" for role in Role]
    return [secured.wire(s) for s in ours] + inboxes + ["_INBOX.>", ">", "$JS.API.>"]


def raw_client(secured: Secured, role: Role, errors: list[str]) -> contextlib.AbstractAsyncContextManager[Client]:
    return raw_login(secured.url, secured.credentials[role], errors)


async def settled(client: Client) -> None:
    """Return once the server has answered everything `client` sent so far (its refusals too).

    nats-py sends a flush's PING ahead of the commands still buffered, so the first PONG may
    come before the server read them; a second PING leaves after all of them, and the server
    answers in order.
    """
    await client.flush()
    await client.flush()


def reported(errors: list[str], kind: str) -> set[str]:
    """The subjects of the refusals reported (lower-cased: nats-py lower-cases the server's -ERR line)."""
    prefix = f'nats: permissions violation for {kind} to "'
    return {e.removeprefix(prefix).removesuffix('"') for e in errors if e.startswith(prefix)}


def lowered(wire_subjects: set[str]) -> set[str]:
    return {s.lower() for s in wire_subjects}


@pytest.mark.parametrize("role", list(Role))
async def test_the_server_refuses_each_role_exactly_what_it_may_not_use(secured: Secured, role: Role) -> None:
    granted = permissions(role, namespace=secured.namespace)
    errors: list[str] = []
    async with raw_client(secured, role, errors) as client:
        for subject in publish_probes(secured):
            await client.publish(subject, b"")
        for subject in subscribe_probes(secured):
            await client.subscribe(subject, cb=_ignore)
        await settled(client)
        assert client.is_connected  # refusals do not cost the connection
    refused_publish = {s for s in publish_probes(secured) if not granted.may_publish(s)}
    refused_subscribe = {s for s in subscribe_probes(secured) if not granted.may_subscribe(s)}
    assert reported(errors, "publish") == lowered(refused_publish)
    assert reported(errors, "subscription") == lowered(refused_subscribe)
    # The probes hit both sides of every role's lists, so this can fail either way.
    assert refused_publish != set(publish_probes(secured))
    assert refused_subscribe != set(subscribe_probes(secured))
    # What the issue names, spelled out.
    submit, event = secured.wire(subjects.run_submit("echo")), secured.wire(subjects.run_events("r1"))
    assert (submit in refused_publish) == (role not in {Role.INGRESS, Role.DISPATCH})
    assert (event in refused_publish) == (role not in {Role.INGRESS, Role.DISPATCH})
    for call in (subjects.tool("search"), subjects.memory_tool("write_todos"), subjects.sandbox_release("i1")):
        assert (secured.wire(call) in refused_publish) == (role is not Role.DISPATCH), call
    assert (secured.wire(subjects.run_events_all()) in refused_subscribe) == (
        role not in {Role.INGRESS, Role.DISPATCH, Role.OBSERVER}
    )
    assert "_INBOX.>" in refused_subscribe
    assert f"$JS.API.STREAM.DELETE.{secured.stream(subjects.EVENTS_STREAM)}" in refused_publish


async def _ignore(_msg: object) -> None:
    return None


@pytest.mark.parametrize("role", [Role.SANDBOX, Role.MEMORY, Role.TAPE, Role.GOVERNANCE])
async def test_services_that_are_not_a_gateway_cannot_submit_runs_or_read_events(
    secured: Secured, harness: NatsBus, role: Role, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="atmosphere.bus")
    run_id = uuid.uuid4().hex
    async with as_role(secured, role) as bus:
        # Submitting: the server drops the message, so JetStream never acknowledges it.
        with pytest.raises(BusError):
            await bus.js_publish(subjects.run_submit("echo"), RunSubmission(run_id=run_id, agent="echo"), timeout=0.5)
        assert await harness.stream_last_seq(subjects.RUNS_STREAM) == 0

        # Reading events live: the subscription gets nothing (a marker on a subject the role may
        # read, sent after the event by the same publisher, arrives after it would have).
        async with (
            bus.subscribe(subjects.run_events_all(), RunEvent) as events,
            bus.subscribe(subjects.service_health(role), HealthCheckRequest) as marker,
        ):
            await settled(bus.client)  # both subscriptions are in place
            await harness.publish(subjects.run_events(run_id), RunEvent(run_id=run_id, seq=1))
            await harness.publish(subjects.service_health(role), HealthCheckRequest())
            assert await marker.receive(10) is not None
            assert await events.receive(0) is None
        refused = f'permissions violation for subscription to "{secured.wire(subjects.run_events_all())}"'
        assert refused.lower() in caplog.text  # logged as a warning (nats-py lower-cases it)

        # Reading events from the stream: no consumer can be made on ATMO_EVENTS (nobody may
        # make one anywhere: the tape reads the stream by direct get).
        events_stream = secured.stream(subjects.EVENTS_STREAM)
        before = (await harness.client.jetstream().stream_info(events_stream)).state.consumer_count
        config = js_api.ConsumerConfig(filter_subject=secured.wire(subjects.run_events_all()))
        with pytest.raises(nats.errors.TimeoutError):
            await bus.client.jetstream().add_consumer(events_stream, config, timeout=0.5)
        after = (await harness.client.jetstream().stream_info(events_stream)).state.consumer_count
        assert after == before
    assert f'permissions violation for publish to "$JS.API.CONSUMER.CREATE.{events_stream}"'.lower() in caplog.text


async def test_no_service_may_make_the_layout_only_the_provisioner(secured: Secured, harness: NatsBus) -> None:
    layout = JetStreamLayout(consumers=run_queue.consumers())
    js = harness.client.jetstream()
    for info in await js.streams_info():
        if secured.namespace.upper() in (info.config.name or ""):
            await js.delete_stream(info.config.name or "")
    # A service's login waits for a layout it may not make, and says what is missing.
    async with as_role(secured, Role.SANDBOX) as sandbox:
        with pytest.raises(LayoutNotProvisionedError, match=r"bucket ATMO_TOOLS does not exist"):
            await sandbox.verify(role_layout(Role.SANDBOX, layout), timeout=1)
    async with as_role(secured, Role.PROVISIONER) as provisioner:
        await provisioner.provision(layout, by="the test's provisioner")
        await provisioner.provision(layout, by="the test's provisioner")  # again, over what exists
    names = {info.config.name for info in await js.streams_info()}
    assert {secured.stream(s.name) for s in layout.streams()} <= names
    assert {f"KV_{secured.stream(b.name)}" for b in layout.buckets()} <= names
    assert {f"OBJ_{secured.stream(b.name)}" for b in layout.object_buckets()} <= names
    for role in SERVICE_ROLES:
        async with as_role(secured, role) as bus:
            assert await bus.verify(role_layout(role, layout), timeout=5) == "the test's provisioner", role


async def test_the_observer_follows_a_run_that_dispatch_wrote(secured: Secured, harness: NatsBus) -> None:
    run_id = uuid.uuid4().hex
    written = [
        RunEvent(run_id=run_id, seq=1, metadata=Metadata(key="run", value_json='"x"')),
        RunEvent(run_id=run_id, seq=2, text_delta=TextDelta(text="hi")),
        RunEvent(run_id=run_id, seq=3, complete=Complete()),
    ]
    async with as_role(secured, Role.DISPATCH) as dispatch, as_role(secured, Role.OBSERVER) as observer:
        for event in written:
            await dispatch.js_publish(subjects.run_events(run_id), event)
        seen = [event async for event in follow_run(observer, run_id)]
        assert [e.seq for e in seen] == [1, 2, 3]
        # ... but may not write one, nor control the run.
        with pytest.raises(BusError):
            await observer.js_publish(subjects.run_events(run_id), RunEvent(run_id=run_id, seq=4), timeout=0.5)


async def test_tls_required_refuses_a_server_without_tls(secured: Secured) -> None:
    credential = secured.credentials[Role.TAPE]
    with pytest.raises(ConnectError, match="does not require TLS"):
        async with connect(
            secured.url,
            name="tls-only",
            user=credential.user,
            password=credential.password,
            tls_required=True,
            connect_timeout=60,
        ):
            pass


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca, cert, key)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl to make test certificates with")
    ca_key, ca, key, csr, cert = (directory / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def run(*args: str | Path) -> None:
        subprocess.run([openssl, *map(str, args)], check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        ca_key,
        "-out",
        ca,
    )
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", csr)
    run(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        ca,
        "-CAkey",
        ca_key,
        "-set_serial",
        "1",
        "-days",
        "2",
        "-extfile",
        ext,
        "-out",
        cert,
    )
    return ca, cert, key


async def test_tls_with_the_ca_connects_and_without_it_is_refused(tmp_path: Path) -> None:
    ca, cert, key = make_certificates(tmp_path)
    namespace = "tls"
    credentials = new_credentials(namespace=namespace, roles=[Role.PROVISIONER])
    config = tmp_path / "tls.conf"
    tls = f'tls: {{"cert_file": "{cert}", "key_file": "{key}"}}\n'
    config.write_text(tls + authorization_config(credentials.values(), namespace=namespace))
    server = NatsServer(tmp_path / "nats", extra_args=("-c", str(config))).start()
    credential = credentials[Role.PROVISIONER]
    try:
        async with connect(
            server.url,
            name="tls",
            namespace=namespace,
            user=credential.user,
            password=credential.password,
            tls_ca=ca,
            tls_required=True,
        ) as bus:
            await bus.provision(JetStreamLayout())
        with pytest.raises(ConnectError, match="certificate was not accepted"):
            async with connect(
                server.url, name="no-ca", user=credential.user, password=credential.password, connect_timeout=60
            ):
                pass
    finally:
        server.stop()


async def test_unreadable_tls_files_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConnectError, match="cannot use the TLS files"):
        async with connect("nats://127.0.0.1:1", name="missing", tls_ca=tmp_path / "missing.pem"):
            pass
