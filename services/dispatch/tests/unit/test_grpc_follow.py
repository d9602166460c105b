"""gRPC `Follow` (and what `Run` sends) over a real gRPC server, with runs on the in-memory bus.

No dispatch worker runs here: the tests write a run's events to `ATMO_EVENTS` themselves, as
the submitter and the worker owning a run do, so each case controls exactly what is stored
and what arrives live.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.config import TokenGrant
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.dispatch.v1 import dispatch_pb2_grpc
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor, FollowRequest, RunRequest, RunResponse
from atmosphere.contracts.run.v1.run_pb2 import (
    Complete,
    Control,
    InputMessage,
    Metadata,
    RunEvent,
    RunInput,
    TextDelta,
)
from atmosphere.dispatch.grpc_api import DispatchServicer, serve_grpc
from atmosphere.service import Authenticator
from atmosphere.testing import wait_until

if TYPE_CHECKING:
    from atmosphere.contracts.dispatch.v1.dispatch_pb2_grpc import DispatchServiceAsyncStub

ADA = "ada-token-0001"
BOB = "bob-token-0001"
GRANTS = (TokenGrant(token=ADA, user_id="ada"), TokenGrant(token=BOB, user_id="bob"))
ECHO = AgentDescriptor(name="echo", path="/atmosphere/agent/echo")
DEADLINE = 10.0
"""A safety net against a hang, never an assertion."""


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@dataclass
class Dispatch:
    bus: FakeBus
    stub: DispatchServiceAsyncStub


@contextlib.asynccontextmanager
async def dispatch_on(bus: FakeBus, grants: Sequence[TokenGrant] = ()) -> AsyncIterator[Dispatch]:
    servicer = DispatchServicer(bus, [ECHO], dict, authenticator=Authenticator(tuple(grants)))
    async with (
        serve_grpc(servicer, host="127.0.0.1", port=0) as port,
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield Dispatch(bus, dispatch_pb2_grpc.DispatchServiceStub(channel))


@pytest.fixture
async def bus() -> FakeBus:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    return bus


class Run:
    """Writes one run's events the way its submitter and worker do: numbered from 1."""

    def __init__(self, bus: FakeBus, run_id: str = "r1", owner: str = "") -> None:
        self.bus = bus
        self.run_id = run_id
        self.owner = owner
        self.seq = 0

    async def emit(self, **kind: object) -> int:
        self.seq += 1
        event = RunEvent(run_id=self.run_id, seq=self.seq, agent="echo", owner=self.owner, **kind)  # type: ignore[arg-type]
        await self.bus.js_publish(subjects.run_events(self.run_id), event)
        return self.seq

    async def text(self, *pieces: str) -> None:
        for piece in pieces:
            await self.emit(text_delta=TextDelta(text=piece))

    async def start(self) -> None:
        await self.emit(metadata=Metadata(key="X-Atmosphere-Run-Id", value_json=f'"{self.run_id}"'))

    async def model_input(self) -> None:
        messages = [
            InputMessage(role="system", content="secret system prompt"),
            InputMessage(role="user", content="hi"),
        ]
        await self.emit(input=RunInput(messages=messages))

    async def complete(self) -> None:
        await self.emit(complete=Complete())


async def collect(responses: grpc.aio.UnaryStreamCall[Any, RunResponse]) -> list[RunResponse]:
    async with asyncio.timeout(DEADLINE):
        return [r async for r in responses]


async def read_one(call: grpc.aio.UnaryStreamCall[Any, RunResponse]) -> RunResponse:
    """The call's next response (it must send one)."""
    response = await call.read()
    assert isinstance(response, RunResponse), response
    return response


async def read_rest(call: grpc.aio.UnaryStreamCall[Any, RunResponse]) -> list[RunResponse]:
    """What a call that was already `read()` from sends until it ends (iterating it is not allowed)."""
    rest = []
    async with asyncio.timeout(DEADLINE):
        while (response := await call.read()) is not grpc.aio.EOF:
            assert isinstance(response, RunResponse)
            rest.append(response)
    return rest


def texts(responses: Sequence[RunResponse]) -> str:
    return "".join(r.event.text_delta.text for r in responses)


async def test_a_finished_run_is_replayed_after_the_seq_given_and_the_stream_ends(bus: FakeBus) -> None:
    run = Run(bus)
    await run.start()
    await run.text("a ", "b ", "c")
    await run.complete()
    async with dispatch_on(bus) as dispatch:
        whole = await collect(dispatch.stub.Follow(FollowRequest(run_id="r1")))
        rest = await collect(dispatch.stub.Follow(FollowRequest(run_id="r1", after_seq=2)))
        seen_the_end = await collect(dispatch.stub.Follow(FollowRequest(run_id="r1", after_seq=5)))
    assert [r.seq for r in whole] == [1, 2, 3, 4, 5]
    assert [(r.run_id, r.seq) for r in whole] == [(r.event.run_id, r.event.seq) for r in whole]
    assert texts(whole) == "a b c"
    assert [r.seq for r in rest] == [3, 4, 5]
    assert texts(rest) == "b c"
    assert rest[-1].event.WhichOneof("kind") == "complete"
    assert seen_the_end == []


async def test_a_live_run_continues_live_through_its_terminal_event(bus: FakeBus) -> None:
    run = Run(bus)
    await run.start()
    await run.text("one ")
    async with dispatch_on(bus) as dispatch:
        follow = dispatch.stub.Follow(FollowRequest(run_id="r1"))
        async with asyncio.timeout(DEADLINE):
            assert [(await read_one(follow)).seq, (await read_one(follow)).seq] == [1, 2]
            await run.text("two ", "three")
            await run.complete()
        rest = await read_rest(follow)
    assert [r.seq for r in rest] == [3, 4, 5]
    assert texts(rest) == "two three"


async def test_an_after_seq_beyond_the_last_one_waits_for_later_events(bus: FakeBus) -> None:
    run = Run(bus)
    await run.start()
    async with dispatch_on(bus) as dispatch:
        follow = asyncio.create_task(collect(dispatch.stub.Follow(FollowRequest(run_id="r1", after_seq=3))))
        await run.text("x", "y", "z")
        assert not follow.done()
        await run.complete()
        responses = await follow
    assert [r.seq for r in responses] == [4, 5]
    assert texts(responses) == "z"


async def test_the_models_input_is_never_sent_and_its_seq_is_skipped(bus: FakeBus) -> None:
    run = Run(bus)
    await run.start()
    await run.model_input()
    await run.text("hello")
    await run.complete()
    async with dispatch_on(bus) as dispatch:
        responses = await collect(dispatch.stub.Follow(FollowRequest(run_id="r1")))
    assert [r.seq for r in responses] == [1, 3, 4]
    assert "input" not in [r.event.WhichOneof("kind") for r in responses]
    assert all("secret system prompt" not in str(r) for r in responses)


async def test_run_sends_neither_the_models_input_nor_less_than_the_seq_up_front(bus: FakeBus) -> None:
    async with dispatch_on(bus) as dispatch:
        call = dispatch.stub.Run(RunRequest(agent="echo", message="hi"))
        async with asyncio.timeout(DEADLINE):
            first = await read_one(call)  # the run-id event dispatch writes as it submits
            assert first.seq == 1
            assert first.run_id == first.event.run_id != ""
            run = Run(bus, first.run_id)
            run.seq = 1
            await run.model_input()
            await run.text("hi")
            await run.complete()
        rest = await read_rest(call)
    assert [(r.run_id, r.seq) for r in rest] == [(first.run_id, 3), (first.run_id, 4)]
    assert [r.event.WhichOneof("kind") for r in rest] == ["text_delta", "complete"]


async def test_runs_headers_name_its_run_so_a_stream_cut_before_any_event_can_follow_it(bus: FakeBus) -> None:
    async with dispatch_on(bus) as dispatch:
        call = dispatch.stub.Run(RunRequest(agent="echo", message="hi"))
        async with asyncio.timeout(DEADLINE):
            headers = dict(await call.initial_metadata())
            first = await read_one(call)
        call.cancel()
    assert headers["x-atmosphere-run-id"] == first.run_id != ""


async def test_dropping_a_follow_call_leaves_the_run_running(bus: FakeBus) -> None:
    run = Run(bus)
    await run.start()
    await run.text("streaming ")
    async with dispatch_on(bus) as dispatch:
        follow = dispatch.stub.Follow(FollowRequest(run_id="r1"))
        async with asyncio.timeout(DEADLINE):
            await read_one(follow)
        follow.cancel()
        # A `Run` dropped after it: its cancel is the one control that may appear.
        dropped = dispatch.stub.Run(RunRequest(agent="echo", message="hi"))
        async with asyncio.timeout(DEADLINE):
            sentinel = (await read_one(dropped)).run_id
        dropped.cancel()

        async def sentinel_cancelled() -> bool:
            return sentinel in cancelled(bus)

        await wait_until(sentinel_cancelled, what="the dropped Run's cancel")
    assert cancelled(bus) == [sentinel]


def cancelled(bus: FakeBus) -> list[str]:
    return [m.run_id for _, m in bus.published if isinstance(m, Control) and m.HasField("cancel")]


@pytest.mark.parametrize("run_id", ["", "a.b", "runs.>", "r" * 129, "a b"])
async def test_a_malformed_run_id_is_an_invalid_argument(bus: FakeBus, run_id: str) -> None:
    async with dispatch_on(bus) as dispatch:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await collect(dispatch.stub.Follow(FollowRequest(run_id=run_id)))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "Malformed run id (1-128 letters, digits, _-:@)"


async def test_without_auth_an_unknown_run_is_not_found(bus: FakeBus) -> None:
    async with dispatch_on(bus) as dispatch:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await collect(dispatch.stub.Follow(FollowRequest(run_id="nobody")))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert refused.value.details() == "Unknown run nobody"


async def test_with_auth_another_users_run_reads_exactly_like_an_unknown_one(bus: FakeBus) -> None:
    run = Run(bus, "adas-run", owner="ada")
    await run.start()
    await run.text("private")
    await run.complete()
    async with dispatch_on(bus, GRANTS) as dispatch:
        refusals = []
        for run_id in ("adas-run", "no-such-run"):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await collect(dispatch.stub.Follow(FollowRequest(run_id=run_id), metadata=bearer(BOB)))
            refusals.append((refused.value.code(), (refused.value.details() or "").replace(run_id, "<id>")))
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await collect(dispatch.stub.Follow(FollowRequest(run_id="adas-run")))
        own = await collect(dispatch.stub.Follow(FollowRequest(run_id="adas-run"), metadata=bearer(ADA)))
    assert refusals == [(grpc.StatusCode.NOT_FOUND, "Unknown run <id>")] * 2
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert texts(own) == "private"


@pytest.mark.parametrize("grants", [(), GRANTS], ids=["no auth", "auth"])
async def test_bus_trouble_is_unavailable(grants: Sequence[TokenGrant]) -> None:
    unprovisioned = FakeBus()  # no `ATMO_EVENTS`: every look at a run's events fails
    async with dispatch_on(unprovisioned, grants) as dispatch:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await collect(dispatch.stub.Follow(FollowRequest(run_id="r1"), metadata=bearer(ADA)))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "try again" in (refused.value.details() or "")


async def test_a_run_ending_in_an_error_ends_the_follow_with_it(bus: FakeBus) -> None:
    run = Run(bus)
    await run.start()
    await run.emit(error=Error(code="run.cancelled", message="cancelled"))
    async with dispatch_on(bus) as dispatch:
        responses = await collect(dispatch.stub.Follow(FollowRequest(run_id="r1")))
    assert [r.event.WhichOneof("kind") for r in responses] == ["metadata", "error"]


async def test_a_run_stream_cut_by_the_server_stopping_leaves_the_run_running(bus: FakeBus) -> None:
    servicer = DispatchServicer(bus, [ECHO], dict)
    async with contextlib.AsyncExitStack() as server:
        port = await server.enter_async_context(serve_grpc(servicer, host="127.0.0.1", port=0, stop_grace=0))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = dispatch_pb2_grpc.DispatchServiceStub(channel).Run(RunRequest(agent="echo", message="hi"))
            async with asyncio.timeout(DEADLINE):
                run_id = (await read_one(call)).run_id
            await server.aclose()  # the server stops while the client still listens
            with pytest.raises(grpc.aio.AioRpcError) as cut:
                await read_rest(call)
    assert cut.value.code() == grpc.StatusCode.UNAVAILABLE  # retryable: the client follows elsewhere
    assert cancelled(bus) == []
    # The run is still there to follow, from any replica.
    async with dispatch_on(bus) as other:
        follow = other.stub.Follow(FollowRequest(run_id=run_id, after_seq=1))
        run = Run(bus, run_id)
        run.seq = 1
        await run.complete()
        assert [r.event.WhichOneof("kind") for r in await read_rest(follow)] == ["complete"]
