"""`BuiltInAgentRuntime`: streamed OpenAI chat completions with tools, retries and structure.

One run is a loop of rounds: stream a completion (text is forwarded as it arrives, tool-call
argument fragments as `tool_call_delta` events); when the model asks for tools, run them all
concurrently through `ctx.run_tool` (dispatch's governed choke point), append their results
and go again, up to the tool-loop cap. Usage is reported once per round.

As a model gateway (`CLIENT_TOOLS`), the caller's own functions are offered beside the agent's
tools: a round that calls any of them ends the run, those calls (each checked by
`ctx.pass_to_client`) handed back in `Complete.client_tool_calls`. The agent's own calls of that
round are not run: their results would reach nobody, and the model asks again once the caller's
results are in.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel

from atmosphere.bus.errors import StructuredOutputInvalidError, ToolLoopExhaustedError
from atmosphere.contracts.run.v1.run_pb2 import (
    Complete,
    EntityComplete,
    EntityStart,
    RunEvent,
    StructuredField,
    ToolCallDelta,
    ToolStart,
)
from atmosphere.dispatch.runtime import structured
from atmosphere.dispatch.runtime.http11 import Http11Transport
from atmosphere.dispatch.runtime.provider import (
    CallLimits,
    ProviderCallError,
    RoundHooks,
    RoundResult,
    ToolCallBuffer,
    stream_round,
)
from atmosphere.dispatch.tool_errors import NO_TOOL_RUNNER, TOOL_LIMIT_REACHED
from atmosphere.sdk import ChatMessage, OnMaxIterations, StreamingSession
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.lifecycle import ModelCall, notify_model_end, notify_model_error, notify_model_start
from atmosphere.sdk.runtime import (
    AgentExecutionContext,
    AgentRuntime,
    RecordedRound,
    RecordedToolCall,
    RuntimeConfig,
    StreamedPiece,
    ToolCallRequest,
)

log = logging.getLogger("atmosphere.dispatch.runtime")

DEFAULT_MODEL = "default"
UNKNOWN_FINISH = "unknown"
"""The terminal's finish reason when the provider closed its stream properly (`[DONE]`) but never
said why the answer ended: whole or cut short, nobody can tell."""


CACHE_KEY_HOSTS = ("api.openai.com",)
CACHE_KEY_HOST_SUFFIXES = (".openai.azure.com",)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@functools.lru_cache(maxsize=64)  # asked on every model call, of the few URLs configured: parsed once
def accepts_cache_key(base_url: str, mode: str) -> bool:
    """Whether to send `prompt_cache_key` to `base_url`.

    Default-deny: several OpenAI-compatible servers reject unknown fields, and a rejected field
    fails the whole request, so `auto` sends it only to OpenAI, Azure OpenAI and loopback.
    """
    value = mode.strip().lower()
    if value == "enabled":
        return True
    if value == "disabled":
        return False
    host = (httpx.URL(base_url).host or "").lower() if base_url else ""
    return host in CACHE_KEY_HOSTS or host.endswith(CACHE_KEY_HOST_SUFFIXES) or host in LOOPBACK


def is_http_url(url: str | None) -> bool:
    """Whether `url` is one the built-in runtime can call (`http://` or `https://`)."""
    return bool(url) and str(url).lower().startswith(("http://", "https://"))


class BuiltInAgentRuntime(AgentRuntime):
    """Any OpenAI-compatible provider (`LLM_BASE_URL`), over one pooled httpx client."""

    name = "built-in"
    priority = 0

    def __init__(self, config: RuntimeConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        """Configure; the HTTP client is created on first use.

        `transport` replaces the network (a test's `httpx.MockTransport`): every request then
        goes to it, with the same deadlines and retries as against a real provider.
        """
        super().__init__(config)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def is_available(self) -> bool:
        """Available when an http(s) provider URL is configured (any other cannot be called)."""
        return is_http_url(self.config.base_url)

    def unavailable_reason(self) -> str:
        """What to set (the URL itself is never shown: it may carry credentials)."""
        if self.is_available():
            return ""
        return (
            "no model configured: set LLM_BASE_URL"
            if not self.config.base_url
            else "LLM_BASE_URL is not an http(s) URL"
        )

    def capabilities(self) -> frozenset[AiCapability]:
        """Each flag is pinned by the runtime contract suite (`atmosphere.testing`)."""
        return frozenset(
            {
                AiCapability.TEXT_STREAMING,
                AiCapability.SYSTEM_PROMPT,
                AiCapability.CONVERSATION_MEMORY,
                AiCapability.TOOL_CALLING,
                AiCapability.TOOL_CALL_DELTA,
                AiCapability.TOKEN_USAGE,
                AiCapability.PER_REQUEST_RETRY,
                AiCapability.CANCELLATION,
                AiCapability.STRUCTURED_OUTPUT,
                AiCapability.NATIVE_STRUCTURED_OUTPUT,
                AiCapability.MODEL_ENUMERATION,
                AiCapability.CLIENT_TOOLS,
            }
        )

    @property
    def client(self) -> httpx.AsyncClient:
        """The pooled client, sized for the configured concurrency (never httpx's silent 100)."""
        if self._client is None:
            config = self.config
            size = max(1, config.max_concurrency)
            self._client = httpx.AsyncClient(
                # A model streams a piece per token: read on asyncio's own sockets (`http11`),
                # not through httpcore's, which spent twice the CPU on each piece.
                transport=self._transport or Http11Transport(max_connections=size),
                limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
                # The read timeout is the stall timeout; the first-byte and whole-call deadlines
                # are enforced per call by `stream_round`.
                timeout=httpx.Timeout(
                    connect=config.connect_timeout,
                    read=config.stall_timeout,
                    write=config.stall_timeout,
                    pool=config.first_byte_timeout,
                ),
            )
        return self._client

    def _url(self, path: str) -> str:
        return f"{(self.config.base_url or '').rstrip('/')}/{path}"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

    async def list_models(self) -> list[str]:
        """`GET <base>/models`."""
        response = await self.client.get(self._url("models"), headers=self._headers())
        response.raise_for_status()
        return [str(m["id"]) for m in response.json().get("data", []) if isinstance(m, dict) and "id" in m]

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Answer `ctx.request`, ending `session` with `complete` or `error`."""
        try:
            if ctx.request.response_format is not None:
                await self._structured(ctx, session, ctx.request.response_format)
            else:
                answer = await self._conversation(ctx, session, _messages(ctx), forward_text=True)
                if answer.handed_back:
                    ending = Complete(finish_reason="tool_calls", client_tool_calls=answer.handed_back)
                else:
                    ending = Complete(finish_reason=finish_reason(answer.last))
                await session.emit(RunEvent(complete=ending))
        except ProviderCallError as exc:
            await session.emit(RunEvent(error=exc.error.to_proto()))
        except (ToolLoopExhaustedError, StructuredOutputInvalidError) as exc:
            await session.emit(RunEvent(error=exc.to_proto()))

    def _body(self, ctx: AgentExecutionContext, messages: list[dict[str, Any]], *, tools: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": ctx.request.model or self.config.model or DEFAULT_MODEL,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        generation = self.config.generation
        if generation.temperature is not None:
            body["temperature"] = generation.temperature
        if generation.max_tokens is not None:
            body["max_tokens"] = generation.max_tokens
        if generation.top_p is not None:
            body["top_p"] = generation.top_p
        if generation.stop:
            body["stop"] = list(generation.stop)
        hint = ctx.request.cache_hint
        if hint is not None and accepts_cache_key(self.config.base_url or "", self.config.prompt_cache_key):
            body["prompt_cache_key"] = hint.key
        offered = (*ctx.tools, *ctx.client_tools) if tools else ()
        if offered:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in offered
            ]
            if ctx.tool_choice is not None:
                body["tool_choice"] = ctx.tool_choice
        if ctx.request.answer_format is not None:
            body["response_format"] = dict(ctx.request.answer_format)
        return body

    async def _conversation(
        self,
        ctx: AgentExecutionContext,
        session: StreamingSession,
        messages: list[dict[str, Any]],
        *,
        forward_text: bool,
        extra: dict[str, Any] | None = None,
    ) -> Answer:
        """Rounds until the model answers without tools (or is cut off, or calls the caller's functions)."""
        iterations = 0
        offer_tools = True
        client = {t.name for t in ctx.client_tools} if ctx.pass_to_client is not None else set()
        while True:
            body = {**self._body(ctx, messages, tools=offer_tools), **(extra or {})}
            result = await self._round(ctx, session, body, forward_text=forward_text)
            if not result.tool_calls or not offer_tools or result.cut_off:
                # A cut-off round's tool calls may be truncated mid-argument: never run them.
                return Answer(result)
            if iterations >= ctx.tool_loop.cap:
                if ctx.tool_loop.on_max_iterations is OnMaxIterations.FAIL:
                    msg = f"Tool loop exhausted after {ctx.tool_loop.cap} iterations"
                    raise ToolLoopExhaustedError(msg)
                log.warning(
                    "run %s: tool loop cap %d reached; asking for an answer without tools",
                    ctx.run_id,
                    ctx.tool_loop.cap,
                )
                offer_tools = False
                messages.append(_assistant(result))
                messages.extend(_refusals(result.tool_calls))
                continue
            iterations += 1
            messages.append(_assistant(result))
            if client & {c.name for c in result.tool_calls}:
                handed_back, results = await pass_to_client(ctx, result.tool_calls, client, self._run_tools)
                if handed_back:
                    return Answer(result, tuple(handed_back))
                messages.extend(results)  # every call of the caller's was refused: the model hears why
                continue
            messages.extend(await self._run_tools(ctx, result.tool_calls))

    async def _round(
        self, ctx: AgentExecutionContext, session: StreamingSession, body: dict[str, Any], *, forward_text: bool
    ) -> RoundResult:
        """One model round; in a durable run a committed round replays with no call to the model."""
        journaled = await ctx.rounds.next_round() if ctx.rounds is not None else None
        if journaled is not None and journaled.recorded is not None:
            return await _replay(session, journaled.recorded, forward_text=forward_text)
        pieces: list[StreamedPiece] = []
        call = ModelCall(
            run_id=ctx.run_id,
            agent=ctx.agent,
            model=str(body.get("model", "")),
            provider=self.name,
            message_count=len(body.get("messages", ())),
            tool_count=len(body.get("tools", ())),
        )
        notify_model_start(ctx.listeners, call)
        started = time.perf_counter()
        try:
            result = await self._live_round(ctx, session, body, forward_text=forward_text, pieces=pieces)
        except BaseException as exc:  # a cancelled call ends too, so that no observer waits for it
            notify_model_error(ctx.listeners, call, exc)
            raise
        notify_model_end(ctx.listeners, call, result.usage, (time.perf_counter() - started) * 1000)
        if journaled is not None:
            await journaled.commit(_recorded(result, pieces))
        if result.usage is not None:
            await session.usage(result.usage)
        return result

    async def _live_round(
        self,
        ctx: AgentExecutionContext,
        session: StreamingSession,
        body: dict[str, Any],
        *,
        forward_text: bool,
        pieces: list[StreamedPiece],
    ) -> RoundResult:
        async def on_text(text: str) -> None:
            if forward_text:
                pieces.append(StreamedPiece(text=text))
                await session.send(text)

        async def on_tool_delta(call_id: str, name: str, fragment: str) -> None:
            pieces.append(StreamedPiece(call_id=call_id, name=name, fragment=fragment))
            await session.emit(
                RunEvent(tool_call_delta=ToolCallDelta(call_id=call_id, tool_name=name, arguments_fragment=fragment))
            )

        return await stream_round(
            self.client,
            url=self._url("chat/completions"),
            body=body,
            headers=self._headers(),
            retry=ctx.retry,
            hooks=RoundHooks(on_text=on_text, on_tool_delta=on_tool_delta, on_retry=session.progress),
            limits=CallLimits.of(self.config),
        )

    async def _run_tools(self, ctx: AgentExecutionContext, calls: list[ToolCallBuffer]) -> list[dict[str, Any]]:
        if ctx.run_tool is None:
            return _refusals(calls, NO_TOOL_RUNNER)
        runner = ctx.run_tool
        results = await asyncio.gather(
            *(
                runner(
                    ToolCallRequest(call_id=c.call_id or f"call_{i}", name=c.name, arguments_json=c.arguments or "{}")
                )
                for i, c in enumerate(calls)
            )
        )
        return [
            {"role": "tool", "tool_call_id": c.call_id or f"call_{i}", "content": content}
            for i, (c, content) in enumerate(zip(calls, results, strict=True))
        ]

    async def _structured(self, ctx: AgentExecutionContext, session: StreamingSession, model: type[BaseModel]) -> None:
        """Ask for JSON matching `model`; reprompt up to the retry budget; fail closed.

        Raises:
            StructuredOutputInvalidError: no answer validated within the retry budget.
        """
        messages = _messages(ctx)
        native: dict[str, Any] | None = {"response_format": structured.response_format(model)}
        attempts = ctx.structured_output_retries + 1
        error = ""
        for attempt in range(attempts):
            try:
                text = (await self._conversation(ctx, session, messages, forward_text=False, extra=native)).last.text
            except ProviderCallError as exc:
                if native is None or exc.status not in {400, 422}:
                    raise
                # The provider refused native structured output: fall back to the instructions.
                log.info("run %s: native structured output refused (%s); using prompt instructions", ctx.run_id, exc)
                native = None
                messages = _with_instructions(messages, model)
                text = (await self._conversation(ctx, session, messages, forward_text=False)).last.text
            try:
                entity = structured.parse(model, text)
            except ValueError as exc:
                error = str(exc)
                log.info("run %s: structured attempt %d failed: %s", ctx.run_id, attempt + 1, error)
                messages = [
                    *messages,
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": structured.reprompt(model, ctx.request.message, text, error)},
                ]
                continue
            await _emit_entity(session, model, entity, text)
            await session.emit(RunEvent(complete=Complete(finish_reason="stop")))
            return
        msg = f"structured output did not match schema after {attempts} attempt(s): {error}"
        raise StructuredOutputInvalidError(msg)


async def pass_to_client(
    ctx: AgentExecutionContext,
    calls: list[ToolCallBuffer],
    client: set[str],
    run_tools: Callable[[AgentExecutionContext, list[ToolCallBuffer]], Awaitable[list[dict[str, Any]]]],
) -> tuple[list[ToolStart], list[dict[str, Any]]]:
    """The round's calls of the caller's functions that may go back to it; the model's answers if none may.

    When none passes its checks, the round goes on as if all had run: each refused call gets its
    refusal, and each call of the agent's own tools runs (`run_tools`) and gets its result.
    """
    gate = ctx.pass_to_client
    assert gate is not None, "no caller functions are offered without a gate"
    requests = [
        ToolCallRequest(call_id=c.call_id or f"call_{i}", name=c.name, arguments_json=c.arguments or "{}")
        for i, c in enumerate(calls)
    ]
    theirs = [r for r in requests if r.name in client]
    refusals = await asyncio.gather(*(gate(r) for r in theirs))
    handed_back = [
        ToolStart(tool_name=r.name, call_id=r.call_id, arguments_json=r.arguments_json)
        for r, refusal in zip(theirs, refusals, strict=True)
        if refusal is None
    ]
    if handed_back:
        return handed_back, []
    answers = {r.call_id: str(refusal) for r, refusal in zip(theirs, refusals, strict=True)}
    ours = [c for c in calls if c.name not in client]
    own_results = await run_tools(ctx, ours) if ours else []
    answers.update({m["tool_call_id"]: m["content"] for m in own_results})
    return [], [{"role": "tool", "tool_call_id": r.call_id, "content": answers[r.call_id]} for r in requests]


@dataclass(frozen=True)
class Answer:
    """How a conversation of rounds ended: its last round, and the calls handed back to the caller (if any)."""

    last: RoundResult
    handed_back: tuple[ToolStart, ...] = ()


def _recorded(result: RoundResult, pieces: list[StreamedPiece]) -> RecordedRound:
    calls = tuple(
        RecordedToolCall(call_id=c.call_id or f"call_{i}", name=c.name, arguments=c.arguments or "{}")
        for i, c in enumerate(result.tool_calls)
    )
    return RecordedRound(
        text=result.text,
        tool_calls=calls,
        finish_reason=result.finish_reason,
        usage=result.usage,
        pieces=tuple(pieces),
    )


async def _replay(session: StreamingSession, recorded: RecordedRound, *, forward_text: bool) -> RoundResult:
    """A committed round as if the model had just sent it: the same pieces, then its usage."""
    if recorded.pieces:
        for piece in recorded.pieces:
            if piece.call_id:
                delta = ToolCallDelta(call_id=piece.call_id, tool_name=piece.name, arguments_fragment=piece.fragment)
                await session.emit(RunEvent(tool_call_delta=delta))
            elif forward_text:
                await session.send(piece.text)
    elif forward_text and recorded.text:
        await session.send(recorded.text)
    if recorded.usage is not None:
        await session.usage(recorded.usage)
    calls = [ToolCallBuffer(call_id=c.call_id, name=c.name, arguments=c.arguments) for c in recorded.tool_calls]
    return RoundResult(text=recorded.text, tool_calls=calls, finish_reason=recorded.finish_reason, usage=recorded.usage)


def finish_reason(answer: RoundResult) -> str:
    """The terminal's finish reason: the provider's if it cut the answer short, `unknown` if it never said.

    Else `stop`. A last round that still asked for tools (the tool-loop cap refused them) ended its answer
    all the same, so it is a `stop` too: `tool_calls` would promise calls the answer lacks.
    """
    if answer.finish_reason is None:
        return UNKNOWN_FINISH
    return answer.finish_reason if answer.cut_off else "stop"


def _messages(ctx: AgentExecutionContext) -> list[dict[str, Any]]:
    return [_message(m) for m in ctx.request.messages()]


def _message(message: ChatMessage) -> dict[str, Any]:
    """A turn in OpenAI's shape: an assistant's calls of the caller's functions, a `tool` turn's call id."""
    said: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        said["content"] = message.content or None
        said["tool_calls"] = [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.role == "tool":
        said["tool_call_id"] = message.tool_call_id
    return said


def _with_instructions(messages: list[dict[str, Any]], model: type[BaseModel]) -> list[dict[str, Any]]:
    instructions = structured.schema_instructions(model)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + instructions}, *messages[1:]]
    return [{"role": "system", "content": instructions.strip()}, *messages]


def _assistant(result: RoundResult) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": result.text or None,
        "tool_calls": [
            {
                "id": c.call_id or f"call_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments or "{}"},
            }
            for i, c in enumerate(result.tool_calls)
        ],
    }


def _refusals(calls: list[ToolCallBuffer], reason: str = "") -> list[dict[str, Any]]:
    text = reason or TOOL_LIMIT_REACHED
    return [{"role": "tool", "tool_call_id": c.call_id or f"call_{i}", "content": text} for i, c in enumerate(calls)]


async def _emit_entity(session: StreamingSession, model: type[BaseModel], entity: BaseModel, text: str) -> None:
    type_name = model.__name__
    await session.emit(
        RunEvent(entity_start=EntityStart(type_name=type_name, json_schema=json.dumps(structured.json_schema(model))))
    )
    for name, value in entity.model_dump(mode="json").items():
        await session.emit(
            RunEvent(
                structured_field=StructuredField(field_name=name, value_json=json.dumps(value), schema_type=type_name)
            )
        )
    await session.emit(
        RunEvent(entity_complete=EntityComplete(type_name=type_name, entity_json=entity.model_dump_json()))
    )
    await session.send(text)
