"""Bounded body reading and total JSON parsing (`atmosphere.ingress.bodies`)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from atmosphere.ingress.bodies import (
    BodyError,
    BodyTooLargeError,
    MalformedJsonError,
    UnusableJsonError,
    parse_json,
    read_body,
    read_text,
)


def request_with(
    chunks: list[bytes], *, length: int | None = None, disconnect: bool = False
) -> tuple[Request, list[int]]:
    """A request whose body arrives in `chunks`; the list counts how many were received."""
    received: list[int] = []
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    pending = list(chunks)

    async def receive() -> dict[str, Any]:
        received.append(1)
        if not pending:
            return {"type": "http.disconnect"} if disconnect else {"type": "http.request", "body": b""}
        chunk = pending.pop(0)
        more = bool(pending) or disconnect
        return {"type": "http.request", "body": chunk, "more_body": more}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "query_string": b""}
    return Request(scope, receive), received


async def test_a_body_within_the_limit_is_read_whole() -> None:
    request, _ = request_with([b"abc", b"def"], length=6)
    assert await read_body(request, limit=6) == b"abcdef"


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    request, received = request_with([b"x" * 10], length=10_000_000)
    with pytest.raises(BodyTooLargeError) as refused:
        await read_body(request, limit=1024)
    assert received == []
    assert (refused.value.status, refused.value.code, refused.value.limit) == (413, "too_large", 1024)


async def test_a_body_without_length_is_cut_at_the_limit_while_reading() -> None:
    request, received = request_with([b"x" * 600, b"x" * 600, b"x" * 600, b"x" * 600])
    with pytest.raises(BodyTooLargeError):
        await read_body(request, limit=1024)
    assert len(received) == 2  # stopped at the chunk that crossed the limit


async def test_a_client_leaving_mid_body_is_a_body_error() -> None:
    request, _ = request_with([b"partial"], disconnect=True)
    with pytest.raises(BodyError) as refused:
        await read_body(request, limit=1024)
    assert refused.value.status == 400


async def test_a_malformed_content_length_is_a_body_error() -> None:
    request, _ = request_with([b"x"])
    request.scope["headers"] = [(b"content-length", b"12abc")]
    with pytest.raises(BodyError, match="Content-Length"):
        await read_body(request, limit=1024)


async def test_text_must_be_utf8() -> None:
    request, _ = request_with([b"\xff\xfe"], length=2)
    with pytest.raises(BodyError, match="UTF-8"):
        await read_text(request, limit=1024)
    request, _ = request_with(["héllo".encode()])
    assert await read_text(request, limit=1024) == "héllo"


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"a": ' * 100_000 + "1" + "}" * 100_000,
        "[" * 65 + "]" * 65,
        '{"a": "\\ud800"}',
        '["ok", "\\udfff"]',
        '{"\\udc00": 1}',
        "1" * 5000,
        '{"n": -' + "9" * 5000 + "}",
        "NaN",
        '{"n": Infinity}',
        "[-Infinity]",
        "1e999",
        '{"n": -1e400}',
    ],
)
def test_unusable_json_is_one_typed_error(text: str) -> None:
    with pytest.raises(UnusableJsonError):
        parse_json(text)


@pytest.mark.parametrize("text", ["", "{", '{"a": }', "[1,]", "nope", b"\xff"])
def test_json_syntax_errors_are_malformed_not_unusable(text: str | bytes) -> None:
    with pytest.raises(MalformedJsonError) as refused:
        parse_json(text)
    assert not isinstance(refused.value, UnusableJsonError)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"a": [1, 2.5, {"b": null}]}', {"a": [1, 2.5, {"b": None}]}),
        ('"\\ud83d\\ude00"', "😀"),
        ("[" * 64 + "]" * 64, eval("[" * 64 + "]" * 64)),
        ("9" * 4000, int("9" * 4000)),
        ('"\\u0000"', "\x00"),
    ],
)
def test_usable_json_parses_as_json_loads_would(text: str, value: Any) -> None:
    assert parse_json(text) == value
