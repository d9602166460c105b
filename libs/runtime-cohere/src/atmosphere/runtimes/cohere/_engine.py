"""The Cohere runtime's engine: Command models through Cohere's own v2 Chat API and SDK, natively.

One run is a loop of rounds, as in the built-in runtime: stream a chat (text and the tool plan
are forwarded as they arrive, a tool call's argument fragments as `tool_call_delta` events);
when the model stops for `TOOL_CALL`, run every call of the round concurrently through
`ctx.run_tool` (dispatch's governed choke point, the only way a tool runs), send their results
back as `tool` messages and go again, up to the tool-loop cap. Usage is reported once per round.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import cohere
import httpx
from pydantic import BaseModel

from atmosphere.contracts.run.v1.run_pb2 import Complete, RunEvent, ToolCallDelta
from atmosphere.runtimes.cohere import _structured as structured
from atmosphere.runtimes.cohere._call import CallLimits, stream_round
from atmosphere.runtimes.cohere._errors import STRUCTURED_OUTPUT_INVALID, TOOL_LOOP_EXHAUSTED
from atmosphere.runtimes.cohere._journal import recorded, replay
from atmosphere.runtimes.cohere._messages import NO_TOOLS, Exchange, tools
from atmosphere.runtimes.cohere._settings import DEFAULT_BASE_URL, CohereSettings
from atmosphere.runtimes.cohere._stream import CUT_OFF, RoundHooks, RoundResult, ToolCall
from atmosphere.sdk import OnMaxIterations, StreamingSession
from atmosphere.sdk.runtime import AgentExecutionContext, RuntimeConfig, StreamedPiece, ToolCallRequest
from atmosphere.sdk.runtime_errors import NO_TOOL_RUNNER, TOOL_LIMIT_REACHED, RunFailedError

log = logging.getLogger("atmosphere.runtimes.cohere")

UNKNOWN_FINISH = "unknown"
"""The terminal's finish reason when the stream ended properly but never said why the answer ended."""
MODEL_PAGES = 100
"""Pages of `GET /v1/models` read at most (a provider whose page token never ends cannot loop us)."""


class CohereEngine:
    """What `CohereAgentRuntime` runs once a run needs it: the SDK client and the rounds.

    Apart from the runtime's own module so that installing the adapter costs dispatch nothing
    until an agent runs on it: importing the SDK takes seconds, and every dispatch process
    discovers every installed runtime at start.
    """

    def __init__(self, config: RuntimeConfig, settings: CohereSettings) -> None:
        """Configure; the SDK client is created on first use."""
        self.config = config
        self.settings = settings
        self._http: httpx.AsyncClient | None = None
        self._client: cohere.AsyncClientV2 | None = None
        # The credentials are the settings' alone: a key, or none at all (a gateway that adds its own).
        # The SDK always sends `Authorization: Bearer <key>`; a header set to None is dropped from a
        # request, so a base URL alone sends no credential rather than an empty one.
        self.request_options: dict[str, Any] = (
            {} if settings.api_key else {"additional_headers": {"Authorization": None}}
        )

    @property
    def client(self) -> cohere.AsyncClientV2:
        """The SDK client: this runtime's deadlines and pool size, no retries of its own (`_call` retries)."""
        if self._client is None:
            config, settings = self.config, self.settings
            size = max(1, config.max_concurrency)
            timeout = httpx.Timeout(
                connect=config.connect_timeout,
                read=config.stall_timeout,
                write=config.stall_timeout,
                pool=config.first_byte_timeout,
            )
            self._http = httpx.AsyncClient(
                timeout=timeout, limits=httpx.Limits(max_connections=size, max_keepalive_connections=size)
            )
            # An explicit key ("" for none) and base URL keep the SDK from reading its own environment
            # variables: the settings come from `RuntimeConfig.extra` only.
            self._client = cohere.AsyncClientV2(
                api_key=settings.api_key or "",
                base_url=settings.base_url or DEFAULT_BASE_URL,
                max_retries=0,
                httpx_client=self._http,
                log_warning_experimental_features=False,
            )
        return self._client

    async def list_models(self) -> list[str]:
        """`GET /v1/models` of the models that chat, every page."""
        names: list[str] = []
        token: str | None = None
        for _ in range(MODEL_PAGES):
            page = await self.client.models.list(
                page_size=1000, page_token=token, endpoint="chat", request_options=self.request_options
            )
            names += [m.name for m in page.models if isinstance(m.name, str) and m.name]
            if not page.next_page_token or page.next_page_token == token:
                break
            token = page.next_page_token
        return names

    async def aclose(self) -> None:
        """Close the SDK's HTTP client and its connection pool."""
        if self._http is not None:
            await self._http.aclose()
        self._http = None
        self._client = None

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Answer `ctx.request`, ending `session` with `complete` or `error`."""
        exchange = Exchange(ctx.request)
        try:
            if ctx.request.response_format is not None:
                await self._structured(ctx, session, exchange, ctx.request.response_format)
            else:
                answer = await self._conversation(ctx, session, exchange, forward_text=True)
                await session.emit(RunEvent(complete=Complete(finish_reason=finish_reason(answer))))
        except RunFailedError as failure:
            await session.emit(failure.to_event())

    def _params(
        self, ctx: AgentExecutionContext, exchange: Exchange, *, offer_tools: bool, native: type[BaseModel] | None
    ) -> dict[str, Any]:
        """The arguments of one round's `chat_stream` (the SDK adds `stream`)."""
        params: dict[str, Any] = {
            "model": ctx.request.model or self.settings.model,
            "messages": exchange.wire_messages(),
            "request_options": self.request_options,
        }
        if self.settings.max_tokens is not None:
            params["max_tokens"] = self.settings.max_tokens
        generation = self.config.generation
        if generation.temperature is not None:
            params["temperature"] = generation.temperature
        if generation.top_p is not None:
            params["p"] = generation.top_p
        if generation.stop:
            params["stop_sequences"] = list(generation.stop)
        if ctx.tools:
            params["tools"] = tools(ctx.tools)
            if not offer_tools:
                params["tool_choice"] = NO_TOOLS
        if native is not None:
            params["response_format"] = structured.response_format(native)
        return params

    async def _conversation(
        self,
        ctx: AgentExecutionContext,
        session: StreamingSession,
        exchange: Exchange,
        *,
        forward_text: bool,
        native: type[BaseModel] | None = None,
    ) -> RoundResult:
        """Rounds until the model answers without tools (or is cut off); returns the final round."""
        iterations = 0
        offer_tools = True
        while True:
            params = self._params(ctx, exchange, offer_tools=offer_tools, native=native)
            result = await self._round(ctx, session, params, forward_text=forward_text)
            if not result.tool_calls or not offer_tools or result.cut_off:
                # A cut-off round's tool calls may be truncated mid-arguments: never run them.
                return result
            if iterations >= ctx.tool_loop.cap:
                if ctx.tool_loop.on_max_iterations is OnMaxIterations.FAIL:
                    raise RunFailedError(
                        TOOL_LOOP_EXHAUSTED, f"Tool loop exhausted after {ctx.tool_loop.cap} iterations"
                    )
                log.warning(
                    "run %s: tool loop cap %d reached; asking for an answer without tools",
                    ctx.run_id,
                    ctx.tool_loop.cap,
                )
                offer_tools = False
                exchange.add_round(result, [TOOL_LIMIT_REACHED] * len(result.tool_calls))
                continue
            iterations += 1
            exchange.add_round(result, await self._run_tools(ctx, result.tool_calls))

    async def _round(
        self, ctx: AgentExecutionContext, session: StreamingSession, params: dict[str, Any], *, forward_text: bool
    ) -> RoundResult:
        """One model round; in a durable run a committed round replays with no call to the model."""
        journaled = await ctx.rounds.next_round() if ctx.rounds is not None else None
        if journaled is not None and journaled.recorded is not None:
            return await replay(session, journaled.recorded, forward_text=forward_text)
        pieces: list[StreamedPiece] = []

        async def on_text(text: str) -> None:
            if forward_text:
                pieces.append(StreamedPiece(text=text))
                await session.send(text)

        async def on_tool_delta(call_id: str, name: str, fragment: str) -> None:
            pieces.append(StreamedPiece(call_id=call_id, name=name, fragment=fragment))
            delta = ToolCallDelta(call_id=call_id, tool_name=name, arguments_fragment=fragment)
            await session.emit(RunEvent(tool_call_delta=delta))

        result = await stream_round(
            self.client,
            params,
            retry=ctx.retry,
            hooks=RoundHooks(on_text=on_text, on_tool_delta=on_tool_delta, on_retry=session.progress),
            limits=CallLimits.of(self.config),
        )
        if journaled is not None:
            await journaled.commit(recorded(result, pieces))
        if result.usage is not None:
            await session.usage(result.usage)
        return result

    async def _run_tools(self, ctx: AgentExecutionContext, calls: list[ToolCall]) -> list[str]:
        """Every call of the round at once, through the choke point; their results in the calls' order."""
        if ctx.run_tool is None:
            return [NO_TOOL_RUNNER] * len(calls)
        runner = ctx.run_tool
        requests = [ToolCallRequest(call_id=c.call_id, name=c.name, arguments_json=c.arguments or "{}") for c in calls]
        return list(await asyncio.gather(*(runner(request) for request in requests)))

    async def _structured(
        self, ctx: AgentExecutionContext, session: StreamingSession, exchange: Exchange, model: type[BaseModel]
    ) -> None:
        """Ask for JSON matching `model`; reprompt up to the retry budget; fail closed.

        Raises:
            RunFailedError: no answer validated within the retry budget.
        """
        native: type[BaseModel] | None = model
        if ctx.tools:
            # Cohere refuses `response_format` beside `tools`: the schema goes in the instructions.
            native = None
            exchange.instructions = structured.schema_instructions(model)
        attempts = ctx.structured_output_retries + 1
        error = ""
        for attempt in range(attempts):
            try:
                text = (await self._conversation(ctx, session, exchange, forward_text=False, native=native)).text
            except RunFailedError as failure:
                if native is None or failure.status not in structured.REFUSED_STATUSES:
                    raise
                # The provider refused native structured output: fall back to the instructions.
                log.info(
                    "run %s: native structured output refused (%s); using prompt instructions", ctx.run_id, failure
                )
                native = None
                exchange.instructions = structured.schema_instructions(model)
                text = (await self._conversation(ctx, session, exchange, forward_text=False)).text
            try:
                entity = structured.parse(model, text)
            except ValueError as exc:
                error = str(exc)
                log.info("run %s: structured attempt %d failed: %s", ctx.run_id, attempt + 1, error)
                exchange.add_retry(text, structured.reprompt(model, ctx.request.message, text, error))
                continue
            await structured.emit_entity(session, model, entity, text)
            await session.emit(RunEvent(complete=Complete(finish_reason="stop")))
            return
        msg = f"structured output did not match schema after {attempts} attempt(s): {error}"
        raise RunFailedError(STRUCTURED_OUTPUT_INVALID, msg)


def finish_reason(answer: RoundResult) -> str:
    """The terminal's finish reason, as the built-in runtime reports it.

    `length` for an answer cut at `max_tokens` (`MAX_TOKENS`): the text streamed so far stands,
    and the terminal says it is not the whole answer. `unknown` when the stream ended without a
    finish reason; else `stop` (`COMPLETE`, `STOP_SEQUENCE`, or a last round whose tool calls the
    tool-loop cap refused). `ERROR` and `TIMEOUT` never get here: they fail the round (`_call`).
    """
    if answer.finish_reason is None:
        return UNKNOWN_FINISH
    return CUT_OFF.get(answer.finish_reason, "stop")
