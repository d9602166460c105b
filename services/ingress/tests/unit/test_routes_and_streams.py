"""Unknown paths, /docs without a CDN, polls and resumes at a run's end, keep-alives and the drain."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.frames import Frame
from atmosphere.bus.testing import FakeBus
from atmosphere.config import NatsSettings
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import Complete, Metadata, RunEvent, TextDelta
from atmosphere.ingress.agent_sse import _sse_response
from atmosphere.ingress.api import create_app
from atmosphere.ingress.connection import SERVICE_RESTART_CODE, Closed, Connection
from atmosphere.ingress.errors import OpenAiError, OpenAiUnavailableError
from atmosphere.ingress.openai_api import ClientGoneError, DrainingError, answer_unless_gone, failure_of
from atmosphere.ingress.openai_wire import parse_chat_request
from atmosphere.ingress.pacing import KEEP_ALIVE_COMMENT, Drain, PacedResponse, Pause, paced
from atmosphere.ingress.settings import IngressOptions, IngressSettings
from atmosphere.ingress.state import IngressState
from atmosphere.service import Health, ServiceRuntime, StreamSlots

ECHO = AgentDescriptor(name="echo", path="/atmosphere/agent/echo")
SHOUT = AgentDescriptor(name="shout", path="/shout")  # an `@ai_endpoint` path
RUN = "run-finished"


def finished_run() -> list[RunEvent]:
    common: dict[str, Any] = {"run_id": RUN, "agent": "echo", "session_id": "s1"}
    return [
        RunEvent(seq=1, metadata=Metadata(key="X-Atmosphere-Run-Id", value_json=f'"{RUN}"'), **common),
        RunEvent(seq=2, text_delta=TextDelta(text="hello"), **common),
        RunEvent(seq=3, complete=Complete(summary="hello"), **common),
    ]


@pytest.fixture
async def bus() -> FakeBus:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    for descriptor in (ECHO, SHOUT):
        await bus.kv_put(subjects.AGENTS_BUCKET, descriptor.name, descriptor)
    for event in finished_run():
        await bus.js_publish(subjects.run_events(RUN), event)
    return bus


@pytest.fixture
def client(bus: FakeBus) -> TestClient:
    settings = IngressSettings(nats=NatsSettings(url="nats://127.0.0.1:1"), ai_openai_enabled=True)
    app = create_app(settings)
    # The lifespan would connect to NATS; the routes only need the state it builds.
    app.state.ingress = IngressState.build(
        settings, ServiceRuntime(bus=bus, health=Health("ingress", bus), probe_port=0)
    )
    return TestClient(app)


# -- 404 for unknown paths, 405 only where a route serves the path -------------------------------


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT"])
def test_an_unknown_path_is_a_json_404_whatever_the_method(client: TestClient, method: str) -> None:
    response = client.request(method, "/no/such/thing")
    assert response.status_code == 404
    assert response.json() == {"error": "Not Found", "code": "ingress.not_found"}


def test_a_known_path_with_another_method_is_a_405_naming_the_allowed_ones(client: TestClient) -> None:
    cancel = client.get(f"/atmosphere/runs/{RUN}/cancel")
    assert (cancel.status_code, cancel.headers["allow"]) == (405, "POST")
    assert cancel.json()["code"] == "ingress.method_not_allowed"
    health = client.delete("/healthz")
    assert (health.status_code, health.headers["allow"]) == (405, "GET")


def test_an_ai_endpoint_path_is_posted_to(client: TestClient) -> None:
    response = client.get("/shout")
    assert (response.status_code, response.headers["allow"]) == (405, "POST")


def test_an_unknown_openai_operation_is_openais_404_for_a_get_too(client: TestClient) -> None:
    response = client.get("/atmosphere/v1/files")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


# -- /docs without a CDN -------------------------------------------------------------------------


def test_docs_reference_no_external_url_and_their_assets_load(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    assert "://" not in page.text  # nothing from elsewhere: no CDN, no online validator
    referenced = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(referenced) == [
        "/docs/assets/favicon-32x32.png",
        "/docs/assets/swagger-ui-bundle.js",
        "/docs/assets/swagger-ui.css",
    ]
    for url in referenced:
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert asset.content, url
    assert "SwaggerUIBundle" in client.get("/docs/assets/swagger-ui-bundle.js").text
    assert client.get("/openapi.json").json()["info"]["title"] == "Atmosphere ingress"
    assert client.get("/docs/oauth2-redirect").status_code == 200
    # Only the named files: the bundle's directory (with its sample page) is not served.
    assert client.get("/docs/assets/index.html").status_code == 404
    assert client.get("/redoc").status_code == 404  # ReDoc would need a CDN


# -- the end of a run ----------------------------------------------------------------------------


def test_a_long_poll_at_the_terminal_seq_is_done_at_once(client: TestClient) -> None:
    at_end = client.get(f"/atmosphere/runs/{RUN}/poll", params={"after": 3, "wait": 5}).json()
    assert at_end == {"frames": [], "done": True, "after": 3}
    past_end = client.get(f"/atmosphere/runs/{RUN}/poll", params={"after": 40, "wait": 5}).json()
    assert past_end == {"frames": [], "done": True, "after": 40}
    before_end = client.get(f"/atmosphere/runs/{RUN}/poll", params={"after": 2, "wait": 5}).json()
    assert [f["type"] for f in before_end["frames"]] == ["complete"]
    assert (before_end["done"], before_end["after"]) == (True, 3)


async def test_a_long_poll_that_does_not_wait_answers_what_is_stored(bus: FakeBus) -> None:
    """`wait=0` is "do not wait for new frames", never "answer nothing": stored frames come at once."""
    live = "run-live"
    common: dict[str, Any] = {"run_id": live, "agent": "echo", "session_id": "s2"}
    for event in (
        RunEvent(seq=1, metadata=Metadata(key="X-Atmosphere-Run-Id", value_json=f'"{live}"'), **common),
        RunEvent(seq=2, text_delta=TextDelta(text="so far"), **common),
    ):
        await bus.js_publish(subjects.run_events(live), event)
    settings = IngressSettings(nats=NatsSettings(url="nats://127.0.0.1:1"))
    app = create_app(settings)
    app.state.ingress = IngressState.build(
        settings, ServiceRuntime(bus=bus, health=Health("ingress", bus), probe_port=0)
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ingress") as http:

        async def poll(run_id: str, after: int) -> dict[str, Any]:
            answer: dict[str, Any] = (
                await http.get(f"/atmosphere/runs/{run_id}/poll", params={"after": after, "wait": 0})
            ).json()
            return answer

        finished, at_end = await poll(RUN, 0), await poll(RUN, 3)
        going, nothing_new = await poll(live, 0), await poll(live, 2)
    assert [f["type"] for f in finished["frames"]] == ["metadata", "streaming-text", "complete"]
    assert (finished["done"], finished["after"]) == (True, 3)
    assert at_end == {"frames": [], "done": True, "after": 3}
    assert [f["seq"] for f in going["frames"]] == [1, 2]
    assert (going["done"], going["after"]) == (False, 2)
    assert nothing_new == {"frames": [], "done": False, "after": 2}


async def socket_frames(bus: FakeBus, resume: tuple[str, int]) -> list[Frame]:
    """The frames a WebSocket resuming `resume` gets before its client leaves (at the first frame)."""
    connection = Connection(
        bus=bus,
        agent=ECHO,
        conversation_id="c1",
        principal=Principal(),
        transport="websocket",
        max_prompts=4,
        send_queue_frames=16,
    )
    sent: list[Frame] = []
    got_frame = asyncio.Event()

    async def send(frame: Frame) -> None:
        sent.append(frame)
        got_frame.set()

    async def receive() -> str | Closed:
        await asyncio.wait_for(got_frame.wait(), 10)  # a silent socket fails here
        return Closed(1006)

    async def close(_code: int, _reason: str) -> None:
        return None

    await connection.serve(receive, send, close, resume=resume)
    return sent


@pytest.mark.parametrize("last_seq", [3, 99])
async def test_a_websocket_resume_at_or_past_the_end_gets_the_terminal_frame(bus: FakeBus, last_seq: int) -> None:
    frames = await socket_frames(bus, (RUN, last_seq))
    assert [(f["type"], f["seq"], f["runId"]) for f in frames] == [("complete", 3, RUN)]


# -- keep-alives and the drain -------------------------------------------------------------------


async def quiet_after(*items: RunEvent, closed: asyncio.Event) -> AsyncGenerator[RunEvent, None]:
    """`items`, then nothing (a run waiting on a tool or an approval) until closed."""
    try:
        for item in items:
            yield item
        await asyncio.Event().wait()
    finally:
        closed.set()


async def test_a_quiet_pulled_stream_ends_at_once_when_ingress_drains() -> None:
    closed = asyncio.Event()
    drain = Drain()
    stream = paced(quiet_after(*finished_run()[:2], closed=closed), draining=drain.event)
    seen: list[object] = [await anext(stream), await anext(stream)]
    drain.start()
    seen += [item async for item in stream]
    assert [getattr(item, "seq", item) for item in seen] == [1, 2, Pause.DRAINING]
    assert closed.is_set()  # the source (the run's follower) is closed with the stream


async def test_a_failing_source_fails_the_paced_stream() -> None:
    async def broken() -> AsyncIterator[RunEvent]:
        yield finished_run()[0]
        raise OpenAiUnavailableError("gone")

    stream = paced(broken(), draining=asyncio.Event())
    assert (await anext(stream)).seq == 1  # type: ignore[union-attr]
    with pytest.raises(OpenAiError):
        await anext(stream)


async def sse_body(
    response: PacedResponse, *, until: Callable[[list[bytes]], bool], then: Callable[[], None]
) -> list[bytes]:
    """The body chunks `response` sends; `then()` runs once the chunks so far satisfy `until`."""
    chunks: list[bytes] = []
    reached = asyncio.Event()

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body" and message["body"]:
            chunks.append(message["body"])
            if until(chunks):
                reached.set()

    streaming = asyncio.ensure_future(response.stream_response(send))
    await asyncio.wait_for(reached.wait(), 10)
    then()
    await asyncio.wait_for(streaming, 10)
    return chunks


async def test_an_sse_stream_keeps_alive_then_names_the_run_to_resume_when_ingress_drains() -> None:
    closed = asyncio.Event()
    drain = Drain()
    state: Any = SimpleNamespace(settings=IngressSettings(ingress=IngressOptions(sse_keep_alive=0.02)), drain=drain)
    slot = StreamSlots(per_client=1, total=1).claim("client")
    response = _sse_response(state, RUN, quiet_after(*finished_run()[:2], closed=closed), slot=slot, headers={})
    chunks = await sse_body(response, until=lambda got: got.count(KEEP_ALIVE_COMMENT) >= 2, then=drain.start)
    first, second, *between, last = chunks
    assert first.startswith(b"id: 1\n")
    assert second.startswith(b"id: 2\n")
    assert set(between) == {KEEP_ALIVE_COMMENT}  # only comments while the run is quiet
    assert not last.startswith(b"id:")  # Last-Event-ID stays the last frame really sent
    assert b'"code":"ingress.draining"' in last
    assert f'"runId":"{RUN}","lastSeq":2,"resume":"/atmosphere/runs/{RUN}/events"'.encode() in last
    assert closed.is_set()  # the run's follower is closed with the stream


async def test_a_busy_sse_stream_sends_no_keep_alive_and_ends_with_its_source() -> None:
    async def busy() -> AsyncIterator[RunEvent]:
        for event in finished_run():
            await asyncio.sleep(0.01)  # events closer together than the keep-alive interval
            yield event

    state: Any = SimpleNamespace(settings=IngressSettings(ingress=IngressOptions(sse_keep_alive=0.5)), drain=Drain())
    response = _sse_response(state, RUN, busy(), slot=StreamSlots(per_client=1, total=1).claim("client"), headers={})
    sent: list[bytes] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body" and message["body"]:
            sent.append(message["body"])

    await asyncio.wait_for(response.stream_response(send), 10)
    assert KEEP_ALIVE_COMMENT not in sent
    assert [chunk.split(b"\n", 1)[0] for chunk in sent] == [f"id: {e.seq}".encode() for e in finished_run()]


async def test_a_draining_socket_closes_with_1012_naming_its_unfinished_runs(bus: FakeBus) -> None:
    connection = Connection(
        bus=bus,
        agent=ECHO,
        conversation_id="c1",
        principal=Principal(),
        transport="websocket",
        max_prompts=4,
        send_queue_frames=16,
    )
    drain = Drain()
    closes: list[tuple[int, str]] = []
    closing = asyncio.Event()

    async def close(code: int, reason: str) -> None:
        closes.append((code, reason))
        closing.set()

    async def receive() -> str | Closed:
        if not connection.runs:
            return "hello"  # starts a run that FakeBus never finishes
        await asyncio.wait_for(closing.wait(), 10)
        drain.start()  # harmless twice
        return Closed(SERVICE_RESTART_CODE)

    async def send(_frame: Frame) -> None:
        if not drain.draining:
            drain.start()

    with drain.tracking(connection):
        await connection.serve(receive, send, close)
    [run_id] = connection.runs
    assert closes == [(SERVICE_RESTART_CODE, f"Server restarting; resume with X-Atmosphere-Run-Id: {run_id}")]


# -- the OpenAI usage chunk ----------------------------------------------------------------------


def test_include_usage_is_read_from_stream_options() -> None:
    def parsed(**extra: Any) -> bool:
        body = {"messages": [{"role": "user", "content": "hi"}], **extra}
        return parse_chat_request(json.dumps(body).encode()).include_usage

    assert parsed(stream=True) is False
    assert parsed(stream=True, stream_options={"include_usage": False}) is False
    assert parsed(stream=True, stream_options={"include_usage": True}) is True
    assert parsed(stream=False, stream_options={"include_usage": True}) is False  # nothing is streamed
    for bad in ({"include_usage": "yes"}, "include_usage"):
        with pytest.raises(OpenAiError) as refused:
            parsed(stream=True, stream_options=bad)
        assert refused.value.status == 400


async def test_a_completion_still_waiting_for_its_first_text_when_ingress_drains_is_a_retryable_503() -> None:
    drain = Drain()
    stopped = asyncio.Event()

    async def never_answers() -> Any:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    waiting = asyncio.create_task(answer_unless_gone(drain, a_request(), never_answers()))
    await asyncio.sleep(0)
    drain.start()
    with pytest.raises(DrainingError) as drained:
        await waiting
    assert stopped.is_set()
    failure = failure_of(drained.value)
    assert failure.status == 503
    assert "Retry-After" in failure.headers()


def a_request(gone: asyncio.Event | None = None) -> Request:
    """A request whose body was read: its `receive` answers only when the client hangs up."""

    async def receive() -> dict[str, Any]:
        await (gone or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


async def test_a_completion_whose_client_leaves_before_the_first_byte_stops_at_once() -> None:
    gone = asyncio.Event()
    stopped = asyncio.Event()

    async def never_answers() -> Any:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    waiting = asyncio.create_task(answer_unless_gone(Drain(), a_request(gone), never_answers()))
    await asyncio.sleep(0)
    gone.set()
    with pytest.raises(ClientGoneError):
        await waiting
    assert stopped.is_set()
