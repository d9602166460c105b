"""Sandbox's series move where calls end: the app's tools, `code_exec`, `eval`; its open code sessions.

Counters are process-wide: every assertion compares a delta around the action. The tool
workers' kills and live count are in `tests/integration/test_tool_workers.py` (real processes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from prometheus_client import REGISTRY

from atmosphere.bus import subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.sandbox import metrics
from atmosphere.sandbox.code import CODE_EXEC_TOOL, CodeSessions, CodeSettings, ExecResult
from atmosphere.sandbox.code.results import Language
from atmosphere.sandbox.code.tool import run_code_exec
from atmosphere.sandbox.handlers import ToolHost
from atmosphere.sandbox.js.pool import EvalOutcome, EvalPool
from atmosphere.sandbox.js.tool import EVAL_TOOL, run_eval
from atmosphere.sdk import ApprovalRequired, tool


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def delta(name: str, **labels: str) -> Callable[[], float]:
    """How much the sample moved since this was called."""
    before = sample(name, **labels)
    return lambda: sample(name, **labels) - before


def executions(kind: str, outcome: str) -> Callable[[], float]:
    return delta("atmosphere_sandbox_executions_total", kind=kind, outcome=outcome)


def kills(kind: str, reason: str) -> Callable[[], float]:
    return delta("atmosphere_sandbox_kills_total", kind=kind, reason=reason)


@tool
def double(n: int) -> int:
    """Twice `n`."""
    return 2 * n


@tool
def broken() -> str:
    """Always fails."""
    raise RuntimeError("disk full")


@tool(timeout=0.05)
async def slow() -> str:
    """Too slow."""
    await asyncio.sleep(5)
    return "late"


@tool
def pay() -> str:
    """Needs a human first."""
    raise ApprovalRequired("Pay 5 EUR?")


async def test_each_call_of_an_app_tool_is_counted_by_outcome_and_timed() -> None:
    moved = {outcome: executions("tool", outcome) for outcome in ("ok", "error", "timeout", "approval")}
    timed = delta("atmosphere_sandbox_execution_duration_seconds_count", kind="tool")
    bus = FakeBus()
    async with bus.serve(ToolHost({t.name: t for t in (double, broken, slow, pay)}).router()):
        calls = (("double", '{"n": 2}'), ("broken", "{}"), ("slow", "{}"), ("pay", "{}"), ("double", "[1]"))
        for name, arguments in calls:  # the last: arguments that are no JSON object
            call = ToolCall(call_id="c", name=name, arguments_json=arguments)
            await bus.request(subjects.tool(name), call, ToolReply)
    assert {outcome: round(moved[outcome]()) for outcome in moved} == {"ok": 1, "error": 2, "timeout": 1, "approval": 1}
    assert timed() == 5


@dataclass
class OneSandbox:
    """A backend whose every run comes to `result`."""

    result: ExecResult

    @property
    def name(self) -> str:
        return "fake"

    def languages(self) -> tuple[Language, ...]:
        return ("python",)

    async def open(self, session_id: str) -> OneSandbox:
        return self

    async def run(self, language: Language, code: str) -> ExecResult:
        return self.result

    async def close(self) -> None:
        pass


async def exec_once(result: ExecResult, arguments: str = '{"language": "python", "code": "print(1)"}') -> None:
    sessions = CodeSessions(OneSandbox(result), CodeSettings())
    try:
        await run_code_exec(sessions, ToolCall(call_id="c", name=CODE_EXEC_TOOL, arguments_json=arguments))
    finally:
        await sessions.close()


async def test_code_exec_names_what_stopped_the_code() -> None:
    ok, error, timeout, killed = (executions(CODE_EXEC_TOOL, o) for o in ("ok", "error", "timeout", "killed"))
    over_time, over_memory = kills(CODE_EXEC_TOOL, "timeout"), kills(CODE_EXEC_TOOL, "memory")

    await exec_once(ExecResult(exit_code=0, stdout="1\n", stderr=""))
    await exec_once(ExecResult(exit_code=1, stdout="", stderr="Traceback"))
    await exec_once(ExecResult(exit_code=0, stdout="", stderr=""), arguments="{nope")
    await exec_once(ExecResult(exit_code=137, stdout="", stderr="", timed_out=True, limit="timeout"))
    await exec_once(ExecResult(exit_code=137, stdout="", stderr="", limit="memory"))

    assert (ok(), error(), timeout(), killed()) == (1, 2, 1, 1)  # a non-zero exit is the code's own error
    assert (over_time(), over_memory()) == (1, 1)


async def test_the_open_code_sessions_are_read_at_each_scrape() -> None:
    sessions = CodeSessions(OneSandbox(ExecResult(exit_code=0, stdout="", stderr="")), CodeSettings())
    metrics.observe_code_sessions(sessions)
    try:
        await sessions.exec("run-1", "python", "print(1)")
        await sessions.exec("run-2", "python", "print(2)")
        assert sample("atmosphere_sandbox_code_sessions") == 2
        await sessions.release("run-1")
        assert sample("atmosphere_sandbox_code_sessions") == 1
    finally:
        await sessions.close()
    assert sample("atmosphere_sandbox_code_sessions") == 0


@dataclass
class Answers:
    """Stands in for an `EvalPool`: every evaluation comes to `outcome`."""

    outcome: EvalOutcome

    async def evaluate(self, code: str) -> EvalOutcome:
        return self.outcome


async def test_eval_counts_timeouts_and_memory_kills() -> None:
    ok, error, timeout, killed = (executions(EVAL_TOOL, o) for o in ("ok", "error", "timeout", "killed"))
    over_time, over_memory, died = (kills(EVAL_TOOL, r) for r in ("timeout", "memory", "crashed"))
    outcomes = [
        EvalOutcome("result", "2"),
        EvalOutcome("error", "ReferenceError: x is not defined"),
        EvalOutcome("busy", "Error: eval is busy"),
        EvalOutcome("timeout", "Error: eval timed out after 100 ms"),
        EvalOutcome("oom", "Error: eval ran out of memory"),
        EvalOutcome("stopped", "Error: the JavaScript worker stopped"),
    ]
    for outcome in outcomes:
        await run_eval(cast(EvalPool, Answers(outcome)), ToolCall(call_id="c", arguments_json='{"code": "1+1"}'))
    await run_eval(cast(EvalPool, Answers(outcomes[0])), ToolCall(call_id="c", arguments_json='{"cod": "1"}'))

    assert (ok(), error(), timeout(), killed()) == (1, 3, 1, 2)
    assert (over_time(), over_memory(), died()) == (1, 1, 1)
