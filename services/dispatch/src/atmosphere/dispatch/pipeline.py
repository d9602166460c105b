"""`session.stream(message)`: interceptors, the runtime, budgets and tools for one run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from atmosphere.bus.runs import RunEventWriter, is_terminal
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunRequest
from atmosphere.dispatch.budget import BudgetExceededError, BudgetMeter
from atmosphere.dispatch.conversation import ConversationMemory
from atmosphere.dispatch.harness import AgentHarness
from atmosphere.dispatch.memory_client import HistoryUnavailableError
from atmosphere.dispatch.tools import ToolGateway
from atmosphere.sdk import AiRequest, CacheHint, ChatMessage, PromptCache, StreamingSession
from atmosphere.sdk.host import AgentSpec, BudgetReason
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime, ToolSpec

log = logging.getLogger("atmosphere.dispatch")

HISTORY_METADATA_KEY = "ai.request.history"
"""Request metadata with prior turns (JSON list of `{role, content}`), set by the OpenAI API."""
MAX_HISTORY_TURNS = 200

NO_RUNTIME = "No model runtime is available: set LLM_BASE_URL (and LLM_MODEL) to an OpenAI-compatible provider"


@dataclass
class RunSink:
    """Where a run's session events go: the event writer, plus text capture and the budget."""

    writer: RunEventWriter
    meter: BudgetMeter | None = None
    text: list[str] = field(default_factory=list)
    breach: BudgetExceededError | None = None
    on_breach: Callable[[], object] | None = None
    session: StreamingSession | None = None
    failed: bool = False
    """The run ended with an error event."""
    before_terminal: Callable[[RunEvent], Awaitable[None]] | None = None
    """Runs just before the terminal event is published (memory records the turn there)."""

    async def __call__(self, event: RunEvent) -> None:
        """Publish `event`; then count it against the budget (usage is forwarded before the check)."""
        if self.before_terminal is not None and is_terminal(event):
            hook, self.before_terminal = self.before_terminal, None
            await hook(event)
        await self.writer.emit(event)
        kind = event.WhichOneof("kind")
        if kind == "text_delta" and not event.origin_run_id:  # a sub-agent's text is not the answer
            self.text.append(event.text_delta.text)
        elif kind == "error":
            self.failed = True
        elif kind == "usage" and self.meter is not None and self.breach is None:
            try:
                self.meter.add(event.usage)
            except BudgetExceededError as exc:
                await self.trip(exc)

    async def trip(self, breach: BudgetExceededError) -> None:
        """End the run with one error frame and stop the model call."""
        self.breach = breach
        if self.session is not None:
            await self.session.error(str(breach), code="budget.exceeded")
        if self.on_breach is not None:
            self.on_breach()


def history_of(run: RunRequest) -> tuple[ChatMessage, ...]:
    """Prior turns the client sent with the request (the OpenAI API), bounded and sanitized.

    A client's system messages ride along as history; they never replace the agent's own
    system prompt.
    """
    raw = run.metadata.get(HISTORY_METADATA_KEY)
    if not raw:
        return ()
    try:
        turns = json.loads(raw)
    except json.JSONDecodeError:
        log.warning("run %s: ignoring malformed %s", run.run_id, HISTORY_METADATA_KEY)
        return ()
    if not isinstance(turns, list):
        return ()
    history = [
        ChatMessage(turn["role"], turn["content"])
        for turn in turns[-MAX_HISTORY_TURNS:]
        if isinstance(turn, dict)
        and turn.get("role") in {"system", "user", "assistant"}
        and isinstance(turn.get("content"), str)
    ]
    return tuple(history)


def cache_hint(spec: AgentSpec, harness: AgentHarness, run: RunRequest) -> CacheHint | None:
    """The prompt-cache hint of a run: one key per agent, or per agent and conversation."""
    if harness.prompt_cache is PromptCache.NONE:
        return None
    key = f"atmo:{spec.name}"
    if harness.prompt_cache is PromptCache.AGGRESSIVE:
        key = f"{key}:{run.conversation_id}"
    return CacheHint(harness.prompt_cache, key)


class ModelPipeline:
    """Answers `session.stream(message)` for every run of this dispatch instance."""

    def __init__(self, runtime: AgentRuntime | None, conversation: ConversationMemory | None = None) -> None:
        """Use `runtime` (None when no runtime is available) and `conversation` for memory."""
        self.runtime = runtime
        self.conversation = conversation

    async def stream(
        self,
        *,
        spec: AgentSpec,
        run: RunRequest,
        session: StreamingSession,
        sink: RunSink,
        gateway: ToolGateway,
        tools: Mapping[str, ToolSpec],
        message: str,
        harness: AgentHarness | None = None,
    ) -> None:
        """Run one model exchange to its terminal event."""
        if self.runtime is None:
            await session.error(NO_RUNTIME, code="runtime.unavailable")
            return
        harness = harness or AgentHarness()
        staged = history_of(run)
        memory = self.conversation
        try:
            history = await memory.history(run, harness, staged) if memory is not None else staged
        except HistoryUnavailableError as exc:  # never answered as if the conversation were new
            await session.error(str(exc), code=exc.code)
            return
        request = AiRequest(
            message=message,
            system_prompt=spec.system_prompt,
            history=history,
            model=spec.model,
            metadata=dict(run.metadata),
            response_format=spec.response_format,
            cache_hint=cache_hint(spec, harness, run),
        )
        for interceptor in spec.interceptors:
            try:
                request = await interceptor.pre_process(request)
            except Exception:
                log.exception("interceptor %s failed on run %s", type(interceptor).__name__, run.run_id)
                await session.error(f"Interceptor {type(interceptor).__name__} failed", code="interceptor.failed")
                return
        if memory is not None:
            # The harness's long-term memory runs after the user's interceptors, as Atmosphere's does.
            request = await memory.recall(run, harness, request)
        ctx = AgentExecutionContext(
            run_id=run.run_id,
            agent=spec.name,
            conversation_id=run.conversation_id,
            request=request,
            tools=tuple(tools.values()),
            run_tool=gateway.run_tool,
            tool_loop=spec.tool_loop,
            retry=spec.retry,
            structured_output_retries=spec.structured_output_retries,
        )
        answer_from = len(sink.text)
        recorded = False

        async def record(terminal: RunEvent | None) -> None:
            # On complete: the user message and the answer; on an error (or a cancel): only the
            # user message. Before the terminal event goes out, so the next turn (or a fact
            # extraction) of this conversation finds it stored.
            nonlocal recorded
            if memory is None or recorded:
                return
            recorded = True
            completed = terminal is not None and terminal.WhichOneof("kind") == "complete"
            await memory.record(
                run,
                harness,
                user=message,
                answer="".join(sink.text[answer_from:]) if completed else None,
                model=request.model or (self.runtime.config.model if self.runtime else None),
                staged=bool(staged),
            )

        sink.before_terminal = record
        try:
            await self._execute(ctx, session, sink, spec)
        finally:
            sink.before_terminal = None
            if not recorded:
                await asyncio.shield(record(None))
        if sink.breach is None and session.closed:
            text = "".join(sink.text)
            for interceptor in reversed(spec.interceptors):
                try:
                    await interceptor.post_process(request, text)
                except Exception:
                    log.exception(
                        "interceptor %s post_process failed on run %s", type(interceptor).__name__, run.run_id
                    )

    async def _execute(
        self, ctx: AgentExecutionContext, session: StreamingSession, sink: RunSink, spec: AgentSpec
    ) -> None:
        assert self.runtime is not None
        task = asyncio.create_task(self.runtime.execute(ctx, session))
        sink.on_breach = task.cancel
        deadline = spec.budget.max_wall_clock if spec.budget is not None else None
        started = time.monotonic()
        try:
            done, _ = await asyncio.wait({task}, timeout=deadline if deadline and deadline > 0 else None)
            if not done:
                task.cancel()
                elapsed_ms = (time.monotonic() - started) * 1000
                assert deadline is not None
                await sink.trip(BudgetExceededError(BudgetReason.WALL_CLOCK, round(elapsed_ms), deadline * 1000))
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return
            if task.cancelled():
                if sink.breach is None:
                    raise asyncio.CancelledError
                return
            error = task.exception()
            if error is not None:
                log.error("runtime %s failed on run %s", self.runtime.name, ctx.run_id, exc_info=error)
                await session.error(f"The model runtime failed ({type(error).__name__})", code="runtime.failed")
                return
            if not session.closed:
                await session.complete()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
