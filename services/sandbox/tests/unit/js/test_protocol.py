"""The worker's framing: bounded lines, malformed requests answered (not fatal), replies checked."""

from __future__ import annotations

import io

import pytest

from atmosphere.sandbox.js.protocol import MAX_REQUEST_BYTES, FrameError, Limits, Reply, decode, encode, reply_limit
from atmosphere.sandbox.js.worker import answer, requests

LIMITS = Limits(timeout_seconds=0.5, max_memory_bytes=32 << 20, max_output_chars=10)


def echo(code: str, _limits: Limits) -> tuple[str, str, bool]:
    return "result", code, False


def test_a_line_over_the_bound_is_skipped_whole_and_reading_goes_on() -> None:
    oversized = b"x" * (MAX_REQUEST_BYTES + 10) + b"\n"
    stream = io.BytesIO(encode({"id": 1, "code": "a"}) + oversized + encode({"id": 2, "code": "b"}))
    lines = list(requests(stream))
    assert lines[1] is None
    assert [decode(line)["id"] for line in (lines[0], lines[2]) if line is not None] == [1, 2]


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (None, f"the request is over {MAX_REQUEST_BYTES} bytes"),
        (b"garbage\n", "not a JSON frame: b'garbage\\n'"),
        (b"[1]\n", "not a JSON object: b'[1]\\n'"),
        (b'{"id": "1", "code": "1"}\n', "a request needs an integer `id` and a string `code`"),
    ],
)
def test_a_malformed_request_gets_an_error_reply_with_no_id(line: bytes | None, text: str) -> None:
    assert answer(line, echo, LIMITS) == Reply(-1, "error", text)


def test_an_engine_failure_is_an_error_reply_and_not_the_end_of_the_worker() -> None:
    def broken(_code: str, _limits: Limits) -> tuple[str, str, bool]:
        raise RuntimeError("conversion failed")

    reply = answer(encode({"id": 7, "code": "1"}), broken, LIMITS)
    assert reply == Reply(7, "error", "the JavaScript engine failed: RuntimeError: conversion failed")


@pytest.mark.parametrize(
    "frame",
    [
        {"id": 1, "kind": "result"},
        {"id": 1, "kind": "weird", "text": ""},
        {"id": "1", "kind": "result", "text": ""},
        {"id": 1, "kind": "result", "text": "", "truncated": "no"},
    ],
)
def test_a_reply_of_another_shape_is_refused(frame: dict[str, object]) -> None:
    with pytest.raises(FrameError):
        Reply.parse(frame)


def test_a_reply_frame_of_the_largest_text_fits_its_bound() -> None:
    for text in ("\x00" * 10, "\U0001f600" * 5):  # 10 UTF-16 units, each escaped as `\uXXXX`
        worst = Reply(2**31, "result", text, truncated=True)
        assert len(encode(worst.frame())) <= reply_limit(LIMITS.max_output_chars)
        assert Reply.parse(decode(encode(worst.frame()))) == worst
