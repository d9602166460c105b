"""The governance admin routes in-process: the real ingress app, and a stand-in governance on one `FakeBus`.

The stand-in answers governance's subjects as the brief of the governance side fixes them
(`atmo.gov.check`, `atmo.gov.admin.<op>`, `atmo.gov.decisions`) and records what it was sent,
so each test sees both what ingress forwarded and what it answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.bus.errors import GovernanceBadRequestError
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdminRequest,
    AdminResponse,
    CheckRequest,
    CheckResponse,
    DecisionRecord,
    ListDecisionsRequest,
    ListDecisionsResponse,
)
from atmosphere.ingress.api import create_app
from atmosphere.ingress.governance_admin import BODY_BYTES, admin_subject
from atmosphere.ingress.settings import IngressOptions, IngressSettings

ADMIN_TOKEN = "admin-token-1"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
CHECK = "/api/admin/governance/check"
DENIED = {
    "allowed": False,
    "decision": "deny",
    "reason": "Wire transfers need a human",
    "matched_policy": "production-policy",
    "matched_source": "yaml:/etc/policies.yaml",
    "evaluation_ms": 0.12,
}
POLICIES = [
    {
        "name": "no-deletes",
        "source": "yaml:/app/atmosphere-policies.yaml",
        "version": "1.0",
        "className": "DenyList",
        "digest": "sha256:ab12",
        "type": "deny-list",
    },
    {
        "name": "kill-switch",
        "source": "code:atmosphere.governance.KillSwitch",
        "version": "embedded",
        "className": "KillSwitch",
        "digest": "sha256:cd34",
        "type": "kill-switch",
        "armed": False,
        "armedReason": None,
        "armedAt": None,
    },
]
ARMED_AT = "2026-12-02T05:39:40Z"


@dataclass
class StandInGovernance:
    """Answers governance's admin subjects from canned JSON; `seen` is every (subject, body) it was sent."""

    seen: list[tuple[str, str]] = field(default_factory=list)
    records: list[DecisionRecord] = field(default_factory=list)
    armed: dict[str, Any] = field(default_factory=lambda: {"armed": False, "reason": None, "operator": None})

    def answer(self, op: str, body: dict[str, Any]) -> Any:
        if op == "policies":
            return POLICIES
        if op == "summary":
            return {"policyCount": 2, "sources": ["yaml:/app/atmosphere-policies.yaml"]}
        if op == "health":
            return {"status": "ok", "policyCount": 2, "killSwitch": {**self.armed, "armedAt": None}}
        if op == "reload":
            if body.get("yaml", "").startswith("{nope"):
                raise GovernanceBadRequestError("Reload refused, nothing changed: the YAML does not parse: line 1")
            return {
                "reloaded": body.get("swapName", "all"),
                "version": "2.0",
                "digest": "sha256:ef56",
                "policyCount": 2,
            }
        if op == "arm":
            self.armed = {"armed": True, "reason": body["reason"], "operator": body.get("operator") or "unknown"}
            return {**self.armed, "armedAt": ARMED_AT}
        self.armed = {"armed": False, "reason": None, "operator": None}
        return {**self.armed, "armedAt": None}

    def router(self) -> Router:
        router = Router()

        async def check(request: CheckRequest, _ctx: MessageContext) -> CheckResponse:
            self.seen.append((subjects.governance("check"), request.body_json))
            body = json.loads(request.body_json)
            answer = DENIED if body.get("action") == "wire_transfer" else {**DENIED, "allowed": True, "reason": ""}
            return CheckResponse(result_json=json.dumps(answer))

        async def decisions(request: ListDecisionsRequest, _ctx: MessageContext) -> ListDecisionsResponse:
            self.seen.append((subjects.governance("decisions"), f"{request.run_id}:{request.limit}"))
            return ListDecisionsResponse(decisions=self.records[: request.limit])

        router.add(subjects.governance("check"), CheckRequest, check)
        router.add(subjects.governance("decisions"), ListDecisionsRequest, decisions)
        for op in ("policies", "summary", "health", "reload", "arm", "disarm"):
            router.add(admin_subject(op), AdminRequest, self._admin(op))
        return router

    def _admin(self, op: str) -> Callable[[AdminRequest, MessageContext], Any]:
        async def handle(request: AdminRequest, _ctx: MessageContext) -> AdminResponse:
            self.seen.append((admin_subject(op), request.body_json))
            return AdminResponse(result_json=json.dumps(self.answer(op, json.loads(request.body_json))))

        return handle


@dataclass
class Admin:
    http: httpx.AsyncClient
    governance: StandInGovernance
    bus: FakeBus


@contextlib.asynccontextmanager
async def admin(*, governance: bool = True, max_payload: int = 4 * BODY_BYTES, **settings: Any) -> AsyncIterator[Admin]:
    """The real ingress app (its lifespan as in production) and, with `governance`, the stand-in serving."""
    bus = FakeBus(max_payload=max_payload)
    app = create_app(IngressSettings(**{"admin_token": ADMIN_TOKEN, **settings}), bus=bus)
    stand_in = StandInGovernance()
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        if governance:
            await stack.enter_async_context(bus.serve(stand_in.router()))
        transport = httpx.ASGITransport(app=app)
        client = await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url="http://ingress"))
        yield Admin(client, stand_in, bus)


# -- /check ----------------------------------------------------------------------------------------


async def test_check_passes_the_body_through_and_answers_governances_result_verbatim() -> None:
    body = {"agent_id": "banker", "action": "wire_transfer", "context": {"amount": 10, "memo": None, "tags": []}}
    async with admin() as a:
        denied = await a.http.post(CHECK, headers=ADMIN, json=body)
        allowed = await a.http.post(CHECK, headers=ADMIN, json={})
    assert denied.status_code == 200
    assert denied.json() == DENIED
    assert allowed.json()["allowed"] is True
    # What governance received is the body as the client sent it, nulls inside `context` included.
    assert [json.loads(b) for s, b in a.governance.seen] == [body, {}]
    assert {s for s, _ in a.governance.seen} == {"atmo.gov.check"}


@pytest.mark.parametrize(
    ("content", "status", "code"),
    [
        pytest.param(b"{nope", 400, "ingress.malformed_json", id="not-json"),
        pytest.param(b"[1, 2]", 400, "admin.bad_request", id="an-array"),
        pytest.param(b'"wire_transfer"', 400, "admin.bad_request", id="a-string"),
        pytest.param(b"null", 400, "admin.bad_request", id="null"),
        pytest.param(b"", 400, "ingress.malformed_json", id="empty"),
        pytest.param(b'{"agent_id": 7}', 400, "admin.bad_request", id="agent-id-a-number"),
        pytest.param(b'{"context": "amount=10"}', 400, "admin.bad_request", id="context-a-string"),
        pytest.param(b'{"action": ["a"]}', 400, "admin.bad_request", id="action-a-list"),
        pytest.param(b'{"action": "\\ud800"}', 400, "ingress.malformed_json", id="lone-surrogate"),
        pytest.param(b"\xff\xfe", 400, "ingress.bad_request", id="not-utf8"),
    ],
)
async def test_check_refuses_a_body_that_is_not_a_check(content: bytes, status: int, code: str) -> None:
    async with admin() as a:
        answer = await a.http.post(CHECK, headers=ADMIN, content=content)
    assert (answer.status_code, answer.json()["code"]) == (status, code), answer.text
    assert answer.json()["error"]
    assert a.governance.seen == []  # refused before anything reached governance


async def test_check_takes_a_mebibyte_and_refuses_one_byte_more() -> None:
    padding = BODY_BYTES - len(b'{"context": {"blob": ""}}')
    exact = b'{"context": {"blob": "' + b"x" * padding + b'"}}'
    assert len(exact) == BODY_BYTES
    async with admin() as a:
        taken = await a.http.post(CHECK, headers=ADMIN, content=exact)
        refused = await a.http.post(CHECK, headers=ADMIN, content=exact + b" ")
    assert taken.status_code == 200, taken.text
    assert (refused.status_code, refused.json()["code"]) == (413, "ingress.too_large")
    assert len(a.governance.seen) == 1


async def test_the_body_limit_shrinks_to_what_the_broker_carries() -> None:
    async with admin(max_payload=64 * 1024) as a:
        refused = await a.http.post(CHECK, headers=ADMIN, content=b'{"action": "' + b"x" * (64 * 1024) + b'"}')
    assert (refused.status_code, refused.json()["code"]) == (413, "ingress.too_large")
    assert a.governance.seen == []


async def test_a_malformed_check_that_governance_refuses_is_a_400() -> None:
    async with admin(governance=False) as a:
        router = Router()

        async def refuse(_request: CheckRequest, _ctx: MessageContext) -> CheckResponse:
            raise GovernanceBadRequestError("Malformed check: 'context' must be an object")

        router.add(subjects.governance("check"), CheckRequest, refuse)
        async with a.bus.serve(router):
            answer = await a.http.post(CHECK, headers=ADMIN, json={"action": "x"})
    assert (answer.status_code, answer.json()["code"]) == (400, "admin.bad_request")
    assert "context" in answer.json()["error"]


# -- the reads -------------------------------------------------------------------------------------


async def test_the_reads_answer_governances_json() -> None:
    async with admin() as a:
        policies = await a.http.get("/api/admin/governance/policies", headers=ADMIN)
        summary = await a.http.get("/api/admin/governance/summary", headers=ADMIN)
        health = await a.http.get("/api/admin/governance/health", headers=ADMIN)
    assert [r.status_code for r in (policies, summary, health)] == [200, 200, 200]
    assert policies.json() == POLICIES
    assert summary.json() == {"policyCount": 2, "sources": ["yaml:/app/atmosphere-policies.yaml"]}
    assert health.json()["killSwitch"]["armed"] is False
    assert [s for s, _ in a.governance.seen] == [
        "atmo.gov.admin.policies",
        "atmo.gov.admin.summary",
        "atmo.gov.admin.health",
    ]


async def test_a_governance_answer_that_is_not_json_is_a_503() -> None:
    async with admin(governance=False) as a:
        router = Router()

        async def garbled(_request: AdminRequest, _ctx: MessageContext) -> AdminResponse:
            return AdminResponse(result_json="<html>")

        router.add(admin_subject("summary"), AdminRequest, garbled)
        async with a.bus.serve(router):
            answer = await a.http.get("/api/admin/governance/summary", headers=ADMIN)
    assert (answer.status_code, answer.json()["code"]) == (503, "admin.unavailable")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        pytest.param("POST", CHECK, {"action": "x"}, id="check"),
        pytest.param("GET", "/api/admin/governance/policies", None, id="policies"),
        pytest.param("GET", "/api/admin/governance/summary", None, id="summary"),
        pytest.param("GET", "/api/admin/governance/health", None, id="health"),
        pytest.param("GET", "/api/admin/governance/decisions", None, id="decisions"),
        pytest.param("POST", "/api/admin/governance/reload", {"swapName": "p", "yaml": "policies: []"}, id="reload"),
        pytest.param("POST", "/api/admin/governance/kill-switch/arm", {"reason": "incident"}, id="arm"),
        pytest.param("POST", "/api/admin/governance/kill-switch/disarm", {}, id="disarm"),
    ],
)
async def test_every_route_is_gated_and_says_when_governance_is_absent(
    method: str, path: str, body: dict[str, Any] | None
) -> None:
    async with admin(governance=False) as a:
        anonymous = await a.http.request(method, path, json=body)
        wrong = await a.http.request(method, path, json=body, headers={"authorization": "Bearer nope"})
        absent = await a.http.request(method, path, json=body, headers=ADMIN)
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "admin.unauthorized")
    assert (wrong.status_code, wrong.json()["code"]) == (401, "admin.unauthorized")
    assert (absent.status_code, absent.json()["code"]) == (404, "admin.absent")
    assert "governance" in absent.json()["error"]


async def test_a_silent_governance_is_a_503() -> None:
    async with admin(governance=False, ingress=IngressOptions(admin_timeout=0.05)) as a:
        router = Router()
        never = asyncio.Event()

        async def silent(_request: AdminRequest, _ctx: MessageContext) -> AdminResponse:
            await never.wait()
            return AdminResponse()

        router.add(admin_subject("health"), AdminRequest, silent)
        async with a.bus.serve(router):
            answer = await a.http.get("/api/admin/governance/health", headers=ADMIN)
            never.set()
    assert (answer.status_code, answer.json()["code"]) == (503, "admin.unavailable")


# -- the changes: reload and the kill switch -------------------------------------------------------


async def test_reload_arm_and_disarm_forward_their_bodies_and_answer_governance() -> None:
    reload = {"swapName": "production", "yaml": "policies:\n  - {name: p, type: kill-switch}\n"}
    async with admin() as a:
        reloaded = await a.http.post("/api/admin/governance/reload", headers=ADMIN, json=reload)
        armed = await a.http.post(
            "/api/admin/governance/kill-switch/arm", headers=ADMIN, json={"reason": "incident 7", "operator": "ada"}
        )
        health = await a.http.get("/api/admin/governance/health", headers=ADMIN)
        disarmed = await a.http.post(
            "/api/admin/governance/kill-switch/disarm", headers=ADMIN, json={"operator": "ada"}
        )
    assert reloaded.json() == {"reloaded": "production", "version": "2.0", "digest": "sha256:ef56", "policyCount": 2}
    assert armed.json() == {"armed": True, "reason": "incident 7", "operator": "ada", "armedAt": ARMED_AT}
    assert health.json()["killSwitch"]["reason"] == "incident 7"
    assert disarmed.json()["armed"] is False
    sent = {s: json.loads(b) for s, b in a.governance.seen}
    assert sent["atmo.gov.admin.reload"] == reload
    assert sent["atmo.gov.admin.disarm"] == {"operator": "ada"}


async def test_a_reload_naming_nothing_rereads_the_files() -> None:
    async with admin() as a:
        answer = await a.http.post("/api/admin/governance/reload", headers=ADMIN, json={})
    assert answer.json()["reloaded"] == "all"
    assert a.governance.seen == [("atmo.gov.admin.reload", "{}")]


async def test_a_yaml_that_does_not_parse_is_a_400() -> None:
    async with admin() as a:
        answer = await a.http.post(
            "/api/admin/governance/reload", headers=ADMIN, json={"swapName": "production", "yaml": "{nope"}
        )
    assert (answer.status_code, answer.json()["code"]) == (400, "admin.bad_request")
    assert "line 1" in answer.json()["error"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param("/api/admin/governance/reload", {"yaml": "policies: []"}, id="reload-no-swap-name"),
        pytest.param("/api/admin/governance/reload", {"swapName": "p"}, id="reload-no-yaml"),
        pytest.param("/api/admin/governance/reload", {"swapName": "  ", "yaml": ""}, id="reload-blank-swap-name"),
        pytest.param("/api/admin/governance/reload", {"swapName": "p", "yaml": 3}, id="reload-yaml-a-number"),
        pytest.param("/api/admin/governance/reload", {"swapName": "p", "yaml": ""}, id="reload-empty-yaml"),
        pytest.param("/api/admin/governance/reload", {"swapName": None, "yaml": "x"}, id="reload-null-swap-name"),
        pytest.param("/api/admin/governance/kill-switch/arm", {}, id="arm-no-reason"),
        pytest.param("/api/admin/governance/kill-switch/arm", {"reason": " \t"}, id="arm-blank-reason"),
        pytest.param("/api/admin/governance/kill-switch/arm", {"reason": "r", "operator": 1}, id="arm-operator-number"),
        pytest.param("/api/admin/governance/kill-switch/disarm", [], id="disarm-an-array"),
    ],
)
async def test_a_change_with_an_unusable_body_is_a_400(path: str, body: Any) -> None:
    async with admin() as a:
        answer = await a.http.post(path, headers=ADMIN, json=body)
    assert (answer.status_code, answer.json()["code"]) == (400, "admin.bad_request"), answer.text
    assert a.governance.seen == []


async def test_changes_need_the_admin_token_even_when_reads_are_open() -> None:
    arm = ("/api/admin/governance/kill-switch/arm", {"reason": "r"})
    async with admin(admin_http_read_auth_required=False) as a:
        read = await a.http.get("/api/admin/governance/policies")
        check = await a.http.post(CHECK, json={"action": "x"})
        anonymous = await a.http.post(arm[0], json=arm[1])
        with_token = await a.http.post(arm[0], json=arm[1], headers=ADMIN)
    assert (read.status_code, check.status_code) == (200, 200)
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "admin.unauthorized")
    assert with_token.status_code == 200
    assert [s for s, _ in a.governance.seen if "arm" in s] == ["atmo.gov.admin.arm"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/admin/governance/reload",
        "/api/admin/governance/kill-switch/arm",
        "/api/admin/governance/kill-switch/disarm",
    ],
)
async def test_without_an_admin_token_changes_are_refused_even_with_reads_open(path: str) -> None:
    async with admin(admin_http_read_auth_required=False, admin_token="") as a:
        read = await a.http.get("/api/admin/governance/summary")
        change = await a.http.post(path, json={"swapName": "p", "yaml": "", "reason": "r"})
        guessed = await a.http.post(
            path, json={"swapName": "p", "yaml": "", "reason": "r"}, headers={"authorization": "Bearer "}
        )
    assert read.status_code == 200
    assert (change.status_code, change.json()["code"]) == (403, "admin.forbidden")
    assert (guessed.status_code, guessed.json()["code"]) == (403, "admin.forbidden")
    assert not [s for s, _ in a.governance.seen if "summary" not in s]


async def test_without_an_admin_token_reads_are_refused_too() -> None:
    async with admin(admin_token="") as a:
        check = await a.http.post(CHECK, json={})
    assert (check.status_code, check.json()["code"]) == (403, "admin.forbidden")


async def test_a_change_too_large_is_a_413() -> None:
    async with admin() as a:
        answer = await a.http.post(
            "/api/admin/governance/reload",
            headers=ADMIN,
            content=b'{"swapName": "p", "yaml": "' + b"#" * BODY_BYTES + b'"}',
        )
    assert (answer.status_code, answer.json()["code"]) == (413, "ingress.too_large")


# -- the decision log ------------------------------------------------------------------------------


def record(decision_id: str, **fields: Any) -> DecisionRecord:
    at = Timestamp()
    at.FromMilliseconds(1_764_653_980_123)
    base: dict[str, Any] = {
        "decision_id": decision_id,
        "run_id": "run-1",
        "operation": "check_tool",
        "subject": "delete_file",
        "allowed": False,
        "policy": "no-deletes",
        "reason": "deny-list: tool argument matched a denied phrase",
        "decided_at": at,
        "principal": "ada",
        "policy_source": "yaml:/app/atmosphere-policies.yaml",
        "policy_version": "1.0",
        "policy_digest": "sha256:ab12",
        "outcome": "deny",
        "evaluation_ms": 0.04,
        "context_json": json.dumps({"phase": "pre_admission", "message": "call_tool:delete_file", "memo": None}),
    }
    return DecisionRecord(**{**base, **fields})


async def test_decisions_are_rows_in_the_seeds_shape() -> None:
    async with admin() as a:
        a.governance.records = [record("d2"), record("d1", allowed=True, outcome="", context_json="", reason="")]
        answer = await a.http.get(
            "/api/admin/governance/decisions", headers=ADMIN, params={"runId": "run-1", "limit": 5}
        )
    assert answer.status_code == 200
    newest, older = answer.json()
    assert newest == {
        "timestamp": "2025-12-02T05:39:40.123Z",
        "policy_name": "no-deletes",
        "policy_source": "yaml:/app/atmosphere-policies.yaml",
        "policy_version": "1.0",
        "decision": "deny",
        "reason": "deny-list: tool argument matched a denied phrase",
        "evaluation_ms": 0.04,
        "context_snapshot": {"phase": "pre_admission", "message": "call_tool:delete_file", "memo": None},
        "decision_id": "d2",
        "run_id": "run-1",
        "operation": "check_tool",
        "subject": "delete_file",
        "principal": "ada",
        "allowed": False,
        "policy_digest": "sha256:ab12",
    }
    # A row without an outcome (written before outcomes were) reads as what it allowed.
    assert (older["decision"], older["context_snapshot"]) == ("admit", {})
    assert a.governance.seen == [("atmo.gov.decisions", "run-1:5")]


async def test_a_snapshot_that_is_not_an_object_still_shows_the_row() -> None:
    async with admin() as a:
        a.governance.records = [record("d1", context_json="[1, 2]")]
        answer = await a.http.get("/api/admin/governance/decisions", headers=ADMIN)
    assert answer.status_code == 200
    assert answer.json()[0]["context_snapshot"] == {"unreadable": "[1, 2]"}


@pytest.mark.parametrize(
    ("query", "code"),
    [
        pytest.param({"limit": "0"}, "ingress.bad_request", id="limit-zero"),
        pytest.param({"limit": "1001"}, "ingress.bad_request", id="limit-too-many"),
        pytest.param({"limit": "abc"}, "ingress.bad_request", id="limit-abc"),
        pytest.param({"runId": "a.b"}, "admin.bad_request", id="run-id-dotted"),
        pytest.param({"runId": "r" * 129}, "ingress.bad_request", id="run-id-long"),
    ],
)
async def test_a_malformed_decisions_query_is_a_400(query: dict[str, str], code: str) -> None:
    async with admin() as a:
        answer = await a.http.get("/api/admin/governance/decisions", headers=ADMIN, params=query)
    assert (answer.status_code, answer.json()["code"]) == (400, code)
    assert a.governance.seen == []


# -- methods and unknown paths ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        pytest.param("GET", CHECK, "POST", id="get-check"),
        pytest.param("PUT", CHECK, "POST", id="put-check"),
        pytest.param("DELETE", "/api/admin/governance/kill-switch/arm", "POST", id="delete-arm"),
        pytest.param("OPTIONS", "/api/admin/governance/reload", "POST", id="options-reload"),
        pytest.param("POST", "/api/admin/governance/policies", "GET", id="post-policies"),
        pytest.param("PATCH", "/api/admin/governance/decisions", "GET", id="patch-decisions"),
        pytest.param("POST", "/api/admin/agents", "GET", id="post-agents"),
        pytest.param("DELETE", "/api/admin/tape/runs/r1/steps", "GET", id="delete-steps"),
    ],
)
async def test_another_method_on_an_admin_path_is_a_405_naming_exactly_its_methods(
    method: str, path: str, allow: str
) -> None:
    async with admin() as a:
        answer = await a.http.request(method, path, headers=ADMIN)
    assert (answer.status_code, answer.headers["allow"]) == (405, allow)
    assert answer.json()["code"] == "ingress.method_not_allowed"
    assert a.governance.seen == []


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
async def test_an_unknown_admin_path_is_a_json_404_whatever_the_method(method: str) -> None:
    async with admin() as a:
        unknown = await a.http.request(method, "/api/admin/governance/nothing", headers=ADMIN)
        traversal = await a.http.request(method, "/api/admin/governance/..%2Fpolicies", headers=ADMIN)
    assert (unknown.status_code, unknown.json()["code"]) == (404, "admin.not_found")
    assert "allow" not in unknown.headers
    assert (traversal.status_code, traversal.json()["code"]) == (400, "admin.bad_request")


def test_the_dotted_admin_subjects_are_tokens_under_governance() -> None:
    assert admin_subject("policies") == "atmo.gov.admin.policies"
    with pytest.raises(ValueError, match="operation"):
        admin_subject("a.b")
