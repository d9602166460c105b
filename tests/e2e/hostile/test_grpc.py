"""Hostile input against dispatch's gRPC `DispatchService`, on the wire as a client could send it.

Every case gets a clear gRPC status (never `OK`, never a bare `INTERNAL`/`UNKNOWN`), and after
each one the service still completes a normal authenticated run.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from atmosphere.bus import subjects
from atmosphere.bus.sizes import ENVELOPE_ROOM
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.dispatch.v1 import dispatch_pb2, dispatch_pb2_grpc
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import (
    CancelRequest,
    FollowRequest,
    GetInfoRequest,
    ListAgentsRequest,
    RunRequest,
    RunResponse,
)
from tests.e2e.hostile.conftest import HostileStack

SERVICE = "/atmosphere.contracts.dispatch.v1.DispatchService"
Code = grpc.StatusCode
Metadata = tuple[tuple[str, str | bytes], ...]


@dataclass(frozen=True)
class Target:
    address: str
    max_payload: int
    token: str
    other_token: str

    @property
    def auth(self) -> Metadata:
        return (("authorization", f"Bearer {self.token}"),)


@pytest.fixture(scope="module")
def target(hostile: HostileStack) -> Target:
    async def ask() -> tuple[str, int]:
        reply = await hostile.stack.bus.request(
            subjects.service_info("dispatch"), ServiceInfoRequest(), ServiceInfoResponse
        )
        return json.loads(reply.info_json)["grpc"], hostile.stack.bus.max_payload

    address, max_payload = hostile.call(ask())
    return Target(address, max_payload, hostile.token, hostile.other_token)


Call = Callable[[grpc.aio.Channel, Target], Awaitable[Any]]


async def run(channel: grpc.aio.Channel, request: RunRequest, metadata: Metadata) -> list[RunResponse]:
    stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
    return [r async for r in stub.Run(request, metadata=metadata)]


def run_as(credentials: Callable[[Target], Metadata], **fields: Any) -> Call:
    """A `Run` of `RunRequest(**fields)` (agent echo, a message, unless given) with those credentials."""
    request = RunRequest(**{"agent": "echo", "message": "hello", **fields})
    return lambda channel, target: run(channel, request, credentials(target))


def run_with(**fields: Any) -> Call:
    """A `Run` by the authenticated user."""
    return run_as(lambda t: t.auth, **fields)


def run_sized(build: Callable[[Target], RunRequest]) -> Call:
    """A `Run` whose request is sized from the broker's limit."""
    return lambda channel, target: run(channel, build(target), target.auth)


def raw(method: str, payload: bytes, *, stream: bool = False) -> Call:
    """Bytes on the wire as `method`'s request: what no generated client would send."""

    async def call(channel: grpc.aio.Channel, target: Target) -> Any:
        path = f"{SERVICE}/{method}"
        if stream:
            responses: grpc.aio.UnaryStreamMultiCallable[bytes, RunResponse] = channel.unary_stream(
                path, response_deserializer=RunResponse.FromString
            )
            return [r async for r in responses(payload, metadata=target.auth)]
        method_call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
        return await method_call(payload, metadata=target.auth)

    return call


def follow(request: FollowRequest, metadata: Callable[[Target], Metadata] = lambda t: t.auth) -> Call:
    """A `Follow` of `request`, read to its end."""

    async def call(channel: grpc.aio.Channel, target: Target) -> list[RunResponse]:
        stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
        return [r async for r in stub.Follow(request, metadata=metadata(target))]

    return call


def unary(method: str, request: Any, metadata: Callable[[Target], Metadata] = lambda t: t.auth) -> Call:
    async def call(channel: grpc.aio.Channel, target: Target) -> Any:
        stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
        return await getattr(stub, method)(request, metadata=metadata(target))

    return call


def field(number: int, value: bytes) -> bytes:
    """One length-delimited protobuf field (`value` under 128 bytes)."""
    return bytes([number << 3 | 2, len(value)]) + value


def over_bus_limit(target: Target) -> RunRequest:
    # One byte more than a run's request may carry on the bus.
    limit = target.max_payload - ENVELOPE_ROOM
    request = RunRequest(agent="echo", message="")
    request.message = "x" * (limit + 1 - request.ByteSize() - 4)
    while request.ByteSize() <= limit:
        request.message += "x"
    return request


def over_bus_limit_in_bytes_only(target: Target) -> RunRequest:
    # Fewer characters than the limit, more bytes: sizes are counted in bytes.
    return RunRequest(agent="echo", message="€" * ((target.max_payload - ENVELOPE_ROOM) // 3 + 1))


def over_grpc_limit(target: Target) -> RunRequest:
    return RunRequest(agent="echo", message="x" * (target.max_payload + 1))


NO_AUTH: Callable[[Target], Metadata] = lambda t: ()  # noqa: E731
BAD_AUTH: dict[str, Callable[[Target], Metadata]] = {
    "no metadata": NO_AUTH,
    "unknown bearer token": lambda t: (("authorization", "Bearer not-a-real-token"),),
    "basic scheme": lambda t: (("authorization", f"Basic {t.token}"),),
    "empty bearer": lambda t: (("authorization", "Bearer "),),
    "empty api key": lambda t: (("x-api-key", ""),),
    "token in a binary header": lambda t: (("authorization-bin", f"Bearer {t.token}".encode()),),
    "token with a suffix": lambda t: (("authorization", f"Bearer {t.token}x"),),
    "token prefix only": lambda t: (("x-api-key", t.token[:-1]),),
    "a 1 KB api key": lambda t: (("x-api-key", "k" * 1024),),
}

CASES: dict[str, tuple[Call, Code | None]] = {
    **{f"Run: {name}": (run_as(md), Code.UNAUTHENTICATED) for name, md in BAD_AUTH.items()},
    "Run: a 100 KB authorization header": (
        run_as(lambda t: (("authorization", "Bearer " + "t" * 100_000),)),
        Code.RESOURCE_EXHAUSTED,
    ),
    "Cancel: no metadata": (unary("Cancel", CancelRequest(run_id="r1"), NO_AUTH), Code.UNAUTHENTICATED),
    "ListAgents: unknown token": (
        unary("ListAgents", ListAgentsRequest(), BAD_AUTH["unknown bearer token"]),
        Code.UNAUTHENTICATED,
    ),
    "GetInfo: no metadata": (unary("GetInfo", GetInfoRequest(), NO_AUTH), Code.UNAUTHENTICATED),
    "Run: an agent outside the grant": (
        run_as(lambda t: (("x-api-key", t.other_token),), agent="assistant"),
        Code.PERMISSION_DENIED,
    ),
    "Run: unknown agent": (run_with(agent="nobody"), Code.NOT_FOUND),
    "Run: empty agent": (run_with(agent=""), Code.NOT_FOUND),
    "Run: a 10k-character agent": (run_with(agent="a" * 10_000), Code.NOT_FOUND),
    "Run: a wildcard agent": (run_with(agent="echo.>"), Code.NOT_FOUND),
    "Run: empty message": (run_with(message=""), Code.INVALID_ARGUMENT),
    "Run: blank message": (run_with(message=" \n\t "), Code.INVALID_ARGUMENT),
    "Run: one byte over the bus limit": (run_sized(over_bus_limit), Code.INVALID_ARGUMENT),
    "Run: over the bus limit in UTF-8 bytes": (run_sized(over_bus_limit_in_bytes_only), Code.INVALID_ARGUMENT),
    "Run: over the gRPC message limit": (run_sized(over_grpc_limit), Code.RESOURCE_EXHAUSTED),
    "Run: traversal conversation id": (run_with(conversation_id="../../etc"), Code.INVALID_ARGUMENT),
    "Run: 129-character conversation id": (run_with(conversation_id="c" * 129), Code.INVALID_ARGUMENT),
    "Run: conversation id with a newline": (run_with(conversation_id="a\nb"), Code.INVALID_ARGUMENT),
    "Run: conversation id with a subject dot": (run_with(conversation_id="a.b"), Code.INVALID_ARGUMENT),
    "Run: 65 metadata entries": (run_with(metadata={f"k{i}": "v" for i in range(65)}), Code.INVALID_ARGUMENT),
    "Run: reserved queue-level metadata": (
        run_with(metadata={"atmosphere.run.nesting": "3"}),
        Code.INVALID_ARGUMENT,
    ),
    "Run: reserved sub-agent metadata": (run_with(metadata={"ai.subagent.depth": "0"}), Code.INVALID_ARGUMENT),
    "Run: empty metadata key": (run_with(metadata={"": "v"}), Code.INVALID_ARGUMENT),
    "Run: 200-character metadata key": (run_with(metadata={"k" * 200: "v"}), Code.INVALID_ARGUMENT),
    "Run: invalid UTF-8 in agent": (raw("Run", field(1, b"\xff\xfeecho") + field(2, b"hi"), stream=True), None),
    "Run: invalid UTF-8 in message": (raw("Run", field(1, b"echo") + field(2, b"hi \xc3\x28"), stream=True), None),
    "Run: lone surrogate bytes in message": (
        raw("Run", field(1, b"echo") + field(2, b"\xed\xa0\x80"), stream=True),
        None,
    ),
    "Run: truncated protobuf": (raw("Run", b"\x0a\x05ab", stream=True), None),
    "Run: garbage bytes": (raw("Run", b"\xff\xff\xff\xff\xff", stream=True), None),
    "Cancel: invalid UTF-8 run id": (raw("Cancel", field(1, b"\xff\xfe")), None),
    "Cancel: empty run id": (unary("Cancel", CancelRequest(run_id="")), Code.INVALID_ARGUMENT),
    "Cancel: wildcard run id": (unary("Cancel", CancelRequest(run_id="a.b.>")), Code.INVALID_ARGUMENT),
    "Cancel: 200-character run id": (unary("Cancel", CancelRequest(run_id="r" * 200)), Code.INVALID_ARGUMENT),
    "Cancel: an unknown run": (unary("Cancel", CancelRequest(run_id="no-such-run")), Code.NOT_FOUND),
    **{
        f"Follow: {name}": (follow(FollowRequest(run_id="r1"), md), Code.UNAUTHENTICATED)
        for name, md in BAD_AUTH.items()
    },
    "Follow: empty run id": (follow(FollowRequest(run_id="")), Code.INVALID_ARGUMENT),
    "Follow: wildcard run id": (follow(FollowRequest(run_id="*")), Code.INVALID_ARGUMENT),
    "Follow: full wildcard run id": (follow(FollowRequest(run_id=">")), Code.INVALID_ARGUMENT),
    "Follow: 200-character run id": (follow(FollowRequest(run_id="r" * 200)), Code.INVALID_ARGUMENT),
    "Follow: an unknown run": (follow(FollowRequest(run_id="no-such-run")), Code.NOT_FOUND),
    "Follow: an unknown run, the largest after_seq": (
        follow(FollowRequest(run_id="no-such-run", after_seq=2**64 - 1)),
        Code.NOT_FOUND,
    ),
    "Follow: invalid UTF-8 run id": (raw("Follow", field(1, b"\xff\xfe"), stream=True), None),
    "Follow: garbage bytes": (raw("Follow", b"\xff\xff\xff\xff\xff", stream=True), None),
    "an unknown method": (raw("Explode", b""), Code.UNIMPLEMENTED),
}
"""name → (the call, the status it must get; None: `INVALID_ARGUMENT` naming the malformed request)."""


@pytest.fixture
def channel_factory(target: Target) -> Callable[[], grpc.aio.Channel]:
    return lambda: grpc.aio.insecure_channel(target.address, options=[("grpc.max_send_message_length", -1)])


async def still_serving(channel: grpc.aio.Channel, target: Target) -> None:
    events = [r.event for r in await run(channel, RunRequest(agent="echo", message="still serving"), target.auth)]
    assert events[-1].WhichOneof("kind") == "complete", events
    assert "".join(e.text_delta.text for e in events) == "still serving"


@pytest.mark.parametrize("case", list(CASES))
async def test_hostile_grpc_input_gets_a_clear_status(
    case: str, target: Target, channel_factory: Callable[[], grpc.aio.Channel]
) -> None:
    call, expected = CASES[case]
    async with channel_factory() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(channel, target)
        code, details = refused.value.code(), refused.value.details() or ""
        if expected is None:
            assert code == Code.INVALID_ARGUMENT, (code, details)
            assert details.startswith("Malformed atmosphere.contracts.dispatch.v1."), details
        else:
            assert code == expected, (code, details)
        assert details.strip(), "a refusal says why"
        assert len(details) <= 1024
        await still_serving(channel, target)


async def test_a_token_may_list_only_what_its_grant_covers(target: Target) -> None:
    async with grpc.aio.insecure_channel(target.address) as channel:
        stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
        other = await stub.ListAgents(dispatch_pb2.ListAgentsRequest(), metadata=(("x-api-key", target.other_token),))
        assert [a.name for a in other.agents] == ["echo"]
        await still_serving(channel, target)


async def test_a_run_is_followed_by_its_owner_only(target: Target) -> None:
    async with grpc.aio.insecure_channel(target.address) as channel:
        stub = dispatch_pb2_grpc.DispatchServiceStub(channel)
        started = await run(channel, RunRequest(agent="echo", message="mine alone"), target.auth)
        run_id = started[0].run_id
        followed = [r async for r in stub.Follow(FollowRequest(run_id=run_id), metadata=target.auth)]
        assert [(r.run_id, r.seq) for r in followed] == [(r.run_id, r.seq) for r in started]
        with pytest.raises(grpc.aio.AioRpcError) as other:
            async for _ in stub.Follow(FollowRequest(run_id=run_id), metadata=(("x-api-key", target.other_token),)):
                pass
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            async for _ in stub.Follow(FollowRequest(run_id="x" + run_id[1:]), metadata=target.auth):
                pass
        # Someone else's run reads exactly like a run that does not exist.
        assert other.value.code() == unknown.value.code() == Code.NOT_FOUND
        assert other.value.details() == f"Unknown run {run_id}"
        assert unknown.value.details() == f"Unknown run x{run_id[1:]}"
        await still_serving(channel, target)
