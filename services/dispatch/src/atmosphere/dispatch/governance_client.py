"""Dispatch's outbound adapter to governance: run admission and tool-call checks on the bus.

The run id and principal travel in the request bodies, which governance reads; they are not
repeated as `atmo-run-id`/`atmo-principal` headers (nothing read them, and a header block costs
both ends a parse on every message).
"""

from __future__ import annotations

import logging

from atmosphere.bus import Bus, BusError, request_retrying, subjects
from atmosphere.bus.errors import GovernanceDeniedError, GovernanceUnavailableError
from atmosphere.contracts.governance.v1.governance_pb2 import AdmitRequest, CheckToolCallRequest, Decision
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission

log = logging.getLogger("atmosphere.dispatch")

UNAVAILABLE = "Request denied: governance is unavailable (fail-closed)"


class GovernanceClient:
    """Asks governance about runs and tool calls; no answer means no (fail-closed)."""

    def __init__(self, bus: Bus, *, timeout: float = 5.0) -> None:
        """Ask over `bus`, waiting at most `timeout` seconds per question."""
        self._bus = bus
        self.timeout = timeout

    async def admit(self, run: RunSubmission) -> str:
        """Return when `run` may start: the message to run (a policy may have rewritten it, e.g. redacted).

        Raises:
            GovernanceDeniedError: a policy refused it (`details` name the policy and reason).
            GovernanceUnavailableError: governance did not answer in time.
        """
        admit = AdmitRequest(
            run_id=run.run_id, agent=run.agent, message=run.message, principal=run.principal, transport=run.transport
        )
        try:
            # A check is safe to repeat: a broker restart within the timeout costs a moment, not the run.
            decision = await request_retrying(
                self._bus,
                subjects.governance("admit"),
                admit,
                Decision,
                deadline=self.timeout,
            )
        except BusError as exc:
            log.warning("run %s: governance did not answer admission (%s); refusing", run.run_id, exc)
            raise GovernanceUnavailableError(UNAVAILABLE) from exc
        if not decision.allowed:
            policy = decision.policy or "default"
            # The policy and reason ride along as details, so whoever follows the run (a parent's
            # `task` tool) can word the denial without parsing the message.
            raise GovernanceDeniedError(
                f"Request denied by policy {policy}: {decision.reason}",
                details={"policy": policy, "reason": decision.reason},
            )
        return decision.rewritten_message or run.message

    async def check_tool(self, run: RunSubmission, tool_name: str, arguments_json: str) -> Decision:
        """Governance's decision on one tool call.

        Raises:
            BusError: no decision (the caller refuses the call: fail-closed).
        """
        request = CheckToolCallRequest(
            run_id=run.run_id,
            agent=run.agent,
            tool_name=tool_name,
            arguments_json=arguments_json,
            principal=run.principal,
        )
        return await self._bus.request(subjects.governance("check_tool"), request, Decision, timeout=self.timeout)
