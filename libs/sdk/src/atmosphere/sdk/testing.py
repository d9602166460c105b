"""Test an agent in-process: no NATS, no services to start, no model to download.

`AgentTestEnv` runs one agent of an `App` through the platform's own code — dispatch's run
executor and built-in runtime (the real tool loop, structured output, retries, budgets),
the sandbox's tool host (your real `@tool` functions), memory's plan and file tools over a
temporary workspace — all wired on the in-memory bus. Only the model is scripted: a
`ScriptedModel` answers each model request with the next `Turn` (text, tool calls,
structured output, an error). What the run produced comes back as the same JSON frames a
WebSocket client receives (`RunResult.frames`) and as the raw `RunEvent`s.

Model requests never reach the network here: the runtime's HTTP client talks to the script
only, and a run without a script is refused with an error frame. Pass
`allow_model_requests=True` and a `RuntimeConfig` to use a real provider on purpose.

    from atmosphere.sdk.testing import ScriptedModel, Turn, run_agent

    def test_weather() -> None:
        model = ScriptedModel(Turn.tool_call("get_weather", city="Paris"), Turn.text("Sunny in Paris."))
        result = run_agent(app, "assistant", "Weather in Paris?", model=model)
        assert result.completed
        assert result.text == "Sunny in Paris."
        assert result.tool_results() == {"get_weather": "sunny"}

In async tests, `async with AgentTestEnv(app, model=model) as env: result = await env.run(...)`
keeps one environment (memory, workspace) across several runs.

This module drives the platform's services in-process, so it needs them installed next to the
SDK (the dispatch, memory, sandbox and ingress distributions); importing it without them
raises an `ImportError` that says what to install.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel

from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    CheckToolCallRequest,
    Decision,
    RunEndedAck,
    RunEndedReport,
    ScreenedFact,
    ScreenedText,
    ScreenFactsRequest,
    ScreenFactsResponse,
    ScreenRequest,
    ScreenResponse,
)
from atmosphere.contracts.run.v1.run_pb2 import ApprovalDecision, Control, ControlAck, RunEvent, RunSubmission
from atmosphere.sdk._app import App
from atmosphere.sdk.errors import UserError
from atmosphere.sdk.runtime import RuntimeConfig

try:
    import httpx

    from atmosphere.bus import Bus, JetStreamLayout, MessageContext, Router, subjects
    from atmosphere.bus.testing import FakeBus
    from atmosphere.dispatch.conversation import ConversationMemory
    from atmosphere.dispatch.handlers import RunExecutor
    from atmosphere.dispatch.harness import HarnessConfig, resolve_app
    from atmosphere.dispatch.memory_client import MemoryClient
    from atmosphere.dispatch.pipeline import ModelPipeline
    from atmosphere.dispatch.run import ExecutorOptions
    from atmosphere.dispatch.runtime.openai import BuiltInAgentRuntime
    from atmosphere.ingress.frames import to_frame
    from atmosphere.memory.handlers import MemoryHandlers
    from atmosphere.memory.store import MemoryStore
    from atmosphere.memory.workspaces import Workspaces
    from atmosphere.sandbox.handlers import ToolHost
except ImportError as exc:  # pragma: no cover - depends on what is installed
    msg = (
        "atmosphere.sdk.testing runs your agent on the platform's own services in-process; install them "
        f"with `pip install 'atmosphere-ai-sdk[testing]'` (or `atmosphere-ai-cli`, which has them all): {exc}"
    )
    raise ImportError(msg) from exc

__all__ = [
    "AgentTestEnv",
    "ModelRequest",
    "RunResult",
    "ScriptedModel",
    "ToolCallScript",
    "Turn",
    "run_agent",
]

T = TypeVar("T", bound=BaseModel)
Frame = dict[str, Any]

SCRIPTED_BASE_URL = "http://scripted-model.invalid/v1"
"""Where the scripted model "lives": a name that resolves nowhere, so nothing can leak out."""
REFUSED = (
    "Model requests are refused in atmosphere.sdk.testing: script the model with ScriptedModel(...) "
    "or pass allow_model_requests=True with a RuntimeConfig"
)


# -- the scripted model -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCallScript:
    """One tool call a scripted turn asks for."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    """The arguments object, or raw JSON text (to test what a model's malformed JSON does)."""
    call_id: str = ""
    """Empty: `call_<n>` is assigned."""


@dataclass(frozen=True, slots=True)
class Turn:
    """What the model answers to one request; build one with the class methods."""

    content: str = ""
    """The answer text (streamed word by word)."""
    calls: tuple[ToolCallScript, ...] = ()
    """The tool calls asked for."""
    status: int = 200
    """Not 200: the provider fails the request with this HTTP status and `error_message`."""
    error_message: str = ""
    usage: tuple[int, int] = (10, 5)
    """(input, output) tokens reported for the round."""
    finish_reason: str = ""
    """Default: `tool_calls` when there are calls, else `stop`; `length` cuts the answer short."""

    @classmethod
    def text(cls, text: str, *, usage: tuple[int, int] = (10, 5), finish_reason: str = "") -> Turn:
        """Answer with `text`."""
        return cls(content=text, usage=usage, finish_reason=finish_reason)

    @classmethod
    def tool_call(cls, name: str, /, **arguments: Any) -> Turn:
        """Ask for one call of tool `name` with `arguments`."""
        return cls(calls=(ToolCallScript(name, arguments),))

    @classmethod
    def tool_calls(cls, *calls: ToolCallScript, text: str = "") -> Turn:
        """Ask for several tool calls at once (they run concurrently), optionally after some text."""
        return cls(content=text, calls=tuple(calls))

    @classmethod
    def structured(cls, value: BaseModel | Mapping[str, Any]) -> Turn:
        """Answer with `value` as JSON: the structured output of an agent with `response_format`."""
        text = value.model_dump_json() if isinstance(value, BaseModel) else json.dumps(dict(value))
        return cls(content=text)

    @classmethod
    def error(cls, message: str, *, status: int = 400) -> Turn:
        """The provider refuses the request with `status` (429 and 5xx are retried per the agent's RetryPolicy)."""
        if status < 400:
            msg = f"an error turn needs an HTTP error status (>= 400), got {status}"
            raise UserError(msg)
        return cls(status=status, error_message=message)


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One request the runtime sent to the model, as a script function sees it."""

    messages: tuple[Mapping[str, Any], ...]
    """The OpenAI-style messages: system, history, user, assistant tool calls, tool results."""
    tools: tuple[str, ...]
    """The names of the tools offered (user tools and the harness's built-in ones)."""
    body: Mapping[str, Any]
    """The whole request body (model, response_format, stream options, ...)."""

    @property
    def last_tool_result(self) -> str | None:
        """The content of the newest `tool` message, or None."""
        for message in reversed(self.messages):
            if message.get("role") == "tool":
                return str(message.get("content"))
        return None


Script = Callable[[ModelRequest], Turn]


class ScriptedModel:
    """A model that answers from a script: a list of turns, or a function of the request.

    Every request is kept in `requests`. A request past the end of the script fails the run
    with an error naming the request number (a test that makes one call too many fails loudly).
    """

    def __init__(self, *turns: Turn | str, function: Script | None = None) -> None:
        """Answer with `turns` in order (a plain string is a text turn), or with `function(request)`."""
        if turns and function is not None:
            msg = "give ScriptedModel either turns or a function, not both"
            raise UserError(msg)
        self._turns = [Turn.text(t) if isinstance(t, str) else t for t in turns]
        self._function = function
        self.requests: list[ModelRequest] = []

    def _next(self, request: ModelRequest) -> Turn:
        self.requests.append(request)
        if self._function is not None:
            return self._function(request)
        index = len(self.requests) - 1
        if index >= len(self._turns):
            return Turn.error(
                f"the scripted model has no turn left for request {index + 1} (it has {len(self._turns)})"
            )
        return self._turns[index]

    async def handle(self, http: httpx.Request) -> httpx.Response:
        """Answer one chat-completions request of the runtime (the `httpx.MockTransport` handler)."""
        if not http.url.path.endswith("/chat/completions"):
            return _error_response(404, f"the scripted model serves chat completions only, not {http.url.path}")
        body = json.loads(http.content)
        tools = tuple(t["function"]["name"] for t in body.get("tools", ()))
        try:
            turn = self._next(ModelRequest(messages=tuple(body["messages"]), tools=tools, body=body))
        except Exception as exc:  # a bug in the test's script: shown in the run's error, never retried
            return _error_response(400, f"the script function raised {type(exc).__name__}: {exc}")
        if turn.status != 200:
            return _error_response(turn.status, turn.error_message)
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content="".join(_sse(turn, body)).encode()
        )


def _error_response(status: int, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message, "type": "scripted", "code": None}})


def _chunk(body: Mapping[str, Any], delta: Mapping[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": dict(delta), "finish_reason": finish}
    chunk = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "model": body.get("model", ""),
        "choices": [choice],
    }
    return f"data: {json.dumps(chunk)}\n\n"


def _sse(turn: Turn, body: Mapping[str, Any]) -> Iterator[str]:
    """The streamed answer of `turn`, as an OpenAI-compatible server sends it."""
    yield _chunk(body, {"role": "assistant"})
    for piece in _words(turn.content):
        yield _chunk(body, {"content": piece})
    for index, call in enumerate(turn.calls):
        arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(dict(call.arguments))
        delta = {
            "id": call.call_id or f"call_{index}",
            "index": index,
            "type": "function",
            "function": {"name": call.name, "arguments": arguments},
        }
        yield _chunk(body, {"tool_calls": [delta]})
    yield _chunk(body, {}, turn.finish_reason or ("tool_calls" if turn.calls else "stop"))
    prompt, completion = turn.usage
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    yield f"data: {json.dumps({'id': 'chatcmpl-scripted', 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


def _words(text: str) -> list[str]:
    words = text.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]] if text else []


def _refuse(_request: httpx.Request) -> httpx.Response:
    return _error_response(403, REFUSED)


class _ScriptedRuntime(BuiltInAgentRuntime):
    """Dispatch's built-in runtime whose HTTP client reaches only the script (no socket is opened)."""

    def __init__(self, config: RuntimeConfig, transport: httpx.AsyncBaseTransport) -> None:
        super().__init__(config)
        self._transport = transport

    @property
    def client(self) -> httpx.AsyncClient:
        """A client over the in-memory transport."""
        if self._client is None:
            self._client = httpx.AsyncClient(transport=self._transport)
        return self._client


# -- what a run produced ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    """Everything one run produced, in order."""

    run_id: str
    events: tuple[RunEvent, ...]
    """The `RunEvent`s as dispatch published them (seq order)."""
    frames: tuple[Frame, ...]
    """The same events as the JSON frames a WebSocket client receives."""

    @property
    def kinds(self) -> list[str]:
        """Each frame's `type` or `event` name, e.g. `["tool-start", "tool-result", "streaming-text", ...]`."""
        return [str(f.get("type") or f.get("event")) for f in self.frames]

    @property
    def text(self) -> str:
        """The answer: every `streaming-text` frame joined."""
        return "".join(str(f["data"]) for f in self.frames if f.get("type") == "streaming-text")

    @property
    def completed(self) -> bool:
        """Whether the run ended with a `complete` frame."""
        return bool(self.frames) and self.frames[-1].get("type") == "complete"

    @property
    def error(self) -> Frame | None:
        """The terminal `error` frame (`data` is the message, `code` the error code), or None."""
        last = self.frames[-1] if self.frames else None
        return last if last is not None and last.get("type") == "error" else None

    def of(self, kind: str) -> list[Frame]:
        """The frames of one `type` or `event` name (`"tool-result"`, `"plan-update"`, ...)."""
        return [f for f in self.frames if kind in (f.get("type"), f.get("event"))]

    def tool_results(self) -> dict[str, str]:
        """Each tool's last successful result (`tool-result`), by tool name; errors are not in it.

        A call that failed (the tool raised, was refused, timed out, or its approval was denied)
        is in `tool_errors()` instead, so a test cannot mistake an error text for a result.
        """
        return self._last_by_tool("tool-result", "result")

    def tool_errors(self) -> dict[str, str]:
        """Each tool's last error (`tool-error`) text, by tool name (what the model was told)."""
        return self._last_by_tool("tool-error", "error")

    def _last_by_tool(self, event: str, field: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for frame in self.frames:
            if frame.get("event") == event:
                data = frame["data"]
                found[str(data.get("toolName"))] = str(data.get(field, ""))
        return found

    def output(self, model: type[T]) -> T:
        """The structured output (`entity-complete`) of an agent with `response_format`, validated."""
        entities = self.of("entity-complete")
        if not entities:
            msg = f"run {self.run_id} produced no structured output (frames: {self.kinds})"
            raise AssertionError(msg)
        data = entities[-1]["data"]
        value = data.get("entity", data) if isinstance(data, dict) else data
        return model.model_validate(value if not isinstance(value, str) else json.loads(value))


# -- the environment ----------------------------------------------------------------------------


def _allow_everything() -> Router:
    """Governance without policies: every run admitted, every tool call allowed, every result kept."""
    router = Router()

    async def admit(_request: AdmitRequest, _ctx: MessageContext) -> Decision:
        return Decision(allowed=True, policy="testing")

    async def check(_request: CheckToolCallRequest, _ctx: MessageContext) -> Decision:
        return Decision(allowed=True, policy="testing")

    async def screen(request: ScreenRequest, _ctx: MessageContext) -> ScreenResponse:
        kept = [ScreenedText(keep=True, text=text, verdict="SAFE") for text in request.texts]
        return ScreenResponse(texts=kept, tier="RULE_BASED", mode="OFF")

    async def run_ended(request: RunEndedReport, _ctx: MessageContext) -> RunEndedAck:
        return RunEndedAck(tenant=request.principal.tenant or "__default__", priced=True)

    router.add(subjects.governance("admit"), AdmitRequest, admit)
    router.add(subjects.governance("check_tool"), CheckToolCallRequest, check)
    router.add(subjects.governance("screen"), ScreenRequest, screen)
    router.add(subjects.governance("run_ended"), RunEndedReport, run_ended)
    return router


async def _store_every_fact(request: ScreenFactsRequest) -> ScreenFactsResponse:
    return ScreenFactsResponse(
        facts=[ScreenedFact(store=True, text=fact, verdict="SAFE") for fact in request.facts], tier="RULE_BASED"
    )


Approval = Literal["approve", "deny"]


class AgentTestEnv:
    """The platform in one process, for one `App`: run its agents against a scripted model.

    `workspace` (default: a fresh temporary directory, removed on exit) holds memory's store
    and the agents' plan and file workspaces, so a test can read what `write_file` wrote.
    Tools that ask for approval are answered with `approvals` ("approve" or "deny").
    """

    def __init__(
        self,
        app: App,
        *,
        model: ScriptedModel | None = None,
        allow_model_requests: bool = False,
        runtime_config: RuntimeConfig | None = None,
        workspace: Path | str | None = None,
        approvals: Approval = "approve",
    ) -> None:
        """Serve `app` with `model`; see the class docstring."""
        if not isinstance(cast(object, app), App):  # a module or a class passed by mistake
            msg = f"AgentTestEnv needs an atmosphere.sdk.App, got {type(app).__name__}"
            raise UserError(msg)
        if allow_model_requests and (runtime_config is None or not runtime_config.base_url):
            msg = "allow_model_requests=True needs runtime_config=RuntimeConfig(base_url=..., model=...)"
            raise UserError(msg)
        if approvals not in ("approve", "deny"):
            msg = f"approvals must be 'approve' or 'deny', got {approvals!r}"
            raise UserError(msg)
        self.app = app
        self.model = model
        self._allow = allow_model_requests
        self._runtime_config = runtime_config
        self._given_workspace = Path(workspace) if workspace is not None else None
        self._approvals = approvals
        self._stack: contextlib.AsyncExitStack | None = None
        self._bus: FakeBus | None = None
        self._executor: RunExecutor | None = None
        self._runs = itertools.count(1)
        self.workspace: Path = self._given_workspace or Path()
        """The directory holding memory's store and the workspaces (valid inside `async with`)."""

    def _runtime(self) -> BuiltInAgentRuntime:
        if self._allow and self._runtime_config is not None:
            return BuiltInAgentRuntime(self._runtime_config)
        config = RuntimeConfig(base_url=SCRIPTED_BASE_URL, model="scripted", stall_timeout=30.0)
        handler = self.model.handle if self.model is not None else _refuse
        return _ScriptedRuntime(config, httpx.MockTransport(handler))

    async def __aenter__(self) -> AgentTestEnv:
        """Start the in-process services."""
        stack = contextlib.AsyncExitStack()
        try:
            await self._start(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        if self._given_workspace is None:
            self.workspace = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="atmosphere-test-")))
        else:
            self.workspace = self._given_workspace
            self.workspace.mkdir(parents=True, exist_ok=True)
        bus = FakeBus()
        await bus.provision(JetStreamLayout())
        store = await stack.enter_async_context(MemoryStore.open(self.workspace / "memory.db"))
        memory = MemoryHandlers(
            store, Workspaces(self.workspace / "workspace"), _store_every_fact, max_payload=bus.max_payload
        )
        tools = ToolHost(self.app.tools, max_payload=bus.max_payload, objects=bus)
        for router in (_allow_everything(), memory.router(), tools.router(), self._approver(bus)):
            await stack.enter_async_context(bus.serve(router))
        runtime = self._runtime()
        stack.push_async_callback(runtime.aclose)
        config = HarnessConfig()
        harnesses = resolve_app(
            self.app, config, runtime_name=runtime.name, runtime_capabilities=runtime.capabilities()
        )
        pipeline = ModelPipeline(runtime, ConversationMemory(MemoryClient(bus), config, runtime))
        options = ExecutorOptions(offload_threshold=config.offload_threshold)
        self._executor = RunExecutor(self.app, bus, pipeline, options, harnesses=harnesses)
        self._bus = bus

    def _approver(self, bus: Bus) -> Router:
        """Answers every `approval-required` event with the environment's decision."""
        router = Router()
        pending: set[asyncio.Task[ControlAck]] = set()

        async def on_event(event: RunEvent, _ctx: MessageContext) -> None:
            if event.WhichOneof("kind") != "approval_required":
                return
            decision = ApprovalDecision(approval_id=event.approval_required.approval_id, action=self._approvals)
            control = Control(run_id=event.run_id, approval=decision)
            # Answered beside the subscription: the run waits for it, so it must not wait in line.
            task = asyncio.create_task(
                bus.request(subjects.run_control(event.run_id), control, ControlAck, timeout=10.0)
            )
            pending.add(task)
            task.add_done_callback(pending.discard)

        router.add(subjects.run_events_all(), RunEvent, on_event)
        return router

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop everything and remove the temporary workspace."""
        stack, self._stack, self._executor, self._bus = self._stack, None, None, None
        if stack is not None:
            await stack.aclose()

    async def run(
        self,
        agent: str,
        message: str,
        *,
        conversation_id: str = "conversation-1",
        user_id: str = "",
        metadata: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Send `message` to `agent` and return what the run produced once it ended.

        Runs of one `conversation_id` share history and workspace, as on a served stack.
        """
        if self._executor is None or self._bus is None:
            msg = "use AgentTestEnv inside `async with`"
            raise UserError(msg)
        if self.app.agent(agent) is None:
            msg = f"the app has no agent named {agent!r} (it has {sorted(self.app.agents)})"
            raise UserError(msg)
        number = next(self._runs)
        run_id = f"run-{number}-{uuid.uuid4().hex[:8]}"
        request = RunSubmission(
            run_id=run_id,
            session_id=f"session-{number}",
            conversation_id=conversation_id,
            agent=agent,
            message=message,
            principal=Principal(user_id=user_id, auth_method="anonymous" if not user_id else "testing"),
            metadata=dict(metadata or {}),
        )
        await self._executor.execute(request)
        return self._result(run_id)

    def _result(self, run_id: str) -> RunResult:
        assert self._bus is not None
        subject = subjects.run_events(run_id)
        events = sorted(
            (
                RunEvent.FromString(data)
                for s, data in self._bus.stream_messages(subjects.EVENTS_STREAM)
                if s == subject
            ),
            key=lambda e: e.seq,
        )
        frames = tuple(frame for frame in (to_frame(e) for e in events) if frame is not None)
        return RunResult(run_id=run_id, events=tuple(events), frames=frames)


def run_agent(
    app: App,
    agent: str,
    message: str,
    *,
    model: ScriptedModel | None = None,
    allow_model_requests: bool = False,
    runtime_config: RuntimeConfig | None = None,
    approvals: Approval = "approve",
) -> RunResult:
    """Run one prompt in a fresh `AgentTestEnv` and return its result (for plain, synchronous tests)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no loop running: the usual case of a plain test
    else:
        msg = "run_agent() is for synchronous tests; in an async test use `async with AgentTestEnv(...) as env`"
        raise UserError(msg)

    async def once() -> RunResult:
        env = AgentTestEnv(
            app,
            model=model,
            allow_model_requests=allow_model_requests,
            runtime_config=runtime_config,
            approvals=approvals,
        )
        async with env:
            return await env.run(agent, message)

    return asyncio.run(once())
