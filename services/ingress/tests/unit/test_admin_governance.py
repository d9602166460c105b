"""`POST /api/admin/governance/check` end to end in-process: the real ingress app and real governance handlers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from atmosphere.bus.testing import FakeBus
from atmosphere.governance.handlers import GovernanceHandlers
from atmosphere.governance.plane import load_ring
from atmosphere.governance.store import DecisionLog
from atmosphere.ingress.api import create_app
from atmosphere.ingress.settings import IngressSettings

ADMIN = {"authorization": "Bearer admin-token-1"}
POLICIES = """\
name: production-policy
rules:
  - name: block-wire-transfers
    condition: {field: action, operator: eq, value: wire_transfer}
    action: deny
    priority: 100
    message: "Wire transfers need a human"
defaults: {action: allow}
"""


@contextlib.asynccontextmanager
async def admin(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    bus = FakeBus()
    app = create_app(IngressSettings(admin_token="admin-token-1"), bus=bus)
    files = tmp_path / "ms.yaml"
    files.write_text(POLICIES)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        log = await stack.enter_async_context(DecisionLog.open(tmp_path / "governance.db"))
        ring = load_ring(tmp_path / "no-app", [files])
        await stack.enter_async_context(bus.serve(GovernanceHandlers(log, ring=ring).router()))
        transport = httpx.ASGITransport(app=app)
        yield await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url="http://ingress"))


async def test_check_answers_on_microsofts_wire(tmp_path: Path) -> None:
    async with admin(tmp_path) as http:
        denied = await http.post(
            "/api/admin/governance/check",
            headers=ADMIN,
            json={"agent_id": "banker", "action": "wire_transfer", "context": {"amount": 10}},
        )
        allowed = await http.post(
            "/api/admin/governance/check", headers=ADMIN, json={"agent_id": "banker", "action": "balance"}
        )
    assert denied.status_code == 200
    body = denied.json()
    assert (body["allowed"], body["decision"], body["reason"], body["matched_policy"]) == (
        False,
        "deny",
        "Wire transfers need a human",
        "production-policy",
    )
    assert body["matched_source"].startswith("yaml:")
    assert allowed.json()["allowed"] is True
    assert allowed.json()["reason"] == ""


async def test_check_refuses_what_is_not_a_check(tmp_path: Path) -> None:
    async with admin(tmp_path) as http:
        anonymous = await http.post("/api/admin/governance/check", json={"action": "x"})
        not_json = await http.post("/api/admin/governance/check", headers=ADMIN, content=b"{nope")
        a_list = await http.post("/api/admin/governance/check", headers=ADMIN, json=[1, 2])
        huge = await http.post("/api/admin/governance/check", headers=ADMIN, content=b"x" * (65 * 1024))
    assert anonymous.status_code in {401, 403}
    assert (not_json.status_code, a_list.status_code, huge.status_code) == (400, 400, 413)
    assert "error" in not_json.json() or "message" in not_json.json() or "detail" in not_json.json()
