"""`atmo.gov.decisions`, `atmo.gov.check` and `atmo.gov.admin.<op>`: the decision log and the operators' surface.

Reads wait for this replica to have applied what governance's log held when they began; the
kill switch and reloads go through the log, so every replica takes them. The decision log is
returned newest first as far as it fits in one answer (`truncated`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from atmosphere.bus import MessageContext
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdminRequest,
    AdminResponse,
    CheckRequest,
    CheckResponse,
    KillSwitchChange,
    ListDecisionsRequest,
    ListDecisionsResponse,
    PolicyReload,
)
from atmosphere.governance.errors import GovernanceBadRequestError
from atmosphere.governance.plane import GovernancePlane
from atmosphere.governance.policies import PolicyFileError, parse_policies
from atmosphere.governance.replication import GovernanceJournal, record_of
from atmosphere.governance.responders.common import ITEM_OVERHEAD, MAX_FIELD_CHARS, check_fields, now
from atmosphere.governance.store import DecisionLog

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
ADMIN_OPS = ("policies", "summary", "health", "reload", "arm", "disarm")
READ_OPS = frozenset({"policies", "summary", "health"})


class AdminResponders:
    """Lists decisions, answers policy checks, and serves the admin ops (views, the kill switch, reloads)."""

    def __init__(
        self, log: DecisionLog, plane: GovernancePlane, journal: GovernanceJournal, *, reply_bytes: int
    ) -> None:
        """Read decisions from `log` and views from `plane`; change state through `journal`; fit `reply_bytes`."""
        self._log = log
        self._plane = plane
        self._journal = journal
        self._reply_bytes = reply_bytes

    async def decisions(self, request: ListDecisionsRequest, _ctx: MessageContext) -> ListDecisionsResponse:
        """`atmo.gov.decisions`: the newest decisions, optionally of one run, as many as fit in one reply."""
        check_fields(run_id=request.run_id)
        limit = request.limit if 0 < request.limit <= MAX_LIMIT else DEFAULT_LIMIT
        await self._journal.caught_up()
        rows = await self._log.recent(run_id=request.run_id, limit=limit)
        records = []
        room = self._reply_bytes
        for row in rows:
            records.append(record_of(row))
            room -= records[-1].ByteSize() + ITEM_OVERHEAD
            if room < 0:
                records.pop()
                return ListDecisionsResponse(decisions=records, truncated=True)
        return ListDecisionsResponse(decisions=records)

    async def check(self, request: CheckRequest, _ctx: MessageContext) -> CheckResponse:
        """`atmo.gov.check`: what the policies in force say of an action (MS `/check`; nothing is logged)."""
        try:
            body = json.loads(request.body_json)
            if not isinstance(body, dict):
                msg = "the body must be a JSON object"
                raise ValueError(msg)
            await self._journal.caught_up()  # with every reload acknowledged so far
            result = await self._plane.check(body)
        except (ValueError, RecursionError) as exc:
            raise GovernanceBadRequestError(f"Malformed check: {exc}"[:MAX_FIELD_CHARS]) from None
        return CheckResponse(result_json=json.dumps(result))

    def admin(self, op: str) -> Callable[[AdminRequest, MessageContext], Awaitable[AdminResponse]]:
        """The responder of `atmo.gov.admin.<op>` (JSON body in, JSON answer out)."""

        async def answer(request: AdminRequest, _ctx: MessageContext) -> AdminResponse:
            try:
                body = json.loads(request.body_json or "{}")
            except (ValueError, RecursionError):
                raise GovernanceBadRequestError("the body must be a JSON object") from None
            if not isinstance(body, dict):
                raise GovernanceBadRequestError("the body must be a JSON object")
            return AdminResponse(result_json=json.dumps(await self._admin_result(op, body)))

        return answer

    async def _admin_result(self, op: str, body: dict[str, Any]) -> Any:
        plane = self._plane
        if op in READ_OPS:
            await self._journal.caught_up()  # every replica answers with every change acknowledged
            if op == "policies":
                return plane.policies_view()
            return plane.summary() if op == "summary" else plane.health()
        operator = _text_field(body, "operator") or "unknown"
        if op == "arm":
            reason = _text_field(body, "reason")
            if not reason.strip():
                raise GovernanceBadRequestError("arming the kill switch needs a non-blank 'reason'")
            return await self._journal.switch(KillSwitchChange(armed=True, reason=reason, operator=operator, at=now()))
        if op == "disarm":
            return await self._journal.switch(KillSwitchChange(armed=False, operator=operator, at=now()))
        assert op == "reload"
        swap_name, text = _text_field(body, "swapName"), _text_field(body, "yaml")
        if bool(swap_name) != bool(text):
            raise GovernanceBadRequestError("a reload names both 'swapName' and 'yaml', or neither (re-read the files)")
        if swap_name:
            # Refused here, before it is logged, when it cannot apply (every replica would refuse it).
            try:
                parse_policies(text, source=f"reload:{swap_name}")
            except PolicyFileError as exc:
                raise GovernanceBadRequestError(f"Reload refused, nothing changed: {exc}"[:MAX_FIELD_CHARS]) from None
        return await self._journal.reload(PolicyReload(swap_name=swap_name, yaml=text, operator=operator))


def _text_field(body: dict[str, Any], key: str) -> str:
    value = body.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise GovernanceBadRequestError(f"'{key}' must be a string")
    return value
