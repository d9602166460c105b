"""The contract every `AgentRuntime` passes, pinning each capability it declares.

Subclass `AgentRuntimeContract` in the runtime's tests and implement `make_runtime`; the suite
drives the runtime against a `ScriptedModel` served on loopback (the `fake_provider` fixture). A
capability may be declared only if this suite has a test for it (`CAPABILITY_TESTS`), and every
declared capability's tests run: runtime truth, checked.

The suite is wire-agnostic: `wire` (default `OPENAI_WIRE`, OpenAI's chat completions) says how a
runtime is configured for the fake provider and how the tests read what it sent; a runtime that
speaks Anthropic's Messages API sets `wire = ANTHROPIC_WIRE`. The same scripted `Turn`s answer
on either wire.
"""

from __future__ import annotations

import abc
import asyncio
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
from pydantic import BaseModel

from atmosphere.bus.runs import SinkHost
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.sdk import AiRequest, ChatMessage, MessageToolCall, RetryPolicy, StreamingSession, ToolLoopPolicy
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime, RuntimeConfig, ToolCallRequest, ToolSpec
from atmosphere.testing.model_turns import ToolCallScript, Turn, block_text
from atmosphere.testing.scripted_model import ScriptedModel

FAST_RETRY = RetryPolicy(max_retries=2, initial_delay=0.01, max_delay=1.0)

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = ToolSpec(
    name="get_time",
    description="Local time in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


LOOKUP = ToolSpec(
    name="lookup",
    description="The caller's own search (a client-side function).",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)


class City(BaseModel):
    """A structured answer used by the structured-output tests."""

    city: str
    temperature: float


RENDEZVOUS_WAIT = 5.0
"""Seconds a tool call waits for the others of a rendezvous (their start, not a measure of speed)."""


class Recorder:
    """A session that keeps every event, and a tool runner that records its calls."""

    def __init__(
        self, tool_results: dict[str, str] | None = None, tool_delay: float = 0.0, rendezvous: int = 0
    ) -> None:
        """`rendezvous`: each tool call waits (up to `RENDEZVOUS_WAIT`) until that many are under way."""
        self.events: list[RunEvent] = []
        self.tool_calls: list[ToolCallRequest] = []
        self.client_calls: list[ToolCallRequest] = []
        """Calls of the caller's own functions the runtime asked to hand back (`pass_to_client`)."""
        self.client_refusals: dict[str, str] = {}
        """Function name → the refusal `pass_to_client` answers with (not in it: handed back)."""
        self._results = tool_results or {}
        self._delay = tool_delay
        self._rendezvous = rendezvous
        self._all_under_way = asyncio.Event()
        self.waited_alone = 0
        """Calls that gave up waiting for the others: they were not run at the same time."""

        async def sink(event: RunEvent) -> None:
            self.events.append(event)

        self.session = StreamingSession(SinkHost(sink), run_id="r1", session_id="s1", conversation_id="c1")

    async def run_tool(self, call: ToolCallRequest) -> str:
        self.tool_calls.append(call)
        if self._rendezvous:
            if len(self.tool_calls) >= self._rendezvous:
                self._all_under_way.set()
            try:
                await asyncio.wait_for(self._all_under_way.wait(), RENDEZVOUS_WAIT)
            except TimeoutError:
                self.waited_alone += 1
        if self._delay:
            await asyncio.sleep(self._delay)
        return self._results.get(call.name, f"result of {call.name}")

    async def pass_to_client(self, call: ToolCallRequest) -> str | None:
        self.client_calls.append(call)
        return self.client_refusals.get(call.name)

    def kinds(self) -> list[str]:
        return [e.WhichOneof("kind") or "" for e in self.events]

    def text(self) -> str:
        return "".join(e.text_delta.text for e in self.events if e.WhichOneof("kind") == "text_delta")

    def terminal(self) -> RunEvent:
        assert self.events, "no events"
        last = self.events[-1]
        assert last.WhichOneof("kind") in {"complete", "error"}, self.kinds()
        return last


Said = tuple[Any, ...]
"""One message as a wire's reader sees it: (role, content), then any other fields it carries."""


class ContractWire:
    """One provider wire as the contract sees it: the runtime's configuration, and readers of what it sent.

    The readers give a request's parts in the terms the tests check, whatever the wire's shape;
    `OPENAI_WIRE` reads OpenAI's chat completions exactly as the suite always did.
    """

    name = "openai"

    def config(self, provider: ScriptedModel) -> RuntimeConfig:
        """A runtime's configuration for the fake provider."""
        return RuntimeConfig(base_url=provider.base_url, model="fake-model", stall_timeout=5.0)

    def streamed(self, request: Mapping[str, Any]) -> Any:
        """The request's `stream` flag as sent."""
        return request["stream"]

    def conversation(self, request: Mapping[str, Any]) -> list[Said]:
        """The messages in order, each `(role, content)`: the system prompt first when one is sent.

        A message with more fields than these has them after, sorted (so that it equals no plain pair).
        """
        return [_said(m) for m in request["messages"]]

    def tool_names(self, request: Mapping[str, Any]) -> list[str]:
        """The names of the tools offered."""
        return [t.get("function", {}).get("name") for t in request["tools"]]

    def offers_tools(self, request: Mapping[str, Any]) -> bool:
        """Whether the model may call a tool."""
        return "tools" in request

    def asked_tools(self, request: Mapping[str, Any]) -> list[str]:
        """The tools the assistant's turn before the newest tool results called."""
        return [c.get("function", {}).get("name") for c in request["messages"][-2]["tool_calls"]]

    def last_tool_result(self, request: Mapping[str, Any]) -> Said:
        """The newest tool result as `(call id, content)` (then any other fields, sorted)."""
        last = dict(request["messages"][-1])
        if last.get("role") != "tool":
            return ("not a tool result", last)
        extra = sorted((k, v) for k, v in last.items() if k not in {"role", "tool_call_id", "content"})
        return (last.get("tool_call_id"), last.get("content"), *extra)

    def messages_of_a_tool_round(self, calls: int) -> int:
        """How many messages one round of `calls` parallel tool calls adds (the call, each result)."""
        return 1 + calls

    def structured_format(self, request: Mapping[str, Any]) -> Any:
        """The type of native structured output asked for (`json_schema`), None when none is."""
        return request["response_format"]["type"] if "response_format" in request else None


class AnthropicContractWire(ContractWire):
    """Anthropic's Messages API: a top-level `system`, `tool_use` and `tool_result` blocks.

    The runtime is configured through `RuntimeConfig.extra` with the SDK's own setting names
    (`ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`, `ANTHROPIC_MODEL`); a conversation reads as
    OpenAI's would, so the tests' checks are the same: the `system` first, each text message as
    `(role, text)` (text blocks joined), each `tool_result` block as `("tool", content)`.
    """

    name = "anthropic"

    def config(self, provider: ScriptedModel) -> RuntimeConfig:
        """A runtime's configuration for the fake provider, in `extra` (not `LLM_*`'s fields)."""
        extra = {
            "ANTHROPIC_BASE_URL": provider.anthropic_base_url,
            "ANTHROPIC_API_KEY": "contract-key",
            "ANTHROPIC_MODEL": "fake-model",
        }
        return RuntimeConfig(stall_timeout=5.0, extra=extra)

    def conversation(self, request: Mapping[str, Any]) -> list[Said]:
        """The `system` first (when sent), then each message's text, and each tool result as a `tool` message."""
        said: list[Said] = []
        if "system" in request:
            said.append(("system", block_text(request["system"])))
        for message in request["messages"]:
            content = message.get("content")
            blocks = content if isinstance(content, list) else []
            results = [b for b in blocks if isinstance(b, Mapping) and b.get("type") == "tool_result"]
            if not results or any(isinstance(b, Mapping) and b.get("type") == "text" for b in blocks):
                said.append((message.get("role"), block_text(content)))
            said += [("tool", block_text(b.get("content"))) for b in results]
        return said

    def tool_names(self, request: Mapping[str, Any]) -> list[str]:
        """The names of the tools declared."""
        return [t.get("name") for t in request["tools"]]

    def offers_tools(self, request: Mapping[str, Any]) -> bool:
        """Tools declared, and not withheld by `tool_choice: none`.

        Anthropic wants the tools declared while the conversation holds `tool_use` blocks.
        """
        return "tools" in request and (request.get("tool_choice") or {}).get("type") != "none"

    def asked_tools(self, request: Mapping[str, Any]) -> list[str]:
        """The `tool_use` blocks of the assistant's message before the newest tool results."""
        content = request["messages"][-2]["content"]
        return [b["name"] for b in content if isinstance(b, Mapping) and b.get("type") == "tool_use"]

    def last_tool_result(self, request: Mapping[str, Any]) -> Said:
        """The newest `tool_result` block as `(tool_use_id, content)`."""
        last = request["messages"][-1]
        content = last.get("content") if last.get("role") == "user" else None
        results = [b for b in content or () if isinstance(b, Mapping) and b.get("type") == "tool_result"]
        if not results:
            return ("not a tool result", last)
        return (results[-1].get("tool_use_id"), block_text(results[-1].get("content")))

    def messages_of_a_tool_round(self, calls: int) -> int:
        """The assistant's message of `tool_use` blocks, and one user message of every result."""
        del calls
        return 2

    def structured_format(self, request: Mapping[str, Any]) -> Any:
        """The `output_config.format` type asked for (`json_schema`), None when none is."""
        output = request.get("output_config") or {}
        return output["format"]["type"] if output.get("format") is not None else None


class CohereContractWire(ContractWire):
    """Cohere's v2 chat: OpenAI-like messages, with Cohere's own tool calls, tool choice and JSON mode.

    The runtime is configured through `RuntimeConfig.extra` (`COHERE_BASE_URL`, the SDK's own
    `CO_API_KEY`, `COHERE_MODEL`). The system prompt is a `system` message and
    a tool result a `tool` message, as on OpenAI's wire; an assistant's tool calls carry Cohere's
    `tool_plan` (the text before them), and a string `content` reads as it is, a list as its text.
    """

    name = "cohere"

    def config(self, provider: ScriptedModel) -> RuntimeConfig:
        """A runtime's configuration for the fake provider, in `extra` (not `LLM_*`'s fields)."""
        extra = {"COHERE_BASE_URL": provider.root_url, "CO_API_KEY": "contract-key", "COHERE_MODEL": "fake-model"}
        return RuntimeConfig(stall_timeout=5.0, extra=extra)

    def conversation(self, request: Mapping[str, Any]) -> list[Said]:
        """Each message as `(role, text)`; a `tool` message as `("tool", content)`."""
        return [(m.get("role"), block_text(m.get("content"))) for m in request["messages"]]

    def offers_tools(self, request: Mapping[str, Any]) -> bool:
        """Tools declared, and not withheld by `tool_choice: NONE`."""
        return "tools" in request and request.get("tool_choice") != "NONE"

    def last_tool_result(self, request: Mapping[str, Any]) -> Said:
        """The newest `tool` message as `(tool_call_id, content)`."""
        last = request["messages"][-1]
        if last.get("role") != "tool":
            return ("not a tool result", last)
        return (last.get("tool_call_id"), block_text(last.get("content")))

    def structured_format(self, request: Mapping[str, Any]) -> Any:
        """`json_schema` when the request asks for JSON fitting a schema, None when it asks for no JSON.

        Cohere's JSON mode is `response_format`'s `json_object`, with a `json_schema` or without.
        """
        response_format = request.get("response_format") or {}
        if response_format.get("type") != "json_object":
            return None
        return "json_schema" if response_format.get("json_schema") is not None else "json_object"


class GeminiContractWire(ContractWire):
    """The Gemini API (`generateContent`): a top-level `systemInstruction`, `contents` of parts.

    The runtime is configured through `RuntimeConfig.extra` with `google-genai`'s own setting
    names (`GOOGLE_GEMINI_BASE_URL`, `GOOGLE_API_KEY`) and `GEMINI_MODEL`; a conversation reads as
    OpenAI's would: the system instruction first, each content's text as `(role, text)` (`model`
    read as `assistant`), each `functionResponse` part as `("tool", result)`.
    """

    name = "gemini"

    def config(self, provider: ScriptedModel) -> RuntimeConfig:
        """A runtime's configuration for the fake provider, in `extra` (not `LLM_*`'s fields)."""
        extra = {
            "GOOGLE_GEMINI_BASE_URL": provider.root_url,
            "GOOGLE_API_KEY": "contract-key",
            "GEMINI_MODEL": "fake-model",
        }
        return RuntimeConfig(stall_timeout=5.0, extra=extra)

    def streamed(self, request: Mapping[str, Any]) -> Any:
        """Always true: Gemini asks for a stream in its route (`:streamGenerateContent`), not its body.

        The fake's record of a request is its body, so this wire cannot read the flag; the
        streaming test still fails a runtime that does not stream, whose answer arrives whole.
        """
        del request
        return True

    def conversation(self, request: Mapping[str, Any]) -> list[Said]:
        """The `systemInstruction` first (when sent), then each content's text, and each function response as `tool`."""
        said: list[Said] = []
        if "systemInstruction" in request:
            said.append(("system", _gemini_text(request["systemInstruction"].get("parts"))))
        for content in request["contents"]:
            parts = [p for p in content.get("parts") or () if isinstance(p, Mapping)]
            role = "assistant" if content.get("role") == "model" else content.get("role")
            responses = [p["functionResponse"] for p in parts if "functionResponse" in p]
            if not responses or any("text" in p for p in parts):
                said.append((role, _gemini_text(parts)))
            said += [("tool", _gemini_result(r)) for r in responses]
        return said

    def tool_names(self, request: Mapping[str, Any]) -> list[str]:
        """The names of the functions declared."""
        return [d.get("name") for t in request["tools"] for d in t.get("functionDeclarations", ())]

    def offers_tools(self, request: Mapping[str, Any]) -> bool:
        """Functions declared, and not withheld by `toolConfig.functionCallingConfig.mode: NONE`."""
        mode = ((request.get("toolConfig") or {}).get("functionCallingConfig") or {}).get("mode")
        return "tools" in request and mode != "NONE"

    def asked_tools(self, request: Mapping[str, Any]) -> list[str]:
        """The `functionCall` parts of the model's content before the newest function responses."""
        parts = request["contents"][-2].get("parts") or ()
        return [p["functionCall"]["name"] for p in parts if isinstance(p, Mapping) and "functionCall" in p]

    def last_tool_result(self, request: Mapping[str, Any]) -> Said:
        """The newest `functionResponse` part as `(id, result)`."""
        last = request["contents"][-1]
        parts = last.get("parts") or () if last.get("role") == "user" else ()
        responses = [p["functionResponse"] for p in parts if isinstance(p, Mapping) and "functionResponse" in p]
        if not responses:
            return ("not a tool result", last)
        return (responses[-1].get("id"), _gemini_result(responses[-1]))

    def messages_of_a_tool_round(self, calls: int) -> int:
        """The model's content of `functionCall` parts, and one user content of every response."""
        del calls
        return 2

    def structured_format(self, request: Mapping[str, Any]) -> Any:
        """`json_schema` when `generationConfig` asks for a response schema, None when it does not."""
        generation = request.get("generationConfig") or {}
        return "json_schema" if {"responseJsonSchema", "responseSchema"} & set(generation) else None


def _gemini_text(parts: Any) -> str:
    return "".join(str(p.get("text", "")) for p in parts or () if isinstance(p, Mapping))


def _gemini_result(response: Mapping[str, Any]) -> Any:
    """A function response's result: its `result` text when it is one, else the response as JSON."""
    body = response.get("response") or {}
    result = body.get("result") if isinstance(body, Mapping) else None
    return result if isinstance(result, str) else json.dumps(body)


OPENAI_WIRE = ContractWire()
ANTHROPIC_WIRE = AnthropicContractWire()
COHERE_WIRE = CohereContractWire()
GEMINI_WIRE = GeminiContractWire()


def _said(message: Mapping[str, Any]) -> Said:
    extra = sorted((k, v) for k, v in message.items() if k not in {"role", "content"})
    return (message.get("role"), message.get("content"), *extra)


def context(recorder: Recorder, request: AiRequest, **overrides: Any) -> AgentExecutionContext:
    values: dict[str, Any] = {
        "run_id": "r1",
        "agent": "contract",
        "conversation_id": "c1",
        "request": request,
        "run_tool": recorder.run_tool,
        "retry": FAST_RETRY,
    }
    values.update(overrides)
    return AgentExecutionContext(**values)


class ClientToolsContract:
    """The `CLIENT_TOOLS` part of the contract (a model gateway), mixed into `AgentRuntimeContract`.

    Only OpenAI's wire carries a caller's functions so far: these read the chat-completions body itself.
    """

    if TYPE_CHECKING:

        def require(self, capability: AiCapability) -> None: ...

        async def run(
            self, provider: ScriptedModel, request: AiRequest, recorder: Recorder | None = None, **overrides: Any
        ) -> Recorder: ...

    async def test_client_tool_calls_are_handed_back(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.CLIENT_TOOLS)
        fake_provider.script(
            Turn.tool_calls(
                ToolCallScript("lookup", {"q": "atlas"}, call_id="call_c"),
                ToolCallScript("get_weather", {"city": "Oslo"}, call_id="call_o"),
            )
        )
        recorder = Recorder()
        await self.run(
            fake_provider,
            AiRequest(message="Find atlas"),
            recorder,
            tools=(WEATHER,),
            client_tools=(LOOKUP,),
            tool_choice="required",
            pass_to_client=recorder.pass_to_client,
        )
        [sent] = fake_provider.requests  # one round: the caller runs its function, not the runtime
        assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather", "lookup"]
        assert sent["tool_choice"] == "required"
        assert [c.name for c in recorder.client_calls] == ["lookup"]
        assert recorder.tool_calls == []  # the agent's own call of that round waits for the next one
        ending = recorder.terminal().complete
        assert ending.finish_reason == "tool_calls"
        [call] = ending.client_tool_calls
        assert (call.tool_name, call.call_id, json.loads(call.arguments_json)) == ("lookup", "call_c", {"q": "atlas"})

    async def test_a_refused_client_call_goes_back_to_the_model(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.CLIENT_TOOLS)
        fake_provider.script(
            Turn.tool_calls(
                ToolCallScript("lookup", {"q": "secrets"}, call_id="call_c"),
                ToolCallScript("get_weather", {"city": "Oslo"}, call_id="call_o"),
            ),
            Turn.text("I may not look that up; Oslo is cold."),
        )
        recorder = Recorder({"get_weather": "cold"})
        recorder.client_refusals["lookup"] = "Error: denied by policy"
        await self.run(
            fake_provider,
            AiRequest(message="Find secrets"),
            recorder,
            tools=(WEATHER,),
            client_tools=(LOOKUP,),
            pass_to_client=recorder.pass_to_client,
        )
        second = fake_provider.requests[1]["messages"]
        answers = {m["tool_call_id"]: m["content"] for m in second if m["role"] == "tool"}
        assert answers == {"call_c": "Error: denied by policy", "call_o": "cold"}
        assert recorder.text() == "I may not look that up; Oslo is cold."
        assert recorder.terminal().complete.finish_reason == "stop"
        assert not recorder.terminal().complete.client_tool_calls

    async def test_the_client_exchange_continues_where_it_stopped(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.CLIENT_TOOLS)
        fake_provider.script(Turn.text('{"title": "Atlas"}'))
        continuation = (
            ChatMessage("assistant", "", (MessageToolCall("call_c", "lookup", '{"q": "atlas"}'),)),
            ChatMessage("tool", "Atlas: a book of maps", tool_call_id="call_c"),
        )
        answer_format = {"type": "json_schema", "json_schema": {"name": "book", "schema": {"type": "object"}}}
        recorder = Recorder()
        await self.run(
            fake_provider,
            AiRequest(message="Find atlas", continuation=continuation, answer_format=answer_format),
            recorder,
            client_tools=(LOOKUP,),
            pass_to_client=recorder.pass_to_client,
        )
        [sent] = fake_provider.requests
        assert sent["messages"][-3:] == [
            {"role": "user", "content": "Find atlas"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_c", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "atlas"}'}}
                ],
            },
            {"role": "tool", "content": "Atlas: a book of maps", "tool_call_id": "call_c"},
        ]
        assert sent["response_format"] == answer_format
        assert recorder.text() == '{"title": "Atlas"}'
        assert recorder.terminal().complete.finish_reason == "stop"


class AgentRuntimeContract(ClientToolsContract, abc.ABC):
    """Inherit in a test class; set `expected_capabilities` and implement `make_runtime`.

    A runtime that does not speak OpenAI's chat completions sets `wire` too (`ANTHROPIC_WIRE`).
    """

    expected_capabilities: ClassVar[frozenset[AiCapability]]
    wire: ClassVar[ContractWire] = OPENAI_WIRE

    CAPABILITY_TESTS: ClassVar[dict[AiCapability, tuple[str, ...]]] = {
        AiCapability.TEXT_STREAMING: ("test_text_streams_in_pieces_then_completes",),
        AiCapability.SYSTEM_PROMPT: ("test_the_system_prompt_goes_first",),
        AiCapability.CONVERSATION_MEMORY: ("test_history_is_sent_in_order",),
        AiCapability.TOKEN_USAGE: ("test_usage_is_reported",),
        AiCapability.TOOL_CALLING: (
            "test_tool_calls_round_trip",
            "test_parallel_tool_calls_run_concurrently",
            "test_a_strict_tool_loop_fails_at_its_cap",
            "test_a_lenient_tool_loop_answers_without_tools",
        ),
        AiCapability.TOOL_CALL_DELTA: ("test_tool_call_arguments_stream_as_deltas",),
        AiCapability.PER_REQUEST_RETRY: (
            "test_rate_limits_are_retried_honoring_retry_after",
            "test_a_bad_request_is_not_retried",
        ),
        AiCapability.CANCELLATION: ("test_cancelling_closes_the_upstream_request",),
        AiCapability.STRUCTURED_OUTPUT: ("test_structured_output_heals_and_fails_closed",),
        AiCapability.NATIVE_STRUCTURED_OUTPUT: ("test_native_structured_output_with_fallback",),
        AiCapability.MODEL_ENUMERATION: ("test_models_are_listed",),
        AiCapability.CLIENT_TOOLS: (
            "test_client_tool_calls_are_handed_back",
            "test_a_refused_client_call_goes_back_to_the_model",
            "test_the_client_exchange_continues_where_it_stopped",
        ),
    }

    @abc.abstractmethod
    def make_runtime(self, config: RuntimeConfig) -> AgentRuntime:
        """A runtime talking to the fake provider as `config` says (`wire.config`: `base_url` for OpenAI's wire)."""

    def runtime_for(self, provider: ScriptedModel) -> AgentRuntime:
        return self.make_runtime(self.wire.config(provider))

    def require(self, capability: AiCapability) -> None:
        if capability not in self.expected_capabilities:
            pytest.skip(f"{capability.value} is not declared by this runtime")

    async def run(
        self, provider: ScriptedModel, request: AiRequest, recorder: Recorder | None = None, **overrides: Any
    ) -> Recorder:
        recorder = recorder or Recorder()
        runtime = self.runtime_for(provider)
        try:
            await runtime.execute(context(recorder, request, **overrides), recorder.session)
        finally:
            await runtime.aclose()
        return recorder

    # -- declarations ------------------------------------------------------------------------

    async def test_declares_exactly_the_expected_capabilities(self, fake_provider: ScriptedModel) -> None:
        runtime = self.runtime_for(fake_provider)
        assert runtime.is_available()
        assert runtime.capabilities() == self.expected_capabilities

    def test_every_declared_capability_is_pinned_by_a_test(self) -> None:
        unpinned = [c.value for c in self.expected_capabilities if c not in self.CAPABILITY_TESTS]
        assert not unpinned, f"declared without a contract test: {unpinned}"
        for tests in self.CAPABILITY_TESTS.values():
            for name in tests:
                assert callable(getattr(self, name, None)), name

    # -- streaming ---------------------------------------------------------------------------

    async def test_text_streams_in_pieces_then_completes(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.TEXT_STREAMING)
        fake_provider.script(Turn.text("Hello brave new world"))
        recorder = await self.run(fake_provider, AiRequest(message="hi"))
        assert recorder.text() == "Hello brave new world"
        assert recorder.kinds().count("text_delta") >= 2
        assert recorder.terminal().WhichOneof("kind") == "complete"
        assert self.wire.streamed(fake_provider.requests[0]) is True

    async def test_the_system_prompt_goes_first(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.SYSTEM_PROMPT)
        fake_provider.script(Turn.text("ok"))
        await self.run(fake_provider, AiRequest(message="hi", system_prompt="Be brief."))
        said = self.wire.conversation(fake_provider.requests[0])
        assert said[0] == ("system", "Be brief.")
        assert said[-1] == ("user", "hi")

    async def test_history_is_sent_in_order(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.CONVERSATION_MEMORY)
        fake_provider.script(Turn.text("Paris"))
        history = (ChatMessage("user", "I live in France."), ChatMessage("assistant", "Noted."))
        await self.run(fake_provider, AiRequest(message="Capital?", history=history))
        assert self.wire.conversation(fake_provider.requests[0]) == [
            ("user", "I live in France."),
            ("assistant", "Noted."),
            ("user", "Capital?"),
        ]

    async def test_usage_is_reported(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.TOKEN_USAGE)
        fake_provider.script(Turn.text("ok", usage=(12, 3)))
        recorder = await self.run(fake_provider, AiRequest(message="hi"))
        [usage] = [e.usage for e in recorder.events if e.WhichOneof("kind") == "usage"]
        assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (12, 3, 15)
        assert recorder.kinds().index("usage") < recorder.kinds().index("complete")

    # -- tools -------------------------------------------------------------------------------

    async def test_tool_calls_round_trip(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.TOOL_CALLING)
        fake_provider.script(
            Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_w")),
            Turn.text("It is sunny in Paris."),
        )
        recorder = Recorder({"get_weather": "sunny, 22C"})
        await self.run(fake_provider, AiRequest(message="Weather in Paris?"), recorder, tools=(WEATHER,))
        [call] = recorder.tool_calls
        assert (call.name, json.loads(call.arguments_json), call.call_id) == (
            "get_weather",
            {"city": "Paris"},
            "call_w",
        )
        first, second = fake_provider.requests
        assert self.wire.tool_names(first)[0] == "get_weather"
        assert self.wire.last_tool_result(second) == ("call_w", "sunny, 22C")
        assert self.wire.asked_tools(second)[0] == "get_weather"
        assert recorder.text() == "It is sunny in Paris."
        assert recorder.terminal().WhichOneof("kind") == "complete"

    async def test_parallel_tool_calls_run_concurrently(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.TOOL_CALLING)
        fake_provider.script(
            Turn.tool_calls(
                ToolCallScript("get_weather", {"city": "Oslo"}), ToolCallScript("get_time", {"city": "Oslo"})
            ),
            Turn.text("Cold, and late."),
        )
        # Each call waits for the other to be under way: one after the other, the first waits alone.
        recorder = Recorder(rendezvous=2)
        await self.run(fake_provider, AiRequest(message="Oslo?"), recorder, tools=(WEATHER, TIME))
        assert sorted(c.name for c in recorder.tool_calls) == ["get_time", "get_weather"]
        assert recorder.waited_alone == 0, "the two tools ran one after the other"
        # The user's message, then the assistant's tool calls and the 2 results.
        assert len(fake_provider.requests[1].messages) == 1 + self.wire.messages_of_a_tool_round(2)

    async def test_a_strict_tool_loop_fails_at_its_cap(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.TOOL_CALLING)
        fake_provider.script(*[Turn.tool_calls(ToolCallScript("get_weather", {"city": "X"})) for _ in range(3)])
        recorder = await self.run(
            fake_provider, AiRequest(message="loop"), tools=(WEATHER,), tool_loop=ToolLoopPolicy.strict(2)
        )
        terminal = recorder.terminal()
        assert terminal.error.message == "Tool loop exhausted after 2 iterations"
        assert len(recorder.tool_calls) == 2

    async def test_a_lenient_tool_loop_answers_without_tools(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.TOOL_CALLING)
        fake_provider.script(
            Turn.tool_calls(ToolCallScript("get_weather", {"city": "X"})),
            Turn.tool_calls(ToolCallScript("get_weather", {"city": "Y"})),
            Turn.text("Best I can say."),
        )
        recorder = await self.run(
            fake_provider, AiRequest(message="loop"), tools=(WEATHER,), tool_loop=ToolLoopPolicy.max_iterations(1)
        )
        assert not self.wire.offers_tools(fake_provider.requests[2])
        assert recorder.text() == "Best I can say."
        assert recorder.terminal().WhichOneof("kind") == "complete"

    async def test_tool_call_arguments_stream_as_deltas(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.TOOL_CALL_DELTA)
        arguments = {"city": "San Francisco, California"}
        fake_provider.script(Turn.tool_calls(ToolCallScript("get_weather", arguments, call_id="c9")), Turn.text("ok"))
        recorder = await self.run(fake_provider, AiRequest(message="?"), tools=(WEATHER,))
        deltas = [e.tool_call_delta for e in recorder.events if e.WhichOneof("kind") == "tool_call_delta"]
        assert len(deltas) > 1
        assert {d.call_id for d in deltas} == {"c9"}
        assert json.loads("".join(d.arguments_fragment for d in deltas)) == arguments

    # -- failures ----------------------------------------------------------------------------

    async def test_rate_limits_are_retried_honoring_retry_after(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.PER_REQUEST_RETRY)
        fake_provider.script(
            Turn.error("scripted failure", status=429, retry_after=0.3),
            Turn.error("scripted failure", status=503),
            Turn.text("Finally."),
        )
        started = time.monotonic()
        recorder = await self.run(fake_provider, AiRequest(message="hi"))
        assert time.monotonic() - started >= 0.3
        assert recorder.text() == "Finally."
        assert recorder.kinds().count("complete") == 1
        assert "error" not in recorder.kinds()
        assert len(fake_provider.requests) == 3

    async def test_a_bad_request_is_not_retried(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.PER_REQUEST_RETRY)
        fake_provider.script(Turn.error("bad temperature", status=400), Turn.text("never"))
        recorder = await self.run(fake_provider, AiRequest(message="hi"))
        assert recorder.terminal().error.message == "API returned 400: bad temperature"
        assert len(fake_provider.requests) == 1

    async def test_cancelling_closes_the_upstream_request(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.CANCELLATION)
        fake_provider.script(Turn.stalled("Thinking", seconds=30))
        recorder = Recorder()
        runtime = self.runtime_for(fake_provider)
        task = asyncio.create_task(runtime.execute(context(recorder, AiRequest(message="hi")), recorder.session))
        try:
            for _ in range(200):
                if recorder.text():
                    break
                await asyncio.sleep(0.01)
            assert recorder.text() == "Thinking"
            cancelled_at = time.monotonic()
            task.cancel()
            await asyncio.wait({task}, timeout=10.0)
            await asyncio.wait_for(fake_provider.disconnected.wait(), 10.0)
            assert time.monotonic() - cancelled_at < 10.0  # the stall lasts 30 s; loose for a loaded machine
        finally:
            await runtime.aclose()

    # -- structure ---------------------------------------------------------------------------

    async def test_structured_output_heals_and_fails_closed(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.STRUCTURED_OUTPUT)
        fake_provider.script(Turn.text('{"city": "Paris"}'), Turn.text('{"city": "Paris", "temperature": 21.5}'))
        recorder = await self.run(
            fake_provider, AiRequest(message="Weather?", response_format=City), structured_output_retries=1
        )
        [entity] = [e.entity_complete for e in recorder.events if e.WhichOneof("kind") == "entity_complete"]
        assert json.loads(entity.entity_json) == {"city": "Paris", "temperature": 21.5}
        assert recorder.terminal().WhichOneof("kind") == "complete"
        assert "temperature" in self.wire.conversation(fake_provider.requests[1])[-1][1]  # the reprompt names the error

        fake_provider.script(Turn.text("not json at all"))
        recorder = await self.run(fake_provider, AiRequest(message="Weather?", response_format=City))
        assert recorder.terminal().error.message.startswith("structured output did not match schema after 1 attempt(s)")
        assert "entity_complete" not in recorder.kinds()

    async def test_native_structured_output_with_fallback(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.NATIVE_STRUCTURED_OUTPUT)
        fake_provider.script(Turn.text('{"city": "Rome", "temperature": 30}'))
        await self.run(fake_provider, AiRequest(message="Weather?", response_format=City))
        assert self.wire.structured_format(fake_provider.requests[0]) == "json_schema"

        fake_provider.script(
            Turn.error("response_format is not supported", status=400),
            Turn.text('{"city": "Rome", "temperature": 30}'),
        )
        recorder = await self.run(
            fake_provider, AiRequest(message="Weather?", system_prompt="Be exact.", response_format=City)
        )
        fallback = fake_provider.requests[-1]
        assert self.wire.structured_format(fallback) is None
        instructions = self.wire.conversation(fallback)[0][1]
        assert instructions.startswith("Be exact.")
        assert "JSON schema" in instructions
        assert recorder.terminal().WhichOneof("kind") == "complete"

    async def test_models_are_listed(self, fake_provider: ScriptedModel) -> None:
        self.require(AiCapability.MODEL_ENUMERATION)
        runtime = self.runtime_for(fake_provider)
        try:
            assert await runtime.list_models() == list(fake_provider.models)
        finally:
            await runtime.aclose()
