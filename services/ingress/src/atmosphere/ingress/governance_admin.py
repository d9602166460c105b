"""The governance admin surface, proxied over the bus to governance (behaviour reference §9.4, §9.5).

    POST /api/admin/governance/check                 {agent_id, action, context} → {allowed, decision, reason, …}
    GET  /api/admin/governance/policies              the policies in force, with their identity and counters
    GET  /api/admin/governance/summary               {policyCount, sources}
    GET  /api/admin/governance/health                {status, policyCount, killSwitch}
    GET  /api/admin/governance/decisions?limit=&runId=   the decision log, newest first, in the seed's shape
    POST /api/admin/governance/reload                {swapName, yaml} → {reloaded, version, digest, policyCount}
    POST /api/admin/governance/kill-switch/arm       {reason, operator} → {armed: true, reason, operator, armedAt}
    POST /api/admin/governance/kill-switch/disarm    {operator} → {armed: false, …}

Reads (and `/check`, which decides nothing) pass the admin reads gate; the three POSTs that change
governance always need the admin token (`require_admin_write`). Bodies are read within
`BODY_BYTES`, parsed totally and validated here against the schema the OpenAPI document declares,
so what the document calls valid is what is accepted; governance validates again and its
`BadRequestError` (a YAML that does not parse, say) is a 400 that leaves the old policy in force.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from google.protobuf.message import Message
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from atmosphere.bus import Bus, subjects
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdminRequest,
    AdminResponse,
    CheckRequest,
    CheckResponse,
    DecisionRecord,
    ListDecisionsRequest,
    ListDecisionsResponse,
)
from atmosphere.ingress.bodies import parse_json
from atmosphere.ingress.errors import AdminBadRequestError, AdminUnavailableError, BodyError
from atmosphere.ingress.http import (
    ADMIN_ERRORS,
    OPTIONAL_ID,
    admin_call,
    admin_timeout,
    bounded_text,
    error_responses,
    require_admin,
    require_admin_write,
    state_of,
    valid_id,
)
from atmosphere.ingress.inbound import message_limit, require_fits

log = logging.getLogger("atmosphere.ingress.governance")

M = TypeVar("M", bound=Message)
B = TypeVar("B", bound=BaseModel)

BODY_BYTES = 1 << 20
"""The largest body of these routes (a `/check` context, a policy file): 1 MiB, or less if the broker's limit is."""
PREFIX = "/api/admin/governance"
BODY_ERRORS = error_responses(400, 401, 403, 404, 413, 503)
"""What a route reading a body may answer besides its 200: the reads' errors, and 413 for a body too large."""

router = APIRouter()


def admin_subject(op: str) -> str:
    """`atmo.gov.admin.<op>`, where `op` is one token (`policies`, `reload`, `arm`, …)."""
    return subjects.governance(f"admin.{subjects.token(op, what='operation')}")


# -- the OpenAPI document's bodies and answers, which are also what ingress validates ----------------


class _Body(BaseModel):
    """A request body: types are checked strictly (a number is not a string), unknown keys are kept."""

    model_config = ConfigDict(strict=True, extra="allow")


class CheckBody(_Body):
    """Microsoft's `/check` request; every field optional, `context` an object of any JSON values (nulls too)."""

    agent_id: str | None = None
    action: str | None = None
    context: dict[str, Any] | None = None


def _undocumented_default(schema: dict[str, Any]) -> None:
    """Leave a field's placeholder default out of the document: absent means absent, not an empty value."""
    schema.pop("default", None)


class ReloadBody(_Body):
    """Which policy to replace and the YAML (native or Microsoft schema) replacing it; neither: re-read the files.

    Both or neither (`dependentRequired`): a name without a document, or a document without a name, is a 400.
    """

    model_config = ConfigDict(
        strict=True,
        extra="allow",
        json_schema_extra={"dependentRequired": {"swapName": ["yaml"], "yaml": ["swapName"]}},
    )

    swapName: str = Field(  # noqa: N815 - the wire's camelCase
        default="", min_length=1, max_length=256, pattern=r"\S", json_schema_extra=_undocumented_default
    )
    yaml: str = Field(default="", min_length=1, json_schema_extra=_undocumented_default)

    @model_validator(mode="after")
    def _both_or_neither(self) -> ReloadBody:
        if ("swapName" in self.model_fields_set) != ("yaml" in self.model_fields_set):
            msg = "a reload names both 'swapName' and 'yaml', or neither (re-read the policy files)"
            raise ValueError(msg)
        return self


class ArmBody(_Body):
    """Why the kill switch is armed (shown in every denial while it is), and by whom."""

    reason: str = Field(min_length=1, max_length=1024, pattern=r"\S")
    operator: str | None = Field(default=None, max_length=256)


class DisarmBody(_Body):
    """Who disarms the kill switch."""

    operator: str | None = Field(default=None, max_length=256)


class _Answer(BaseModel):
    """An answer governance composes; documented here, passed on verbatim (extra keys are allowed)."""

    model_config = ConfigDict(extra="allow")


class CheckResult(_Answer):
    """Microsoft's `/check` answer; `reason` is blank when allowed."""

    allowed: bool
    decision: Literal["allow", "deny", "transform", "prefer"]
    reason: str
    matched_policy: str | None
    matched_source: str | None
    evaluation_ms: float


class PolicyEntry(_Answer):
    """One policy in force: its identity, and the counters of dry-run and kill-switch entries."""

    name: str
    source: str
    version: str
    className: str  # noqa: N815
    digest: str
    type: str | None = None
    dryRun: bool | None = None  # noqa: N815
    wrappedPolicyName: str | None = None  # noqa: N815
    shadowAdmits: int | None = None  # noqa: N815
    shadowDenies: int | None = None  # noqa: N815
    shadowTransforms: int | None = None  # noqa: N815
    shadowPrefers: int | None = None  # noqa: N815
    delegateErrors: int | None = None  # noqa: N815
    armed: bool | None = None
    armedReason: str | None = None  # noqa: N815
    armedAt: str | None = None  # noqa: N815


class Summary(_Answer):
    """How many policies are in force, and where they came from."""

    policyCount: int  # noqa: N815
    sources: list[str]
    killSwitchArmed: bool | None = None  # noqa: N815
    judgesOutput: bool | None = None  # noqa: N815
    heldConcurrencySlots: int | None = None  # noqa: N815
    spendUsdByTenant: dict[str, float] | None = None  # noqa: N815
    pricedModels: int | None = None  # noqa: N815


class KillSwitchState(_Answer):
    """The kill switch: `reason`, `operator` and `armedAt` are null while it is disarmed."""

    armed: bool
    reason: str | None = None
    operator: str | None = None
    armedAt: str | None = None  # noqa: N815


class Health(_Answer):
    """Governance's own view of itself."""

    status: str
    policyCount: int  # noqa: N815
    killSwitch: KillSwitchState  # noqa: N815
    checkedAt: str | None = None  # noqa: N815


class Reloaded(_Answer):
    """The swap took: what was reloaded (the swap name, or `all`), the new document's version and digest."""

    reloaded: str
    version: str
    digest: str
    policyCount: int  # noqa: N815


class DecisionRow(BaseModel):
    """One decision-log row: the seed's `AuditEntry` fields, then Atmosphere's own."""

    timestamp: str = Field(description="ISO 8601 (RFC 3339, UTC)")
    policy_name: str
    policy_source: str
    policy_version: str
    decision: str = Field(description="admit, transform, deny, prefer or error")
    reason: str
    evaluation_ms: float
    context_snapshot: dict[str, Any]
    decision_id: str
    run_id: str
    operation: str = Field(description="admit, check_tool, check_output or screen_fact")
    subject: str
    principal: str
    allowed: bool
    policy_digest: str


def _request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI `requestBody` of a route that reads `model` as JSON itself (required, `application/json`)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


def _answers(model: Any, errors: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    return {200: {"model": model, "description": "governance's answer, as it gave it"}, **errors}


# -- reading a body and asking governance ------------------------------------------------------------


def body_limit(request: Request) -> int:
    """`BODY_BYTES`, or less when the broker's `max_payload` leaves no room for the envelope around that much."""
    return message_limit(BODY_BYTES, state_of(request).bus.max_payload)


async def read_object(request: Request, model: type[B]) -> tuple[str, B]:
    """The body as JSON text and validated as `model`; 413 past `body_limit`, 400 for anything else unusable."""
    text = await bounded_text(request, limit=body_limit(request))
    try:
        value = parse_json(text)
    except BodyError as exc:
        raise exc.as_ingress_error() from None
    if not isinstance(value, dict):
        msg = f"The body must be a JSON object, not {_json_type(value)}"
        raise AdminBadRequestError(msg)
    try:
        return text, model.model_validate(value)
    except ValidationError as exc:
        raise AdminBadRequestError(_invalid(exc)) from None


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _invalid(exc: ValidationError) -> str:
    """The first few problems, short: where and what (never the offending value)."""
    parts = [f"{'.'.join(str(p) for p in e['loc'])[:80] or 'body'}: {e['msg'][:120]}" for e in exc.errors()[:5]]
    return "Invalid body: " + "; ".join(parts)


async def ask_governance(request: Request, subject: str, message: M, reply_type: type[Any]) -> Any:
    """Send `message` to governance on `subject`; its reply (the bus failure's `AdminError` otherwise)."""

    async def ask(bus: Bus) -> Any:
        require_fits(message, bus.max_payload, what="The body")  # 413, after the gate
        return await bus.request(subject, message, reply_type, timeout=admin_timeout(request))

    return await admin_call(request, "governance", ask)


def _verbatim(result_json: str) -> JSONResponse:
    """Governance's JSON answer as it gave it (a reply that is not JSON is governance failing: 503)."""
    try:
        value = json.loads(result_json)
    except ValueError:
        log.warning("governance answered an admin request with something that is not JSON")
        raise AdminUnavailableError("The governance service answered something that is not JSON") from None
    return JSONResponse(value)


async def _admin_op(request: Request, op: str, body_json: str = "{}") -> JSONResponse:
    reply: AdminResponse = await ask_governance(
        request, admin_subject(op), AdminRequest(body_json=body_json), AdminResponse
    )
    return _verbatim(reply.result_json)


# -- the routes ----------------------------------------------------------------------------------


@router.post(
    f"{PREFIX}/check",
    summary="What the policies in force say of an action (Microsoft /check wire)",
    openapi_extra=_request_body(CheckBody),
    response_model=None,
    responses=_answers(CheckResult, BODY_ERRORS),
)
async def governance_check(request: Request) -> JSONResponse:
    """`{"agent_id", "action", "context"}` → `{"allowed", "decision", "reason", "matched_policy", …}`.

    Evaluated as a pre-admission of `agent_id`: the context's entries become request metadata,
    `action` is added as metadata `action`, `context.message` is the message. Nothing is logged.
    """
    require_admin(state_of(request), request)  # before a byte of the body is read
    text, _ = await read_object(request, CheckBody)
    reply: CheckResponse = await ask_governance(
        request, subjects.governance("check"), CheckRequest(body_json=text), CheckResponse
    )
    return _verbatim(reply.result_json)


@router.get(
    f"{PREFIX}/policies",
    summary="The policies in force, in evaluation order",
    response_model=None,
    responses=_answers(list[PolicyEntry], ADMIN_ERRORS),
)
async def governance_policies(request: Request) -> JSONResponse:
    """`[{name, source, version, className, digest, type, …}]`; dry-run and kill-switch entries add their state."""
    return await _admin_op(request, "policies")


@router.get(
    f"{PREFIX}/summary",
    summary="How many policies, from where",
    response_model=None,
    responses=_answers(Summary, ADMIN_ERRORS),
)
async def governance_summary(request: Request) -> JSONResponse:
    """`{policyCount, sources}`."""
    return await _admin_op(request, "summary")


@router.get(
    f"{PREFIX}/health",
    summary="Governance's health and the kill switch",
    response_model=None,
    responses=_answers(Health, ADMIN_ERRORS),
)
async def governance_health(request: Request) -> JSONResponse:
    """`{status, policyCount, killSwitch: {armed, reason, operator, armedAt}}`."""
    return await _admin_op(request, "health")


async def _write(request: Request, op: str, model: type[BaseModel]) -> JSONResponse:
    """A change to governance: the admin token, always; then a valid body; then governance's answer."""
    require_admin_write(state_of(request), request)
    text, _ = await read_object(request, model)
    return await _admin_op(request, op, text)


@router.post(
    f"{PREFIX}/reload",
    summary="Replace a swappable policy with a new YAML document (hot reload)",
    openapi_extra=_request_body(ReloadBody),
    response_model=None,
    responses=_answers(Reloaded, BODY_ERRORS),
)
async def governance_reload(request: Request) -> JSONResponse:
    """`{swapName, yaml}` → `{reloaded, version, digest, policyCount}`; a YAML that does not parse is a 400."""
    return await _write(request, "reload", ReloadBody)


@router.post(
    f"{PREFIX}/kill-switch/arm",
    summary="Deny everything from now on (break glass)",
    openapi_extra=_request_body(ArmBody),
    response_model=None,
    responses=_answers(KillSwitchState, BODY_ERRORS),
)
async def governance_arm(request: Request) -> JSONResponse:
    """`{reason, operator}` → `{armed: true, reason, operator, armedAt}`."""
    return await _write(request, "arm", ArmBody)


@router.post(
    f"{PREFIX}/kill-switch/disarm",
    summary="Let traffic through again",
    openapi_extra=_request_body(DisarmBody),
    response_model=None,
    responses=_answers(KillSwitchState, BODY_ERRORS),
)
async def governance_disarm(request: Request) -> JSONResponse:
    """`{operator}` → `{armed: false, …}`."""
    return await _write(request, "disarm", DisarmBody)


def decision_row(record: DecisionRecord) -> dict[str, Any]:
    """A `DecisionRecord` in the seed's shape (`GET /decisions`), with Atmosphere's ids after it."""
    return {
        "timestamp": record.decided_at.ToJsonString(),
        "policy_name": record.policy,
        "policy_source": record.policy_source,
        "policy_version": record.policy_version,
        # A row written before outcomes were recorded says only whether it was allowed.
        "decision": record.outcome or ("admit" if record.allowed else "deny"),
        "reason": record.reason,
        "evaluation_ms": record.evaluation_ms,
        "context_snapshot": _snapshot(record),
        "decision_id": record.decision_id,
        "run_id": record.run_id,
        "operation": record.operation,
        "subject": record.subject,
        "principal": record.principal,
        "allowed": record.allowed,
        "policy_digest": record.policy_digest,
    }


def _snapshot(record: DecisionRecord) -> dict[str, Any]:
    if not record.context_json:
        return {}
    try:
        value = json.loads(record.context_json)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        # Governance's bug, not the reader's: the row is still shown, its snapshot says what happened.
        log.warning("decision %s has a context snapshot that is not a JSON object", record.decision_id)
        return {"unreadable": record.context_json[:200]}
    return value


@router.get(
    f"{PREFIX}/decisions",
    summary="The decision log, newest first",
    response_model=None,
    responses=_answers(list[DecisionRow], ADMIN_ERRORS),
)
async def governance_decisions(
    request: Request,
    runId: Annotated[str, Query(max_length=128, json_schema_extra={"pattern": OPTIONAL_ID})] = "",  # noqa: N803
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JSONResponse:
    """One row per admission, tool-call, output and memory-fact check, as many as fit in one bus reply.

    `[{timestamp, policy_name, policy_source, policy_version, decision, reason, evaluation_ms,
    context_snapshot, decision_id, run_id, operation, subject, principal, allowed, policy_digest}]`.
    """
    if runId and not valid_id(runId):
        raise AdminBadRequestError("Malformed runId")
    reply: ListDecisionsResponse = await ask_governance(
        request,
        subjects.governance("decisions"),
        ListDecisionsRequest(run_id=runId, limit=limit),
        ListDecisionsResponse,
    )
    return JSONResponse([decision_row(d) for d in reply.decisions])
