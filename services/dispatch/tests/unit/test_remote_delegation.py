"""`delegate_task` to a remote A2A agent: a real `a2a-sdk` server on loopback, governance on the in-memory bus.

The server is the SDK's own (`DefaultRequestHandler`, its JSON-RPC and Agent Card routes) with a
scripted executor: what it does depends on the message (`hello`, `fail`, `ask`, `hang`, `big`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.governance.v1.governance_pb2 import (
    AdmitRequest,
    CheckOutputRequest,
    Decision,
    RunEndedAck,
    RunEndedReport,
)
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.dispatch.delegation import Delegation
from atmosphere.dispatch.governance_client import GovernanceClient
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.dispatch.remote_delegation import (
    REMOTE_METADATA_KEY,
    STARTED,
    RemoteLimits,
    RemoteMember,
    RemoteOverride,
    remote_fleets,
    remote_info,
)
from atmosphere.sdk import App, RemoteAgent, agent, coordinator
from atmosphere.testing.asgi_server import serving_asgi

pytest.importorskip("a2a.server", reason="dispatch's `a2a` extra (with the SDK's server) is not installed")

from a2a.helpers import new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, TaskState
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN = "remote-secret"
CAP = 10.0
"""A safety cap on waiting for the server's side of a test (never what is asserted)."""


@dataclass
class Remote:
    """The scripted A2A agent: what it was sent, what it was asked to cancel."""

    url: str = ""
    messages: list[str] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    cancels: list[str] = field(default_factory=list)
    interface_url: str = ""
    """The interface its card names (empty: its own URL)."""


class Scripted(AgentExecutor):
    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        text = context.get_user_input()
        self.remote.messages.append(text)
        await event_queue.enqueue_event(new_task_from_user_message(context.message))
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        working = updater.new_agent_message([new_text_part("Looking it up")])
        await updater.update_status(TaskState.TASK_STATE_WORKING, message=working)
        if text == "fail":
            await updater.failed(updater.new_agent_message([new_text_part("no sources found")]))
        elif text == "ask":
            await updater.requires_input(updater.new_agent_message([new_text_part("Which year?")]))
        elif text == "hang":
            await updater.add_artifact([new_text_part("partial")], artifact_id="answer", name="answer")
            await asyncio.Event().wait()  # until the SDK cancels the executor, or the server stops
        elif text == "flood":  # more than the call may read, then no end
            for i in range(40):
                await updater.add_artifact(
                    [new_text_part("y" * 5000)], artifact_id="answer", name="answer", append=i > 0
                )
            await asyncio.Event().wait()
        elif text == "big":
            await updater.add_artifact([new_text_part("x" * 200_000)], artifact_id="answer", name="answer")
            await updater.complete()
        else:
            for i, chunk in enumerate(["Hel", "lo from ", "afar"]):
                await updater.add_artifact([new_text_part(chunk)], artifact_id="answer", name="answer", append=i > 0)
            await updater.add_artifact(
                [new_text_part("Hello from afar")], artifact_id="answer", name="answer", last_chunk=True
            )
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.remote.cancels.append(context.task_id or "")
        self.remote.cancelled.set()
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()


class _Recording:
    """The app, with each request's Authorization header noted."""

    def __init__(self, app: ASGIApp, remote: Remote) -> None:
        self.app, self.remote = app, remote

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            self.remote.authorizations.append(headers.get(b"authorization", b"").decode())
        await self.app(scope, receive, send)


def _card(url: str) -> AgentCard:
    return AgentCard(
        name="researcher",
        description="Finds sources.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=url, protocol_binding=TransportProtocol.JSONRPC, protocol_version=PROTOCOL_VERSION_CURRENT
            )
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="research", name="research", description="Research", tags=["research"])],
    )


@contextlib.asynccontextmanager
async def serving(remote: Remote) -> AsyncIterator[Remote]:
    """The scripted agent at `remote.url` (its card under it) until the context exits."""
    holder: dict[str, AgentCard] = {}

    async def card_now(_card: AgentCard) -> AgentCard:
        return holder["card"]

    handler = DefaultRequestHandler(
        agent_executor=Scripted(remote), task_store=InMemoryTaskStore(), agent_card=_card("http://placeholder/a2a")
    )
    routes = [
        *create_agent_card_routes(
            _card("http://placeholder/a2a"), card_modifier=card_now, card_url="/a2a/.well-known/agent-card.json"
        ),
        *create_jsonrpc_routes(handler, rpc_url="/a2a"),
    ]
    app = _Recording(Starlette(routes=routes), remote)
    async with serving_asgi(app) as port:
        remote.url = f"http://127.0.0.1:{port}/a2a"
        holder["card"] = _card(remote.interface_url or remote.url)
        yield remote


@dataclass
class Gate:
    """The stand-in governance: the admissions it saw, the ends reported, its answer."""

    allow: bool = True
    rewrite: str = ""
    judge_output: str | None = None
    """A word no answer may hold (admission then says answers are checked); None: answers are not judged."""
    admissions: list[AdmitRequest] = field(default_factory=list)
    output_checks: list[CheckOutputRequest] = field(default_factory=list)
    ended: list[RunEndedReport] = field(default_factory=list)


@dataclass
class World:
    bus: FakeBus
    remote: Remote
    gate: Gate
    events: list[RunEvent] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the parent heard the remote task began (its id known: it can be cancelled)."""

    async def emit(self, event: RunEvent) -> None:
        self.events.append(event)
        if event.progress.message.startswith(STARTED):
            self.started.set()

    def delegation(self, **kw: Any) -> Delegation:
        member = kw.pop("member", RemoteMember("researcher", self.remote.url, TOKEN))
        return Delegation(
            self.bus,
            RunSubmission(
                run_id="parent-1",
                conversation_id="c1",
                agent="lead",
                message="coordinate",
                principal=Principal(user_id="ada"),
            ),
            self.emit,
            fleet=kw.pop("fleet", {}),
            memory=MemoryClient(self.bus, timeout=1),
            remotes={"researcher": member},
            governance=GovernanceClient(kw.pop("governance_bus", self.bus), timeout=2),
            remote_limits=kw.pop("limits", RemoteLimits(timeout=CAP)),
            **kw,
        )

    def forwarded(self, kind: str) -> list[RunEvent]:
        return [e for e in self.events if e.WhichOneof("kind") == kind]


@pytest.fixture
async def world() -> AsyncIterator[World]:
    bus = FakeBus()
    gate = Gate()

    async def admit(request: AdmitRequest, _ctx: MessageContext) -> Decision:
        gate.admissions.append(request)
        if not gate.allow:
            return Decision(allowed=False, policy="no-remote", reason="remote delegation is off")
        return Decision(allowed=True, rewritten_message=gate.rewrite, check_output=gate.judge_output is not None)

    async def check_output(request: CheckOutputRequest, _ctx: MessageContext) -> Decision:
        gate.output_checks.append(request)
        if gate.judge_output and gate.judge_output in request.response:
            return Decision(allowed=False, policy="no-words", reason=f"'{gate.judge_output}' is not said here")
        return Decision(allowed=True)

    async def ended(report: RunEndedReport, _ctx: MessageContext) -> RunEndedAck:
        gate.ended.append(report)
        return RunEndedAck()

    router = Router()
    router.add(subjects.governance("admit"), AdmitRequest, admit)
    router.add(subjects.governance("run_ended"), RunEndedReport, ended)
    router.add(subjects.governance("check_output"), CheckOutputRequest, check_output)
    async with bus.serve(router), serving(Remote()) as remote:
        yield World(bus, remote, gate)


async def test_the_remote_answer_comes_back_and_its_text_streams_tagged(world: World) -> None:
    result = await world.delegation().delegate_task({"agent": "researcher", "message": "hello"})

    assert result == "Hello from afar"
    assert world.remote.messages == ["hello"]
    # The token went with the card's request and the message's.
    assert len(world.remote.authorizations) >= 2
    assert set(world.remote.authorizations) == {f"Bearer {TOKEN}"}
    deltas = world.forwarded("text_delta")
    assert "".join(e.text_delta.text for e in deltas) == "Hello from afar"
    admitted = world.gate.admissions[0]
    assert {e.origin_agent for e in world.events} == {"researcher"}
    assert {e.origin_run_id for e in world.events} == {admitted.run_id}
    progress = [e.progress.message for e in world.forwarded("progress")]
    assert progress[1:] == ["Looking it up"]
    assert progress[0].startswith("The remote agent took the task (task ")
    # The edge, as governance sees a sub-run's: the parent, the member, its URL.
    assert admitted.parent_run_id == "parent-1"
    assert admitted.agent == "researcher"
    assert admitted.transport == "delegation"
    assert admitted.metadata[REMOTE_METADATA_KEY] == world.remote.url
    assert admitted.principal.user_id == "ada"
    assert [(r.run_id, r.succeeded) for r in world.gate.ended] == [(admitted.run_id, True)]


async def test_a_declared_url_names_the_member_too(world: World) -> None:
    result = await world.delegation().delegate_task({"agent": world.remote.url + "/", "message": "hello"})
    assert result == "Hello from afar"


async def test_an_undeclared_url_is_an_unknown_agent(world: World) -> None:
    other = world.remote.url.replace("/a2a", "/other")
    result = await world.delegation().delegate_task({"agent": other, "message": "hello"})
    assert result == f"delegate_task failed: unknown agent '{other}'. Available agents: [researcher]"
    assert world.remote.messages == []
    assert world.gate.admissions == []


async def test_governance_denies_the_edge_before_anything_is_sent(world: World) -> None:
    world.gate.allow = False
    result = await world.delegation().delegate_task({"agent": "researcher", "message": "hello"})
    assert result == (
        "delegate_task to 'researcher' failed: Request denied by policy no-remote: remote delegation is off"
    )
    assert world.remote.messages == []
    assert world.remote.authorizations == []


async def test_a_rewritten_message_is_what_the_remote_gets(world: World) -> None:
    world.gate.rewrite = "hello"
    await world.delegation().delegate_task({"agent": "researcher", "message": "hello jane.doe@example.com"})
    assert world.remote.messages == ["hello"]


async def test_under_output_policies_the_remote_text_shows_only_once_checked(world: World) -> None:
    world.gate.judge_output = "afar"
    result = await world.delegation().delegate_task({"agent": "researcher", "message": "hello"})
    assert result == "delegate_task to 'researcher' failed: Response blocked: 'afar' is not said here"
    # The answer was held (shorter than one check's 200 characters) until the task's end, when the
    # check of the whole of it stopped it.
    assert [c.response for c in world.gate.output_checks] == ["Hello from afar"]
    assert world.forwarded("text_delta") == []
    assert [r.succeeded for r in world.gate.ended] == [False]

    world.gate.judge_output = "nowhere"
    result = await world.delegation().delegate_task({"agent": "researcher", "message": "hello"})
    assert result == "Hello from afar"
    assert "".join(e.text_delta.text for e in world.forwarded("text_delta")) == "Hello from afar"


async def test_without_governance_nothing_is_sent(world: World) -> None:
    silent = FakeBus()  # no governance answers there
    result = await world.delegation(governance_bus=silent).delegate_task({"agent": "researcher", "message": "hello"})
    assert result.startswith("delegate_task to 'researcher' failed: Request denied: governance is unavailable")
    assert world.remote.messages == []


async def test_a_failed_remote_task_is_a_failure_text(world: World) -> None:
    result = await world.delegation().delegate_task({"agent": "researcher", "message": "fail"})
    assert result == "delegate_task to 'researcher' failed: no sources found"
    assert [r.succeeded for r in world.gate.ended] == [False]


async def test_a_remote_asking_for_input_is_cancelled(world: World) -> None:
    result = await world.delegation().delegate_task({"agent": "researcher", "message": "ask"})
    assert result == (
        "delegate_task to 'researcher' failed: the remote agent asked for input, which a delegation cannot give: "
        "Which year?"
    )
    await asyncio.wait_for(world.remote.cancelled.wait(), CAP)
    assert len(world.remote.cancels) == 1


async def test_the_deadline_cancels_the_remote_task(world: World) -> None:
    # The remote never finishes: only the deadline ends the call (long enough for the card and
    # the first events on any machine, which the test does not assert on).
    result = await world.delegation(limits=RemoteLimits(timeout=2.0)).delegate_task(
        {"agent": "researcher", "message": "hang"}
    )
    assert result == "delegate_task to 'researcher' failed: no reply within 2 seconds"
    if world.started.is_set():  # the task's id had come (always, unless the machine took 2 s for that)
        await asyncio.wait_for(world.remote.cancelled.wait(), CAP)
    assert [r.succeeded for r in world.gate.ended] == [False]


async def test_cancelling_the_parent_cancels_the_remote_task(world: World) -> None:
    call = asyncio.create_task(world.delegation().delegate_task({"agent": "researcher", "message": "hang"}))
    await asyncio.wait_for(world.started.wait(), CAP)  # the remote task is under way, its id known
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(world.remote.cancelled.wait(), CAP)
    assert len(world.remote.cancels) == 1
    # What admission took is given back even so.
    assert [r.succeeded for r in world.gate.ended] == [False]


async def test_what_a_remote_sends_is_bounded(world: World) -> None:
    limits = RemoteLimits(timeout=CAP, max_bytes=100_000)
    result = await world.delegation(limits=limits).delegate_task({"agent": "researcher", "message": "big"})
    assert result == "delegate_task to 'researcher' failed: the remote agent sent more than 100000 bytes"


async def test_a_remote_flooding_a_call_has_its_task_cancelled(world: World) -> None:
    limits = RemoteLimits(timeout=CAP, max_bytes=100_000)
    result = await world.delegation(limits=limits).delegate_task({"agent": "researcher", "message": "flood"})
    assert result == "delegate_task to 'researcher' failed: the remote agent sent more than 100000 bytes"
    await asyncio.wait_for(world.remote.cancelled.wait(), CAP)


async def test_a_card_pointing_elsewhere_is_refused(world: World) -> None:
    world.remote.interface_url = "http://169.254.169.254/a2a"
    async with serving(world.remote) as remote:
        result = await world.delegation(member=RemoteMember("researcher", remote.url)).delegate_task(
            {"agent": "researcher", "message": "hello"}
        )
    assert result.startswith("delegate_task to 'researcher' failed: its Agent Card names no interface at http://127")
    assert remote.messages == []


async def test_an_unreachable_remote_is_a_failure_text(world: World) -> None:
    gone = RemoteMember("researcher", "http://127.0.0.1:9/a2a")
    result = await world.delegation(member=gone).delegate_task({"agent": "researcher", "message": "hello"})
    assert result.startswith("delegate_task to 'researcher' failed: its Agent Card could not be read")
    assert [r.succeeded for r in world.gate.ended] == [False]


async def test_a_member_without_url_says_where_to_set_it(world: World) -> None:
    result = await world.delegation(member=RemoteMember("researcher", "")).delegate_task(
        {"agent": "researcher", "message": "hello"}
    )
    assert result == (
        "delegate_task to 'researcher' failed: no URL is configured for it (its url in ATMOSPHERE_DELEGATION__REMOTES)"
    )
    assert world.gate.admissions == []


async def test_without_the_extra_the_error_names_it(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "a2a.client", None)
    result = await world.delegation().delegate_task({"agent": "researcher", "message": "hello"})
    assert result == (
        "Error: delegate_task cannot reach the remote agent 'researcher': the A2A client is not installed here "
        "(install atmosphere-ai-dispatch[a2a])"
    )
    assert world.gate.admissions == []


async def test_local_and_remote_members_are_listed_together(world: World) -> None:
    result = await world.delegation(fleet={"writer": ""}).delegate_task({"agent": "nobody", "message": "x"})
    assert result == "delegate_task failed: unknown agent 'nobody'. Available agents: [writer, researcher]"


def test_the_deployment_moves_a_declared_member_and_gives_its_token() -> None:
    @agent(name="writer")
    class Writer: ...

    @coordinator(name="lead", fleet=[Writer, RemoteAgent("researcher", "https://declared.example/a2a")])
    class Lead: ...

    app = App(agents=[Writer, Lead])
    moved = remote_fleets(app, {"researcher": RemoteOverride(url="https://moved.example/a2a", token="s3cr3t")})
    assert moved == {"lead": {"researcher": RemoteMember("researcher", "https://moved.example/a2a", "s3cr3t")}}
    assert "s3cr3t" not in repr(moved)
    # A name no coordinator declares adds nothing.
    assert remote_fleets(app, {"intruder": RemoteOverride(url="https://evil.example/a2a")}) == {
        "lead": {"researcher": RemoteMember("researcher", "https://declared.example/a2a")}
    }
    assert remote_info(moved) == {"researcher": "ACTIVE(a2a https://moved.example:443)"}
    assert remote_info({"lead": {"r": RemoteMember("r", "")}}) == {"r": "INACTIVE(no-url)"}
