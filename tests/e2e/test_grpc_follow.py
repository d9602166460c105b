"""gRPC `Follow` on a real nats-server: a run whose dispatch went away is read to its end on another.

Two dispatch services run through their real `serve()`. A client reads part of a `Run` call on
dispatch A, A is stopped under it, and `Follow(run_id, after_seq=<last seq seen>)` on dispatch B
returns exactly the rest: nothing lost, nothing twice. A second test calls `Follow` as a client
that has no generated code at all, only what server reflection tells it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from atmosphere.bus import NatsBus, subjects
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.dispatch.v1 import dispatch_pb2_grpc
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import FollowRequest, RunRequest, RunResponse
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.testing import run_stack, running_service, wait_until

from .conftest import service_map

if TYPE_CHECKING:
    from atmosphere.contracts.dispatch.v1.dispatch_pb2_grpc import DispatchServiceAsyncStub

TICKER = "tests.e2e.apps.ticker:app"
WORDS, PAUSE = 40, 0.25
"""The run outlasts dispatch A's 5 s of grace for calls in progress, so A's stop cuts the call."""
READ_BEFORE_THE_STOP = 5
SERVICE = "atmosphere.contracts.dispatch.v1.DispatchService"


async def grpc_address(bus: NatsBus, *, other_than: str = "") -> str:
    """The gRPC address of a dispatch (one that is not `other_than`: asked until another answers)."""
    found: list[str] = []

    async def answered() -> bool:
        reply = await bus.request(subjects.service_info("dispatch"), ServiceInfoRequest(), ServiceInfoResponse)
        address = json.loads(reply.info_json)["grpc"]
        found.append(address)
        return bool(address) and address != other_than

    await wait_until(answered, timeout=20, what="a dispatch's gRPC address")
    return found[-1]


async def stored_seqs(bus: NatsBus, run_id: str) -> list[int]:
    return sorted([e.seq async for e in bus.replay(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)])


@pytest.mark.timeout(120)
async def test_a_run_cut_off_with_its_dispatch_is_followed_to_its_end_on_another(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    first = service_map(nats_url, bus_namespace, tmp_path / "a", ("governance", "dispatch"), app=TICKER)
    second = service_map(nats_url, bus_namespace, tmp_path / "b", ("dispatch",), app=TICKER)["dispatch"]
    async with (
        run_stack({"governance": first["governance"]}, bus=nats_bus),
        running_service("dispatch", *second, bus=nats_bus),
    ):
        b = await grpc_address(nats_bus)
        dispatch_a = contextlib.AsyncExitStack()
        await dispatch_a.enter_async_context(running_service("dispatch", *first["dispatch"], bus=nats_bus))
        try:
            a = await grpc_address(nats_bus, other_than=b)
            seen, stopping = await read_until_cut(a, stop=dispatch_a.aclose)
        finally:
            await dispatch_a.aclose()
        await stopping
        run_id = seen[0].run_id
        async with grpc.aio.insecure_channel(b) as channel:
            follow = dispatch_pb2_grpc.DispatchServiceStub(channel).Follow(
                FollowRequest(run_id=run_id, after_seq=seen[-1].seq)
            )
            rest = [r async for r in follow]
        whole = seen + rest
        print(f"read {len(seen)} events on A before its stop cut the call, {len(rest)} on B")  # for pytest -s
        assert len(seen) >= READ_BEFORE_THE_STOP
        assert rest, "the run was still going when A stopped"
        # The live tail can reach a follower a moment before the broker has stored the event
        # (core delivery and stream storage run side by side): the stream is read once it holds
        # the terminal event the writer saw acknowledged.
        stored: list[int] = []

        async def stored_through_the_end() -> bool:
            stored[:] = await stored_seqs(nats_bus, run_id)
            return len(stored) >= len(whole)

        await wait_until(stored_through_the_end, timeout=10, what="the run's events stored")
        assert [r.seq for r in whole] == stored
        assert [r.seq for r in whole] == list(range(1, len(whole) + 1))
        assert {r.run_id for r in whole} == {run_id}
        assert whole[-1].event.WhichOneof("kind") == "complete"
        assert "".join(r.event.text_delta.text for r in whole) == "".join(f"w{n} " for n in range(WORDS))


async def read_until_cut(address: str, *, stop: Callable[[], Any]) -> tuple[list[RunResponse], asyncio.Task[None]]:
    """Start a slow run on `address`, stop that dispatch part-way, and read until the call breaks."""
    seen: list[RunResponse] = []
    stopping: list[asyncio.Task[None]] = []

    async def read(call: grpc.aio.UnaryStreamCall[RunRequest, RunResponse]) -> None:
        async for response in call:
            seen.append(response)
            if len(seen) == READ_BEFORE_THE_STOP:
                stopping.append(asyncio.create_task(stop()))

    async with grpc.aio.insecure_channel(address) as channel:
        stub: DispatchServiceAsyncStub = dispatch_pb2_grpc.DispatchServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as cut:
            await read(stub.Run(RunRequest(agent="ticker", message=f"{WORDS} {PAUSE}")))
    assert cut.value.code() == grpc.StatusCode.UNAVAILABLE, cut.value
    return seen, stopping[0]


# -- a client with nothing but reflection --------------------------------------------------------


async def reflected_pool(channel: grpc.aio.Channel) -> descriptor_pool.DescriptorPool:
    """The server's `DispatchService` protos, read over reflection into a fresh pool."""
    # The generated stub is typed for a sync channel; on an aio one its calls are aio calls.
    reflect: Any = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[arg-type]
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    wanted = [reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)]
    while wanted:
        async for reply in reflect.ServerReflectionInfo(iter(wanted)):
            for data in reply.file_descriptor_response.file_descriptor_proto:
                proto = descriptor_pb2.FileDescriptorProto.FromString(data)
                files[proto.name] = proto
        missing = {d for f in files.values() for d in f.dependency} - set(files)
        wanted = [reflection_pb2.ServerReflectionRequest(file_by_filename=name) for name in sorted(missing)]
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    while len(added) < len(files):  # dependencies first
        for name, proto in files.items():
            if name not in added and set(proto.dependency) <= added:
                pool.Add(proto)
                added.add(name)
    return pool


async def test_a_client_with_only_reflection_follows_a_run(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    services = service_map(nats_url, bus_namespace, tmp_path / "data", ("governance", "dispatch"))
    async with run_stack(services, bus=nats_bus):
        address = await grpc_address(nats_bus)
        async with grpc.aio.insecure_channel(address) as channel:
            pool = await reflected_pool(channel)
            method = pool.FindServiceByName(SERVICE).FindMethodByName("Follow")
            request_class = message_factory.GetMessageClass(method.input_type)
            response_class = message_factory.GetMessageClass(method.output_type)
            assert method.server_streaming
            assert method.output_type.full_name == RunResponse.DESCRIPTOR.full_name

            started = [r async for r in dispatch_pb2_grpc.DispatchServiceStub(channel).Run(
                RunRequest(agent="echo", message="seen by reflection"))]  # fmt: skip
            run_id = started[0].run_id
            follow: grpc.aio.UnaryStreamMultiCallable[Message, Any] = channel.unary_stream(
                f"/{SERVICE}/Follow",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response_class.FromString,
            )
            responses = [r async for r in follow(request_class(run_id=run_id, after_seq=1))]
    assert [r.seq for r in responses] == [r.seq for r in started[1:]]
    assert {r.run_id for r in responses} == {run_id}
    assert "".join(r.event.text_delta.text for r in responses) == "seen by reflection"
    assert responses[-1].event.WhichOneof("kind") == "complete"
