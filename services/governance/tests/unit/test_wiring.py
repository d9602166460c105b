"""Governance's real `serve()` on a `FakeBus`: the composition root wires every subject it answers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal, Usage
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdminRequest,
    AdminResponse,
    AdmitRequest,
    CheckRequest,
    CheckResponse,
    CheckToolCallRequest,
    Decision,
    ListDecisionsRequest,
    ListDecisionsResponse,
    RunEndedAck,
    RunEndedReport,
)
from atmosphere.governance.app import serve
from atmosphere.governance.policies import PolicyFileError
from atmosphere.governance.settings import GovernanceSettings
from atmosphere.testing import running_service


@contextlib.asynccontextmanager
async def governance(tmp_path: Path, **extra: Any) -> AsyncIterator[FakeBus]:
    """Governance served by its real `serve()` on a fresh `FakeBus`; stopped and awaited on exit."""
    bus = FakeBus()
    settings = GovernanceSettings(data_dir=tmp_path / "data", probe_host="127.0.0.1", probe_port=0, **extra)
    async with running_service("governance", functools.partial(serve, bus=bus), settings, bus=bus):
        yield bus


async def test_serve_admits_checks_tools_and_logs_both_through_the_bus(tmp_path: Path) -> None:
    async with governance(tmp_path) as bus:
        principal = Principal(user_id="ada")
        admitted = await bus.request(
            subjects.governance("admit"), AdmitRequest(run_id="r1", agent="echo", principal=principal), Decision
        )
        checked = await bus.request(
            subjects.governance("check_tool"),
            CheckToolCallRequest(run_id="r1", agent="echo", tool_name="add", principal=principal),
            Decision,
        )
        log = await bus.request(
            subjects.governance("decisions"), ListDecisionsRequest(run_id="r1"), ListDecisionsResponse
        )
    assert admitted.allowed
    assert admitted.policy == "admit-all"
    assert checked.allowed
    assert {(d.operation, d.subject, d.principal) for d in log.decisions} == {
        ("admit", "echo", "ada"),
        ("check_tool", "add", "ada"),
    }
    assert (tmp_path / "data" / "governance.db").exists()


APP_POLICIES = """\
version: "2.1"
policies:
  - name: no-secrets
    type: deny-list
    config:
      phrases: ["launch codes"]
  - name: no-deletes
    type: deny-list
    config:
      regex: ["^call_tool:delete_"]
"""

MS_POLICIES = """\
name: production-policy
rules:
  - name: block-wire-transfers
    condition: {field: action, operator: eq, value: wire_transfer}
    action: deny
    priority: 100
    message: "Wire transfers need a human"
defaults: {action: allow}
"""


async def test_the_apps_policies_and_the_configured_files_decide_every_edge(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "atmosphere-policies.yaml").write_text(APP_POLICIES)
    ms = tmp_path / "ms.yaml"
    ms.write_text(MS_POLICIES)
    extra = {"app_dir": app, "governance": {"policy_files": [ms]}}
    async with governance(tmp_path, **extra) as bus:
        principal = Principal(user_id="ada")

        async def admit(message: str) -> Decision:
            run = AdmitRequest(run_id="r1", agent="echo", message=message, principal=principal)
            return await bus.request(subjects.governance("admit"), run, Decision)

        fine, secret = await admit("hello"), await admit("What are the LAUNCH CODES?")
        call = CheckToolCallRequest(run_id="r1", agent="echo", tool_name="delete_file", principal=principal)
        deleted = await bus.request(subjects.governance("check_tool"), call, Decision)
        body = {"agent_id": "banker", "action": "wire_transfer", "context": {"amount": 10}}
        check = await bus.request(subjects.governance("check"), CheckRequest(body_json=json.dumps(body)), CheckResponse)
        log = await bus.request(
            subjects.governance("decisions"), ListDecisionsRequest(run_id="r1"), ListDecisionsResponse
        )
    assert (fine.allowed, fine.outcome) == (True, "admit")
    assert (secret.allowed, secret.policy, secret.reason) == (
        False,
        "no-secrets",
        "deny-list: request matched a denied phrase",
    )
    assert secret.policy_source == f"yaml:{app / 'atmosphere-policies.yaml'}"
    assert (secret.policy_version, secret.policy_digest[:7]) == ("2.1", "sha256:")
    assert (deleted.allowed, deleted.policy) == (False, "no-deletes")
    answer = json.loads(check.result_json)
    assert (answer["allowed"], answer["decision"], answer["matched_policy"]) == (
        False,
        "deny",
        "production-policy",
    )
    assert answer["reason"] == "Wire transfers need a human"
    assert [(d.operation, d.allowed, d.policy) for d in reversed(log.decisions)] == [
        ("admit", True, "policy-ring"),  # every installed policy admitted it
        ("admit", False, "no-secrets"),
        ("check_tool", False, "no-deletes"),
    ]


async def test_a_policy_file_that_does_not_parse_stops_governance_at_start_naming_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("policies:\n  - name: x\n    type: no-such-type\n")
    settings = GovernanceSettings(
        data_dir=tmp_path / "data", probe_host="127.0.0.1", probe_port=0, governance={"policy_files": [bad]}
    )
    bus = FakeBus()
    with pytest.raises(PolicyFileError, match=r"bad.yaml:3"):
        await serve(settings, stop=asyncio.Event(), bus=bus)


async def test_a_tenants_spend_survives_a_restart_of_governance(tmp_path: Path) -> None:
    cap = tmp_path / "cap.yaml"
    cap.write_text("policies:\n  - {name: cap, type: cost-ceiling, config: {budget-usd: 1}}\n")
    pricing = tmp_path / "pricing.json"
    pricing.write_text('{"models": {"m": {"input": 1000000, "output": 1000000}}}')  # $1 a token
    extra = {"governance": {"policy_files": [cap], "pricing_file": pricing}}
    acme = Principal(user_id="wile", tenant="acme")
    report = RunEndedReport(run_id="r1", agent="a", principal=acme, model="m", usage=[Usage(input_tokens=2)])
    async with governance(tmp_path, **extra) as bus:
        ack = await bus.request(subjects.governance("run_ended"), report, RunEndedAck)
        assert (ack.tenant, ack.cost_usd) == ("acme", 2.0)
    async with governance(tmp_path, **extra) as bus:
        again = await bus.request(subjects.governance("run_ended"), report, RunEndedAck)  # a late retry
        assert again.cost_usd == 2.0
        admission = AdmitRequest(run_id="r2", agent="a", message="hi", principal=acme)
        refused = await bus.request(subjects.governance("admit"), admission, Decision)
        summary = await bus.request(subjects.governance("admin.summary"), AdminRequest(), AdminResponse)
    assert not refused.allowed
    assert refused.reason == "cost ceiling reached for tenant acme (spent 2.0000 of budget 1.0)"
    assert json.loads(summary.result_json)["spendUsdByTenant"] == {"acme": 2.0}  # counted once, across the restart
