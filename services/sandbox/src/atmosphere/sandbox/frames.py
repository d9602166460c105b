"""The frames between sandbox and its tool workers, on pipes of their own.

A frame is a 4-byte big-endian length, then that many bytes: a 4-byte length of the header, the
header (a small JSON object with an `op`), and the body (a call's arguments, or its outcome's
text, as UTF-8). Text keeps lone surrogates (`surrogatepass`) so that it arrives exactly as the
tool produced it. Both ends refuse a frame over their limit before reading it: a worker that
sends one is stopped, never buffered without bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
from typing import Any, Final

HEADER_ROOM: Final = 64 * 1024
"""Bytes a frame may carry besides its body (the header and the lengths)."""

_LENGTH = struct.Struct(">I")


class FrameError(Exception):
    """The other end sent something that is not a frame within the limit."""


def encode_text(text: str) -> bytes:
    """`text` as a frame body (lone surrogates kept)."""
    return text.encode("utf-8", errors="surrogatepass")


def decode_text(body: bytes) -> str:
    """A frame body as the text that was sent."""
    return body.decode("utf-8", errors="surrogatepass")


def pack(header: dict[str, Any], body: bytes = b"") -> bytes:
    """One frame: `header` (JSON) and `body`."""
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return _LENGTH.pack(_LENGTH.size + len(encoded) + len(body)) + _LENGTH.pack(len(encoded)) + encoded + body


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> tuple[dict[str, Any], bytes] | None:
    """The next frame's header and body; `None` at the end of the stream.

    Raises `FrameError` for a frame larger than `max_bytes` (not read), a stream that ends inside
    a frame, or a header that is not a JSON object with an `op`.
    """
    try:
        prefix = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameError("a frame cut short") from None
        return None
    (size,) = _LENGTH.unpack(prefix)
    if size > max_bytes or size < _LENGTH.size:
        msg = f"a frame of {size} bytes (the limit is {max_bytes})"
        raise FrameError(msg)
    try:
        data = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameError("a frame cut short") from None
    return _split(data)


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    (header_size,) = _LENGTH.unpack_from(data)
    end = _LENGTH.size + header_size
    if end > len(data) or header_size > HEADER_ROOM:
        raise FrameError("a frame whose header does not fit in it")
    try:
        header = json.loads(data[_LENGTH.size : end])
    except ValueError:
        raise FrameError("a frame whose header is not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise FrameError("a frame whose header has no op")
    return header, data[end:]


async def pipe_reader(fd: int) -> tuple[asyncio.StreamReader, asyncio.ReadTransport]:
    """An asyncio reader on the read end `fd` of a pipe (which it then owns), and its transport to close."""
    loop = asyncio.get_running_loop()
    # The default limit bounds `readline`; frames are read with `readexactly`, bounded by their own check.
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader, transport


async def pipe_writer(fd: int) -> asyncio.StreamWriter:
    """An asyncio writer on the write end `fd` of a pipe (which it then owns)."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(fd, "wb", buffering=0)
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)
