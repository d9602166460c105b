"""The gRPC `DispatchService`: runs, cancellation, agents and info, plus health and reflection.

A gRPC run takes the same path as a WebSocket run — `ATMO_RUNS`, any dispatch worker,
governance, tape — so both entry paths behave the same (mode parity).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.bus.runs import is_terminal, submit_run
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1 import dispatch_pb2, dispatch_pb2_grpc
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import (
    AgentDescriptor,
    CancelRequest,
    CancelResponse,
    GetInfoRequest,
    GetInfoResponse,
    ListAgentsRequest,
    ListAgentsResponse,
    RunRequest,
    RunResponse,
)
from atmosphere.contracts.run.v1 import run_pb2
from atmosphere.contracts.run.v1.run_pb2 import Cancel, Control, ControlAck, RunEvent

log = logging.getLogger("atmosphere.dispatch")

SERVICE_NAME = dispatch_pb2.DESCRIPTOR.services_by_name["DispatchService"].full_name
MAX_MESSAGE_CHARS = 1 << 20


class DispatchServicer(dispatch_pb2_grpc.DispatchServiceServicer):
    """Serves the agents described by `descriptors` through the bus."""

    def __init__(self, bus: Bus, descriptors: Sequence[AgentDescriptor], info: Callable[[], dict[str, Any]]) -> None:
        """Submit runs on `bus`."""
        self._bus = bus
        self._agents = {d.name: d for d in descriptors}
        self._info = info

    async def Run(  # noqa: N802 - the gRPC method name
        self, request: RunRequest, context: grpc.aio.ServicerContext[RunRequest, RunResponse]
    ) -> AsyncIterator[RunResponse]:
        """Start a run and stream its events through the terminal one."""
        agent = self._agents.get(request.agent)
        if agent is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Unknown agent '{request.agent}'")
        if not request.message.strip():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "message must not be empty")
        if len(request.message) > MAX_MESSAGE_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"message is longer than {MAX_MESSAGE_CHARS} chars")
        assert agent is not None
        run = _run_request(request, agent, context.peer())
        finished = False
        try:
            async with self._bus.subscribe(subjects.run_events(run.run_id), RunEvent) as events:
                try:
                    await submit_run(self._bus, run)
                except BusError as exc:
                    log.warning("gRPC run %s could not be submitted: %s", run.run_id, exc)
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the run could not be submitted; try again")
                last_seq = 0
                async for envelope in events:
                    event = envelope.message
                    if event.seq <= last_seq:
                        continue
                    last_seq = event.seq
                    yield RunResponse(event=event)
                    if is_terminal(event):
                        finished = True
                        return
        finally:
            if not finished:
                # The client went away (or the call was cancelled): stop the run upstream too.
                await _cancel(self._bus, run.run_id, "the gRPC client cancelled the call")

    async def Cancel(  # noqa: N802 - the gRPC method name
        self, request: CancelRequest, context: grpc.aio.ServicerContext[CancelRequest, CancelResponse]
    ) -> CancelResponse:
        """Cancel a running run (false when no worker owns it)."""
        try:
            subjects.token(request.run_id, what="run id")
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return CancelResponse(accepted=await _cancel(self._bus, request.run_id, request.reason or "cancelled"))

    async def ListAgents(  # noqa: N802 - the gRPC method name
        self, request: ListAgentsRequest, context: grpc.aio.ServicerContext[ListAgentsRequest, ListAgentsResponse]
    ) -> ListAgentsResponse:
        """The agents this deployment serves."""
        return ListAgentsResponse(agents=list(self._agents.values()))

    async def GetInfo(  # noqa: N802 - the gRPC method name
        self, request: GetInfoRequest, context: grpc.aio.ServicerContext[GetInfoRequest, GetInfoResponse]
    ) -> GetInfoResponse:
        """Dispatch's runtime-truth information."""
        return GetInfoResponse(info_json=json.dumps(self._info(), sort_keys=True))


def _run_request(request: RunRequest, agent: AgentDescriptor, peer: str) -> run_pb2.RunRequest:
    submitted = Timestamp()
    submitted.FromNanoseconds(time.time_ns())
    return run_pb2.RunRequest(
        run_id=uuid.uuid4().hex,
        session_id=str(uuid.uuid4()),
        conversation_id=request.conversation_id or uuid.uuid4().hex,
        agent=agent.name,
        message=request.message,
        principal=Principal(auth_method="grpc", name=peer),
        metadata=dict(request.metadata),
        submitted_at=submitted,
        transport="grpc",
        path=agent.path,
    )


async def _cancel(bus: Bus, run_id: str, reason: str) -> bool:
    try:
        ack = await bus.request(
            subjects.run_control(run_id), Control(run_id=run_id, cancel=Cancel(reason=reason)), ControlAck, timeout=2.0
        )
    except BusError:
        return False
    return ack.accepted


@contextlib.asynccontextmanager
async def serve_grpc(servicer: DispatchServicer, *, host: str, port: int) -> AsyncIterator[int]:
    """Run the gRPC server (with health and reflection) while the context is open; yield its port."""
    server = grpc.aio.server()
    dispatch_pb2_grpc.add_DispatchServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("gRPC DispatchService on %s:%d", host, bound)
    try:
        yield bound
    finally:
        await health_servicer.enter_graceful_shutdown()
        await server.stop(grace=5)
