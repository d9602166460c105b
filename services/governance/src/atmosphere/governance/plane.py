"""The policy plane as governance runs it: the ring loaded at start, and each request as a policy context.

Policies come from `atmosphere-policies.yaml` in the app directory (`ATMOSPHERE_APP_DIR`) and
from the files listed in `ATMOSPHERE_GOVERNANCE__POLICY_FILES`, in that order; a file that does
not parse stops governance at start (fail-closed), naming the file and line. No policy at all
admits everything, and says so.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import AdmitRequest, CheckToolCallRequest, Decision
from atmosphere.governance.policies import (
    Admit,
    ConcurrencyLimitPolicy,
    CostCeilingPolicy,
    Deny,
    Evaluation,
    OutputLengthZScorePolicy,
    Phase,
    PolicyContext,
    PolicyFileError,
    PolicyRing,
    Prefer,
    Transform,
    load_policy_files,
)

APP_POLICY_FILE = "atmosphere-policies.yaml"
"""The policy file an app ships in its directory."""
NO_POLICY = "admit-all"
"""What the log names when no policy is installed (everything is admitted)."""


def policy_paths(app_dir: Path, files: Sequence[Path]) -> list[Path]:
    """The policy files in force: the app's own (if it has one), then the configured ones."""
    own = app_dir / APP_POLICY_FILE
    return [own, *files] if own.is_file() else list(files)


NOT_YET_FED = {
    ConcurrencyLimitPolicy: "concurrency-limit needs each run's end",
    CostCeilingPolicy: "cost-ceiling needs each run's cost",
    OutputLengthZScorePolicy: "output-length-zscore needs each streamed answer",
}
"""Policy types whose input governance does not receive yet: refused at start rather than
installed and silently never deciding (a concurrency slot would never be released)."""


def load_ring(app_dir: Path, files: Sequence[Path]) -> PolicyRing:
    """The ring of every policy in force.

    Raises:
        PolicyFileError: a file does not parse, or installs a policy this governance cannot feed yet.
    """
    policies = load_policy_files(policy_paths(app_dir, files))
    for policy in policies:
        missing = NOT_YET_FED.get(type(policy))
        if missing is not None:
            identity = policy.identity
            msg = f"{identity.source}: policy {identity.name!r} is not supported here yet: {missing}"
            raise PolicyFileError(msg)
    return PolicyRing(policies)


def _subject(principal: Principal) -> str:
    return principal.user_id


def admission_context(request: AdmitRequest) -> PolicyContext:
    """A run about to start, as policies see it."""
    principal = request.principal
    return PolicyContext(
        phase=Phase.PRE_ADMISSION,
        message=request.message,
        user_id=_subject(principal),
        agent_id=request.agent,
        metadata={"transport": request.transport, "roles": list(principal.roles), "action": "run"},
    )


def tool_context(request: CheckToolCallRequest) -> PolicyContext:
    """A tool call about to run (the seed's synthetic `call_tool:<tool>` request)."""
    try:
        arguments = json.loads(request.arguments_json or "{}")
    except ValueError:
        arguments = {}
    return PolicyContext.for_tool_call(
        tool=request.tool_name,
        arguments=arguments if isinstance(arguments, dict) else {},
        user_id=_subject(request.principal),
        agent_id=request.agent,
        conversation_id="",
        session_id="",
        roles=tuple(request.principal.roles),
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision as governance answers and logs it."""

    decision: Decision

    @classmethod
    def of(cls, evaluation: Evaluation, *, decision_id: str, original_message: str) -> Outcome:
        """The answer for `evaluation` (its policy's identity included)."""
        identity = evaluation.policy
        answer = Decision(
            decision_id=decision_id,
            policy=identity.name if identity is not None else NO_POLICY,
            policy_source=identity.source if identity is not None else "",
            policy_version=identity.version if identity is not None else "",
            policy_digest=identity.digest if identity is not None else "",
        )
        result = evaluation.decision
        if isinstance(result, Deny):
            answer.allowed, answer.outcome, answer.reason = False, "deny", result.reason
        elif isinstance(result, Transform):
            answer.allowed, answer.outcome, answer.reason = True, "transform", "request rewritten"
            if result.context.message != original_message:
                answer.rewritten_message = result.context.message
        elif isinstance(result, Prefer):
            answer.allowed, answer.outcome = True, "prefer"
            answer.reason = f"prefer {result.preferred}: {result.reason}"
        else:
            assert isinstance(result, Admit)
            answer.allowed, answer.outcome = True, "admit"
            answer.reason = "no policy restricts this request" if identity is None else ""
        return cls(answer)


def identities(ring: PolicyRing) -> list[dict[str, Any]]:
    """The policies in force, for the runtime info."""
    return [dataclasses.asdict(policy.identity) for policy in ring.policies]
