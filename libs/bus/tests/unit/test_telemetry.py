"""What travels with a request besides its payload, and what the bus reports of it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from atmosphere.bus import MessageContext, NoRespondersError, RemoteError, Router, ServiceError, telemetry
from atmosphere.bus.telemetry import bind_run, current_run, subject_family
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse


@pytest.mark.parametrize(
    ("subject", "family"),
    [
        ("atmo.gov.check_tool", "gov.check_tool"),
        ("atmo.gov.admin.reload", "gov.admin.reload"),
        ("atmo.mem.history", "mem.history"),
        ("atmo.mem.tool.read_file", "mem.tool"),
        ("atmo.tool.weather", "tool"),
        ("atmo.tool.mcp:docs", "tool"),
        ("atmo.run.01HXYZ.ctl", "run.ctl"),
        ("atmo.sandbox.host-1:42.tool.code_exec", "sandbox.tool"),
        ("atmo.sandbox.host-1:42.release", "sandbox.release"),
        ("atmo.svc.memory.health", "svc.health"),
        ("atmo.submit.nested.2.agent", "submit"),
        ("team.dev.atmo.tape.runs", "tape.runs"),
        ("atmo", "other"),
        ("nothing.of.ours", "other"),
        ("atmo.run", "run"),
    ],
)
def test_a_subject_family_keeps_no_id_or_name(subject: str, family: str) -> None:
    assert subject_family(subject) == family


def test_a_bound_run_is_current_only_inside_its_block() -> None:
    assert current_run() is None
    with bind_run("r1", "echo"):
        assert current_run() == telemetry.RunTag("r1", "echo")
        with bind_run(""):  # nothing to name: the outer binding stays
            assert current_run() == telemetry.RunTag("r1", "echo")
        with bind_run("r2"):
            assert current_run() == telemetry.RunTag("r2", "")
        assert current_run() == telemetry.RunTag("r1", "echo")
    assert current_run() is None


def _echo_run_router(seen: list[telemetry.RunTag | None]) -> Router:
    router = Router()

    @router.route("atmo.tape.steps", GetStepsRequest)
    async def steps(request: GetStepsRequest, context: MessageContext) -> GetStepsResponse:
        seen.append(current_run())
        return GetStepsResponse()

    return router


async def test_a_request_names_its_run_to_the_handler_and_nothing_else_carries_it() -> None:
    bus = FakeBus()
    seen: list[telemetry.RunTag | None] = []
    async with bus.serve(_echo_run_router(seen)):
        await bus.request("atmo.tape.steps", GetStepsRequest(), GetStepsResponse)
        with bind_run("run-1", "records"):
            await bus.request("atmo.tape.steps", GetStepsRequest(), GetStepsResponse)
            # A run's events are no requests: publishing one sends no header block.
            async with bus.subscribe("atmo.run.run-1.evt", GetStepsRequest) as events:
                await bus.publish("atmo.run.run-1.evt", GetStepsRequest())
                received = await events.receive(1.0)
    assert seen == [None, telemetry.RunTag("run-1", "records")]
    assert received is not None
    assert (received.headers.run_id, received.headers.traceparent) == ("", "")
    assert current_run() is None  # the handler's binding did not leak into the caller


class _Recorded:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.spans: list[str] = []

    def request_done(self, family: str, seconds: float, error: str) -> None:
        assert seconds >= 0
        self.requests.append((family, error))

    def traceparent(self) -> str:
        return "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" if self.spans else ""

    @contextlib.contextmanager
    def client_span(self, subject: str) -> Iterator[None]:
        self.spans.append(f"client {subject}")
        yield

    @contextlib.contextmanager
    def server_span(self, subject: str, traceparent: str) -> Iterator[None]:
        self.spans.append(f"server {subject} {traceparent}")
        yield


@pytest.fixture
def recorded() -> Iterator[_Recorded]:
    hooks = _Recorded()
    telemetry.install_observer(hooks)
    telemetry.install_tracer(hooks)
    try:
        yield hooks
    finally:
        telemetry.install_observer(None)
        telemetry.install_tracer(None)


class _RefusedError(ServiceError):
    code = "tape.bad_request"


async def test_every_request_is_counted_by_family_and_outcome_and_traced_on_both_sides(recorded: _Recorded) -> None:
    bus = FakeBus()
    router = Router()

    @router.route("atmo.tape.steps", GetStepsRequest)
    async def steps(request: GetStepsRequest, _c: MessageContext) -> GetStepsResponse:
        if request.run_id == "bad":
            raise _RefusedError("no")
        return GetStepsResponse()

    async with bus.serve(router):
        await bus.request("atmo.tape.steps", GetStepsRequest(), GetStepsResponse)
        with pytest.raises(RemoteError):
            await bus.request("atmo.tape.steps", GetStepsRequest(run_id="bad"), GetStepsResponse)
    with pytest.raises(NoRespondersError):
        await bus.request("atmo.tape.steps", GetStepsRequest(), GetStepsResponse)
    assert recorded.requests == [
        ("tape.steps", ""),
        ("tape.steps", "tape.bad_request"),
        ("tape.steps", "no_responders"),
    ]
    # The caller's span is entered before the traceparent is read, so the handler's span is its child.
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert recorded.spans[:2] == ["client atmo.tape.steps", f"server atmo.tape.steps {traceparent}"]
