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
from atmosphere.governance.handlers import GovernanceHandlers, runtime_info
from atmosphere.governance.plane import NO_POLICY as POLICY
from atmosphere.governance.store import DecisionLog


async def test_every_decision_is_logged_and_listed(tmp_path: Path) -> None:
    bus = FakeBus()
    async with DecisionLog.open(tmp_path / "gov.db") as log, bus.serve(GovernanceHandlers(log).router()):
        admitted = await bus.request(
            subjects.governance("admit"),
            AdmitRequest(run_id="r1", agent="assistant", principal=Principal(user_id="ada")),
            Decision,
        )
        checked = await bus.request(
            subjects.governance("check_tool"), CheckToolCallRequest(run_id="r1", tool_name="local_time"), Decision
        )
        await bus.request(subjects.governance("admit"), AdmitRequest(run_id="r2", agent="echo"), Decision)
        mine = await bus.request(
            subjects.governance("decisions"), ListDecisionsRequest(run_id="r1"), ListDecisionsResponse
        )
        everything = await bus.request(
            subjects.governance("decisions"), ListDecisionsRequest(limit=-5), ListDecisionsResponse
        )
    assert admitted.allowed
    assert checked.allowed
    assert admitted.policy == POLICY
    assert admitted.decision_id != checked.decision_id
    assert sorted((d.operation, d.subject) for d in mine.decisions) == [
        ("admit", "assistant"),
        ("check_tool", "local_time"),
    ]
    assert len(everything.decisions) == 3
    assert all(d.decided_at.seconds > 0 for d in everything.decisions)
    # The log survives a restart.
    async with DecisionLog.open(tmp_path / "gov.db") as log:
        assert len(await log.recent(run_id="", limit=10)) == 3
    assert runtime_info() == {"governance": {"policies": [{"name": "admit-all"}], "decisionLog": "sqlite"}}
