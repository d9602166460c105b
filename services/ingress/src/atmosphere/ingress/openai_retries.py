"""A retried completion attaches to the run its first attempt started, instead of starting another.

An OpenAI client retries a request whose answer it did not get (its timeout, a dropped
connection, a 5xx): without care every retry is a new run, each doing the work (and the tool
calls) again. Two kinds of request can be recognised as a repeat:

- one with an `Idempotency-Key` header: every request with the same key (and the same caller)
  is the same completion, for as long as its run's events are kept; the same key with another
  body is refused (422), as a key names one request;
- a Stainless-generated SDK's retry (the official `openai` and `anthropic` clients, and
  everything built on them: LangChain, PydanticAI, ...), which says `x-stainless-retry-count: N`
  with N >= 1: it attaches to the run of the same caller's identical request (same body) made
  within `SDK_RETRY_WINDOW`. The first attempt (N = 0) always starts its own run: two identical
  requests sent on purpose are two completions.

The record lives in the KV bucket `ATMO_COMPLETIONS` (keyed by a digest of the caller and the
key or body, never the raw values), so a retry that lands on another ingress replica attaches
too. A request that may be retried and whose client went away before its answer started is
not cancelled at once: its run goes on for `retry_grace` seconds, and is cancelled then unless a
retry attached to it meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.struct_pb2 import Struct

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.bus.runs import cancel_run
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.ingress.errors import OpenAiError, OpenAiInvalidRequestError

log = logging.getLogger("atmosphere.ingress")

BUCKET = subjects.COMPLETIONS_BUCKET
IDEMPOTENCY_HEADER = "idempotency-key"
RETRY_COUNT_HEADER = "x-stainless-retry-count"
MAX_IDEMPOTENCY_KEY = 255
"""Longest `Idempotency-Key` accepted (Stripe's and OpenAI's keys are far shorter)."""
SDK_RETRY_WINDOW = 600.0
"""Seconds after its first attempt within which an SDK's retry attaches (the `openai` client's
default timeout is 600 s, and it retries right after)."""


class OpenAiIdempotencyKeyReusedError(OpenAiError):
    """An `Idempotency-Key` already used for a different request body."""

    status = 422
    code = "idempotency_key_reused"


@dataclass(frozen=True, slots=True)
class RetryKey:
    """How a request can be recognised when it comes again."""

    key: str
    """The KV key: a digest of the caller and the idempotency key (or the body)."""
    body_digest: str
    explicit: bool
    """An `Idempotency-Key` (else an SDK's retry marker)."""
    is_retry: bool
    """Whether this request may attach to an earlier one (always for an explicit key)."""

    @classmethod
    def of(cls, headers: Mapping[str, str], caller: str, body: bytes) -> RetryKey | None:
        """The request's key, or None when nothing marks it as retryable (it is never attached).

        Raises:
            OpenAiInvalidRequestError: an `Idempotency-Key` that is empty or too long.
        """
        body_digest = hashlib.sha256(body).hexdigest()
        explicit = headers.get(IDEMPOTENCY_HEADER)
        if explicit is not None:
            value = explicit.strip()
            if not value or len(value) > MAX_IDEMPOTENCY_KEY:
                msg = f"'Idempotency-Key' must be 1 to {MAX_IDEMPOTENCY_KEY} characters."
                raise OpenAiInvalidRequestError(msg)
            return cls(_digest(caller, "key", value), body_digest, explicit=True, is_retry=True)
        count = headers.get(RETRY_COUNT_HEADER)
        if count is None:
            return None
        retry = count.strip().isdigit() and int(count.strip()) >= 1
        return cls(_digest(caller, "body", body_digest), body_digest, explicit=False, is_retry=retry)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Claim:
    """The completion a key stands for, after this request claimed it."""

    run_id: str
    completion_id: str
    created: int
    attached: int
    """How many later requests attached to it (this one included, if it attached)."""
    ours: bool
    """Whether this request started it (else it attaches to a run already going)."""


def _record(run_id: str, completion_id: str, created: int, *, body_digest: str, attached: int, at: float) -> Struct:
    record = Struct()
    record.update(
        {
            "run_id": run_id,
            "completion_id": completion_id,
            "created": created,
            "body": body_digest,
            "attached": attached,
            "at": at,
        }
    )
    return record


def _claim(record: Struct, *, ours: bool) -> Claim:
    fields = record.fields
    return Claim(
        run_id=fields["run_id"].string_value,
        completion_id=fields["completion_id"].string_value,
        created=int(fields["created"].number_value),
        attached=int(fields["attached"].number_value),
        ours=ours,
    )


class CompletionRetries:
    """Claims completions by key in `ATMO_COMPLETIONS`, and cancels abandoned ones after a grace."""

    def __init__(self, bus: Bus, *, retry_grace: float) -> None:
        """`retry_grace`: seconds an abandoned, retryable completion's run waits for a retry."""
        self._bus = bus
        self.retry_grace = retry_grace
        self._pending: set[asyncio.Task[None]] = set()

    async def claim(
        self, key: RetryKey, run: RunSubmission, completion_id: str, created: int, *, replacing: str = ""
    ) -> Claim:
        """The completion `key` stands for: an earlier one this request may attach to, or `run` now.

        `replacing`: a run id found unusable (its events expired); a record naming it is replaced.

        Raises:
            OpenAiIdempotencyKeyReusedError: the key was used for another body.
            BusError: the bucket could not be read or written.
        """
        outcome: dict[str, object] = {}

        def change(current: Struct | None) -> Struct | None:
            outcome.clear()
            now = time.time()
            if current is not None and current.fields["run_id"].string_value != replacing:
                if key.explicit and current.fields["body"].string_value != key.body_digest:
                    outcome["reused"] = True
                    return current
                fresh = now - current.fields["at"].number_value <= SDK_RETRY_WINDOW
                if key.is_retry and (key.explicit or fresh):
                    attached = Struct()
                    attached.CopyFrom(current)
                    attached.fields["attached"].number_value += 1
                    outcome["attached"] = True
                    return attached
            return _record(run.run_id, completion_id, created, body_digest=key.body_digest, attached=0, at=now)

        record = await self._bus.kv_update(BUCKET, key.key, Struct, change)
        if outcome.get("reused"):
            msg = "This Idempotency-Key was already used for a different request."
            raise OpenAiIdempotencyKeyReusedError(msg, param="Idempotency-Key")
        assert record is not None
        return _claim(record, ours=not outcome.get("attached"))

    def cancel_unless_retried(self, key: RetryKey, claim: Claim, run: RunSubmission, reason: str) -> None:
        """Cancel `run` after the grace, unless a retry attached to it meanwhile (in the background)."""
        task = asyncio.create_task(self._cancel_later(key, claim, run, reason), name=f"retry-grace-{run.run_id}")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _cancel_later(self, key: RetryKey, claim: Claim, run: RunSubmission, reason: str) -> None:
        await asyncio.sleep(self.retry_grace)
        try:
            record = await self._bus.kv_get(BUCKET, key.key, Struct)
        except BusError as exc:
            log.warning("run %s: could not tell whether a retry attached (%s); cancelling it", run.run_id, exc)
            record = None
        if record is not None:
            now = _claim(record, ours=False)
            if now.run_id == claim.run_id and now.attached > claim.attached:
                return  # a retry follows the run now: its own client decides what becomes of it
        await cancel_run(self._bus, run.run_id, reason, principal=run.principal)

    async def close(self) -> None:
        """Stop waiting (ingress stops): runs still in their grace finish on their own.

        Not cancelled: a retry may be on its way to another replica, which attaches to them.
        """
        for task in list(self._pending):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._pending, return_exceptions=True)


__all__ = [
    "IDEMPOTENCY_HEADER",
    "RETRY_COUNT_HEADER",
    "SDK_RETRY_WINDOW",
    "Claim",
    "CompletionRetries",
    "OpenAiIdempotencyKeyReusedError",
    "RetryKey",
]
