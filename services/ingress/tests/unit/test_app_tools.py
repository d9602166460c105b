"""The app's `@tool`s the MCP door exposes (`ATMOSPHERE_MCP__TOOLS`): which, named how, for whom."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.config import TokenGrant
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.tool.v1.tool_pb2 import ToolDescriptor
from atmosphere.ingress.app import surfaces
from atmosphere.ingress.app_tools import ToolDescriptors, app_tools, exposed_name, usable_by
from atmosphere.ingress.auth import Authenticator
from atmosphere.ingress.settings import IngressSettings, McpOptions

SCHEMA = '{"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}'


def agent(name: str, *app: str, tools: tuple[str, ...] = ()) -> AgentDescriptor:
    return AgentDescriptor(name=name, path=f"/atmosphere/agent/{name}", tools=[*app, *tools], app_tools=app)


def described(*names: str, provider: str = "sandbox") -> dict[str, ToolDescriptor]:
    return {
        n: ToolDescriptor(name=n, description=f"{n}.", parameters_json_schema=SCHEMA, provider=provider) for n in names
    }


def test_nothing_is_exposed_unless_configured() -> None:
    assert app_tools([agent("notes", "read_note")], described("read_note"), ()) == {}


def test_each_exposed_tool_is_named_by_its_agent_with_its_schema() -> None:
    agents = [agent("notes", "read_note", "drop_table", tools=("write_todos",)), agent("files", "read_note")]
    tools = app_tools(agents, described("read_note", "drop_table", "write_todos"), ["read_note"])
    assert sorted(tools) == ["files__read_note", "notes__read_note"]
    one = tools["notes__read_note"]
    assert (one.agent.name, one.tool, one.input_schema["required"]) == ("notes", "read_note", ["title"])
    everything = app_tools(agents, described("read_note", "drop_table", "write_todos"), ["*"])
    # A harness tool (only in `tools`) is never exposed: only the agent's own `@tool`s are.
    assert sorted(everything) == ["files__read_note", "notes__drop_table", "notes__read_note"]


def test_a_tool_no_sandbox_serves_is_not_exposed() -> None:
    agents = [agent("notes", "read_note", "gone")]
    tools = app_tools(agents, {**described("read_note"), **described("gone", provider="memory")}, ["*"])
    assert list(tools) == ["notes__read_note"]


def test_a_name_that_could_mean_two_things_is_offered_by_nobody() -> None:
    agents = [
        agent("a", "b__c"),
        agent("a__b", "c"),  # both would be a__b__c
        agent("x", "y"),
        agent("x__y"),  # an agent is a tool of the door: it wins
        agent("odd:name", "y"),  # a colon is no MCP tool name
    ]
    tools = app_tools(agents, described("b__c", "c", "y"), ["*"])
    assert sorted(tools) == []
    assert exposed_name("notes", "read_note") == "notes__read_note"


def test_only_the_tools_of_agents_the_caller_may_use_are_theirs() -> None:
    tools = app_tools([agent("notes", "read_note"), agent("echo", "shout")], described("read_note", "shout"), ["*"])
    grants = (
        TokenGrant(token="token-all-agents", user_id="ada"),
        TokenGrant(token="token-echo-only", user_id="bob", paths=("/atmosphere/agent/echo",)),
    )
    auth = Authenticator(grants)
    ada = auth.identify({"authorization": "Bearer token-all-agents"})
    bob = auth.identify({"authorization": "Bearer token-echo-only"})
    assert sorted(usable_by(ada, tools)) == ["echo__shout", "notes__read_note"]
    assert sorted(usable_by(bob, tools)) == ["echo__shout"]


@pytest.mark.parametrize(
    ("raw", "names"),
    [("*", ("*",)), ("read_note, delete_note", ("read_note", "delete_note")), ('["read_note"]', ("read_note",))],
)
def test_the_setting_takes_names_a_list_or_every_tool(raw: str, names: tuple[str, ...]) -> None:
    assert McpOptions(tools=raw).tools == names  # type: ignore[arg-type] - as the environment gives it


@pytest.mark.parametrize("raw", ["bad name", "a.b", "x" * 65])
def test_the_setting_refuses_what_is_no_tool_name(raw: str) -> None:
    with pytest.raises(ValidationError, match="no tool name"):
        McpOptions(tools=raw)  # type: ignore[arg-type]


def test_the_info_names_the_exposed_tools_only_when_configured() -> None:
    assert "appTools" not in surfaces(IngressSettings()).get("mcp", {})
    configured = surfaces(IngressSettings(mcp=McpOptions(tools=("read_note",))))
    if "mcp" in configured:  # served where the SDK is installed
        assert configured["mcp"]["appTools"] == ["read_note"]


async def test_the_descriptors_are_read_once_per_ttl() -> None:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    await bus.kv_put(subjects.TOOLS_BUCKET, "read_note", described("read_note")["read_note"])
    now = [0.0]
    descriptors = ToolDescriptors(bus, ttl=2.0, clock=lambda: now[0])
    assert list(await descriptors.all()) == ["read_note"]
    await bus.kv_put(subjects.TOOLS_BUCKET, "shout", described("shout")["shout"])
    assert list(await descriptors.all()) == ["read_note"]  # within the ttl
    now[0] = 5.0
    assert sorted(await descriptors.all()) == ["read_note", "shout"]
