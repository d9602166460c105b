"""Test an agent on the platform's own services: no NATS, no stack to start, no model to download.

`AgentTestEnv` starts, for one `App`, the services an agent's run goes through — governance with
the app's policies, memory, the sandbox running the app's tools in its worker processes,
dispatch with its built-in runtime — each through its own `serve()` on the in-memory bus, and
submits runs as ingress does (`atmosphere.bus.runs.new_run`). Only the model is scripted: a
`ScriptedModel` answers each model request with the next `Turn` (text, tool calls, structured
output, an error). What the run produced comes back as the same JSON frames a WebSocket client
receives (`RunResult.frames`) and as the raw `RunEvent`s.

Model requests never reach the network here: the runtime's HTTP client talks to the script
only, and a run without a script is refused with an error frame. Pass
`allow_model_requests=True` and a `RuntimeConfig` to use a real provider on purpose.

    from atmosphere.testing import ScriptedModel, Turn, run_agent

    def test_weather() -> None:
        model = ScriptedModel(Turn.tool_call("get_weather", city="Paris"), Turn.text("Sunny in Paris."))
        result = run_agent(app, "assistant", "Weather in Paris?", model=model)
        assert result.completed
        assert result.text == "Sunny in Paris."
        assert result.tool_results() == {"get_weather": "sunny"}

In async tests, `async with AgentTestEnv(app, model=model) as env: result = await env.run(...)`
keeps one environment (memory, workspace, the tool workers) across several runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import tempfile
import types
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Literal, cast

import httpx

from atmosphere.bus.runs import follow_run, new_run, send_control
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import ApprovalDecision, Control, RunEvent
from atmosphere.sdk import App
from atmosphere.sdk.errors import UserError
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.testing.app_reference import AppReference, reference_of
from atmosphere.testing.results import RunResult, result_of
from atmosphere.testing.scripted_model import ScriptedModel, refuse

Approval = Literal["approve", "deny"]
TRANSPORT = "websocket"
"""The transport runs are submitted as: the kit stands in for a WebSocket client (its frames)."""


class AgentTestEnv:
    """The platform's services for one `App`, in this process: run its agents against a scripted model.

    `workspace` (default: a fresh temporary directory, removed on exit) holds the services' data
    and the agents' plan and file workspaces (`workspace / "workspace"`), so a test can read what
    `write_file` wrote. Tools that ask for approval are answered with `approvals` ("approve" or
    "deny"). The app's tools run in `tool_workers` sandbox worker processes, which import the app
    by its module (so it must be a module-level name); 0 runs them inside this process, for a
    test that reads what a tool changed in the test's own memory.
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
        tool_workers: int = 1,
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
        self._reference = _reference(app, tool_workers)
        self._real_model = runtime_config if allow_model_requests else None
        self._given_workspace = Path(workspace) if workspace is not None else None
        self._approvals = approvals
        self._tool_workers = tool_workers
        self._stack: contextlib.AsyncExitStack | None = None
        self._bus: FakeBus | None = None
        self._runs = itertools.count(1)
        self.workspace: Path = self._given_workspace or Path()
        """The directory holding the services' data and the workspaces (valid inside `async with`)."""

    def _transport(self) -> httpx.AsyncBaseTransport | None:
        """What dispatch's runtime reaches: the script (or a refusal), or the network when allowed."""
        if self._real_model is not None:
            return None
        return httpx.MockTransport(self.model.handle if self.model is not None else refuse)

    async def __aenter__(self) -> AgentTestEnv:
        """Start the services."""
        stack = contextlib.AsyncExitStack()
        try:
            await self._start(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        # Imported here, not with this module: the sandbox's workers import the test module
        # (the app's home), and with it this one; the services are for the test process only.
        from atmosphere.testing.platform import SCRIPTED, Platform, running  # noqa: PLC0415

        if self._given_workspace is None:
            self.workspace = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="atmosphere-test-")))
        else:
            self.workspace = self._given_workspace
            self.workspace.mkdir(parents=True, exist_ok=True)
        reference = self._reference or stack.enter_context(_registered(self.app))
        platform = Platform(reference, self.workspace, self._tool_workers, model=self._real_model or SCRIPTED)
        bus = FakeBus()
        await stack.enter_async_context(running(platform, bus=bus, transport=self._transport()))
        self._bus = bus

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the services (and the tool workers) and remove the temporary workspace."""
        stack, self._stack, self._bus = self._stack, None, None
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
        bus = self._bus
        if bus is None:
            msg = "use AgentTestEnv inside `async with`"
            raise UserError(msg)
        if self.app.agent(agent) is None:
            msg = f"the app has no agent named {agent!r} (it has {sorted(self.app.agents)})"
            raise UserError(msg)
        number = next(self._runs)
        run = new_run(
            agent=agent,
            message=message,
            principal=Principal(user_id=user_id, auth_method="anonymous" if not user_id else "testing"),
            conversation_id=conversation_id,
            transport=TRANSPORT,
            metadata=metadata,
            run_id=f"run-{number}-{uuid.uuid4().hex[:8]}",
        )
        run.session_id = f"session-{number}"  # numbered per environment: what a test can expect
        events: list[RunEvent] = []
        async for event in follow_run(bus, run.run_id, submit=run):
            events.append(event)
            if event.WhichOneof("kind") == "approval_required":
                await self._answer(bus, event, run.principal)
        return result_of(run.run_id, events)

    async def _answer(self, bus: FakeBus, event: RunEvent, principal: Principal) -> None:
        """Answer an approval request with the environment's decision, as a client does through ingress."""
        decision = ApprovalDecision(approval_id=event.approval_required.approval_id, action=self._approvals)
        # A sub-agent's approval is answered to the sub-run that waits for it.
        owner = event.origin_run_id or event.run_id
        await send_control(bus, Control(run_id=owner, principal=principal, approval=decision))


def _reference(app: App, tool_workers: int) -> AppReference | None:
    """Where the services import `app` from; None: only this process can (it is registered on entry)."""
    reference = reference_of(app)
    if reference is None and tool_workers > 0 and app.tools:
        msg = (
            "the sandbox's tool workers import the app by name, and this App is not a module-level name "
            "of any imported module: define it at module level (`app = App(...)`), "
            "or pass tool_workers=0 to run its tools in this process"
        )
        raise UserError(msg)
    return reference


@contextlib.contextmanager
def _registered(app: App) -> Iterator[AppReference]:
    """`app` as a module of this process only (the services in it load it by name), while the context lasts.

    Its app directory is the current one, as `atmosphere dev`'s default: a policy file there applies.
    """
    name = f"atmosphere_testing_app_{uuid.uuid4().hex}"
    module = types.ModuleType(name)
    module.app = app  # type: ignore[attr-defined]
    sys.modules[name] = module
    try:
        yield AppReference(app=f"{name}:app", app_dir=Path.cwd())
    finally:
        del sys.modules[name]


def run_agent(
    app: App,
    agent: str,
    message: str,
    *,
    model: ScriptedModel | None = None,
    allow_model_requests: bool = False,
    runtime_config: RuntimeConfig | None = None,
    approvals: Approval = "approve",
    tool_workers: int = 1,
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
            tool_workers=tool_workers,
        )
        async with env:
            return await env.run(agent, message)

    return asyncio.run(once())
