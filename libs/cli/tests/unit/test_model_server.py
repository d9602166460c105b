"""The local model server answers like a well-behaved provider (llama.cpp replaced by a stub)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from atmosphere.cli import model_server
from atmosphere.cli.model_server import ModelServer

Message = dict[str, Any]


class StubLlama:
    """Counts a token per word; a message containing `overflow` makes llama.cpp itself refuse."""

    def n_ctx(self) -> int:
        return 64

    def tokenize(self, text: bytes, add_bos: bool = True) -> list[int]:
        return [0] * len(text.split())

    def create_chat_completion(self, messages: list[dict[str, str]], **_: Any) -> dict[str, Any]:
        if any("overflow" in m["content"] for m in messages):
            raise ValueError("Requested tokens (80) exceed context window of 64")
        if any("explode" in m["content"] for m in messages):
            raise RuntimeError("llama_decode returned -3")
        return {
            "choices": [{"message": {"role": "assistant", "content": "Hello there"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> ModelServer:
    monkeypatch.setattr(model_server._TextFollower, "processors", lambda self: None)
    monkeypatch.setattr(model_server, "KEEPALIVE_SECONDS", 0.01)
    instance = object.__new__(ModelServer)
    instance.alias = "stub"
    instance._llama = StubLlama()
    instance._lock = asyncio.Lock()
    return instance


async def call(server: ModelServer, raw: bytes, on_send: Callable[[Message], None] = lambda _: None) -> list[Message]:
    """One request straight through the ASGI interface; every message the server sent."""
    sent: list[Message] = []
    finished = asyncio.Event()
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        on_send(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            finished.set()

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
    await server(scope, receive, send)
    return sent


def status(sent: list[Message]) -> int:
    return int(sent[0]["status"])


def body(sent: list[Message]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def request(content: str, *, stream: bool = True) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], "stream": stream}).encode()


@pytest.mark.parametrize("stream", [True, False])
async def test_a_prompt_longer_than_the_context_is_a_400(server: ModelServer, stream: bool) -> None:
    sent = await call(server, request("word " * 100, stream=stream))
    assert status(sent) == 400
    error = json.loads(body(sent))["error"]
    assert (error["code"], error["type"], error["param"]) == (
        "context_length_exceeded",
        "invalid_request_error",
        "messages",
    )


async def test_llama_refusing_mid_stream_is_an_error_event_not_a_broken_stream(server: ModelServer) -> None:
    sent = await call(server, request("please overflow"))
    assert status(sent) == 200
    events = [line.removeprefix(b"data: ") for line in body(sent).split(b"\n\n") if line.startswith(b"data: ")]
    error = json.loads(events[-1])["error"]
    assert error["code"] == "context_length_exceeded"
    assert sent[-1]["more_body"] is False  # the stream ended properly


async def test_a_non_streamed_llama_failure_is_a_json_error(server: ModelServer) -> None:
    sent = await call(server, request("please overflow", stream=False))
    assert status(sent) == 400
    sent = await call(server, request("explode", stream=False))
    assert status(sent) == 500
    assert json.loads(body(sent))["error"]["message"] == "generation failed (RuntimeError)"


async def test_the_finish_reason_is_passed_on(server: ModelServer) -> None:
    sent = await call(server, request("hi"))
    chunks = [json.loads(line[6:]) for line in body(sent).split(b"\n\n") if line.startswith(b"data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert body(sent).endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}',
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 5000 + b"}",
        b"\xff\xfe",
        b"[1]",
        b'{"messages": "hi"}',
        b'{"messages": [{"content": "hi"}]}',
        b'{"messages": [{"role": "user", "content": "hi"}], "stop": 5}',
    ],
    ids=["deep", "nan", "inf", "digits", "utf8", "array", "messages-string", "no-role", "stop-number"],
)
async def test_malformed_requests_are_a_400(server: ModelServer, raw: bytes) -> None:
    sent = await call(server, raw)
    assert status(sent) == 400
    assert json.loads(body(sent))["error"]["type"] == "invalid_request_error"


async def test_lone_surrogates_are_replaced_not_fatal(server: ModelServer) -> None:
    sent = await call(server, b'{"messages": [{"role": "user", "content": "hi \\ud800"}], "stream": true}')
    assert status(sent) == 200


async def test_a_queued_stream_gets_its_headers_and_keep_alives_at_once(server: ModelServer) -> None:
    queued = asyncio.Event()

    def watch(message: Message) -> None:
        if message.get("body") == b": queued\n\n":
            queued.set()

    await server._lock.acquire()  # another request holds the model
    pending = asyncio.create_task(call(server, request("hi"), watch))
    await queued.wait()
    server._lock.release()
    sent = await pending
    assert status(sent) == 200
    assert b"Hello there" in body(sent)
    assert not server._lock.locked()
