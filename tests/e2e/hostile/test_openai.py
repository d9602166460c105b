"""Hostile input against the OpenAI-compatible endpoint (`/atmosphere/v1`).

Every case sends what a hostile (or merely broken) OpenAI client could send and asserts a clear
answer in OpenAI's error shape (`{"error": {"message", "type", "param", "code"}}`) with the right
4xx status; then that the stack is still ready and completes a normal completion and a normal
WebSocket run. A few cases drive a misbehaving model provider through the official `openai`
client: its 400 stays a 400 (and is not retried), an empty answer is an error, a cut-off answer
says why.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from atmosphere.testing import Turn
from tests.e2e.hostile.conftest import HostileStack, hostile_stack

COMPLETIONS = "/atmosphere/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
DEEP = 30_000
"""Nesting deep enough to exhaust a recursive parser, small enough to stay under the message limit."""


@pytest.fixture(scope="module")
def hostile(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileStack]:
    """The hostile stack with the OpenAI endpoint on (no key of its own: the token grants apply)."""
    data = tmp_path_factory.mktemp("hostile-openai") / "data"
    with hostile_stack(nats_url, data, ingress_settings={"ai_openai_enabled": True}) as running:
        yield running


def body(value: Any, **extra: Any) -> bytes:
    return json.dumps({"model": "echo", "messages": USER, **extra} if value is None else value).encode()


@dataclass(frozen=True)
class Case:
    """One hostile request and the answer it must get."""

    name: str
    content: bytes = b""
    status: int = 400
    code: str | None = None
    """The OpenAI `code` expected; None: any (the message says what was wrong)."""
    param: str | None = None
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})
    method: str = "POST"
    path: str = COMPLETIONS
    token: str = "user"
    """`user` (every agent), `other` (only the echo agent) or `none`."""
    chunked: bool = False


def fn(name: str) -> dict[str, Any]:
    """A client function (Chat Completions' `tools` entry)."""
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def nested(depth: int) -> bytes:
    return b'{"model": "echo", "messages": ' + b"[" * depth + b"]" * depth + b"}"


def too_large(limit: int) -> bytes:
    return body(None, padding="x" * (limit + 1024))


CASES = [
    # -- bodies that are not JSON a server can use ---------------------------------------------
    Case("empty-body", b""),
    Case("not-json", b"{nope"),
    Case("json-array", b"[1, 2]"),
    Case("json-string", b'"hello"'),
    Case("json-null", b"null"),
    Case("utf8-bom", b"\xef\xbb\xbf" + body(None)),
    Case("invalid-utf8", b'{"model": "echo", "messages": [{"role": "user", "content": "\xff\xfe"}]}'),
    Case("deep-arrays", nested(DEEP)),
    Case("deep-objects", b'{"model": "echo", "messages": ' + b'{"a":' * 10_000 + b"1" + b"}" * 10_000 + b"}"),
    Case("huge-integer", body(None).replace(b'"hi"}]', b'"hi"}], "max_tokens": ' + b"9" * 5000)),
    Case("huge-float", body(None).replace(b'"hi"}]', b'"hi"}], "temperature": 1e999')),
    Case("nan", body(None).replace(b'"hi"}]', b'"hi"}], "temperature": NaN')),
    Case("infinity", body(None).replace(b'"hi"}]', b'"hi"}], "top_p": -Infinity')),
    Case("lone-surrogate-content", b'{"model": "echo", "messages": [{"role": "user", "content": "a \\ud800 b"}]}'),
    Case("lone-surrogate-model", b'{"model": "\\udfff", "messages": [{"role": "user", "content": "hi"}]}'),
    Case("lone-surrogate-key", b'{"model": "echo", "messages": [{"role": "user", "content": "hi", "\\ud83d": 1}]}'),
    Case(
        "lone-surrogate-user", b'{"model": "echo", "user": "\\ud800", "messages": [{"role": "user", "content": "x"}]}'
    ),
    # -- sizes ------------------------------------------------------------------------------------
    Case("over-the-limit", b"", status=413, code="payload_too_large"),
    Case("over-the-limit-chunked", b"", status=413, code="payload_too_large", chunked=True),
    Case("oversized-model", body(None, model="m" * 300), param="model"),
    Case("oversized-user", body(None, user="u" * 300), param="user"),
    Case("too-many-messages", body({"model": "echo", "messages": USER * 1025}), param="messages"),
    # -- wrong types and shapes -------------------------------------------------------------------
    Case("model-number", body(None, model=42), param="model"),
    Case("user-object", body(None, user={"id": 1}), param="user"),
    Case("stream-string", body(None, stream="yes"), param="stream"),
    Case("temperature-string", body(None, temperature="hot"), param="temperature"),
    Case("max-tokens-float", body(None, max_tokens=1.5), param="max_tokens"),
    Case("stop-number", body(None, stop=5), param="stop"),
    Case("n-string", body(None, n="2"), param="n"),
    Case("no-messages", body({"model": "echo"}), param="messages"),
    Case("empty-messages", body({"model": "echo", "messages": []}), param="messages"),
    Case("messages-object", body({"model": "echo", "messages": {"role": "user", "content": "hi"}}), param="messages"),
    Case("message-string", body({"model": "echo", "messages": ["hi"]}), param="messages"),
    Case("role-number", body({"model": "echo", "messages": [{"role": 7, "content": "hi"}]}), param="messages"),
    Case("role-unknown", body({"model": "echo", "messages": [{"role": "wizard", "content": "hi"}]}), param="messages"),
    Case("content-number", body({"model": "echo", "messages": [{"role": "user", "content": 5}]}), param="messages"),
    Case(
        "content-image",
        body({"model": "echo", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
        code="unsupported_parameter",
        param="messages",
    ),
    Case(
        "last-not-user",
        body({"model": "echo", "messages": [{"role": "assistant", "content": "hi"}]}),
        param="messages",
    ),
    Case(
        "blank-last-message",
        body({"model": "echo", "messages": [{"role": "user", "content": "   "}]}),
        param="messages",
    ),
    Case("tool-without-function", body(None, tools=[{"type": "function"}]), param="tools"),
    Case(
        "tool-of-another-type", body(None, tools=[{"type": "web_search"}]), code="unsupported_parameter", param="tools"
    ),
    Case("tools-too-many", body(None, tools=[fn(f"f{i}") for i in range(129)]), param="tools"),
    Case("tool-named-a-path", body(None, tools=[fn("../../etc/passwd")]), param="tools"),
    Case("tool-choice-without-tools", body(None, tool_choice="required"), param="tool_choice"),
    Case(
        "tool-result-answering-nothing",
        body(None, messages=[*USER, {"role": "tool", "tool_call_id": "call_never_made", "content": "x"}]),
        param="messages",
    ),
    Case(
        "functions-deprecated", body(None, functions=[{"name": "f"}]), code="unsupported_parameter", param="functions"
    ),
    Case("n-three", body(None, n=3), code="unsupported_parameter", param="n"),
    Case("json-mode-unknown", body(None, response_format={"type": "xml"}), param="response_format"),
    # -- headers, methods, credentials, models ----------------------------------------------------
    Case("text-plain", body(None), status=415, code="unsupported_media_type", headers={"content-type": "text/plain"}),
    Case("no-content-type", body(None), status=415, code="unsupported_media_type", headers={}),
    Case("no-credentials", body(None), status=401, code="invalid_api_key", token="none"),
    Case("wrong-credentials", body(None), status=401, code="invalid_api_key", token="wrong"),
    Case("model-outside-grant", body(None, model="assistant"), status=403, code="permission_denied", token="other"),
    Case("unknown-model", body(None, model="gpt-4o"), status=404, code="model_not_found", param="model"),
    Case("control-chars-model", body(None, model="e\x00c\nho"), status=404, code="model_not_found", param="model"),
    Case("get-completions", b"", status=405, code="method_not_allowed", method="GET"),
    # An unknown path is a 404 whatever the method; a 405 only where a route serves the path.
    Case("unknown-route", b"", status=404, code="not_found", method="GET", path="/atmosphere/v1/engines"),
    Case("delete-models", b"", status=405, code="method_not_allowed", method="DELETE", path="/atmosphere/v1/models"),
]


def credentials(hostile: HostileStack, case: Case) -> dict[str, str]:
    token = {"user": hostile.token, "other": hostile.other_token, "wrong": "not-a-token"}.get(case.token)
    return {"Authorization": f"Bearer {token}"} if token else {}


async def chunks(payload: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(payload), 8192):
        yield payload[start : start + 8192]


async def send(hostile: HostileStack, case: Case) -> httpx.Response:
    headers = {**case.headers, **credentials(hostile, case)}
    content: Any = case.content
    if case.code == "payload_too_large":
        content = too_large(hostile.message_limit)
        if case.chunked:
            content = chunks(content)
    async with httpx.AsyncClient(base_url=hostile.url, timeout=20) as http:
        return await http.request(case.method, case.path, content=content, headers=headers)


async def assert_completes_normally(hostile: HostileStack) -> None:
    async with httpx.AsyncClient(base_url=hostile.url, timeout=20, headers=hostile.headers) as http:
        answer = await http.post(COMPLETIONS, json={"model": "echo", "messages": [{"role": "user", "content": "ok?"}]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "ok?"
    await hostile.assert_still_serving()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_hostile_requests_get_an_openai_error(hostile: HostileStack, case: Case) -> None:
    answer = await send(hostile, case)
    assert answer.status_code == case.status, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert error["message"].strip()
    assert isinstance(error["type"], str)
    if case.code is not None:
        assert error["code"] == case.code
    if case.param is not None:
        assert error["param"] == case.param
    await assert_completes_normally(hostile)


async def openai_client(hostile: HostileStack) -> openai.AsyncOpenAI:
    # The default retry budget: whatever the endpoint lets it retry, it would.
    return openai.AsyncOpenAI(base_url=f"{hostile.url}/atmosphere/v1", api_key=hostile.token)


async def test_a_provider_400_reaches_the_official_client_once(hostile: HostileStack) -> None:
    hostile.script(Turn.error("Unknown parameter", status=400, code="unknown_parameter", param="foo"))
    before = len(hostile.provider.requests)
    client = await openai_client(hostile)
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model="assistant", messages=USER)  # type: ignore[arg-type]
    await client.close()
    assert (raised.value.code, raised.value.param) == ("unknown_parameter", "foo")
    assert len(hostile.provider.requests) == before + 1
    await assert_completes_normally(hostile)


async def test_an_empty_provider_answer_is_an_error_not_a_success(hostile: HostileStack) -> None:
    hostile.script(Turn.empty())
    before = len(hostile.provider.requests)
    client = await openai_client(hostile)
    with pytest.raises(openai.APIStatusError) as raised:
        await client.chat.completions.create(model="assistant", messages=USER)  # type: ignore[arg-type]
    await client.close()
    assert raised.value.status_code == 502
    assert len(hostile.provider.requests) == before + 1  # `x-should-retry: false` was heard
    await assert_completes_normally(hostile)


async def test_a_filtered_answer_is_reported_as_filtered(hostile: HostileStack) -> None:
    hostile.script(Turn.text("I was about to", finish_reason="content_filter"))
    client = await openai_client(hostile)
    answer = await client.chat.completions.create(model="assistant", messages=USER)  # type: ignore[arg-type]
    await client.close()
    assert answer.choices[0].finish_reason == "content_filter"
    assert answer.choices[0].message.content == "I was about to"
    await assert_completes_normally(hostile)
