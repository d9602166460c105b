"""The gRPC `DispatchService`: runs, following, cancellation, agents and info, plus health and reflection.

A gRPC run takes the same path as a WebSocket run — `ATMO_RUNS`, any dispatch worker,
governance, tape — so both entry paths behave the same (mode parity). Its events come off the
bus, never out of this process, so `Follow` works on any replica: a client whose `Run` stream
broke with its dispatch continues on another one after the last seq it saw. Authentication is
the agent endpoints' too: with token grants configured (`ATMOSPHERE_INGRESS__AUTH_TOKENS`) every
`DispatchService` call needs `authorization: Bearer <token>` or `x-api-key: <token>` metadata
(`UNAUTHENTICATED` otherwise), a grant covering the agent's path (`PERMISSION_DENIED`), and
`Follow` and `Cancel` reach only the caller's own runs. Health and reflection stay open for probes.

Each `Run` and `Follow` holds one of its client's stream slots while it streams (a client is a
token's user, or an anonymous caller's address): beyond its share, or beyond what this process
follows in all, a call is refused at once with `RESOURCE_EXHAUSTED`. No broker exception's text
reaches a client: a stream that cannot be read is `UNAVAILABLE` with a plain reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError as ProtobufDecodeError
from google.protobuf.message import Message
from google.protobuf.struct_pb2 import Struct
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import aio_server_interceptor

from atmosphere.bus import Bus, BusError, PayloadTooLargeError, subjects
from atmosphere.bus.runs import (
    RUN_ID_METADATA_KEY,
    SERVER_SIDE_KINDS,
    StreamGapError,
    SubmitError,
    UnknownRunError,
    cancel_run,
    follow_run,
    is_terminal,
    last_event,
    new_run,
)
from atmosphere.bus.sizes import data_budget
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1 import dispatch_pb2
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import (
    AgentDescriptor,
    CancelRequest,
    CancelResponse,
    FollowRequest,
    GetInfoRequest,
    GetInfoResponse,
    ListAgentsRequest,
    ListAgentsResponse,
    RunRequest,
    RunResponse,
)
from atmosphere.contracts.run.v1 import run_pb2
from atmosphere.dispatch.settings import DispatchOptions
from atmosphere.service import (
    Authenticator,
    AuthError,
    Caller,
    StreamLimitError,
    StreamSlot,
    StreamSlots,
    client_key,
    scoped_conversation,
    telemetry,
)

log = logging.getLogger("atmosphere.dispatch")

SERVICE_NAME = dispatch_pb2.DESCRIPTOR.services_by_name["DispatchService"].full_name
MAX_METADATA_ENTRIES = 64
MAX_METADATA_KEY_CHARS = 128
RESERVED_METADATA_PREFIXES = ("atmosphere.", "ai.subagent.", "ai.run.")
"""Run metadata dispatch sets itself (queue level, sub-agent depth and workspace): not a client's to choose."""
MAX_REASON_CHARS = 1024
HEALTH_POLL = 0.5
"""Seconds between looks at dispatch's readiness for gRPC health `Watch` streams."""
RUN_ID_HEADER = RUN_ID_METADATA_KEY.lower()
"""The `Run` call's header naming its run (gRPC metadata keys are lower case)."""
MALFORMED_RUN_ID = "Malformed run id (1-128 letters, digits, _-:@)"

M = TypeVar("M", bound=Message)


class MalformedRequest:
    """A request whose bytes are not a valid message (e.g. invalid UTF-8 in a string field).

    The deserializer hands this to the method instead of raising, so the client gets
    `INVALID_ARGUMENT` with a reason rather than gRPC's bare `INTERNAL`.
    """

    def __init__(self, expected: type[Message], reason: str) -> None:
        self.expected = expected.DESCRIPTOR.full_name
        self.reason = reason


def _tolerant(cls: type[M]) -> Callable[[bytes], M | MalformedRequest]:
    def deserialize(data: bytes) -> M | MalformedRequest:
        try:
            return cls.FromString(data)
        except (ProtobufDecodeError, ValueError) as exc:
            return MalformedRequest(cls, str(exc) or type(exc).__name__)

    return deserialize


def _metadata(context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str]:
    """The call's text metadata by lower-case key (binary `-bin` entries are not credentials)."""
    return {key.lower(): value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


class DispatchServicer:
    """Serves the agents described by `descriptors` through the bus."""

    def __init__(
        self,
        bus: Bus,
        descriptors: Sequence[AgentDescriptor],
        info: Callable[[], dict[str, Any]],
        *,
        authenticator: Authenticator | None = None,
        streams: StreamSlots | None = None,
    ) -> None:
        """Submit runs on `bus`; `authenticator` holds the token grants (none: anonymous).

        `streams` bounds the `Run` and `Follow` calls streaming at once, per client and in all.
        """
        self._bus = bus
        self._agents = {d.name: d for d in descriptors}
        self._info = info
        self._auth = authenticator or Authenticator(())
        self._streams = streams or _default_streams()
        self._stopping = False

    def stop_serving(self) -> None:
        """The server is going down: `Run` streams it cuts leave their runs running.

        Only a client that drops its own `Run` call cancels the run. A stream broken by a
        dispatch stopping (a deploy, a scale-down) is the server's doing: the client goes on
        with `Follow` on another replica.
        """
        self._stopping = True

    async def _accept(
        self, request: M | MalformedRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[Caller, M]:
        """Who calls (from the metadata) and what they asked.

        Aborts with `UNAUTHENTICATED`, or `INVALID_ARGUMENT` for bytes that are not a valid request.
        """
        try:
            caller = self._auth.identify(_metadata(context))
        except AuthError as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
        if isinstance(request, MalformedRequest):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"Malformed {request.expected}: {request.reason}"[:MAX_REASON_CHARS]
            )
        return caller, request

    async def _claim_stream(self, caller: Caller, context: grpc.aio.ServicerContext[Any, Any]) -> StreamSlot:
        """A stream slot for this call, or an abort with `RESOURCE_EXHAUSTED` saying which limit."""
        try:
            return self._streams.claim(client_key(caller.principal, _peer_host(context.peer())))
        except StreamLimitError as exc:
            if exc.scope == "client":
                reason = f"Too many run streams open for this client (at most {exc.limit}); end one or try later"
            else:
                reason = f"This server follows as many run streams as it takes ({exc.limit}); try again shortly"
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, reason)

    def _principal(self, caller: Caller, context: grpc.aio.ServicerContext[Any, Any]) -> Principal:
        if self._auth.enabled:
            return caller.principal
        # No-auth mode: who it was is only known by address.
        return Principal(auth_method="grpc", name=context.peer())

    async def Run(  # noqa: N802 - the gRPC method name
        self, received: RunRequest | MalformedRequest, context: grpc.aio.ServicerContext[RunRequest, RunResponse]
    ) -> AsyncIterator[RunResponse]:
        """Start a run and stream its events through the terminal one."""
        caller, request = await self._accept(received, context)
        agent = await self._agent(request.agent)
        if agent is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Unknown agent '{request.agent}'"[:MAX_REASON_CHARS])
        if not caller.may_use(agent.path):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"This token may not use {agent.path}")
        # The same budget as every run request dispatch sends: the broker's limit less the envelope.
        problem = _invalid_run(request, limit=data_budget(self._bus.max_payload))
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        run = _run_request(request, agent, self._principal(caller, context))
        # Claimed before the run is submitted: a refused client starts nothing.
        slot = await self._claim_stream(caller, context)
        try:
            # The run's id goes out in the headers before the run is submitted: a client whose
            # stream breaks before the first event still knows which run to `Follow`, and one
            # that got no headers knows nothing was submitted, so calling `Run` again starts no
            # second run.
            await context.send_initial_metadata(((RUN_ID_HEADER, run.run_id),))
            async for response in self._stream(run, context):
                yield response
        finally:
            slot.release()

    async def _stream(
        self, run: run_pb2.RunSubmission, context: grpc.aio.ServicerContext[RunRequest, RunResponse]
    ) -> AsyncIterator[RunResponse]:
        finished = False
        # The same follower as every other transport: events in seq order, once each, with
        # gaps (a broker restart, a reconnect) completed from the stream.
        events = follow_run(self._bus, run.run_id, submit=run)
        try:
            async for event in events:
                if event.WhichOneof("kind") not in SERVER_SIDE_KINDS:
                    yield _response(event)
                if is_terminal(event):
                    finished = True
                    return
        except PayloadTooLargeError:
            finished = True  # nothing was queued: there is no run to stop
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "The request is too large for the bus")
        except SubmitError as exc:
            finished = True  # nothing was queued
            log.warning("gRPC run %s could not be submitted: %s", run.run_id, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the run could not be submitted; try again")
        except StreamGapError as exc:
            log.warning("gRPC run %s stopped at a gap: %s", run.run_id, exc)
            await context.abort(grpc.StatusCode.DATA_LOSS, exc.plainly)
        except BusError as exc:
            log.warning("gRPC run %s could not be followed: %s", run.run_id, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the run's stream broke (run {run.run_id})")
        except Exception:
            # Anything else is a bug of ours: logged whole, never its text to the client.
            log.exception("gRPC run %s failed", run.run_id)
            await context.abort(grpc.StatusCode.INTERNAL, f"the run's stream failed (run {run.run_id}); Follow it")
        finally:
            await events.aclose()
            if not finished and not self._stopping:
                # The client went away (or the call was cancelled): stop the run upstream too.
                await _cancel(self._bus, run.run_id, "the gRPC client cancelled the call", run.principal)

    async def Follow(  # noqa: N802 - the gRPC method name
        self, received: FollowRequest | MalformedRequest, context: grpc.aio.ServicerContext[FollowRequest, RunResponse]
    ) -> AsyncIterator[RunResponse]:
        """Stream an existing run's events after `after_seq` through the terminal one.

        A finished run's stored events are replayed; a live run's continue as they happen.
        Dropping the call leaves the run running. With auth on, only the caller's own runs.
        """
        caller, request = await self._accept(received, context)
        await self._check_run(caller, request.run_id, context)
        slot = await self._claim_stream(caller, context)
        events = follow_run(self._bus, request.run_id, after_seq=request.after_seq)
        try:
            async for event in events:
                if event.WhichOneof("kind") not in SERVER_SIDE_KINDS:
                    yield _response(event)
        except UnknownRunError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Unknown run {request.run_id}")
        except StreamGapError as exc:
            log.warning("gRPC follow of run %s stopped at a gap: %s", request.run_id, exc)
            await context.abort(grpc.StatusCode.DATA_LOSS, exc.plainly)
        except BusError as exc:
            log.warning("gRPC follow of run %s broke: %s", request.run_id, exc)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"the run cannot be followed right now (run {request.run_id}); try again after the last seq received",
            )
        except Exception:
            # Anything else is a bug of ours: logged whole, never its text to the client.
            log.exception("gRPC follow of run %s failed", request.run_id)
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"the run could not be followed (run {request.run_id}); try again after the last seq received",
            )
        finally:
            slot.release()
            await events.aclose()

    async def Cancel(  # noqa: N802 - the gRPC method name
        self,
        received: CancelRequest | MalformedRequest,
        context: grpc.aio.ServicerContext[CancelRequest, CancelResponse],
    ) -> CancelResponse:
        """Cancel a running run (false when no worker owns it); with auth on, only the caller's own."""
        caller, request = await self._accept(received, context)
        await self._check_run(caller, request.run_id, context)
        reason = request.reason[:MAX_REASON_CHARS] or "cancelled"
        return CancelResponse(accepted=await _cancel(self._bus, request.run_id, reason, caller.principal))

    async def _check_run(self, caller: Caller, run_id: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Abort unless `run_id` is well-formed and, with auth on, the caller's own run.

        `INVALID_ARGUMENT` for an id that cannot be a run's, `UNAVAILABLE` when the run cannot
        be looked up, `NOT_FOUND` for someone else's run and for an unknown one alike.
        """
        try:
            subjects.token(run_id, what="run id")
        except ValueError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, MALFORMED_RUN_ID)
        if not self._auth.enabled:
            return
        try:
            mine = await self._may_control(caller, run_id)
        except BusError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "runs cannot be looked up right now; try again")
        if not mine:
            # Someone else's run reads exactly like one that does not exist: ids cannot be probed.
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Unknown run {run_id}")

    async def _agent(self, name: str) -> AgentDescriptor | None:
        """The agent `name`: this pool's own, or one another runtime pool serves now (`ATMO_AGENTS`).

        A gRPC client may call any dispatch: an agent pinned to another runtime is queued in its
        own pool's queue, found through the descriptor that pool keeps alive.
        """
        own = self._agents.get(name)
        if own is not None:
            return own
        try:
            return await self._bus.kv_get(
                subjects.AGENTS_BUCKET, subjects.token(name, what="agent name"), AgentDescriptor
            )
        except (BusError, ValueError):
            return None

    async def _may_control(self, caller: Caller, run_id: str) -> bool:
        """Whether `caller` owns the stored run `run_id` and may use its agent."""
        last = await last_event(self._bus, run_id)
        if last is None:
            return False
        known = self._agents.get(last.agent)
        path = known.path if known is not None else f"/atmosphere/agent/{last.agent}"
        return caller.may_access(owner=last.owner, path=path)

    async def ListAgents(  # noqa: N802 - the gRPC method name
        self,
        received: ListAgentsRequest | MalformedRequest,
        context: grpc.aio.ServicerContext[ListAgentsRequest, ListAgentsResponse],
    ) -> ListAgentsResponse:
        """The agents this deployment serves (with auth on: those the caller's grant covers)."""
        caller, _ = await self._accept(received, context)
        try:
            every = await self._bus.kv_items(subjects.AGENTS_BUCKET, AgentDescriptor)
        except BusError:
            every = {}
        # This pool's own agents (even if the bucket could not be read), then other pools' live ones.
        agents = [*self._agents.values(), *(a for name, a in sorted(every.items()) if name not in self._agents)]
        return ListAgentsResponse(agents=[a for a in agents if caller.may_use(a.path)])

    async def GetInfo(  # noqa: N802 - the gRPC method name
        self,
        received: GetInfoRequest | MalformedRequest,
        context: grpc.aio.ServicerContext[GetInfoRequest, GetInfoResponse],
    ) -> GetInfoResponse:
        """Dispatch's runtime-truth information."""
        await self._accept(received, context)
        info = self._info()
        typed = Struct()
        typed.update(info)
        return GetInfoResponse(info_json=json.dumps(info, sort_keys=True), info=typed)


def _invalid_run(request: RunRequest, *, limit: int) -> str:
    """Why `request` cannot become a run ("" when it can)."""
    if not request.message.strip():
        return "message must not be empty"
    if request.conversation_id:
        try:
            subjects.token(request.conversation_id, what="conversation id")
        except ValueError:
            return "Malformed conversation_id (1-128 letters, digits, '_', '-', ':', '@')"
    problem = _invalid_metadata(request.metadata)
    if problem:
        return problem
    size = request.ByteSize()
    if size > limit:
        return f"The request is {size} bytes; at most {limit} fit a run"
    return ""


def _invalid_metadata(metadata: Mapping[str, str]) -> str:
    if len(metadata) > MAX_METADATA_ENTRIES:
        return f"At most {MAX_METADATA_ENTRIES} metadata entries"
    for key in metadata:
        if not key or len(key) > MAX_METADATA_KEY_CHARS:
            return f"A metadata key must have 1-{MAX_METADATA_KEY_CHARS} characters"
        if key.startswith(RESERVED_METADATA_PREFIXES):
            return f"Metadata key '{key}' is reserved"
    return ""


def _run_request(request: RunRequest, agent: AgentDescriptor, principal: Principal) -> run_pb2.RunSubmission:
    return new_run(
        agent=agent.name,
        message=request.message,
        principal=principal,
        # The same scoping as ingress: whatever id is given becomes one of the caller's own.
        conversation_id=scoped_conversation(request.conversation_id or uuid.uuid4().hex, principal),
        transport="grpc",
        path=agent.path,
        metadata=request.metadata,
        pool=agent.pool,
    )


def _default_streams() -> StreamSlots:
    """The stream limits of the default settings."""
    options = DispatchOptions()
    return StreamSlots(per_client=options.grpc_max_streams_per_client, total=options.grpc_max_streams)


def _peer_host(peer: str) -> str:
    """The address of a gRPC peer (`ipv4:10.0.0.1:5432` → `10.0.0.1`), without its port."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer  # a unix socket, or a form gRPC may add: the whole of it
    host = rest.rsplit(":", 1)[0] if ":" in rest else rest
    return host.strip("[]")


def _response(event: run_pb2.RunEvent) -> RunResponse:
    """The response carrying `event`, its run id and seq copied up for clients that resume by them."""
    return RunResponse(event=event, run_id=event.run_id, seq=event.seq)


async def _cancel(bus: Bus, run_id: str, reason: str, principal: Principal) -> bool:
    # The worker accepts control only from the run's owner: the caller's principal goes along.
    return await cancel_run(bus, run_id, reason, principal=principal)


def _handlers(servicer: DispatchServicer) -> grpc.GenericRpcHandler:
    """The `DispatchService` methods, with request parsing that reports malformed bytes."""
    methods: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Run": grpc.unary_stream_rpc_method_handler(
            servicer.Run,
            request_deserializer=_tolerant(RunRequest),
            response_serializer=RunResponse.SerializeToString,
        ),
        "Follow": grpc.unary_stream_rpc_method_handler(
            servicer.Follow,
            request_deserializer=_tolerant(FollowRequest),
            response_serializer=RunResponse.SerializeToString,
        ),
        "Cancel": grpc.unary_unary_rpc_method_handler(
            servicer.Cancel,
            request_deserializer=_tolerant(CancelRequest),
            response_serializer=CancelResponse.SerializeToString,
        ),
        "ListAgents": grpc.unary_unary_rpc_method_handler(
            servicer.ListAgents,
            request_deserializer=_tolerant(ListAgentsRequest),
            response_serializer=ListAgentsResponse.SerializeToString,
        ),
        "GetInfo": grpc.unary_unary_rpc_method_handler(
            servicer.GetInfo,
            request_deserializer=_tolerant(GetInfoRequest),
            response_serializer=GetInfoResponse.SerializeToString,
        ),
    }
    return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)


class BusHealth(health.aio.HealthServicer):
    """gRPC health that follows the bus: `SERVING` only while dispatch can take work.

    Without NATS no run can be submitted or followed, so a load balancer must stop sending
    calls here; `ready` is dispatch's own readiness (wired and connected). `Check` looks at it
    on every call; `Watch` streams hear of a change within `HEALTH_POLL` seconds.
    """

    def __init__(self, ready: Callable[[], bool]) -> None:
        """Report `ready()` for the server and for `DispatchService`."""
        super().__init__()
        self._ready = ready
        self._reported: bool | None = None

    async def follow(self) -> None:
        """Bring the reported status in line with `ready()` (only a change notifies watchers)."""
        ready = self._ready()
        if ready == self._reported:
            return
        self._reported = ready
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.set(name, status)
        log.info("gRPC health: %s", "SERVING" if ready else "NOT_SERVING (the bus is not connected)")

    async def Check(  # noqa: N802 - the gRPC method name
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        """The status as of now, not as of the last poll."""
        await self.follow()
        response: health_pb2.HealthCheckResponse = await super().Check(request, context)
        return response

    async def keep_following(self) -> None:
        """Follow `ready()` until cancelled, for the `Watch` streams."""
        while True:
            await self.follow()
            await asyncio.sleep(HEALTH_POLL)


@contextlib.asynccontextmanager
async def serve_grpc(
    servicer: DispatchServicer,
    *,
    host: str,
    port: int,
    max_message_bytes: int = 4 << 20,
    ready: Callable[[], bool] = lambda: True,
    stop_grace: float = 5.0,
) -> AsyncIterator[int]:
    """Run the gRPC server (with health and reflection) while the context is open; yield its port.

    A request larger than `max_message_bytes` is refused by gRPC itself (`RESOURCE_EXHAUSTED`)
    before it is read into memory. Health is `SERVING` while `ready()` is true. On exit, calls
    in progress get `stop_grace` seconds to finish; the runs of `Run` calls cut after that go on
    (their clients `Follow` them on another replica).
    """
    # With tracing on, each call is a span continuing the client's `traceparent` metadata, and the
    # runs it submits join that trace (`submit_run` stamps the current span on them).
    provider = telemetry.provider()
    interceptors = None if provider is None else [aio_server_interceptor(tracer_provider=provider)]  # type: ignore[no-untyped-call]
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", max_message_bytes)], interceptors=interceptors
    )
    server.add_generic_rpc_handlers((_handlers(servicer),))
    health_servicer = BusHealth(ready)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    following = asyncio.create_task(health_servicer.keep_following(), name="grpc-health")
    log.info("gRPC DispatchService on %s:%d", host, bound)
    try:
        yield bound
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        servicer.stop_serving()
        await health_servicer.enter_graceful_shutdown()
        await server.stop(grace=stop_grace)
