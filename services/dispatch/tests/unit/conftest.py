"""A dispatch executor on the in-memory bus, with stand-ins for governance and the sandbox."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from atmosphere.bus import JetStreamLayout, MessageContext, Router, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    CheckToolCallRequest,
    Decision,
    RunEndedAck,
    RunEndedReport,
    ScreenedText,
    ScreenRequest,
    ScreenResponse,
)
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.dispatch.handlers import RunExecutor
from atmosphere.dispatch.model_side import ModelSide
from atmosphere.dispatch.run_scope import ExecutorOptions
from atmosphere.dispatch.runtime.openai import BuiltInAgentRuntime
from atmosphere.sdk import App
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.testing import ScriptedModel


@dataclass
class Policy:
    """What the stand-in governance answers."""

    admit: bool = True
    tools: bool = True
    denied_tools: frozenset[str] = frozenset()
    """Tool names (as governance sees them) denied even when `tools` allows the rest."""
    reason: str = "not allowed here"
    check_delay: float = 0.0
    """Seconds the tool check takes (longer than the timeout: governance "does not answer")."""
    checks: list[CheckToolCallRequest] = field(default_factory=list)
    admissions: list[AdmitRequest] = field(default_factory=list)
    rewrite: str = ""
    """A transform's rewritten message (e.g. PII redacted); empty: none."""
    screens: list[ScreenRequest] = field(default_factory=list)
    ended: list[RunEndedReport] = field(default_factory=list)
    """The run ends reported (`atmo.gov.run_ended`)."""
    screen: Callable[[str], ScreenedText] = lambda text: ScreenedText(keep=True, text=text, verdict="SAFE")
    """The injection screen's verdict on one text (by default: safe, kept as it is)."""


def screen_answer(policy: Policy) -> Callable[[ScreenRequest, MessageContext], Awaitable[ScreenResponse]]:
    """Governance's side of `atmo.gov.screen`, answering with `policy.screen` per text."""

    async def screen(request: ScreenRequest, _ctx: MessageContext) -> ScreenResponse:
        policy.screens.append(request)
        return ScreenResponse(texts=[policy.screen(text) for text in request.texts], tier="RULE_BASED", mode="TEST")

    return screen


def governance_router(policy: Policy) -> Router:
    router = Router()

    async def admit(request: AdmitRequest, _ctx: MessageContext) -> Decision:
        policy.admissions.append(request)
        return Decision(
            allowed=policy.admit, policy="test-policy", reason=policy.reason, rewritten_message=policy.rewrite
        )

    async def check(request: CheckToolCallRequest, _ctx: MessageContext) -> Decision:
        policy.checks.append(request)
        if policy.check_delay:
            await asyncio.sleep(policy.check_delay)
        allowed = policy.tools and request.tool_name not in policy.denied_tools
        return Decision(allowed=allowed, policy="test-policy", reason=policy.reason)

    router.add(subjects.governance("admit"), AdmitRequest, admit)
    router.add(subjects.governance("check_tool"), CheckToolCallRequest, check)
    router.add(subjects.governance("screen"), ScreenRequest, screen_answer(policy))

    async def run_ended(request: RunEndedReport, _ctx: MessageContext) -> RunEndedAck:
        policy.ended.append(request)
        return RunEndedAck(tenant=request.principal.tenant or "__default__", priced=True)

    router.add(subjects.governance("run_ended"), RunEndedReport, run_ended)
    return router


def tool_router(results: dict[str, str], calls: list[ToolCall], delay: float = 0.0) -> Router:
    router = Router()
    for name, content in results.items():

        async def answer(call: ToolCall, _ctx: MessageContext, content: str = content) -> ToolReply:
            calls.append(call)
            if delay:
                await asyncio.sleep(delay)
            return ToolReply(call_id=call.call_id, content=content, is_error=content.startswith("Error:"))

        router.add(subjects.tool(name), ToolCall, answer)
    return router


@dataclass
class Harness:
    bus: FakeBus
    provider: ScriptedModel
    policy: Policy
    tool_calls: list[ToolCall]
    stack: contextlib.AsyncExitStack

    def executor(self, app: App, *, with_runtime: bool = True, **options: Any) -> RunExecutor:
        runtime = (
            BuiltInAgentRuntime(RuntimeConfig(base_url=self.provider.base_url, model="fake-model", stall_timeout=5))
            if with_runtime
            else None
        )
        if runtime is not None:
            self.stack.push_async_callback(runtime.aclose)
        return RunExecutor(app, self.bus, ModelSide(runtime), ExecutorOptions(**options))

    async def serve_governance(self) -> None:
        await self.stack.enter_async_context(self.bus.serve(governance_router(self.policy)))

    async def serve_tools(self, results: dict[str, str], delay: float = 0.0) -> None:
        await self.stack.enter_async_context(self.bus.serve(tool_router(results, self.tool_calls, delay)))

    def events(self, run_id: str = "r1") -> list[RunEvent]:
        found = [
            RunEvent.FromString(data)
            for subject, data in self.bus.stream_messages(subjects.EVENTS_STREAM)
            if subject == subjects.run_events(run_id)
        ]
        return sorted(found, key=lambda e: e.seq)


def kinds(events: list[RunEvent]) -> list[str]:
    return [e.WhichOneof("kind") or "" for e in events]


def request(agent: str, message: str = "a b c", run_id: str = "r1") -> RunSubmission:
    return RunSubmission(run_id=run_id, session_id="s1", conversation_id="c1", agent=agent, message=message)


@pytest.fixture
async def harness(fake_provider: ScriptedModel) -> AsyncIterator[Harness]:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    async with contextlib.AsyncExitStack() as stack:
        h = Harness(bus=bus, provider=fake_provider, policy=Policy(), tool_calls=[], stack=stack)
        await h.serve_governance()
        yield h
