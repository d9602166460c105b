"""Governance's responders: admission, tool-call checks, the memory-injection screen, the log.

Admissions, tool calls and answers are decided by the policy plane (`plane.py`): the app's
`atmosphere-policies.yaml`, the configured policy files (native or Microsoft schema) and the
app's Python policies, behind the kill switch; with none installed everything is admitted under
`admit-all`, and the log and the runtime info say so. Every decision names its policy (name,
source, version, digest) and is logged with its evaluation time and context snapshot — of an
answer's checks, the final one and any that stopped it (a streamed answer is checked every 200
characters). A run's end feeds cost accounting and frees its concurrency slot. Facts bound for
long-term memory, tool results and retrieved documents are screened for prompt injection
(`screening.py`, fail-closed); every non-safe verdict is logged.

Whatever changes state goes through governance's log (`replication.py`): decisions, run ends,
the kill switch and reloads are applied by every replica; reads wait for this replica to have
applied what the log held when they began.

Each area has its own responders (`responders/`: decisions, screens, the log and admin); this
routes governance's subjects to them.

Bounds: ids and names longer than `MAX_FIELD_CHARS` are refused (`governance.bad_request`)
before anything is decided or logged; every answer fits in one bus message (`max_payload`):
facts the screen's answer has no room for are refused (never passed unscreened), and the
decision log is returned newest first as far as it fits (`truncated`).
"""

from __future__ import annotations

from typing import Any

from atmosphere.bus import Router, subjects
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, reply_budget
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdminRequest,
    AdmitRequest,
    CheckOutputRequest,
    CheckRequest,
    CheckToolCallRequest,
    ListDecisionsRequest,
    RunEndedReport,
    ScreenFactsRequest,
    ScreenRequest,
)
from atmosphere.governance.plane import NO_POLICY, GovernancePlane
from atmosphere.governance.replication import GovernanceJournal, GovernanceReplica
from atmosphere.governance.responders.admin import ADMIN_OPS, AdminResponders
from atmosphere.governance.responders.common import MAX_FIELD_CHARS
from atmosphere.governance.responders.decisions import DecisionResponders
from atmosphere.governance.responders.screens import TIER, MemorySafety, ScreenResponders
from atmosphere.governance.screening import Screening
from atmosphere.governance.store import DecisionLog

__all__ = ["MAX_FIELD_CHARS", "GovernanceHandlers", "MemorySafety", "runtime_info"]


def runtime_info(
    safety: MemorySafety | None = None, plane: GovernancePlane | None = None, screening: Screening | None = None
) -> dict[str, Any]:
    """Governance's runtime-truth fragment: the policies and screens really in force."""
    policies = plane.identities() if plane is not None and plane.policies else [{"name": NO_POLICY}]
    governance: dict[str, Any] = {"policies": policies, "decisionLog": "sqlite"}
    if plane is not None:
        governance["killSwitch"] = plane.kill_switch_state()
        governance["checksOutput"] = plane.judges_output
        # The table runs are charged with (costs, budgets), so a client can price a run's usage alike.
        governance["pricing"] = {"unit": "USD per million tokens", "models": plane.pricing.listed()}
    info: dict[str, Any] = {"governance": governance}
    if safety is not None and safety.enabled:
        info["memorySafety"] = {"active": True, "tier": TIER, "breach": safety.breach.value}
    if screening is not None:
        info.update(screening.runtime_info())
    return info


class GovernanceHandlers:
    """Admission, tool-call and answer checks, run ends, screens, the decision log, the admin surface."""

    def __init__(
        self,
        log: DecisionLog,
        safety: MemorySafety | None = None,
        *,
        plane: GovernancePlane | None = None,
        screening: Screening | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        journal: GovernanceJournal | None = None,
    ) -> None:
        """Decide with `plane` (none: admit all), record every decision in `log`, screen per `safety`/`screening`.

        `journal` puts what changes state on governance's log, where every replica applies it to
        its own `log` and `plane`; without one (a single governance) it applies here at once.
        """
        self.plane = plane or GovernancePlane(())
        journal = journal or GovernanceJournal(GovernanceReplica(log, self.plane))
        reply_bytes = reply_budget(max_payload)
        self._decisions = DecisionResponders(self.plane, journal)
        self._screens = ScreenResponders(
            safety or MemorySafety(), screening or Screening(), journal, reply_bytes=reply_bytes
        )
        self._admin = AdminResponders(log, self.plane, journal, reply_bytes=reply_bytes)

    def router(self) -> Router:
        """Governance's subjects."""
        router = Router()
        router.add(subjects.governance("check"), CheckRequest, self._admin.check)
        router.add(subjects.governance("admit"), AdmitRequest, self._decisions.admit)
        router.add(subjects.governance("check_tool"), CheckToolCallRequest, self._decisions.check_tool)
        router.add(subjects.governance("check_output"), CheckOutputRequest, self._decisions.check_output)
        router.add(subjects.governance("run_ended"), RunEndedReport, self._decisions.run_ended)
        router.add(subjects.governance("screen"), ScreenRequest, self._screens.screen)
        router.add(subjects.governance("decisions"), ListDecisionsRequest, self._admin.decisions)
        router.add(subjects.governance("screen_facts"), ScreenFactsRequest, self._screens.screen_facts)
        for op in ADMIN_OPS:
            router.add(subjects.governance(f"admin.{op}"), AdminRequest, self._admin.admin(op))
        return router
