"""MCP servers' tools at the choke point: offered while listed, governed as `<server>.<tool>`, sent on.

The sandbox's side (sessions, listing) is stood in for: descriptors written to `ATMO_TOOLS` as a
sandbox lists them, and a router answering `atmo.tool.mcp:<server>`.
"""

from __future__ import annotations

import json

from atmosphere.bus import MessageContext, Router, subjects
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolDescriptor, ToolReply
from atmosphere.dispatch.descriptors import publish_descriptors
from atmosphere.dispatch.permissions import ToolPermission, ToolPermissions
from atmosphere.sdk import App, McpServer, agent
from atmosphere.sdk.host import APPROVED_ARGUMENT
from atmosphere.testing import ToolCallScript, Turn

from .conftest import Harness, request

DOCS = McpServer.http("docs", "http://127.0.0.1:9/mcp", timeout=7)
FILES = McpServer.stdio("files", ["python", "-m", "files"])
SEARCH_SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}


@agent(name="reader", system_prompt="Read.", mcp_servers=[DOCS, FILES], harness=[])
class Reader:
    """Calls MCP tools."""


@agent(name="plain", system_prompt="No servers.", harness=[])
class Plain:
    """Declares no MCP server."""


APP = App(agents=[Reader, Plain])


def listed(name: str, schema: dict[str, object] | None = None) -> ToolDescriptor:
    return ToolDescriptor(
        name=name,
        description=f"The tool {name}.",
        parameters_json_schema=json.dumps(schema or {"type": "object", "properties": {}}),
        timeout_seconds=7,
        provider="mcp",
    )


async def list_tools(harness: Harness, *names: str) -> None:
    for name in names:
        schema = SEARCH_SCHEMA if name == "docs__search" else None
        await harness.bus.kv_put(subjects.TOOLS_BUCKET, name, listed(name, schema))


async def serve_mcp(harness: Harness, calls: list[tuple[str, ToolCall]], *servers: str) -> None:
    """A sandbox holding sessions with `servers`: each call is recorded and answered."""
    router = Router()
    for server in servers:

        async def answer(call: ToolCall, _ctx: MessageContext, server: str = server) -> ToolReply:
            calls.append((server, call))
            return ToolReply(call_id=call.call_id, content=f"{server} answered {call.arguments_json}")

        router.add(subjects.mcp_tool(server), ToolCall, answer)
    await harness.stack.enter_async_context(harness.bus.serve(router, queue="sandbox"))


def offered_names(harness: Harness) -> list[str]:
    return sorted(t["function"]["name"] for t in harness.provider.requests[0].get("tools", []))


def tool_messages(harness: Harness) -> list[str]:
    return [m["content"] for m in harness.provider.requests[-1]["messages"] if m["role"] == "tool"]


async def test_an_agent_is_offered_the_listed_tools_of_its_own_servers_only(harness: Harness) -> None:
    await list_tools(harness, "docs__search", "files__read_file", "other__drop")
    harness.provider.script(Turn.text("ok"))
    await harness.executor(APP).execute(request("reader", run_id="r-reader"))
    assert offered_names(harness) == ["docs__search", "files__read_file"]  # not another app's server
    [search] = [t for t in harness.provider.requests[0]["tools"] if t["function"]["name"] == "docs__search"]
    assert search["function"]["parameters"] == SEARCH_SCHEMA

    harness.provider.requests.clear()
    harness.provider.script(Turn.text("ok"))
    await harness.executor(APP).execute(request("plain", run_id="r-plain"))
    assert offered_names(harness) == []


async def test_a_server_that_lists_nothing_offers_nothing(harness: Harness) -> None:
    await list_tools(harness, "files__read_file")  # docs is down: its sandbox withdrew its tools
    harness.provider.script(Turn.text("ok"))
    await harness.executor(APP).execute(request("reader"))
    assert offered_names(harness) == ["files__read_file"]


async def test_calls_are_governed_as_server_dot_tool_and_sent_to_their_servers(harness: Harness) -> None:
    await list_tools(harness, "docs__search", "files__read_file")
    calls: list[tuple[str, ToolCall]] = []
    await serve_mcp(harness, calls, "docs", "files")
    harness.provider.script(
        Turn.tool_calls(
            ToolCallScript("docs__search", {"query": "tape"}, call_id="c1"),
            ToolCallScript("files__read_file", {"path": "a.txt"}, call_id="c2"),
        ),
        Turn.text("done"),
    )
    await harness.executor(APP).execute(request("reader"))
    assert sorted(check.tool_name for check in harness.policy.checks) == ["docs.search", "files.read_file"]
    assert sorted((server, call.name) for server, call in calls) == [
        ("docs", "docs__search"),
        ("files", "files__read_file"),
    ]
    assert all(APPROVED_ARGUMENT not in json.loads(call.arguments_json) for _, call in calls)
    assert sorted(tool_messages(harness)) == [
        'docs answered {"query": "tape"}',
        'files answered {"path": "a.txt"}',
    ]
    results = [e.tool_result for e in harness.events() if e.WhichOneof("kind") == "tool_result"]
    assert sorted(r.tool_name for r in results) == ["docs__search", "files__read_file"]
    screened = [text for screen in harness.policy.screens for text in screen.texts]
    assert 'docs answered {"query": "tape"}' in screened  # the injection screen saw the result


async def test_a_policy_denying_server_dot_tool_refuses_it(harness: Harness) -> None:
    await list_tools(harness, "docs__search", "docs__delete_page")
    harness.policy.denied_tools = frozenset({"docs.delete_page"})
    calls: list[tuple[str, ToolCall]] = []
    await serve_mcp(harness, calls, "docs")
    harness.provider.script(
        Turn.tool_calls(ToolCallScript("docs__delete_page", {}, call_id="c1")),
        Turn.text("I may not delete it"),
    )
    await harness.executor(APP).execute(request("reader"))
    assert calls == []
    [denial] = tool_messages(harness)
    assert "Tool docs__delete_page denied by policy 'test-policy'" in denial
    assert [check.tool_name for check in harness.policy.checks] == ["docs.delete_page"]


async def test_arguments_are_checked_against_the_listed_input_schema(harness: Harness) -> None:
    await list_tools(harness, "docs__search")
    calls: list[tuple[str, ToolCall]] = []
    await serve_mcp(harness, calls, "docs")
    harness.provider.script(Turn.tool_calls(ToolCallScript("docs__search", {}, call_id="c1")), Turn.text("oops"))
    await harness.executor(APP).execute(request("reader"))
    assert calls == []
    assert harness.policy.checks == []  # refused before governance, like any tool's bad arguments
    [refusal] = tool_messages(harness)
    assert "query: field required" in refusal


async def test_the_operators_permissions_name_mcp_tools_as_server_dot_tool(harness: Harness) -> None:
    await list_tools(harness, "docs__search")
    calls: list[tuple[str, ToolCall]] = []
    await serve_mcp(harness, calls, "docs")
    harness.provider.script(
        Turn.tool_calls(ToolCallScript("docs__search", {"query": "x"}, call_id="c1")), Turn.text("denied")
    )
    permissions = ToolPermissions({"docs.*": ToolPermission.DENY})
    await harness.executor(APP, tool_permissions=permissions).execute(request("reader"))
    assert calls == []
    [refusal] = tool_messages(harness)
    assert "Tool docs__search denied by ToolPermissionPolicy" in refusal


async def test_no_sandbox_connected_to_the_server_is_a_clear_error(harness: Harness) -> None:
    await list_tools(harness, "docs__search")  # listed, but the sandbox that listed it is gone
    harness.provider.script(
        Turn.tool_calls(ToolCallScript("docs__search", {"query": "x"}, call_id="c1")), Turn.text("down")
    )
    await harness.executor(APP).execute(request("reader"))
    [failure] = tool_messages(harness)
    assert failure == "Error: no sandbox is connected to the MCP server 'docs' right now; docs__search did not run"
    errors = [e.tool_error for e in harness.events() if e.WhichOneof("kind") == "tool_error"]
    assert [e.error for e in errors] == [failure]


async def test_the_agent_descriptor_lists_its_mcp_tools_only_while_a_sandbox_lists_them(harness: Harness) -> None:
    executor = harness.executor(APP, sandbox_tools_refresh=0)
    base = [AgentDescriptor(name="reader", tools=[]), AgentDescriptor(name="plain", tools=["own"])]

    async def descriptor(name: str) -> list[str]:
        found = await harness.bus.kv_get(subjects.AGENTS_BUCKET, name, AgentDescriptor)
        assert found is not None
        return list(found.tools)

    await list_tools(harness, "docs__search", "files__read_file")
    await publish_descriptors(harness.bus, base, executor.listed_mcp_tools)
    assert await descriptor("reader") == ["docs__search", "files__read_file"]
    assert await descriptor("plain") == ["own"]

    await harness.bus.kv_delete(subjects.TOOLS_BUCKET, "docs__search")  # docs stopped answering
    await publish_descriptors(harness.bus, base, executor.listed_mcp_tools)
    assert await descriptor("reader") == ["files__read_file"]
    assert list(base[0].tools) == []  # the declared descriptor itself is left as it was
