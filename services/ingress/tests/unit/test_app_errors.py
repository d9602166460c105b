"""Errors ingress answers itself: the broker not answering, unknown OpenAI operations, runs that started over."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from atmosphere.bus import BusError, JetStreamLayout
from atmosphere.bus.runs import ANSWER_REWOUND_METADATA_KEY, RESUMED_METADATA_KEY
from atmosphere.bus.testing import FakeBus
from atmosphere.config import NatsSettings
from atmosphere.contracts.run.v1.run_pb2 import Metadata, RunEvent, RunSubmission, TextDelta
from atmosphere.ingress.api import create_app
from atmosphere.ingress.openai_api import AnswerChangedError, CompletionRun
from atmosphere.ingress.openai_wire import Completion
from atmosphere.ingress.settings import IngressSettings
from atmosphere.ingress.state import IngressState
from atmosphere.service import Health, ServiceRuntime


class SilentBroker(FakeBus):
    """Connected, but every key-value read fails as during a broker restart."""

    async def kv_items(self, bucket: str, message_type: Any) -> Any:
        msg = "listing bucket failed: nats: timeout"
        raise BusError(msg)


@pytest.fixture
async def client() -> TestClient:
    bus = SilentBroker()
    await bus.provision(JetStreamLayout())
    settings = IngressSettings(nats=NatsSettings(url="nats://127.0.0.1:1"), ai_openai_enabled=True)
    app = create_app(settings)
    # The lifespan would connect to NATS; the routes only need the state it builds.
    app.state.ingress = IngressState.build(
        settings, ServiceRuntime(bus=bus, health=Health("ingress", bus), probe_port=0)
    )
    return TestClient(app)


def test_an_http_route_answers_503_with_retry_after(client: TestClient) -> None:
    response = client.post("/atmosphere/agent/echo", content="hello")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"
    assert response.json()["code"] == "ingress.unavailable"


def test_the_openai_api_answers_503_in_its_own_shape(client: TestClient) -> None:
    response = client.get("/atmosphere/v1/models")
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "server_error"


def test_a_websocket_is_accepted_then_closed_with_4503(client: TestClient) -> None:
    with client.websocket_connect("/atmosphere/agent/echo") as ws, pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_text()
    assert closed.value.code == 4503
    assert "try again" in closed.value.reason


def test_an_unknown_operation_under_the_openai_prefix_is_openais_404(client: TestClient) -> None:
    response = client.post("/atmosphere/v1/embeddings", json={"input": "x"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


async def test_an_openai_completion_goes_on_across_its_runs_resumption() -> None:
    async def events() -> AsyncGenerator[RunEvent, None]:
        yield RunEvent(seq=2, text_delta=TextDelta(text="w0 w1 "))
        # The worker died; the run goes on elsewhere, without what was already sent.
        yield RunEvent(seq=3, metadata=Metadata(key=RESUMED_METADATA_KEY, value_json='{"fromSeq": 3}'))
        yield RunEvent(seq=4, text_delta=TextDelta(text="w2"))

    active = CompletionRun(
        None, RunSubmission(run_id="r1"), events(), Completion(model="m"), deadline=time.monotonic() + 10
    )  # type: ignore[arg-type]
    texts = []
    while (event := await active.next()) is not None:
        texts.append(event.text_delta.text)
    assert "".join(texts) == "w0 w1 w2"


def _rewound(discard: int) -> RunEvent:
    value = json.dumps({"discard": discard})
    return RunEvent(seq=4, metadata=Metadata(key=ANSWER_REWOUND_METADATA_KEY, value_json=value))


async def test_a_whole_openai_completion_takes_a_rewound_answer_back() -> None:
    async def events() -> AsyncGenerator[RunEvent, None]:
        yield RunEvent(seq=2, text_delta=TextDelta(text="Paris is the capit"))
        yield RunEvent(seq=3, metadata=Metadata(key=RESUMED_METADATA_KEY, value_json='{"fromSeq": 3}'))
        yield _rewound(len("is the capit"))  # the answer asked again came out differently
        yield RunEvent(seq=5, text_delta=TextDelta(text="has been the capital."))

    active = CompletionRun(
        None, RunSubmission(run_id="r1"), events(), Completion(model="m"), deadline=time.monotonic() + 10
    )  # type: ignore[arg-type]
    while (event := await active.next()) is not None:
        active.text.append(event.text_delta.text)
    assert "".join(active.text) == "Paris has been the capital."


async def test_a_streamed_openai_completion_whose_answer_changed_is_an_error_not_a_splice() -> None:
    async def events() -> AsyncGenerator[RunEvent, None]:
        yield RunEvent(seq=2, text_delta=TextDelta(text="Paris is"))
        yield _rewound(2)

    active = CompletionRun(
        None, RunSubmission(run_id="r1"), events(), Completion(model="m"), deadline=time.monotonic() + 10
    )  # type: ignore[arg-type]
    await active.next()
    active.streaming = True  # the first piece went to the client
    with pytest.raises(AnswerChangedError):
        await active.next()
