"""Dispatch's outbound adapter to governance: admission, tool-call checks, output checks, screens.

The run id and principal travel in the request bodies, which governance reads; they are not
repeated as `atmo-run-id`/`atmo-principal` headers (nothing read them, and a header block costs
both ends a parse on every message). Every question notes whether governance answered
(`governance_availability`): during an outage runs are refused without holding a slot for the
whole timeout, and the first answer after it lets every waiting question through at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TypeVar

from google.protobuf.message import Message

from atmosphere.bus import Bus, BusError, RemoteError, subjects
from atmosphere.bus.errors import GovernanceDeniedError, GovernanceUnavailableError
from atmosphere.contracts.common.v1.common_pb2 import Usage
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    CheckOutputRequest,
    CheckToolCallRequest,
    Decision,
    RunEndedAck,
    RunEndedReport,
    ScreenRequest,
    ScreenResponse,
)
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.dispatch.governance_availability import Availability, ask

log = logging.getLogger("atmosphere.dispatch")

M = TypeVar("M", bound=Message)

UNAVAILABLE = "Request denied: governance is unavailable (fail-closed)"
RESPONSE_BLOCKED = "Response blocked: "
"""How a stopped answer's error begins (Atmosphere's prefix; clients classify by it)."""
OUTPUT_UNAVAILABLE = RESPONSE_BLOCKED + "governance is unavailable, so the answer was not checked (fail-closed)"
REPORT_RETRY_SECONDS = 120.0
"""How long a run-end report governance did not take is sent again (across a governance restart)."""
REPORT_SPREAD = 0.5
"""Seconds over which the retried reports are spread, so that those an outage held back do not
reach governance all in one instant with the first runs after it."""
RETRY_AFTER = "1"
"""Seconds after which a run refused because governance did not answer may be sent again
(`Retry-After` on the OpenAI endpoint): governance is asked again by the very next run."""
CHECK_WINDOW = 32 * 1024
"""Characters of an answer (its tail) sent with each check; four bytes each fit any bus limit we accept."""
SERVER_METADATA = frozenset({"roles", "tenant", "action", "transport", "tool_name", "tool_args", "tool_args_preview"})
"""Context keys governance sets itself: a client's run metadata never supplies them."""


class GovernanceClient:
    """Asks governance about runs and tool calls; no answer means no (fail-closed)."""

    def __init__(self, bus: Bus, *, timeout: float = 5.0) -> None:
        """Ask over `bus`, waiting at most `timeout` seconds per question."""
        self._bus = bus
        self.timeout = timeout
        self.availability = Availability()
        self._reports: set[asyncio.Task[None]] = set()
        """Run-end reports being retried in the background (held so they are not collected)."""

    async def admit(self, run: RunSubmission) -> str:
        """Return when `run` may start: the message to run (a policy may have rewritten it, e.g. redacted).

        Raises:
            GovernanceDeniedError: a policy refused it (`details` name the policy and reason).
            GovernanceUnavailableError: governance did not answer in time.
        """
        decision = await self.admission(run)
        return decision.rewritten_message or run.message

    async def admission(self, run: RunSubmission) -> Decision:
        """Governance's admission of `run`, when it may start (`check_output`: send its answer to be checked).

        Raises:
            GovernanceDeniedError: a policy refused it (`details` name the policy and reason).
            GovernanceUnavailableError: governance did not answer in time.
        """
        admit = AdmitRequest(
            run_id=run.run_id,
            agent=run.agent,
            message=run.message,
            principal=run.principal,
            transport=run.transport,
            metadata={k: v for k, v in run.metadata.items() if k not in SERVER_METADATA},
            parent_run_id=run.parent_run_id,
            conversation_id=run.conversation_id,
            session_id=run.session_id,
        )
        try:
            # A check is safe to repeat: a broker restart within the timeout costs a moment, not the run.
            decision = await self._ask(subjects.governance("admit"), admit, Decision)
        except BusError as exc:
            log.warning("run %s: governance did not answer admission (%s); refusing", run.run_id, exc)
            raise GovernanceUnavailableError(UNAVAILABLE, details={"retry_after": RETRY_AFTER}) from exc
        if not decision.allowed:
            policy = decision.policy or "default"
            # The policy and reason ride along as details, so whoever follows the run (a parent's
            # `task` tool) can word the denial without parsing the message.
            raise GovernanceDeniedError(
                f"Request denied by policy {policy}: {decision.reason}",
                details={"policy": policy, "reason": decision.reason},
            )
        return decision

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
            conversation_id=run.conversation_id,
            session_id=run.session_id,
        )
        return await self._ask(subjects.governance("check_tool"), request, Decision, retry=False)

    async def check_output(self, run: RunSubmission, tail: str, *, length: int, final: bool) -> Decision:
        """Governance's decision on the answer so far (`final`: the whole answer, before `complete`).

        `tail` ends the answer, whose whole length is `length`. Only its last `CHECK_WINDOW`
        characters travel: a check costs the same at the end of a long answer as at its start
        (not the whole answer each time), and a 10 MB answer is still checkable in one bus
        message; each window holds everything new since the previous check.

        Raises:
            BusError: no decision (the caller stops the answer: fail-closed).
        """
        request = CheckOutputRequest(
            run_id=run.run_id,
            agent=run.agent,
            principal=run.principal,
            message=run.message[:CHECK_WINDOW],
            response=tail[-CHECK_WINDOW:],
            response_chars=length,
            final=final,
            conversation_id=run.conversation_id,
            session_id=run.session_id,
        )
        return await self._ask(subjects.governance("check_output"), request, Decision)

    async def run_ended(
        self, run: RunSubmission, *, usage: list[Usage], model: str, response_chars: int, succeeded: bool
    ) -> RunEndedAck | None:
        """Tell governance a run ended: its cost is accounted, its concurrency slot freed.

        One try before the run's terminal event (which must not wait out a retry loop); if
        governance does not answer, the report is sent again in the background for
        `REPORT_RETRY_SECONDS` (governance counts each run id once, so a late copy is harmless).
        None when the first try got no answer.
        """
        report = RunEndedReport(
            run_id=run.run_id,
            agent=run.agent,
            principal=run.principal,
            usage=usage,
            model=model,
            response_chars=response_chars,
            succeeded=succeeded,
        )
        subject = subjects.governance("run_ended")
        try:
            return await self._ask(subject, report, RunEndedAck, retry=False)
        except RemoteError as exc:  # an answer: governance refused the report; sending it again changes nothing
            log.warning("run %s: governance refused the run's end (%s)", run.run_id, exc)
            return None
        except BusError as exc:
            log.warning(
                "run %s: governance did not take the run's end (%s); retrying in the background", run.run_id, exc
            )
        task = asyncio.create_task(self._report_later(subject, report), name=f"run-ended-{run.run_id}")
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)
        return None

    async def _report_later(self, subject: str, report: RunEndedReport) -> None:
        try:
            # Spread: the reports an outage held back are not all sent in the same instant.
            await asyncio.sleep(random.uniform(0, REPORT_SPREAD))  # noqa: S311 - a spread, not a secret
            await ask(self._bus, self.availability, subject, report, RunEndedAck, deadline=REPORT_RETRY_SECONDS)
        except BusError as exc:
            log.error("run %s: its end never reached governance; its cost is not accounted (%s)", report.run_id, exc)

    async def screen(self, run: RunSubmission, kind: str, texts: list[str], *, source: str) -> ScreenResponse:
        """The injection screen's verdict on `texts` (`kind`: "tool_output" or "document").

        Raises:
            BusError: no verdict (the caller decides what fail-closed means for its texts).
        """
        request = ScreenRequest(kind=kind, texts=texts, source=source, run_id=run.run_id, principal=run.principal)
        return await self._ask(subjects.governance("screen"), request, ScreenResponse, retry=False)

    async def _ask(self, subject: str, request: Message, reply_type: type[M], *, retry: bool = True) -> M:
        """One question within this client's timeout (see `governance_availability.ask`)."""
        return await ask(self._bus, self.availability, subject, request, reply_type, deadline=self.timeout, retry=retry)
