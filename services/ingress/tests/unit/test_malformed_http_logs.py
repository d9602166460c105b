"""A malformed HTTP request costs the log one line with its reason, never a traceback.

Ingress's real `serve()` on a `FakeBus`, raw bytes over a loopback socket: whatever a client
sends, the log says what was refused and why in a line, so a scanner cannot fill it with stacks.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.ingress.tests.unit.test_wiring import running_ingress

MALFORMED = {
    "bad-method": b"GE\x01T / HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad-version": b"GET / HTTP/9.Z\r\nHost: x\r\n\r\n",
    "bad-header-name": b"GET / HTTP/1.1\r\nHo st: x\r\n\r\n",
    "length-and-chunked": (
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "non-ascii-path": b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
    "url-uvicorn-cannot-parse": b"GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n",
    "tls-to-the-http-port": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
}


async def exchange(url: str, raw: bytes) -> bytes:
    host, _, port = url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


@pytest.mark.parametrize("name", list(MALFORMED))
async def test_a_malformed_request_logs_one_line_with_its_reason_and_no_traceback(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_ingress() as (_bus, url):
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            answer = await exchange(url, MALFORMED[name])
            await asyncio.sleep(0.05)  # anything logged after the answer was written
            # What the request cost the log: taken before ingress stops (its own shutdown lines
            # are logged too, when an earlier test set these loggers to INFO).
            logged = list(caplog.records)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b'"code": "ingress.bad_request"' in answer, answer
    about = [r for r in logged if r.name.startswith(("atmosphere.ingress", "uvicorn"))]
    assert len(about) == 1, [r.getMessage() for r in about]
    [line] = about
    assert line.exc_info is None
    assert line.exc_text is None
    assert "\n" not in line.getMessage()
    message = line.getMessage()
    assert message.startswith("refused a malformed HTTP request from 127.0.0.1:"), message
    assert message.split(": ", 1)[1].strip(), message  # and why
