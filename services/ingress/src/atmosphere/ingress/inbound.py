"""What a client sends, parsed and bounded: prompts, approval replies, and the runs they start.

Transport-independent: WebSocket messages and HTTP bodies go through the same rules.

Following a run's event stream (`follow_run`, the heart of resumable streams) lives in
`atmosphere.bus.runs`: dispatch follows its sub-runs the same way.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from google.protobuf.message import Message

from atmosphere.bus import Bus
from atmosphere.bus.runs import new_run, send_control
from atmosphere.bus.sizes import ENVELOPE_ROOM
from atmosphere.bus.text import has_lone_surrogate
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import (
    ApprovalDecision,
    Control,
    ControlAck,
    RunSubmission,
)
from atmosphere.ingress.bodies import MalformedJsonError, UnusableJsonError, parse_json
from atmosphere.ingress.errors import MalformedRequestError, RequestTooLargeError

log = logging.getLogger("atmosphere.ingress")

APPROVAL_PREFIX = "/__approval/"
MAX_APPROVAL_HEAD = 256
"""`<apr_id>/<action>` of an approval reply is short; anything longer is not one."""

HEADER_BYTES = 2 * 1024
"""A generous bound on the headers a run submission or control request carries."""
MAX_HINTS = 64
MAX_HINT_NAME = 128
CLOSE_REASON_BYTES = 123
"""A WebSocket close frame's payload is at most 125 bytes, two of them the code."""


def message_limit(configured: int, max_payload: int) -> int:
    """The largest client message ingress admits.

    The setting, or less when the broker's `max_payload` leaves no room for the envelope around
    a message that large (the other `RunSubmission` fields: ids, principal, path, hints re-encoded
    as metadata; and the headers).
    """
    return max(1024, min(configured, max_payload - ENVELOPE_ROOM))


def require_message_size(raw: str | bytes, limit: int) -> None:
    """Raise `RequestTooLargeError` when `raw` is over `limit` bytes (as UTF-8)."""
    # Encoding is only needed when the character count alone cannot decide.
    oversized = len(raw) > limit or (
        isinstance(raw, str) and len(raw) * 4 > limit and len(raw.encode("utf-8", "surrogatepass")) > limit
    )
    if oversized:
        msg = f"The message exceeds {limit} bytes"
        raise RequestTooLargeError(msg)


def require_fits(message: Message, max_payload: int, *, what: str = "The prompt") -> None:
    """Raise `RequestTooLargeError` unless `message` and its headers fit the broker's `max_payload`."""
    size = message.ByteSize() + HEADER_BYTES
    if size > max_payload:
        msg = f"{what} is too large for the message broker ({size} of at most {max_payload} bytes)"
        raise RequestTooLargeError(msg)


def close_reason(text: str) -> str:
    """`text` cut to fit a WebSocket close frame (123 bytes of UTF-8), never mid-character."""
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= CLOSE_REASON_BYTES:
        return encoded.decode("utf-8")
    return encoded[: CLOSE_REASON_BYTES - 3].decode("utf-8", "ignore") + "..."


@dataclass(frozen=True, slots=True)
class Prompt:
    """A parsed inbound prompt."""

    text: str
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ApprovalReply:
    """A human-in-the-loop answer: `/__approval/<id>/<action> [payload]`."""

    approval_id: str
    action: str
    """"approve", "deny" or "respond" (anything unusable has become "deny")."""
    payload_json: str = ""


def parse_approval(raw: str) -> ApprovalReply:
    """Parse an approval reply with Atmosphere's rules: when in doubt, deny.

    `approve` / `yes` may carry edited arguments (`{"arguments": {...}}` or a bare object);
    unparseable arguments deny. `respond` needs a payload (JSON or text) or it denies. Any other
    action denies.
    """
    text = raw.strip()
    if not text.startswith(APPROVAL_PREFIX):
        msg = "An approval reply looks like /__approval/<apr_id>/<approve|deny|respond> [payload]"
        raise MalformedRequestError(msg)
    head, _, payload = text[len(APPROVAL_PREFIX) :].partition(" ")
    approval_id, _, action = head.partition("/")
    if not approval_id.startswith("apr_") or not action or len(head) > MAX_APPROVAL_HEAD:
        msg = "An approval reply looks like /__approval/<apr_id>/<approve|deny|respond> [payload]"
        raise MalformedRequestError(msg)
    payload = payload.strip()
    deny = ApprovalReply(approval_id, "deny")
    if action in {"approve", "yes"}:
        if not payload:
            return ApprovalReply(approval_id, "approve")
        try:
            edited = parse_json(payload)
        except MalformedJsonError:
            return deny
        return ApprovalReply(approval_id, "approve", json.dumps(edited)) if isinstance(edited, dict) else deny
    if action == "respond" and payload:
        try:
            parse_json(payload)
        except UnusableJsonError:
            return deny
        except MalformedJsonError:
            payload = json.dumps(payload)
        return ApprovalReply(approval_id, "respond", payload)
    return deny


def parse_inbound(raw: str, *, declared_json: bool = False) -> Prompt | ApprovalReply:
    """Parse plain text, `{"prompt": "...", "hints": {...}}` or an approval reply.

    Text that merely starts with `{` but is not JSON is taken as a plain prompt, unless the
    sender declared it JSON (`declared_json`: an HTTP body sent as `application/json`), where
    it is a `MalformedRequestError` like any body that is not a prompt object. JSON that
    parses but cannot be used (nested too deep, a number past Python's digit limit, a lone
    surrogate protobuf would refuse) is a `MalformedRequestError`, as is any unusable field.
    """
    text = raw.strip()
    if not text:
        raise MalformedRequestError("Empty prompt")
    if has_lone_surrogate(text):
        raise MalformedRequestError("The message contains a lone UTF-16 surrogate, which is not valid Unicode")
    if text.startswith(APPROVAL_PREFIX) and not declared_json:
        return parse_approval(text)
    if not text.startswith("{") and not declared_json:
        return Prompt(text=raw)
    try:
        envelope = parse_json(text)
    except UnusableJsonError as exc:
        raise MalformedRequestError(str(exc)) from None
    except MalformedJsonError as exc:
        if declared_json:
            raise MalformedRequestError(f"The body is not valid JSON ({exc.message})") from None
        return Prompt(text=raw)
    if not isinstance(envelope, dict):
        if declared_json:
            raise MalformedRequestError('A JSON body must be an object: {"prompt": "..."}')
        return Prompt(text=raw)
    prompt = envelope.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise MalformedRequestError('A JSON frame needs a non-empty "prompt" string')
    return Prompt(text=prompt, metadata=_hint_metadata(envelope.get("hints")))


def _hint_metadata(hints: object) -> dict[str, str]:
    if hints is None:
        return {}
    if not isinstance(hints, dict):
        raise MalformedRequestError('"hints" must be an object')
    if len(hints) > MAX_HINTS:
        msg = f"At most {MAX_HINTS} hints are accepted"
        raise MalformedRequestError(msg)
    if any(not name or len(name) > MAX_HINT_NAME for name in hints):
        msg = f"A hint name must have 1 to {MAX_HINT_NAME} characters"
        raise MalformedRequestError(msg)
    return {f"hints.{name}": json.dumps(value) for name, value in hints.items()}


def new_run_request(
    *,
    agent: str,
    prompt: Prompt,
    conversation_id: str,
    principal: Principal,
    transport: str,
    path: str,
    pool: str,
) -> RunSubmission:
    """The run a parsed prompt starts (`atmosphere.bus.runs.new_run`: fresh ids, submitted now), queued in `pool`."""
    return new_run(
        agent=agent,
        message=prompt.text,
        principal=principal,
        conversation_id=conversation_id,
        transport=transport,
        path=path,
        metadata=prompt.metadata,
        pool=pool,
    )


async def send_approval(
    bus: Bus, run_id: str, reply: ApprovalReply, *, principal: Principal | None = None
) -> ControlAck:
    """Route an approval reply to the worker running `run_id`.

    Raises `RequestTooLargeError` when the reply (its edited arguments) cannot fit the broker's limit.
    """
    control = Control(
        run_id=run_id,
        principal=principal,
        approval=ApprovalDecision(approval_id=reply.approval_id, action=reply.action, payload_json=reply.payload_json),
    )
    require_fits(control, bus.max_payload, what="The approval")
    return await send_control(bus, control)
