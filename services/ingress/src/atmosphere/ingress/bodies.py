"""Bounded request bodies and total JSON parsing, shared by every ingress route that reads input.

    body = await read_body(request, limit=limit)        # BodyTooLargeError (413) / BodyError (400)
    value = parse_json(body)                            # MalformedJsonError (400), never a crash

`read_body` refuses a declared `Content-Length` over the limit before reading a byte, and
counts while it reads, so a body without a length (chunked) is cut at the limit instead of
being buffered whole. `parse_json` turns every way `json.loads` can blow up (nesting that
exhausts the stack, integers past Python's digit limit, `NaN`/`Infinity`, lone surrogates that
protobuf refuses to serialize) into one typed error. The errors themselves are defined with
every other ingress error in `errors.py`: each names the `IngressError` it is answered with.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from starlette.requests import ClientDisconnect, Request

from atmosphere.bus.text import has_lone_surrogate
from atmosphere.ingress.errors import BodyError, BodyTooLargeError, MalformedJsonError, UnusableJsonError

__all__ = [
    "MAX_JSON_DEPTH",
    "BodyError",
    "BodyTooLargeError",
    "MalformedJsonError",
    "UnusableJsonError",
    "declared_length",
    "parse_json",
    "read_body",
    "read_text",
    "require_usable",
]

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects `parse_json` accepts (no client needs more)."""


def declared_length(request: Request) -> int | None:
    """The request's `Content-Length`, or None when it has none (e.g. chunked)."""
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    if not raw.strip().isdigit() or len(raw) > 19:
        # The HTTP parser already refuses these; stay total if a server ever lets one through.
        msg = "Malformed Content-Length"
        raise BodyError(msg)
    return int(raw)


async def read_body(request: Request, *, limit: int) -> bytes:
    """The whole body, at most `limit` bytes, read as it streams in.

    Raises `BodyTooLargeError` before reading anything when `Content-Length` exceeds `limit`,
    or as soon as the bytes read so far do; `BodyError` when the client leaves mid-body.
    """
    length = declared_length(request)
    if length is not None and length > limit:
        raise BodyTooLargeError(limit)
    received = bytearray()
    try:
        async for chunk in request.stream():
            if len(received) + len(chunk) > limit:
                raise BodyTooLargeError(limit)
            received += chunk
    except ClientDisconnect:
        msg = "The client disconnected before the body was complete"
        raise BodyError(msg) from None
    return bytes(received)


async def read_text(request: Request, *, limit: int) -> str:
    """`read_body` decoded as UTF-8 (`BodyError` when it is not)."""
    raw = await read_body(request, limit=limit)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        msg = "The request body must be UTF-8 text"
        raise BodyError(msg) from None


def parse_json(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads`, total: any value it returns can be re-serialized by JSON and protobuf.

    Raises `MalformedJsonError` for text that is not JSON, and its subclass `UnusableJsonError`
    for JSON nested deeper than `max_depth`, integers beyond Python's digit limit, non-finite
    numbers and strings holding lone surrogates.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            msg = "JSON must be UTF-8 text"
            raise MalformedJsonError(msg) from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except MalformedJsonError:
        raise
    except json.JSONDecodeError as exc:
        msg = f"Malformed JSON: {exc.msg} at position {exc.pos}"
        raise MalformedJsonError(msg) from None
    except RecursionError:
        # The decoder guards its recursion, so a 100k-deep document fails fast here.
        msg = f"JSON nested deeper than {max_depth} levels"
        raise UnusableJsonError(msg) from None
    except ValueError:
        # An integer past `sys.get_int_max_str_digits()`.
        msg = f"A number in the JSON has more than {sys.get_int_max_str_digits()} digits"
        raise UnusableJsonError(msg) from None
    require_usable(value, max_depth=max_depth)
    return value


def require_usable(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise `UnusableJsonError` when a parsed value nests deeper than `max_depth` or has a lone surrogate."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            if has_lone_surrogate(item):
                msg = "Text contains a lone UTF-16 surrogate (e.g. \\ud800), which is not valid Unicode"
                raise UnusableJsonError(msg)
            continue
        if not isinstance(item, dict | list):
            continue
        if depth >= max_depth:
            msg = f"JSON nested deeper than {max_depth} levels"
            raise UnusableJsonError(msg)
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        pending.extend((child, depth + 1) for child in children)


def _refuse_constant(name: str) -> Any:
    msg = f"JSON does not allow {name}"
    raise UnusableJsonError(msg)


def _finite_float(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value):
        msg = f"Number out of range: {raw[:40]}"
        raise UnusableJsonError(msg)
    return value
