"""Transport-independent logic: what a client sends, the agents there are, run control.

Following a run's event stream (`follow_run`, the heart of resumable streams) lives in
`atmosphere.bus.runs`: dispatch follows its sub-runs the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import Bus, subjects
from atmosphere.bus.runs import send_control
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import (
    ApprovalDecision,
    Control,
    ControlAck,
    RunRequest,
)

log = logging.getLogger("atmosphere.ingress")

APPROVAL_PREFIX = "/__approval/"
HISTORY_METADATA_KEY = "ai.request.history"
"""Request metadata carrying prior turns (JSON list of `{role, content}`) when memory is absent."""


class InboundError(ValueError):
    """An inbound frame that is not a usable prompt or command."""


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
    head, _, payload = raw.strip()[len(APPROVAL_PREFIX) :].partition(" ")
    approval_id, _, action = head.partition("/")
    if not approval_id.startswith("apr_") or not action:
        msg = "An approval reply looks like /__approval/<apr_id>/<approve|deny|respond> [payload]"
        raise InboundError(msg)
    payload = payload.strip()
    deny = ApprovalReply(approval_id, "deny")
    if action in {"approve", "yes"}:
        if not payload:
            return ApprovalReply(approval_id, "approve")
        try:
            edited = json.loads(payload)
        except json.JSONDecodeError:
            return deny
        return ApprovalReply(approval_id, "approve", json.dumps(edited)) if isinstance(edited, dict) else deny
    if action == "respond" and payload:
        try:
            json.loads(payload)
        except json.JSONDecodeError:
            payload = json.dumps(payload)
        return ApprovalReply(approval_id, "respond", payload)
    return deny


def parse_inbound(raw: str) -> Prompt | ApprovalReply:
    """Parse plain text, `{"prompt": "...", "hints": {...}}` or an approval reply.

    Text that merely starts with `{` but is not JSON is taken as a plain prompt.
    """
    text = raw.strip()
    if not text:
        raise InboundError("Empty prompt")
    if text.startswith(APPROVAL_PREFIX):
        return parse_approval(text)
    if not text.startswith("{"):
        return Prompt(text=raw)
    try:
        envelope = json.loads(text)
    except json.JSONDecodeError:
        return Prompt(text=raw)
    if not isinstance(envelope, dict):
        return Prompt(text=raw)
    prompt = envelope.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InboundError('A JSON frame needs a non-empty "prompt" string')
    hints = envelope.get("hints")
    if hints is None:
        hints = {}
    if not isinstance(hints, dict):
        raise InboundError('"hints" must be an object')
    metadata = {f"hints.{k}": json.dumps(v) for k, v in hints.items() if isinstance(k, str)}
    return Prompt(text=prompt, metadata=metadata)


def new_run_request(
    *,
    agent: str,
    prompt: Prompt,
    conversation_id: str,
    principal: Principal,
    transport: str,
    path: str,
) -> RunRequest:
    """A fresh `RunRequest` with new run and session ids."""
    submitted = Timestamp()
    submitted.FromNanoseconds(time.time_ns())
    return RunRequest(
        run_id=uuid.uuid4().hex,
        session_id=str(uuid.uuid4()),
        conversation_id=conversation_id,
        agent=agent,
        message=prompt.text,
        principal=principal,
        metadata=prompt.metadata,
        submitted_at=submitted,
        transport=transport,
        path=path,
    )


class AgentDirectory:
    """Which agents exist and where, from the `ATMO_AGENTS` bucket that dispatch fills."""

    def __init__(self, bus: Bus, *, ttl: float = 2.0, miss_ttl: float = 0.25) -> None:
        """Read from `bus`, caching the bucket for `ttl` seconds (`miss_ttl` after a miss).

        A miss re-reads sooner, so an agent whose dispatch just started is found within a
        quarter second, while a burst of requests for a name that does not exist still costs
        at most four bucket reads a second.
        """
        self._bus = bus
        self._ttl = ttl
        self._miss_ttl = miss_ttl
        self._loaded = 0.0
        self._by_name: dict[str, AgentDescriptor] = {}
        self._lock = asyncio.Lock()

    async def _refresh(self, ttl: float | None = None) -> None:
        async with self._lock:
            if time.monotonic() - self._loaded < (self._ttl if ttl is None else ttl):
                return
            self._by_name = await self._bus.kv_items(subjects.AGENTS_BUCKET, AgentDescriptor)
            self._loaded = time.monotonic()

    async def all(self, *, after_miss: bool = False) -> list[AgentDescriptor]:
        """Every agent, by name; `after_miss` when the caller did not find what it looked for."""
        await self._refresh(self._miss_ttl if after_miss else None)
        return [self._by_name[name] for name in sorted(self._by_name)]

    async def lookup(self, name: str) -> AgentDescriptor | None:
        """The agent `name`, or None when no dispatch ever served it."""
        await self._refresh()
        if name not in self._by_name:
            await self._refresh(self._miss_ttl)
        return self._by_name.get(name)

    async def by_path(self, path: str) -> AgentDescriptor | None:
        """The agent served at `path` (an `@ai_endpoint` path or `/atmosphere/agent/<name>`)."""
        await self._refresh()
        found = next((d for d in self._by_name.values() if d.path == path), None)
        if found is None:
            await self._refresh(self._miss_ttl)
            found = next((d for d in self._by_name.values() if d.path == path), None)
        return found


async def send_approval(
    bus: Bus, run_id: str, reply: ApprovalReply, *, principal: Principal | None = None
) -> ControlAck:
    """Route an approval reply to the worker running `run_id`."""
    control = Control(
        run_id=run_id,
        principal=principal,
        approval=ApprovalDecision(approval_id=reply.approval_id, action=reply.action, payload_json=reply.payload_json),
    )
    return await send_control(bus, control)
