"""`Bus.kv_update`, the key-value compare-and-set: `FakeBus` and the real nats-server agree."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from atmosphere.bus import Bus, BusError, JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Usage

BUCKET = subjects.TOOLS_BUCKET


@pytest.fixture(params=["fake", "nats"])
def bus(request: pytest.FixtureRequest) -> Bus:
    if request.param == "fake":
        return FakeBus()
    return request.getfixturevalue("nats_bus")  # type: ignore[no-any-return]


def add(n: int) -> Callable[[Usage | None], Usage]:
    """A change that adds `n` tokens to the count (0 when there is none yet)."""

    def change(current: Usage | None) -> Usage:
        return Usage(total_tokens=(current.total_tokens if current is not None else 0) + n)

    return change


async def test_a_change_sees_the_current_value_and_writes_its_answer(bus: Bus) -> None:
    await bus.provision(JetStreamLayout())
    seen: list[Usage | None] = []

    def first(current: Usage | None) -> Usage:
        seen.append(current)
        return Usage(total_tokens=1, model="m")

    assert await bus.kv_update(BUCKET, "k", Usage, first) == Usage(total_tokens=1, model="m")
    assert seen == [None]
    assert await bus.kv_get(BUCKET, "k", Usage) == Usage(total_tokens=1, model="m")

    def keep(current: Usage | None) -> Usage | None:
        seen.append(current)
        return current

    assert await bus.kv_update(BUCKET, "k", Usage, keep) == Usage(total_tokens=1, model="m")
    assert seen[-1] == Usage(total_tokens=1, model="m")
    assert await bus.kv_get(BUCKET, "k", Usage) == Usage(total_tokens=1, model="m")


async def test_none_deletes_and_a_deleted_key_can_be_written_again(bus: Bus) -> None:
    await bus.provision(JetStreamLayout())
    await bus.kv_put(BUCKET, "k", Usage(total_tokens=5))
    assert await bus.kv_update(BUCKET, "k", Usage, lambda _: None) is None
    assert await bus.kv_get(BUCKET, "k", Usage) is None
    assert await bus.kv_update(BUCKET, "never-written", Usage, lambda current: current) is None
    assert await bus.kv_update(BUCKET, "never-written", Usage, lambda _: None) is None
    # After a delete, the key starts from nothing again.
    assert await bus.kv_update(BUCKET, "k", Usage, add(2)) == Usage(total_tokens=2)
    assert await bus.kv_get(BUCKET, "k", Usage) == Usage(total_tokens=2)


async def test_concurrent_changes_are_all_kept(bus: Bus) -> None:
    """Twenty writers read the same count at once: a plain read-then-put would lose most of them."""
    await bus.provision(JetStreamLayout())
    await asyncio.gather(*(bus.kv_update(BUCKET, "count", Usage, add(1)) for _ in range(20)))
    assert await bus.kv_get(BUCKET, "count", Usage) == Usage(total_tokens=20)
    # A delete racing with writers is retried like any change: whatever ran after it is kept.
    await asyncio.gather(
        bus.kv_update(BUCKET, "count", Usage, lambda _: None),
        *(bus.kv_update(BUCKET, "count", Usage, add(1)) for _ in range(5)),
    )
    left = await bus.kv_get(BUCKET, "count", Usage)
    assert left is None or 1 <= left.total_tokens <= 5


async def test_an_unprovisioned_bucket_is_refused(bus: Bus) -> None:
    with pytest.raises(BusError, match="not provisioned"):
        await bus.kv_update("NO_SUCH_BUCKET", "k", Usage, add(1))
