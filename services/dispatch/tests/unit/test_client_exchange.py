"""The caller's functions in dispatch: read from the run, checked at the choke point, kept in a seed.

A model-gateway run (an OpenAI door with the client's own `tools`) offers the client's functions
beside the agent's; a call of one passes validation, governance, roles and the run's permissions
and is then handed back, never run — the sandbox sees nothing of it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from atmosphere.bus import JetStreamLayout, MessageContext, Router, subjects
from atmosphere.bus.runs import GATEWAY_METADATA_KEY, HISTORY_METADATA_KEY
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.dispatch.client_exchange import NO_EXCHANGE, client_exchange_of
from atmosphere.dispatch.client_turns import client_turns_of
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.permissions import ToolPermission, ToolPermissions
from atmosphere.dispatch.run_input import seed_json, seeded
from atmosphere.dispatch.tools import ToolGateway
from atmosphere.sdk import AiRequest, ChatMessage, MessageToolCall, PermissionMode
from atmosphere.sdk.runtime import ToolCallRequest, ToolSpec

from .conftest import Policy, governance_router

LOOKUP = {
    "name": "lookup",
    "description": "The client's search.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}
TURNS = [
    {"role": "user", "content": "Find atlas"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "lookup", "arguments": '{"q":"a"}'}]},
    {"role": "tool", "content": "maps", "tool_call_id": "c1"},
]


def submission(**metadata: object) -> RunSubmission:
    return RunSubmission(
        run_id="r1", agent="notes", metadata={k: json.dumps(v) for k, v in metadata.items()}, principal=Principal()
    )


def test_the_exchange_is_read_from_the_run() -> None:
    run = submission(
        **{
            GATEWAY_METADATA_KEY: {
                "tools": [LOOKUP, {"name": "read_note", "parameters": {"type": "object"}}],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
                "continuation": TURNS[1:],
            }
        }
    )
    exchange = client_exchange_of(run, reserved={"read_note"})
    assert [t.name for t in exchange.tools] == ["lookup"]  # the agent's own tool of that name wins
    assert exchange.tool_choice == "required"
    assert exchange.answer_format == {"type": "json_object"}
    assert exchange.continuation == (
        ChatMessage("assistant", "", (MessageToolCall("c1", "lookup", '{"q":"a"}'),)),
        ChatMessage("tool", "maps", tool_call_id="c1"),
    )


@pytest.mark.parametrize(
    "raw",
    ["not json", "[1, 2]", json.dumps({"tools": "all", "continuation": [{"role": "wizard", "content": "x"}]})],
)
def test_a_malformed_exchange_is_left_out_not_fatal(raw: str) -> None:
    run = RunSubmission(run_id="r1", metadata={GATEWAY_METADATA_KEY: raw})
    exchange = client_exchange_of(run)
    assert exchange.tools == ()
    assert exchange.continuation == ()


def test_an_ordinary_run_has_no_exchange_and_history_keeps_tool_turns() -> None:
    assert client_exchange_of(submission()) is NO_EXCHANGE
    history = client_turns_of(submission(**{HISTORY_METADATA_KEY: TURNS})).turns
    assert [m.role for m in history] == ["user", "assistant", "tool"]
    assert history[1].tool_calls == (MessageToolCall("c1", "lookup", '{"q":"a"}'),)
    assert history[2].tool_call_id == "c1"


def test_a_durable_runs_seed_keeps_the_calls_of_its_history() -> None:
    history = client_turns_of(submission(**{HISTORY_METADATA_KEY: TURNS})).turns
    request = AiRequest(message="And globe?", system_prompt="Be exact.", history=history)
    seed = seed_json(request, conversation_id="c1", user_id="", path="/p", tools_digest="d")
    again = seeded(AiRequest(message=""), seed)
    assert again.history == history
    assert (again.message, again.system_prompt) == ("And globe?", "Be exact.")


@dataclass
class Bench:
    bus: FakeBus
    policy: Policy
    sandbox_calls: list[ToolCall] = field(default_factory=list)
    events: list[RunEvent] = field(default_factory=list)

    async def emit(self, event: RunEvent) -> None:
        self.events.append(event)

    def gateway(self, mode: PermissionMode = PermissionMode.DEFAULT, **permissions: ToolPermission) -> ToolGateway:
        spec = ToolSpec(LOOKUP["name"], LOOKUP["description"], LOOKUP["parameters"])  # type: ignore[arg-type]
        return ToolGateway(
            bus=self.bus,
            run=RunSubmission(run_id="r1", agent="notes", principal=Principal()),
            emit=self.emit,
            tools={},
            control=RunControl("r1"),
            permission_mode=mode,
            permissions=ToolPermissions(dict(permissions)),
            client_tools={"lookup": spec},
        )


@pytest.fixture
async def bench() -> AsyncIterator[Bench]:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    state = Bench(bus, Policy())
    sandbox = Router()

    async def answer(call: ToolCall, _ctx: MessageContext) -> ToolReply:
        state.sandbox_calls.append(call)
        return ToolReply(call_id=call.call_id, content="ran")

    sandbox.add(subjects.tool("lookup"), ToolCall, answer)
    async with bus.serve(governance_router(state.policy)), bus.serve(sandbox):
        yield state


def lookup(arguments: str = '{"q": "atlas"}') -> ToolCallRequest:
    return ToolCallRequest(call_id="c1", name="lookup", arguments_json=arguments)


async def test_a_checked_call_is_handed_back_never_run(bench: Bench) -> None:
    assert await bench.gateway().pass_to_client(lookup()) is None
    assert [c.tool_name for c in bench.policy.checks] == ["lookup"]
    [start] = bench.events
    assert (start.tool_start.tool_name, json.loads(start.tool_start.arguments_json)) == ("lookup", {"q": "atlas"})
    assert bench.sandbox_calls == []


async def test_governance_refuses_a_call_before_it_is_handed_back(bench: Bench) -> None:
    bench.policy.tools = False
    refusal = await bench.gateway().pass_to_client(lookup())
    assert refusal is not None
    assert "test-policy" in refusal
    assert bench.events == []


async def test_bad_arguments_and_unknown_names_go_back_to_the_model(bench: Bench) -> None:
    refusal = await bench.gateway().pass_to_client(lookup('{"q": 3}'))
    assert refusal is not None
    assert "q: expected string" in refusal
    unknown = await bench.gateway().pass_to_client(ToolCallRequest(call_id="c2", name="erase", arguments_json="{}"))
    assert unknown is not None
    assert "erase" in unknown
    assert bench.policy.checks == []


async def test_the_runs_permissions_hold_for_the_callers_functions(bench: Bench) -> None:
    denied = await bench.gateway(lookup=ToolPermission.DENY).pass_to_client(lookup())
    assert denied is not None
    assert "denied by ToolPermissionPolicy" in denied
    assert await bench.gateway(PermissionMode.DENY_ALL).pass_to_client(lookup()) is not None
    assert [e.WhichOneof("kind") for e in bench.events] == ["tool_error", "tool_error"]
    # A confirm asks nobody: nothing runs here, the caller decides whether its function runs.
    assert await bench.gateway(lookup=ToolPermission.CONFIRM).pass_to_client(lookup()) is None


def test_a_result_cut_from_its_call_is_left_out_of_a_long_history() -> None:
    turns = [{"role": "user", "content": f"q{i}"} for i in range(300)] + TURNS
    # The call is the history's second to last turn: kept; a result whose call was cut away is not.
    assert [m.role for m in client_turns_of(submission(**{HISTORY_METADATA_KEY: turns})).turns][-3:] == [
        "user",
        "assistant",
        "tool",
    ]
    orphan = [{"role": "tool", "content": "lost", "tool_call_id": "c0"}, *TURNS]
    kept = client_turns_of(submission(**{HISTORY_METADATA_KEY: orphan})).turns
    assert [m.role for m in kept] == ["user", "assistant", "tool"]
