"""Governance's real `serve()` on a `FakeBus`: the composition root wires every subject it answers."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from pathlib import Path

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    CheckToolCallRequest,
    Decision,
    ListDecisionsRequest,
    ListDecisionsResponse,
)
from atmosphere.governance.app import serve
from atmosphere.governance.settings import GovernanceSettings
from atmosphere.testing import running_service


@contextlib.asynccontextmanager
async def governance(tmp_path: Path) -> AsyncIterator[FakeBus]:
    """Governance served by its real `serve()` on a fresh `FakeBus`; stopped and awaited on exit."""
    bus = FakeBus()
    settings = GovernanceSettings(data_dir=tmp_path / "data", probe_host="127.0.0.1", probe_port=0)
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
