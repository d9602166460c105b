"""One suite, two backends: `FakeBus` must behave like the real nats-server does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from atmosphere.bus import (
    Bus,
    BusError,
    ConsumerSpec,
    Headers,
    JetStreamLayout,
    MessageContext,
    Nak,
    NoRespondersError,
    RemoteError,
    RequestTimeoutError,
    Retention,
    Router,
    ServiceError,
    StreamSpec,
    Subscription,
    Term,
    WorkItem,
    WrongLastSequenceError,
    connect,
    subjects,
)
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, TextDelta
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse

WORK = StreamSpec(name="WORK", subjects=("work.>",), retention=Retention.WORK_QUEUE)
LOG = StreamSpec(name="LOG", subjects=("log.>",))
LAYOUT = JetStreamLayout(extra_streams=(WORK, LOG))


@pytest.fixture(params=["fake", "nats"])
def bus(request: pytest.FixtureRequest) -> Bus:
    if request.param == "fake":
        return FakeBus()
    return request.getfixturevalue("nats_bus")  # type: ignore[no-any-return]


def text(value: str) -> RunEvent:
    return RunEvent(text_delta=TextDelta(text=value))


async def take(sub: Subscription[Any], n: int, timeout: float = 3.0) -> list[Any]:
    items: list[Any] = []
    iterator = sub.__aiter__()
    for _ in range(n):
        items.append(await asyncio.wait_for(anext(iterator), timeout))
    return items


async def nothing_more(sub: Subscription[Any], wait: float = 0.3) -> bool:
    try:
        await asyncio.wait_for(anext(sub.__aiter__()), wait)
    except TimeoutError:
        return True
    return False


async def test_wildcards_deliver_like_nats(bus: Bus) -> None:
    async with (
        bus.subscribe("c.*.evt", RunEvent) as star,
        bus.subscribe("c.>", RunEvent) as tail,
        bus.subscribe("c.x.ctl", RunEvent) as other,
    ):
        await bus.publish("c.r1.evt", text("one"))
        await bus.publish("c.r1.extra.evt", text("two"))
        [first] = await take(star, 1)
        assert first.subject == "c.r1.evt"
        assert first.message.text_delta.text == "one"
        assert [e.message.text_delta.text for e in await take(tail, 2)] == ["one", "two"]
        assert await nothing_more(star)
        assert await nothing_more(other)


@pytest.fixture
async def publisher(bus: Bus, request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    """Another client of the same broker (on the in-memory bus: the bus itself)."""
    if isinstance(bus, FakeBus):
        yield bus
        return
    url, namespace = request.getfixturevalue("nats_url"), request.getfixturevalue("bus_namespace")
    async with connect(url, name="pytest-publisher", namespace=namespace) as other:
        yield other


async def test_a_subscription_gets_what_another_client_publishes_once_it_is_entered(bus: Bus, publisher: Bus) -> None:
    # Entering `subscribe` means the broker knows the interest: a message another client
    # publishes the moment after is delivered (a `tape follow --all` that said it was listening
    # missed a run's first events: its SUB reached the server after its PING, see
    # `NatsCore._interest_sent`); about one in twenty was lost that way.
    for n in range(100):
        async with bus.subscribe(f"entered.{n}", RunEvent) as sub:
            await publisher.publish(f"entered.{n}", text(str(n)))
            [got] = await take(sub, 1)
        assert got.message.text_delta.text == str(n)


async def test_an_unconfirmed_subscription_gets_what_follows_its_own_next_publish(bus: Bus, publisher: Bus) -> None:
    # `confirmed=False` skips the round trips that prove the broker has the SUB: it is written
    # ahead of this client's next publish, so whatever another client publishes in answer to
    # that publish (a worker's events in answer to a submission) is delivered.
    async with publisher.subscribe("ping.>", RunEvent) as pings:

        async def answer() -> None:
            async for envelope in pings:
                await publisher.publish(f"answer.{envelope.message.text_delta.text}", text("pong"))

        answering = asyncio.create_task(answer())
        try:
            for n in range(100):
                async with bus.subscribe(f"answer.{n}", RunEvent, confirmed=False) as sub:
                    await bus.publish(f"ping.{n}", text(str(n)))
                    [got] = await take(sub, 1)
                assert got.message.text_delta.text == "pong"
        finally:
            answering.cancel()


async def drain(sub: Subscription[Any], quiet: float = 0.3) -> list[Any]:
    items: list[Any] = []
    iterator = sub.__aiter__()
    while True:
        try:
            items.append(await asyncio.wait_for(anext(iterator), quiet))
        except TimeoutError:
            return items


async def test_a_queue_group_gets_each_message_once(bus: Bus) -> None:
    async with (
        bus.subscribe("q.x", RunEvent, queue="workers") as a,
        bus.subscribe("q.x", RunEvent, queue="workers") as b,
        bus.subscribe("q.x", RunEvent) as everyone,
    ):
        for i in range(20):
            await bus.publish("q.x", text(str(i)))
        assert len(await take(everyone, 20)) == 20
        members = [e.message.text_delta.text for e in await drain(a) + await drain(b)]
    assert sorted(members, key=int) == [str(i) for i in range(20)]


def steps_router(calls: list[MessageContext]) -> Router:
    router = Router()

    class NotFoundError(ServiceError):
        code = "tape.not_found"

    @router.route("svc.steps", GetStepsRequest)
    async def steps(request: GetStepsRequest, ctx: MessageContext) -> GetStepsResponse:
        calls.append(ctx)
        if request.run_id == "missing":
            raise NotFoundError("no such run")
        if request.run_id == "crash":
            raise RuntimeError("private detail")
        if request.run_id == "slow":
            await asyncio.sleep(1.0)
        return GetStepsResponse(run_id=request.run_id, count=request.max)

    return router


async def test_request_reply_with_headers(bus: Bus) -> None:
    calls: list[MessageContext] = []
    async with bus.serve(steps_router(calls)):
        reply = await bus.request(
            "svc.steps",
            GetStepsRequest(run_id="r1", max=7),
            GetStepsResponse,
            headers=Headers(traceparent="00-abc-def-01", msg_id="m1"),
        )
    assert (reply.run_id, reply.count) == ("r1", 7)
    [ctx] = calls
    assert ctx.subject == "svc.steps"
    assert ctx.headers.msg_id == "m1"
    assert ctx.headers.traceparent == "00-abc-def-01"


async def test_request_errors_are_typed(bus: Bus) -> None:
    with pytest.raises(NoRespondersError):
        await bus.request("svc.nobody", GetStepsRequest(), GetStepsResponse, timeout=2)
    async with bus.serve(steps_router([])):
        with pytest.raises(RemoteError) as raised:
            await bus.request("svc.steps", GetStepsRequest(run_id="missing"), GetStepsResponse)
        assert raised.value.code == "tape.not_found"
        assert raised.value.message == "no such run"
        with pytest.raises(RemoteError) as raised:
            await bus.request("svc.steps", GetStepsRequest(run_id="crash"), GetStepsResponse)
        assert raised.value.code == "internal"
        assert "private" not in raised.value.message
        with pytest.raises(RequestTimeoutError):
            await bus.request("svc.steps", GetStepsRequest(run_id="slow"), GetStepsResponse, timeout=0.2)


async def test_an_unconfirmed_server_answers_what_follows_its_own_next_publish(bus: Bus, publisher: Bus) -> None:
    # As a run's control subject: served unconfirmed, then the worker publishes an event; a
    # client that saw the event asks on the subject, and must never find nobody answering.
    async with publisher.subscribe("started.>", RunEvent) as started:
        for n in range(50):
            async with bus.serve(steps_router([]), confirmed=False):
                await bus.publish(f"started.{n}", text(str(n)))
                await take(started, 1)
                reply = await publisher.request("svc.steps", GetStepsRequest(run_id=str(n), max=n), GetStepsResponse)
            assert (reply.run_id, reply.count) == (str(n), n)


async def test_a_queue_group_of_servers_answers_each_request_once(bus: Bus) -> None:
    calls: list[MessageContext] = []
    async with bus.serve(steps_router(calls), queue="tape"), bus.serve(steps_router(calls), queue="tape"):
        for i in range(10):
            await bus.request("svc.steps", GetStepsRequest(run_id=f"r{i}"), GetStepsResponse)
    assert len(calls) == 10


async def test_serve_finishes_in_flight_requests_on_exit(bus: Bus) -> None:
    started = asyncio.Event()
    router = Router()

    @router.route("svc.slow", GetStepsRequest)
    async def slow(request: GetStepsRequest, _ctx: MessageContext) -> GetStepsResponse:
        started.set()
        await asyncio.sleep(0.3)
        return GetStepsResponse(run_id=request.run_id)

    async with bus.serve(router):
        pending = asyncio.create_task(bus.request("svc.slow", GetStepsRequest(run_id="r"), GetStepsResponse))
        await asyncio.wait_for(started.wait(), 3)
    # The context exited while the handler was sleeping; its reply still arrives.
    assert (await pending).run_id == "r"


async def test_jetstream_deduplicates_by_message_id(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    first = await bus.js_publish("log.a", text("x"), headers=Headers(msg_id="m1"))
    again = await bus.js_publish("log.a", text("x"), headers=Headers(msg_id="m1"))
    other = await bus.js_publish("log.a", text("y"), headers=Headers(msg_id="m2"))
    assert first.stream == "LOG"
    assert not first.duplicate
    assert again.duplicate
    assert again.seq == first.seq
    assert other.seq == first.seq + 1
    with pytest.raises(BusError, match="no stream"):
        await bus.js_publish("nowhere.a", text("x"))


async def consume_all(bus: Bus, spec: ConsumerSpec, expected: int, **kwargs: Any) -> list[WorkItem[RunEvent]]:
    seen: list[WorkItem[RunEvent]] = []
    done = asyncio.Event()

    async def handler(item: WorkItem[RunEvent]) -> None:
        seen.append(item)
        if len(seen) >= expected:
            done.set()

    async with bus.consume(spec, RunEvent, handler, **kwargs):
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.3)  # anything redelivered by mistake would show up now
    return seen


async def test_core_publishes_are_captured_and_consumed_once(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    for i in range(3):
        await bus.publish("log.run", text(str(i)), headers=Headers(msg_id=f"id{i}"))
    await bus.publish("log.run", text("0"), headers=Headers(msg_id="id0"))  # a duplicate
    spec = ConsumerSpec(stream="LOG", durable="reader", filter_subject="log.>")
    seen = await consume_all(bus, spec, 3)
    assert [i.envelope.message.text_delta.text for i in seen] == ["0", "1", "2"]
    assert [i.delivered for i in seen] == [1, 1, 1]
    assert [i.envelope.headers.msg_id for i in seen] == ["id0", "id1", "id2"]


async def test_nak_redelivers_term_drops_and_ack_settles(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    for name in ("nak-once", "term", "ok"):
        await bus.js_publish(f"work.{name}", text(name))
    deliveries: list[tuple[str, int]] = []
    done = asyncio.Event()

    async def handler(item: WorkItem[RunEvent]) -> None:
        name = item.envelope.message.text_delta.text
        deliveries.append((name, item.delivered))
        if name == "nak-once" and item.delivered == 1:
            raise Nak(delay=0.1)
        if name == "term":
            raise Term("poison")
        if ("nak-once", 2) in deliveries and ("ok", 1) in deliveries:
            done.set()

    spec = ConsumerSpec(stream="WORK", durable="workers", filter_subject="work.>", ack_wait_seconds=5)
    async with bus.consume(spec, RunEvent, handler):
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.5)
    assert sorted(deliveries) == [("nak-once", 1), ("nak-once", 2), ("ok", 1), ("term", 1)]


async def test_competing_workers_process_each_item_once(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    for i in range(30):
        await bus.js_publish("work.item", text(str(i)), headers=Headers(msg_id=f"w{i}"))
    seen: list[str] = []
    done = asyncio.Event()

    async def handler(item: WorkItem[RunEvent]) -> None:
        await asyncio.sleep(0.01)
        seen.append(item.envelope.message.text_delta.text)
        if len(seen) >= 30:
            done.set()

    spec = ConsumerSpec(stream="WORK", durable="pool", filter_subject="work.>")
    async with (
        bus.consume(spec, RunEvent, handler, max_inflight=4),
        bus.consume(spec, RunEvent, handler, max_inflight=4),
    ):
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.3)
    assert sorted(seen, key=int) == [str(i) for i in range(30)]


async def test_an_interrupted_handler_is_redelivered(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    await bus.js_publish("work.long", text("long"))
    started = asyncio.Event()

    async def stuck(_item: WorkItem[RunEvent]) -> None:
        started.set()
        await asyncio.sleep(60)

    spec = ConsumerSpec(stream="WORK", durable="movers", filter_subject="work.>")
    async with bus.consume(spec, RunEvent, stuck, drain_timeout=0.2):
        await asyncio.wait_for(started.wait(), 5)
    # The first worker stopped mid-item: its message goes to the next worker at once.
    seen = await consume_all(bus, spec, 1)
    assert seen[0].envelope.message.text_delta.text == "long"
    assert seen[0].delivered == 2


async def consume_batches_until(
    bus: Bus, spec: ConsumerSpec, expected: int, **kwargs: Any
) -> list[list[WorkItem[RunEvent]]]:
    batches: list[list[WorkItem[RunEvent]]] = []
    done = asyncio.Event()

    async def handler(items: list[WorkItem[RunEvent]]) -> None:
        batches.append(items)
        if sum(len(b) for b in batches) >= expected:
            done.set()

    async with bus.consume_batches(spec, RunEvent, handler, **kwargs):
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.3)  # anything redelivered by mistake would show up now
    return batches


async def test_batches_keep_stream_order_respect_the_bound_and_are_acked(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    for i in range(40):
        await bus.publish("log.run", text(str(i)))
    spec = ConsumerSpec(stream="LOG", durable="recorder", filter_subject="log.>")
    batches = await consume_batches_until(bus, spec, 40, max_batch=16)
    assert all(1 <= len(b) <= 16 for b in batches)
    items = [i for b in batches for i in b]
    assert [i.envelope.message.text_delta.text for i in items] == [str(i) for i in range(40)]
    assert [i.stream_seq for i in items] == sorted(i.stream_seq for i in items)
    assert {i.delivered for i in items} == {1}
    # Acked: the same durable picks up where it left off.
    await bus.publish("log.run", text("40"))
    again = await consume_batches_until(bus, spec, 1)
    assert [i.envelope.message.text_delta.text for b in again for i in b] == ["40"]


async def test_linger_gathers_what_arrives_meanwhile_into_one_batch(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    batches: list[list[str]] = []
    first, done = asyncio.Event(), asyncio.Event()

    async def handler(items: list[WorkItem[RunEvent]]) -> None:
        batches.append([i.envelope.message.text_delta.text for i in items])
        first.set()
        if sum(map(len, batches)) >= 6:
            done.set()

    spec = ConsumerSpec(stream="LOG", durable="lingerer", filter_subject="log.>")
    async with bus.consume_batches(spec, RunEvent, handler, linger=1.0):
        await bus.publish("log.run", text("0"))
        await asyncio.wait_for(first.wait(), 5)
        for i in range(1, 6):  # published while the consumer lingers after its first batch
            await bus.publish("log.run", text(str(i)))
        await asyncio.wait_for(done.wait(), 5)
    assert batches == [["0"], ["1", "2", "3", "4", "5"]]


async def test_a_nak_redelivers_the_whole_batch_and_term_drops_it(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    for name in ("a", "b"):
        await bus.js_publish(f"work.{name}", text(name))
    deliveries: list[tuple[str, int]] = []
    done = asyncio.Event()

    async def handler(items: list[WorkItem[RunEvent]]) -> None:
        deliveries.extend((i.envelope.message.text_delta.text, i.delivered) for i in items)
        if any(i.delivered == 1 for i in items):
            raise Nak(delay=0.1)
        if {("a", 2), ("b", 2)} <= set(deliveries):
            done.set()
        raise Term("recorded elsewhere")

    spec = ConsumerSpec(stream="WORK", durable="batcher", filter_subject="work.>", ack_wait_seconds=5)
    async with bus.consume_batches(spec, RunEvent, handler):
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.5)
    assert sorted(deliveries) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]


async def test_an_interrupted_batch_is_redelivered(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    await bus.js_publish("work.long", text("long"))
    started = asyncio.Event()

    async def stuck(_items: list[WorkItem[RunEvent]]) -> None:
        started.set()
        await asyncio.sleep(60)

    spec = ConsumerSpec(stream="WORK", durable="batch-movers", filter_subject="work.>")
    async with bus.consume_batches(spec, RunEvent, stuck, drain_timeout=0.2):
        await asyncio.wait_for(started.wait(), 5)
    batches = await consume_batches_until(bus, spec, 1)
    assert [(i.envelope.message.text_delta.text, i.delivered) for b in batches for i in b] == [("long", 2)]


async def test_work_queue_consumers_must_not_overlap_and_a_durable_takes_new_settings(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    broad = ConsumerSpec(stream="WORK", durable="broad", filter_subject="work.>")
    narrow = ConsumerSpec(stream="WORK", durable="narrow", filter_subject="work.b.*")

    async def ignore(_item: WorkItem[RunEvent]) -> None:
        return None

    async with bus.consume(broad, RunEvent, ignore):
        pass
    with pytest.raises(BusError, match="not unique"):
        async with bus.consume(narrow, RunEvent, ignore):
            pass
    # The same durable with a narrower filter (an upgrade) is updated, and then both fit.
    await bus.js_publish("work.a", text("for broad"))
    await bus.js_publish("work.b.x", text("for narrow"))
    narrowed = ConsumerSpec(stream="WORK", durable="broad", filter_subject="work.a")
    seen = await consume_all(bus, narrowed, 1)
    assert [i.envelope.message.text_delta.text for i in seen] == ["for broad"]
    seen = await consume_all(bus, narrow, 1)
    assert [i.envelope.message.text_delta.text for i in seen] == ["for narrow"]


async def test_key_value_buckets(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    assert await bus.kv_get(subjects.AGENTS_BUCKET, "echo", GetStepsRequest) is None
    await bus.kv_put(subjects.AGENTS_BUCKET, "echo", GetStepsRequest(run_id="1"))
    await bus.kv_put(subjects.AGENTS_BUCKET, "echo", GetStepsRequest(run_id="2"))
    await bus.kv_put(subjects.AGENTS_BUCKET, "other", GetStepsRequest(run_id="3"))
    assert await bus.kv_get(subjects.AGENTS_BUCKET, "echo", GetStepsRequest) == GetStepsRequest(run_id="2")
    items = await bus.kv_items(subjects.AGENTS_BUCKET, GetStepsRequest)
    assert {k: v.run_id for k, v in items.items()} == {"echo": "2", "other": "3"}
    assert await bus.kv_items(subjects.TOOLS_BUCKET, GetStepsRequest) == {}

    await bus.kv_delete(subjects.AGENTS_BUCKET, "echo")
    await bus.kv_delete(subjects.AGENTS_BUCKET, "never-written")  # nothing there: no error
    assert await bus.kv_get(subjects.AGENTS_BUCKET, "echo", GetStepsRequest) is None
    items = await bus.kv_items(subjects.AGENTS_BUCKET, GetStepsRequest)
    assert {k: v.run_id for k, v in items.items()} == {"other": "3"}
    await bus.kv_put(subjects.AGENTS_BUCKET, "echo", GetStepsRequest(run_id="4"))  # written again after a delete
    assert await bus.kv_get(subjects.AGENTS_BUCKET, "echo", GetStepsRequest) == GetStepsRequest(run_id="4")


async def test_provisioning_is_idempotent_and_refuses_overlaps(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    await bus.provision(LAYOUT)
    await bus.provision(JetStreamLayout(events_max_age_seconds=60, extra_streams=(WORK, LOG)))
    clash = StreamSpec(name="CLASH", subjects=("atmo.run.submit.>",))
    with pytest.raises(BusError):
        await bus.provision(JetStreamLayout(extra_streams=(clash,)))


async def test_last_message_of_a_subject(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    assert await bus.last_message("LOG", "log.r1", RunEvent) is None
    for i in range(3):
        await bus.js_publish("log.r1", text(str(i)))
    await bus.js_publish("log.r2", text("other"))
    last = await bus.last_message("LOG", "log.r1", RunEvent)
    assert last is not None
    assert last.text_delta.text == "2"


async def test_replay_reads_what_a_subject_holds_in_order(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    assert [m async for m in bus.replay("LOG", "log.r1", RunEvent)] == []
    for i in range(40):
        await bus.publish("log.r1" if i % 2 == 0 else "log.r2", text(str(i)))
    await bus.js_publish("log.r1", text("last"))
    replayed = [m.text_delta.text async for m in bus.replay("LOG", "log.r1", RunEvent)]
    assert replayed == [str(i) for i in range(0, 40, 2)] + ["last"]


async def test_an_append_expecting_the_subjects_last_sequence_is_a_compare_and_set(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    first = await bus.js_publish("log.r1", text("a"), headers=Headers(expected_last_subject_seq=0))
    await bus.js_publish("log.r2", text("elsewhere"))  # another subject's writes do not count
    second = await bus.js_publish("log.r1", text("b"), headers=Headers(expected_last_subject_seq=first.seq))
    # A writer that read the subject before `second` loses, and nothing of it is stored.
    for stale in (0, first.seq):
        with pytest.raises(WrongLastSequenceError) as lost:
            await bus.js_publish("log.r1", text("stale"), headers=Headers(expected_last_subject_seq=stale))
        assert lost.value.expected == stale
    replayed = [(seq, m.text_delta.text) async for seq, m in bus.replay_sequenced("LOG", "log.r1", RunEvent)]
    assert replayed == [(first.seq, "a"), (second.seq, "b")]


async def test_purging_a_subject_leaves_the_others(bus: Bus) -> None:
    await bus.provision(LAYOUT)
    for subject in ("log.r1", "log.r1", "log.r2"):
        await bus.js_publish(subject, text(subject))
    await bus.purge("LOG", "log.r1")
    assert [m async for m in bus.replay("LOG", "log.r1", RunEvent)] == []
    assert [m.text_delta.text async for m in bus.replay("LOG", "log.r2", RunEvent)] == ["log.r2"]
    # A purged subject starts over: its last sequence is "none" again.
    await bus.js_publish("log.r1", text("again"), headers=Headers(expected_last_subject_seq=0))
