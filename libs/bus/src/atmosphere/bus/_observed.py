"""One request as the bus's telemetry sees it: its run and trace headers, span, timing and outcome."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from atmosphere.bus import telemetry
from atmosphere.bus._codec import Headers

T = TypeVar("T")

_NO_HEADERS = Headers()


async def observed_request(subject: str, headers: Headers | None, send: Callable[[Headers], Awaitable[T]]) -> T:
    """`send` the request on `subject` with the current run's and span's headers, timed and traced."""
    tracer, observer = telemetry.tracer(), telemetry.observer()
    if tracer is None and observer is None:
        return await send((headers or _NO_HEADERS).for_request())
    started = time.perf_counter()
    error = ""
    try:
        with tracer.client_span(subject) if tracer is not None else contextlib.nullcontext():
            return await send((headers or _NO_HEADERS).for_request())
    except BaseException as exc:
        error = telemetry.error_label(exc) if isinstance(exc, Exception) else "cancelled"
        raise
    finally:
        if observer is not None:
            observer.request_done(telemetry.subject_family(subject), time.perf_counter() - started, error)
