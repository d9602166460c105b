"""gRPC `Run` and `Follow` hold a stream slot each: a client beyond its share, or the process beyond
its total, is `RESOURCE_EXHAUSTED` at once, other users go on, and no broker text reaches a client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import pytest
from google.protobuf.message import Message

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.config import TokenGrant
from atmosphere.contracts.dispatch.v1 import dispatch_pb2_grpc
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor, FollowRequest, RunRequest, RunResponse
from atmosphere.contracts.run.v1.run_pb2 import Metadata, RunEvent, RunSubmission
from atmosphere.dispatch.grpc_api import DispatchServicer, _peer_host, serve_grpc
from atmosphere.service import Authenticator, StreamSlots
from atmosphere.testing import wait_until

if TYPE_CHECKING:
    from atmosphere.contracts.dispatch.v1.dispatch_pb2_grpc import DispatchServiceAsyncStub

M = TypeVar("M", bound=Message)
ADA = "ada-token-0001"
BOB = "bob-token-0001"
GRANTS = (TokenGrant(token=ADA, user_id="ada"), TokenGrant(token=BOB, user_id="bob"))
ECHO = AgentDescriptor(name="echo", path="/atmosphere/agent/echo")
DEADLINE = 10.0
"""A safety net against a hang, never an assertion."""


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@contextlib.asynccontextmanager
async def dispatch_on(
    bus: FakeBus, slots: StreamSlots, grants: Sequence[TokenGrant] = GRANTS
) -> AsyncIterator[DispatchServiceAsyncStub]:
    servicer = DispatchServicer(bus, [ECHO], dict, authenticator=Authenticator(tuple(grants)), streams=slots)
    async with (
        serve_grpc(servicer, host="127.0.0.1", port=0) as port,
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield dispatch_pb2_grpc.DispatchServiceStub(channel)


async def live_run(bus: FakeBus, run_id: str, owner: str) -> None:
    """A run that started (seq 1 stored) and has not ended."""
    event = RunEvent(
        run_id=run_id, seq=1, agent="echo", owner=owner, metadata=Metadata(key="X-Atmosphere-Run-Id", value_json="1")
    )
    await bus.js_publish(subjects.run_events(run_id), event)


@pytest.fixture
async def bus() -> FakeBus:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    await live_run(bus, "ada-run", "ada")
    await live_run(bus, "bob-run", "bob")
    return bus


async def following(stub: DispatchServiceAsyncStub, run_id: str, token: str) -> Any:
    """A `Follow` call that got its first event: it holds its slot now."""
    call = stub.Follow(FollowRequest(run_id=run_id), metadata=bearer(token))
    async with asyncio.timeout(DEADLINE):
        first = await call.read()
    assert isinstance(first, RunResponse), first
    return call


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        async with asyncio.timeout(DEADLINE):
            await call.read()
    return failed.value


async def test_a_client_beyond_its_share_is_refused_and_another_user_is_not(bus: FakeBus) -> None:
    slots = StreamSlots(per_client=2, total=3)
    async with dispatch_on(bus, slots) as stub:
        held = [await following(stub, "ada-run", ADA) for _ in range(2)]
        third = await refused(stub.Follow(FollowRequest(run_id="ada-run"), metadata=bearer(ADA)))
        run = await refused(stub.Run(RunRequest(agent="echo", message="hi"), metadata=bearer(ADA)))
        bobs = await following(stub, "bob-run", BOB)  # ada's share is hers alone
        over_total = await refused(stub.Follow(FollowRequest(run_id="bob-run"), metadata=bearer(BOB)))
        for call in (*held, bobs):
            call.cancel()
    assert third.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "at most 2" in (third.details() or "")
    assert run.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # The refused `Run` started nothing.
    assert not [m for _, m in bus.published if isinstance(m, RunSubmission)]
    assert over_total.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "This server follows as many run streams as it takes (3)" in (over_total.details() or "")


async def test_a_call_the_client_drops_gives_its_slot_back(bus: FakeBus) -> None:
    slots = StreamSlots(per_client=1, total=10)
    async with dispatch_on(bus, slots) as stub:
        first = await following(stub, "ada-run", ADA)
        assert slots.in_use() == 1
        first.cancel()  # the client vanishes mid-follow

        async def given_back() -> bool:
            return slots.in_use() == 0

        await wait_until(given_back, timeout=DEADLINE, what="the slot to come back")
        again = await following(stub, "ada-run", ADA)
        again.cancel()


async def test_anonymous_callers_share_by_address(bus: FakeBus) -> None:
    slots = StreamSlots(per_client=1, total=10)
    async with dispatch_on(bus, slots, grants=()) as stub:
        first = await following(stub, "ada-run", "")
        second = await refused(stub.Follow(FollowRequest(run_id="bob-run")))
        first.cancel()
    assert second.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


class BrokenReplayBus(FakeBus):
    """A bus whose replays fail with a foreign exception, as nats-py's did past the consumer limit."""

    async def replay_sequenced(
        self, stream: str, subject: str, message_type: type[M]
    ) -> AsyncGenerator[tuple[int, M], None]:
        if stream:  # always: the `yield` below only makes this an async generator, like the real one
            raise RuntimeError("nats: BadRequestError: code=400 err_code=10026 description='maximum consumers'")
        yield 0, message_type()


async def test_no_broker_exception_text_reaches_a_follower() -> None:
    bus = BrokenReplayBus()
    await bus.provision(JetStreamLayout())
    await live_run(bus, "ada-run", "ada")
    async with dispatch_on(bus, StreamSlots(per_client=5, total=5)) as stub:
        failed = await refused(stub.Follow(FollowRequest(run_id="ada-run"), metadata=bearer(ADA)))
    assert failed.code() == grpc.StatusCode.INTERNAL
    details = failed.details() or ""
    assert "ada-run" in details
    for leaked in ("BadRequestError", "10026", "RuntimeError", "maximum consumers"):
        assert leaked not in details


@pytest.mark.parametrize(
    ("peer", "host"),
    [("ipv4:10.0.0.1:5432", "10.0.0.1"), ("ipv6:[::1]:5432", "::1"), ("unix:/tmp/s", "unix:/tmp/s")],
)
def test_a_peer_is_its_address_without_the_port(peer: str, host: str) -> None:
    assert _peer_host(peer) == host
