"""One evaluation in V8 through mini-racer: a fresh isolate, the limits, the rendered answer.

Imported only inside a worker process (`atmosphere.sandbox.js.worker`), never by the service.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Final

from py_mini_racer import JSEvalException, JSOOMException, JSTimeoutException, JSUndefined, MiniRacer

from atmosphere.sandbox.js.protocol import Limits, ReplyKind
from atmosphere.sandbox.js.wrapper import answer_probe, wrapped

_PENDING: Final = '{"kind":"pending"}'
"""The wrapper's answer when the code's value is a Promise that has yet to settle."""


def evaluate(code: str, limits: Limits) -> tuple[ReplyKind, str, bool]:
    """Run `code` in a fresh isolate: `(kind, text, truncated)` of the reply."""
    deadline = time.monotonic() + limits.timeout_seconds
    answer_key = f"__atmosphere_answer_{secrets.token_hex(8)}"
    racer = MiniRacer()
    try:
        racer.set_hard_memory_limit(limits.max_memory_bytes)
        answer: object = racer.eval(
            wrapped(code, limits.max_output_chars, answer_key), timeout_sec=limits.timeout_seconds
        )
        if answer == _PENDING:
            answer = _settled(racer, answer_key, deadline)
        return _rendered(answer, limits.max_output_chars)
    except JSTimeoutException:
        return "timeout", "", False
    except JSOOMException:
        return "oom", "", False
    except JSEvalException as exc:
        if racer.was_hard_memory_limit_reached():
            return "oom", "", False
        return "error", _cut(str(exc), limits.max_output_chars)[0], False
    finally:
        # Closing the isolate also stops whatever the code left running (timers, promise loops).
        racer.close()


def _settled(racer: MiniRacer, answer_key: str, deadline: float) -> object:
    """The answer of the code's Promise once it settles; `JSTimeoutException` past `deadline`.

    Each poll is an eval with the time left as its timeout: when a promise loop keeps the isolate
    busy, the poll cannot run, times out, and its cancellation stops the loop.
    """
    probe = answer_probe(answer_key)
    pause = 0.002
    while (left := deadline - time.monotonic()) > 0:
        answer = racer.eval(probe, timeout_sec=left)
        if answer is not JSUndefined:
            return answer
        time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(pause * 2, 0.05)
    raise JSTimeoutException


def _rendered(answer: object, max_output_chars: int) -> tuple[ReplyKind, str, bool]:
    """The wrapper's JSON answer as a reply, checked again.

    Code that tampered with the wrapper's helpers can spoil its own answer, never make the worker
    send something unbounded or malformed.
    """
    try:
        frame = json.loads(answer) if isinstance(answer, str) else None
    except (ValueError, RecursionError):
        frame = None
    if not isinstance(frame, dict) or frame.get("kind") not in {"result", "error"}:
        return "error", "the result could not be read (the code changed JSON or String built-ins?)", False
    text, truncated = frame.get("text"), frame.get("truncated")
    if not isinstance(text, str) or not isinstance(truncated, bool):
        return "error", "the result could not be read (the code changed JSON or String built-ins?)", False
    kept, cut = _cut(text, max_output_chars)
    kind: ReplyKind = "result" if frame["kind"] == "result" else "error"
    return kind, kept, truncated or cut


def _cut(text: str, max_units: int) -> tuple[str, bool]:
    """`text` within `max_units` UTF-16 units (the wrapper's measure), and whether it was cut."""
    if len(text) <= max_units // 2 or len(text.encode("utf-16-le", "surrogatepass")) <= 2 * max_units:
        return text, False
    units = 0
    for index, char in enumerate(text):
        units += 2 if ord(char) > 0xFFFF else 1
        if units > max_units:
            return text[:index], True
    return text, False  # pragma: no cover - the length check above already returned


def v8_version() -> str:
    """The version of the V8 mini-racer runs (starting V8 if it has not started yet)."""
    with MiniRacer() as racer:
        return racer.v8_version
