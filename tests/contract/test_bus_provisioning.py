"""Provisioning, on both backends: one login makes the layout, every other one checks it and binds to it.

A service with a login never makes a stream, bucket or consumer (`atmosphere.bus.permissions`):
it waits until what it uses exists (`Bus.verify`), binds to the run queue's provisioned
consumers (`ConsumerSpec.provisioned`) and reads streams without a consumer (`Bus.read_stream`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats.js.errors
import pytest
from nats.js import api as js_api

from atmosphere.bus import (
    PROVISIONED_BY,
    Bus,
    JetStreamLayout,
    LayoutNotProvisionedError,
    NatsBus,
    RequiredLayout,
    StreamSpec,
    connect,
    run_queue,
    subjects,
)
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission, TextDelta

LOG = StreamSpec(name="LOG", subjects=("log.>",))
LAYOUT = JetStreamLayout(extra_streams=(LOG,), consumers=run_queue.consumers())


@pytest.fixture(params=["fake", "nats"])
def bus(request: pytest.FixtureRequest) -> Bus:
    if request.param == "fake":
        return FakeBus()
    return request.getfixturevalue("nats_bus")  # type: ignore[no-any-return]


async def test_what_was_provisioned_is_verified_and_names_who_made_it(bus: Bus) -> None:
    await bus.provision(LAYOUT, by="the provisioner")
    required = RequiredLayout(
        streams=(subjects.RUNS_STREAM, LOG.name),
        buckets=(subjects.TOOLS_BUCKET,),
        object_buckets=(subjects.TOOL_RESULTS_BUCKET,),
        consumers=run_queue.consumers(),
    )
    assert await bus.verify(required, timeout=5) == "the provisioner"


async def test_what_is_missing_is_named_after_the_wait(bus: Bus) -> None:
    await bus.provision(JetStreamLayout(), by="the provisioner")  # no LOG, no run queue consumers
    required = RequiredLayout(streams=(LOG.name,), consumers=run_queue.consumers()[:1])
    with pytest.raises(LayoutNotProvisionedError) as missing:
        await bus.verify(required, timeout=0.5)
    assert "LOG does not exist" in str(missing.value)
    assert "consumer dispatch of ATMO_RUNS does not exist" in str(missing.value)


async def test_a_provisioned_consumer_is_bound_to_never_made(bus: Bus) -> None:
    await bus.provision(JetStreamLayout(), by="the provisioner")
    worker = run_queue.consumers()[0]

    async def never(_item: Any) -> None:
        raise AssertionError

    with pytest.raises(LayoutNotProvisionedError, match="consumer dispatch of ATMO_RUNS does not exist"):
        async with bus.consume(worker, RunSubmission, never):
            pass
    await bus.provision(JetStreamLayout(consumers=run_queue.consumers()), by="the provisioner")
    got: list[str] = []

    async def take(item: Any) -> None:
        got.append(item.envelope.message.run_id)

    await bus.js_publish(subjects.run_submit("echo"), RunSubmission(run_id="r1", agent="echo"))
    async with bus.consume(worker, RunSubmission, take):
        for _ in range(200):
            if got:
                break
            await _tick()
    assert got == ["r1"]


async def test_read_stream_reads_after_a_sequence_up_to_another_by_filter(bus: Bus) -> None:
    await bus.provision(LAYOUT, by="the provisioner")
    for n in range(6):
        subject = f"log.{'kept' if n % 2 == 0 else 'other'}.{n}"
        await bus.js_publish(subject, RunEvent(text_delta=TextDelta(text=f"m{n}")))
    read = [
        (seq, envelope.subject if envelope else None, envelope.message.text_delta.text if envelope else None)
        async for seq, envelope in bus.read_stream(LOG.name, "log.kept.*", RunEvent, after=1, through=5)
    ]
    assert read == [(3, "log.kept.2", "m2"), (5, "log.kept.4", "m4")]
    everything = [seq async for seq, _ in bus.read_stream(LOG.name, "log.>", RunEvent, after=0, through=6)]
    assert everything == [1, 2, 3, 4, 5, 6]


async def _tick() -> None:
    await asyncio.sleep(0.02)


async def test_a_bucket_made_before_loses_its_roll_ups_and_is_stamped(nats_bus: NatsBus) -> None:
    # nats-py makes a key-value bucket with roll-ups, which let any writer empty it in one publish.
    js = nats_bus.client.jetstream()
    name = nats_bus.stream_name(subjects.TOOLS_BUCKET)
    await js.create_key_value(js_api.KeyValueConfig(bucket=name))
    assert (await js.stream_info(f"KV_{name}")).config.allow_rollup_hdrs
    await nats_bus.provision(JetStreamLayout(), by="the provisioner")
    config = (await js.stream_info(f"KV_{name}")).config
    assert not config.allow_rollup_hdrs
    assert (config.metadata or {})[PROVISIONED_BY] == "the provisioner"


async def test_a_bucket_made_by_another_provisioner_meanwhile_is_taken_as_made(
    nats_bus: NatsBus, nats_url: str, bus_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two replicas of a service starting together both find no bucket: the second's create then
    # meets the first's bucket already stamped and updated, which JetStream refuses as a
    # different configuration. Here the second looked before the first made anything.
    await nats_bus.provision(LAYOUT, by="first")
    async with connect(nats_url, name="second", namespace=bus_namespace) as second:
        js = second._js

        async def looked_too_early(bucket: str) -> Any:
            raise nats.js.errors.BucketNotFoundError

        monkeypatch.setattr(js, "key_value", looked_too_early)
        monkeypatch.setattr(js, "object_store", looked_too_early)
        await second.provision(LAYOUT, by="second")
    config = (await nats_bus.client.jetstream().stream_info(f"KV_{nats_bus.stream_name(subjects.TOOLS_BUCKET)}")).config
    assert not config.allow_rollup_hdrs
    assert (config.metadata or {})[PROVISIONED_BY] == "second"
