import sqlite3
from pathlib import Path

import aiosqlite
import pytest

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
from atmosphere.governance.store import ArmedSwitch, DecisionLog, DecisionRow


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


async def test_every_write_is_committed_when_it_returns(tmp_path: Path) -> None:
    # What a process killed with -9 keeps: each write is committed before it returns (one
    # statement each, autocommit; the switch's two in one transaction), none left pending.
    path = tmp_path / "gov.db"
    row = DecisionRow("d1", "r1", "admit", "assistant", True, "admit-all", "", "ada", decided_at=1_000)
    async with DecisionLog.open(path) as log:
        assert await log.append(row, log_seq=3, counts=b"\x08\x01")
        assert not await log.append(row, log_seq=3)  # stored once
        await log.record_end("r1", log_seq=4, at_ms=2_000)
        assert await log.record_cost("r1", "acme", 0.25, at_ms=2_000)
        await log.save_switch(ArmedSwitch("incident", "ops", 3_000))
        await log.save_swap(swap_name="swap-1", text="policies: []")
        async with aiosqlite.connect(path) as other:  # sees only what is committed
            tables = ("decision_log", "run_ends", "cost_ledger", "kill_switch", "policy_swaps")
            counts = [(await (await other.execute(f"SELECT COUNT(*) FROM {t}")).fetchone())[0] for t in tables]
        assert counts == [1, 1, 1, 1, 1]
        await log.save_switch(None)
        assert await log.switch() is None


async def test_a_switch_that_fails_to_save_keeps_the_old_one_and_later_writes_commit(tmp_path: Path) -> None:
    path = tmp_path / "gov.db"
    async with DecisionLog.open(path) as log:
        await log.save_switch(ArmedSwitch("incident", "ops", 3_000))
        async with aiosqlite.connect(path) as other:  # SQLite itself refuses the next switch's row
            await other.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON kill_switch BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
            )
            await other.commit()
        with pytest.raises(sqlite3.IntegrityError, match="disk says no"):
            await log.save_switch(ArmedSwitch("another", "ops", 4_000))
        assert await log.switch() == ArmedSwitch("incident", "ops", 3_000)  # not half replaced
        await log.record_end("r1", log_seq=5, at_ms=5_000)
        async with aiosqlite.connect(path) as other:
            rows = await (await other.execute("SELECT run_id FROM run_ends")).fetchall()
        assert rows == [("r1",)]  # committed: no transaction was left open
