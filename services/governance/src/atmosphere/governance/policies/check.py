"""The Microsoft-compatible `/check` request and answer (Atmosphere's `POST /governance/check`).

Request `{"agent_id", "action", "context"}`: the context's entries become request metadata,
`action` is added as metadata `action` unless the context has one, `context.message` becomes the
message and `agent_id` the agent. Answer `{"allowed", "decision", "reason", "matched_policy",
"matched_source", "evaluation_ms"}`, the reason blank when allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from atmosphere.governance.policies.model import Admit, Deny, Phase, PolicyContext, Prefer, Transform
from atmosphere.governance.policies.ring import Evaluation, PolicyRing

_DECISION_NAMES: Final = {Admit: "allow", Deny: "deny", Transform: "transform", Prefer: "prefer"}


def _optional_text(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"'{key}' must be a string, got {type(value).__name__}")
    return value


def context_of(body: Mapping[str, Any]) -> PolicyContext:
    """The pre-admission context a `/check` body describes (a `ValueError` says what is wrong)."""
    if not isinstance(body, Mapping):
        raise ValueError("the body must be a JSON object with 'agent_id', 'action' and 'context'")
    agent_id = _optional_text(body, "agent_id")
    action = _optional_text(body, "action")
    raw = body.get("context")
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"'context' must be an object, got {type(raw).__name__}")
    metadata = {str(key): value for key, value in raw.items()}
    if action.strip():
        metadata.setdefault("action", action)
    message = metadata.get("message")
    return PolicyContext(
        phase=Phase.PRE_ADMISSION,
        message="" if message is None else str(message),
        agent_id=agent_id,
        metadata=metadata,
    )


def check_answer(evaluation: Evaluation) -> dict[str, Any]:
    """The `/check` answer for an evaluation."""
    decision = evaluation.decision
    return {
        "allowed": evaluation.allowed,
        "decision": _DECISION_NAMES[type(decision)],
        "reason": decision.reason if isinstance(decision, Deny) else "",
        "matched_policy": evaluation.policy.name if evaluation.policy else None,
        "matched_source": evaluation.policy.source if evaluation.policy else None,
        "evaluation_ms": round(evaluation.evaluation_ms, 2),
    }


def check_request(ring: PolicyRing, body: Mapping[str, Any]) -> dict[str, Any]:
    """Evaluate a `/check` body against the ring (§9.4 semantics) and answer in MS's shape."""
    return check_answer(ring.check(context_of(body)))
