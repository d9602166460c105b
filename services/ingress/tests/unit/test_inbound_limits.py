"""Inbound messages bounded and total: sizes, close reasons, hostile JSON, and a WebSocket
connection that no single message can take down."""

from __future__ import annotations

import asyncio
import json

import pytest

from atmosphere.bus import JetStreamLayout
from atmosphere.bus.frames import Frame
from atmosphere.bus.sizes import ENVELOPE_ROOM
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress import connection as connection_module
from atmosphere.ingress.connection import Closed, Connection
from atmosphere.ingress.errors import MalformedRequestError as InboundError
from atmosphere.ingress.errors import RequestTooLargeError as TooLargeError
from atmosphere.ingress.inbound import (
    ApprovalReply,
    Prompt,
    close_reason,
    message_limit,
    new_run_request,
    parse_approval,
    parse_inbound,
    require_fits,
    require_message_size,
    send_approval,
)

PRINCIPAL = Principal(user_id="ada")


@pytest.mark.parametrize(
    "text",
    [
        "short reason",
        "x" * 123,
        "x" * 124,
        "x" * 500,
        "é" * 100,
        "😀" * 40,
        "a" + "😀" * 40,
        "Unknown agent '" + "a" * 200 + "'",
        "lone \ud800 surrogate",
    ],
)
def test_close_reasons_fit_the_protocol_and_stay_valid_utf8(text: str) -> None:
    reason = close_reason(text)
    encoded = reason.encode("utf-8")  # raises on a cut character or a surrogate
    assert len(encoded) <= 123
    if len(text.encode("utf-8", "replace")) <= 123:
        assert reason == text.encode("utf-8", "replace").decode()
    else:
        assert reason.endswith("...")


def test_message_limit_leaves_room_for_the_envelope_under_the_broker_limit() -> None:
    assert message_limit(1 << 20, 1 << 20) == (1 << 20) - ENVELOPE_ROOM
    assert message_limit(64 * 1024, 1 << 20) == 64 * 1024
    assert message_limit(8 << 20, 8 << 20) == (8 << 20) - ENVELOPE_ROOM


@pytest.mark.parametrize(
    ("raw", "too_large"),
    [("x" * 1024, False), ("x" * 1025, True), ("é" * 512, False), ("é" * 513, True), (b"x" * 1025, True)],
)
def test_message_size_counts_utf8_bytes(raw: str | bytes, too_large: bool) -> None:
    if too_large:
        with pytest.raises(TooLargeError):
            require_message_size(raw, 1024)
    else:
        require_message_size(raw, 1024)


def test_a_run_request_that_would_not_fit_the_broker_is_too_large() -> None:
    # Hints re-encoded as metadata can be larger than the message that carried them.
    prompt = Prompt(text="hi", metadata={"hints.a": json.dumps("é" * 20_000)})
    run = new_run_request(
        agent="echo", prompt=prompt, conversation_id="c", principal=PRINCIPAL, transport="websocket", path="/p", pool=""
    )
    require_fits(run, 1 << 20)
    with pytest.raises(TooLargeError) as refused:
        require_fits(run, 64 * 1024)
    assert (refused.value.status, refused.value.code) == (413, "ingress.too_large")


async def test_an_approval_too_large_for_the_broker_is_refused_before_sending() -> None:
    bus = FakeBus(max_payload=8 * 1024)
    reply = ApprovalReply("apr_000000000000", "respond", json.dumps("x" * 10_000))
    with pytest.raises(TooLargeError):
        await send_approval(bus, "run1", reply, principal=PRINCIPAL)


@pytest.mark.parametrize(
    "raw",
    [
        '{"prompt": "\\ud800"}',
        '{"prompt": "x", "hints": {"a": "\\udfff"}}',
        '{"prompt": "x", "hints": {"a": ' + "[" * 50_000 + "]" * 50_000 + "}}",
        '{"prompt": "x", "hints": {"n": ' + "1" * 5000 + "}}",
        '{"prompt": "x", "hints": {"n": NaN}}',
        '{"prompt": "x", "hints": {"n": 1e999}}',
        '{"prompt": "x", "hints": ' + json.dumps({f"h{i}": i for i in range(65)}) + "}",
        '{"prompt": "x", "hints": {"' + "h" * 129 + '": 1}}',
        '{"prompt": "x", "hints": {"": 1}}',
        '{"prompt": "x", "hints": "text"}',
        "lone \ud800 in plain text",
    ],
)
def test_hostile_json_prompts_are_inbound_errors(raw: str) -> None:
    with pytest.raises(InboundError):
        parse_inbound(raw)


@pytest.mark.parametrize("raw", ["{" * 100_000, "[" * 100_000, '{"prompt": "unterminated'])
def test_text_that_is_not_json_stays_a_plain_prompt(raw: str) -> None:
    assert parse_inbound(raw) == Prompt(text=raw)


@pytest.mark.parametrize(
    ("raw", "action"),
    [
        ("/__approval/apr_1/approve " + "[" * 50_000 + "]" * 50_000, "deny"),
        ('/__approval/apr_1/approve {"a": "\\ud800"}', "deny"),
        ('/__approval/apr_1/approve {"a": ' + "7" * 5000 + "}", "deny"),
        ('/__approval/apr_1/respond {"a": "\\ud800"}', "deny"),
        ('/__approval/apr_1/respond {"a": 1}', "respond"),
        ("/__approval/apr_1/approve", "approve"),
    ],
)
def test_unusable_approval_payloads_deny(raw: str, action: str) -> None:
    assert parse_approval(raw).action == action


@pytest.mark.parametrize("raw", ["approve it", "/__approval/apr_" + "f" * 300 + "/approve", "x" * 12 + "apr_1/yes"])
def test_what_is_not_an_approval_reply_is_refused(raw: str) -> None:
    with pytest.raises(InboundError):
        parse_approval(raw)


async def serve(messages: list[str], *, bus: FakeBus, max_message_bytes: int = 1024) -> list[Frame]:
    """The frames a connection sends for `messages`, then a clean close."""
    connection = Connection(
        bus=bus,
        agent=AgentDescriptor(name="echo", path="/atmosphere/agent/echo"),
        conversation_id="c1",
        principal=PRINCIPAL,
        transport="websocket",
        max_prompts=4,
        send_queue_frames=64,
        max_message_bytes=max_message_bytes,
    )
    sent: list[Frame] = []
    pending = list(messages)

    async def receive() -> str | Closed:
        if pending:
            return pending.pop(0)
        await asyncio.sleep(0.05)  # let the writer flush what was queued
        return Closed(1006)

    async def send(frame: Frame) -> None:
        sent.append(frame)

    async def close(_code: int, _reason: str) -> None:
        return None

    await connection.serve(receive, send, close)
    return sent


async def test_every_bad_message_is_answered_and_the_connection_carries_on() -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    frames = await serve(["x" * 1025, '{"prompt": "\\ud800"}', "", "/__approval/apr_ffffffffffff/approve"], bus=bus)
    assert [(f["type"], f["code"]) for f in frames] == [
        ("error", "ingress.too_large"),
        ("error", "ingress.bad_request"),
        ("error", "ingress.bad_request"),
        ("error", "ingress.unknown_approval"),
    ]


async def test_an_unexpected_failure_in_one_message_is_an_error_frame_not_a_dropped_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    calls = 0

    def broken(raw: str) -> Prompt | ApprovalReply:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        raise InboundError("Empty prompt")

    monkeypatch.setattr(connection_module, "parse_inbound", broken)
    frames = await serve(["first", "second"], bus=bus)
    assert [(f["type"], f["code"]) for f in frames] == [
        ("error", "ingress.internal"),
        ("error", "ingress.bad_request"),
    ]


async def test_a_prompt_too_large_for_the_broker_is_refused_with_a_frame() -> None:
    bus = FakeBus(max_payload=8 * 1024)
    await bus.provision(JetStreamLayout())
    hints = json.dumps({"a": "é" * 900})  # ~2 KB as sent, ~5.4 KB once re-encoded
    frames = await serve(['{"prompt": "hi", "hints": ' + hints + "}"], bus=bus, max_message_bytes=4096)
    assert [(f["type"], f["code"]) for f in frames] == [("error", "ingress.too_large")]
