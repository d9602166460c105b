"""Dispatch's real composition root (`serve`) on the in-memory bus, its model behind `httpx.MockTransport`.

Nothing is mocked inside dispatch: the app is loaded by name, the runtime is discovered
through its entry point and resolved from `LLM_*`, runs are pulled from `ATMO_RUNS` and their
events written to `ATMO_EVENTS`. The only stand-ins are the other side of each seam: a
governance that admits everything (a responder on the bus) and a model provider that answers
OpenAI chat completions (a transport under the built-in runtime's HTTP client).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sys
import types
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.bus.errors import RuntimeUnavailableError, ServiceError
from atmosphere.bus.runs import follow_run, new_run
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.governance.v1.governance_pb2 import AdmitRequest, Decision
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.dispatch.app import NO_MODEL, serve
from atmosphere.dispatch.settings import DispatchOptions, DispatchSettings, LlmSettings
from atmosphere.sdk import App, agent
from atmosphere.testing import running_service, wait_until

APP_MODULE = "atmosphere_dispatch_wiring_app"
"""The module name the test app is loaded under (`ATMOSPHERE_APP=<this>:app`)."""
ANSWER = ["Hello", " from", " the model."]
RUN_DEADLINE = 10.0
"""A safety net against a hang, never an assertion: a run here ends in milliseconds."""


@agent(name="helper", description="Answers with the configured model.", harness=[])
class Helper:
    """Answers with the model, no harness (so no memory service is needed)."""


def completions(request: httpx.Request) -> httpx.Response:
    """An OpenAI-compatible provider: every chat completion streams `ANSWER`, then usage."""
    assert request.url.path == "/v1/chat/completions"
    chunks: list[dict[str, Any]] = [{"choices": [{"delta": {"content": piece}}]} for piece in ANSWER]
    chunks.append({"choices": [{"delta": {}, "finish_reason": "stop"}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())


def admit_everything() -> Router:
    """Governance's side of the admission seam: every run is allowed."""
    router = Router()

    async def admit(_request: AdmitRequest, _ctx: MessageContext) -> Decision:
        return Decision(allowed=True, policy="test")

    router.add(subjects.governance("admit"), AdmitRequest, admit)
    return router


@pytest.fixture(autouse=True)
def test_app(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType(APP_MODULE)
    module.app = App(agents=[Helper])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, APP_MODULE, module)


def dispatch_settings(base_url: str, **extra: Any) -> DispatchSettings:
    return DispatchSettings(
        **extra,
        app=f"{APP_MODULE}:app",
        probe_host="127.0.0.1",
        probe_port=0,
        dispatch=DispatchOptions(grpc_host="127.0.0.1", grpc_port=0, runtime="built-in"),
        llm=LlmSettings(base_url=base_url, model="wired-model"),
    )


@contextlib.asynccontextmanager
async def dispatch_on(bus: FakeBus, base_url: str, **extra: Any) -> AsyncIterator[asyncio.Task[None]]:
    """The real `serve()` as a task until it is ready; on exit `stop` is set and it must end cleanly."""
    run_dispatch = functools.partial(serve, bus=bus, transport=httpx.MockTransport(completions))
    async with (
        bus.serve(admit_everything()),
        running_service("dispatch", run_dispatch, dispatch_settings(base_url, **extra), bus=bus) as task,
    ):
        yield task
    assert task.done()
    assert task.exception() is None  # a clean exit once `stop` was set


async def service_info(bus: FakeBus) -> dict[str, Any]:
    """Dispatch's info, read over the bus as ingress reads it."""
    reply = await bus.request(subjects.service_info("dispatch"), ServiceInfoRequest(), ServiceInfoResponse)
    info: dict[str, Any] = json.loads(reply.info_json)
    return info


async def run_to_the_end(bus: FakeBus, message: str) -> list[RunEvent]:
    request = new_run(
        agent="helper", message=message, principal=Principal(user_id="u1"), conversation_id="c1", transport="test"
    )
    async with asyncio.timeout(RUN_DEADLINE):
        return [event async for event in follow_run(bus, request.run_id, submit=request)]


def kinds(events: list[RunEvent]) -> list[str]:
    return [event.WhichOneof("kind") or "" for event in events]


async def test_a_run_is_answered_by_the_model_behind_the_resolved_runtime() -> None:
    bus = FakeBus()
    async with dispatch_on(bus, "http://model.test/v1"):
        info = await service_info(bus)
        assert info["runtime"]["state"] == "ACTIVE"
        assert (info["runtime"]["name"], info["runtime"]["model"]) == ("built-in", "wired-model")
        assert info["agents"] == ["helper"]
        assert info["grpc"].startswith("127.0.0.1:")
        events = await run_to_the_end(bus, "Hi")
    assert "".join(e.text_delta.text for e in events if e.HasField("text_delta")) == "".join(ANSWER)
    assert kinds(events)[-1] == "complete"


@pytest.mark.parametrize(
    ("base_url", "why"),
    [("", NO_MODEL), ("localhost:8080/v1", "LLM_BASE_URL is not an http(s) URL")],
)
async def test_without_a_usable_provider_url_no_runtime_is_active_and_runs_say_so(base_url: str, why: str) -> None:
    bus = FakeBus()
    async with dispatch_on(bus, base_url):
        info = await service_info(bus)
        assert info["runtime"] == {"state": f"INACTIVE({why})", "name": None, "model": None, "capabilities": []}
        events = await run_to_the_end(bus, "Hi")
    assert kinds(events)[-1] == "error"
    assert isinstance(ServiceError.from_proto(events[-1].error), RuntimeUnavailableError)


@pytest.mark.parametrize(
    ("settings", "state"),
    [
        ({}, "INACTIVE(disabled)"),
        ({"durable_runs_enabled": True}, "ACTIVE(jetstream)"),
        ({"ai_harness_enabled": True}, "ACTIVE(jetstream)"),  # an explicit harness `true` implies it
        ({"ai_harness_enabled": True, "durable_runs_enabled": False}, "INACTIVE(disabled)"),  # explicit false wins
    ],
)
async def test_durable_runs_are_reported_only_when_the_journal_is_attached(
    settings: dict[str, Any], state: str
) -> None:
    bus = FakeBus()
    async with dispatch_on(bus, "http://model.test/v1", **settings):
        info = await service_info(bus)
        assert info["harness"]["durable-runs"] == state
        events = await run_to_the_end(bus, "Hi")

        async def journal_removed() -> bool:  # right after the terminal event, at the run's success
            return not bus.stream_messages(subjects.JOURNAL_STREAM)

        await wait_until(journal_removed, what="the succeeded run's journal to go")
    assert kinds(events)[-1] == "complete"
    journaled = any(subject == subjects.run_journal(events[0].run_id) for subject, _ in bus.published)
    assert journaled == state.startswith("ACTIVE")
