"""A coordinator run's remote fleet members: which one `delegate_task` names, and the governed call to it.

The edge is governed as a local sub-run's: governance admits it (`atmo.gov.admit` with the parent
run, the member's name as the agent, its URL in the metadata; a policy may deny it or rewrite the
message) before anything is sent, and its end is reported (`atmo.gov.run_ended`: the slot admission
took is freed) on every path. When a policy judges answers, the remote's text passes the output
guard a local sub-run's passes (held until a check covers it) and the whole answer a final check
before it is returned. The call itself is `remote_delegation.RemoteCall`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Mapping

from atmosphere.bus.errors import GovernanceDeniedError, GovernanceUnavailableError
from atmosphere.contracts.governance.v1.governance_pb2 import Decision
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.dispatch.governance_client import GovernanceClient
from atmosphere.dispatch.output_guard import OutputGuard
from atmosphere.dispatch.remote_delegation import (
    REMOTE_METADATA_KEY,
    Emit,
    RemoteCall,
    RemoteLimits,
    RemoteMember,
    RemoteOutcome,
    missing_client,
)


class RemoteFleet:
    """The remote members one coordinator run may delegate to, and how it calls them."""

    def __init__(
        self,
        members: Mapping[str, RemoteMember],
        *,
        governance: GovernanceClient | None,
        limits: RemoteLimits,
        emit: Emit,
    ) -> None:
        """Call `members` admitted by `governance` (none: every call refused, fail-closed), within `limits`."""
        self._members = dict(members)
        self._governance = governance
        self._limits = limits
        self._emit = emit

    @property
    def names(self) -> list[str]:
        """The members' names, as declared."""
        return list(self._members)

    def find(self, agent: str) -> RemoteMember | None:
        """The member `agent` names, by its name or by its URL (never any URL that is not a member's)."""
        if agent in self._members:
            return self._members[agent]
        url = agent.rstrip("/")
        return next((m for m in self._members.values() if m.url and m.url.rstrip("/") == url), None)

    @staticmethod
    def metadata(member: RemoteMember) -> dict[str, str]:
        """The admission metadata of a call to `member` (a local member's, and its URL)."""
        return {"fleet.dispatch.agent": member.name, "fleet.dispatch.skill": "default", REMOTE_METADATA_KEY: member.url}

    def refusal(self, member: RemoteMember) -> str | None:
        """Why a call to `member` cannot be made from here at all, or None."""
        missing = missing_client()
        if missing is not None:
            return f"Error: delegate_task cannot reach the remote agent '{member.name}': {missing}"
        failed = f"delegate_task to '{member.name}' failed"
        if not member.url:
            return f"{failed}: no URL is configured for it (its url in ATMOSPHERE_DELEGATION__REMOTES)"
        if self._governance is None:
            return f"{failed}: governance is unavailable (fail-closed)"
        return None

    async def delegate(self, member: RemoteMember, child: RunSubmission) -> str:
        """Send `child`'s message to `member` on the governed edge; its answer, or a failure text."""
        refusal = self.refusal(member)
        if refusal is not None:
            return refusal
        governance = self._governance
        assert governance is not None  # `refusal` refuses without it
        failed = f"delegate_task to '{member.name}' failed"
        try:
            decision = await governance.admission(child)
        except (GovernanceDeniedError, GovernanceUnavailableError) as exc:
            return f"{failed}: {exc.message}"
        outcome = RemoteOutcome(error="the remote call did not end")
        try:
            # When a policy judges answers, the remote's text reaches the client only as checks pass
            # (the output guard a local sub-run has), and the whole answer is checked at the end.
            check = functools.partial(_check, governance, child)
            guard = OutputGuard(check, run_id=child.run_id) if decision.check_output else None
            call = RemoteCall(member, child, self._emit, self._limits, guard=guard)
            outcome = await call.run(decision.rewritten_message or child.message)
        finally:
            # What admission took (a concurrency slot) is freed on every path, as a sub-run's end does.
            report = governance.run_ended(
                child,
                usage=[],
                model="",
                response_chars=len(outcome.text),
                succeeded=outcome.error is None and not outcome.timed_out,
            )
            with contextlib.suppress(Exception):
                await asyncio.shield(report)
        if outcome.timed_out:
            return f"{failed}: no reply within {self._limits.timeout:g} seconds"
        if outcome.error is not None:
            return f"{failed}: {outcome.error}"
        return outcome.text


async def _check(governance: GovernanceClient, child: RunSubmission, tail: str, length: int, final: bool) -> Decision:
    return await governance.check_output(child, tail, length=length, final=final)
