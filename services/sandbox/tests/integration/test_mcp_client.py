"""The sandbox's MCP client against real MCP servers written with the `mcp` SDK.

One server speaks streamable HTTP (served by uvicorn in the test, on a socket the test holds, so
that it can stop and come back on the same port); the other is a script the sandbox starts as its
own child over stdio (`mcp/stdio_server.py`). Timings are the test's own (`McpTimings`, a
server's `timeout`): nothing waits on a sleep to pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from atmosphere.bus import JetStreamLayout, subjects
from atmosphere.bus.testing import FakeBus
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolDescriptor, ToolKind, ToolReply
from atmosphere.sandbox import mcp_hosting
from atmosphere.sandbox.app import serve
from atmosphere.sandbox.mcp_client.connection import McpTimings
from atmosphere.sandbox.mcp_client.servers import PROVIDER, McpServers
from atmosphere.sandbox.settings import SandboxOptions, SandboxSettings
from atmosphere.sdk import McpServer
from atmosphere.testing import running_service
from atmosphere.testing.asgi_server import serving_asgi

STDIO_SERVER = Path(__file__).with_name("mcp") / "stdio_server.py"
TIMINGS = McpTimings(connect=20.0, listing=10.0)
"""Generous: a loaded machine starts a Python child slowly; no test waits for these to pass."""


def docs_app() -> MCPServer:
    """The streamable HTTP server's tools."""
    server = MCPServer("docs")

    @server.tool()
    def search(query: str) -> str:
        """Search the docs."""
        return f"3 pages about {query}"

    @server.tool()
    async def wait_forever() -> str:
        """Never answers (a server too slow for its timeout)."""
        await asyncio.Event().wait()
        return "never"

    @server.tool()
    def broken() -> str:
        """Fails, in its own words."""
        msg = "the index is being rebuilt"
        raise ToolError(msg)

    return server


def bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.asynccontextmanager
async def serving_http(port: int) -> AsyncIterator[None]:
    """The docs server on `port` until the context exits (then nothing listens there)."""
    async with serving_asgi(docs_app().streamable_http_app(), port=port, lifespan="on"):
        yield


@pytest.fixture
def port() -> int:
    with contextlib.closing(bound_socket()) as sock:
        return int(sock.getsockname()[1])


def servers(port: int, *, timeout: float = 30.0) -> McpServers:
    docs = McpServer.http("docs", f"http://127.0.0.1:{port}/mcp", timeout=timeout)
    files = McpServer.stdio("files", [sys.executable, str(STDIO_SERVER)], env={"FILES_PREFIX": "> "}, timeout=timeout)
    return McpServers({"docs": docs, "files": files}, timings=TIMINGS)


async def provisioned_bus() -> FakeBus:
    bus = FakeBus()
    await bus.provision(JetStreamLayout())
    return bus


async def call(bus: FakeBus, server: str, name: str, arguments: dict[str, object] | None = None) -> ToolReply:
    request = ToolCall(call_id="c1", name=name, arguments_json=json.dumps(arguments or {}), run_id="r1")
    return await bus.request(subjects.mcp_tool(server), request, ToolReply, timeout=60)


async def published(bus: FakeBus) -> dict[str, ToolDescriptor]:
    return await bus.kv_items(subjects.TOOLS_BUCKET, ToolDescriptor)


async def test_each_answering_servers_tools_are_published_under_their_model_names(port: int) -> None:
    bus = await provisioned_bus()
    mcp = servers(port)
    try:
        async with serving_http(port):
            await mcp.refresh(bus)
    finally:
        await mcp.close()
    tools = await published(bus)
    assert set(tools) == {
        "docs__search",
        "docs__wait_forever",
        "docs__broken",
        "files__read_file",
        "files__parent_pid",
        "files__crash",
    }
    assert all(t.provider == PROVIDER for t in tools.values())
    read_file = tools["files__read_file"]
    assert json.loads(read_file.parameters_json_schema)["required"] == ["path"]
    assert read_file.description == "Read a file of the store."
    assert read_file.kind == ToolKind.TOOL_KIND_READ  # the server's read-only hint
    assert read_file.idempotent
    assert tools["docs__search"].kind == ToolKind.TOOL_KIND_UNSPECIFIED
    assert not tools["docs__search"].idempotent
    assert tools["docs__search"].timeout_seconds == 30.0
    assert mcp.info() == {"docs": "ACTIVE(3 tools)", "files": "ACTIVE(3 tools)"}


async def test_calls_reach_the_http_server_and_the_sandboxs_own_stdio_child(port: int) -> None:
    bus = await provisioned_bus()
    mcp = servers(port)
    try:
        async with serving_http(port), bus.serve(mcp.router(), queue="sandbox"):
            searched = await call(bus, "docs", "docs__search", {"query": "governance"})
            read = await call(bus, "files", "files__read_file", {"path": "notes.txt"})
            parent = await call(bus, "files", "files__parent_pid")
    finally:
        await mcp.close()
    assert (searched.call_id, searched.content, searched.is_error) == ("c1", "3 pages about governance", False)
    assert (read.content, read.is_error) == ("> contents of notes.txt", False)  # its declared environment
    assert parent.content == str(os.getpid())  # a child of this (the sandbox's) process, nobody else's


async def test_failures_are_tool_errors_naming_the_server(port: int) -> None:
    bus = await provisioned_bus()
    mcp = servers(port)
    try:
        async with serving_http(port), bus.serve(mcp.router(), queue="sandbox"):
            broken = await call(bus, "docs", "docs__broken")
            unknown = await call(bus, "docs", "docs__nothing_here")
            elsewhere = await call(bus, "docs", "files__read_file", {"path": "x"})
            bad_json = await bus.request(
                subjects.mcp_tool("docs"), ToolCall(name="docs__search", arguments_json="{"), ToolReply
            )
    finally:
        await mcp.close()
    assert broken.is_error
    assert broken.content == "Error: docs.broken failed: Error executing tool broken: the index is being rebuilt"
    assert unknown.is_error
    assert "nothing_here" in unknown.content
    assert unknown.content.startswith("Error")
    assert (elsewhere.is_error, elsewhere.content) == (
        True,
        "Error: files__read_file is not a tool of the MCP server 'docs'",
    )
    assert (bad_json.is_error, bad_json.content) == (True, "Error: the arguments are not valid JSON")


async def test_a_server_slower_than_its_timeout_is_a_clear_error(port: int) -> None:
    bus = await provisioned_bus()
    mcp = servers(port, timeout=0.5)
    try:
        async with serving_http(port), bus.serve(mcp.router(), queue="sandbox"):
            slow = await call(bus, "docs", "docs__wait_forever")
            after = await call(bus, "docs", "docs__search", {"query": "x"})  # the session is still usable
    finally:
        await mcp.close()
    assert slow.is_error
    assert slow.content == "Error: the MCP server 'docs' did not finish docs.wait_forever within 0.5s"
    assert (after.is_error, after.content) == (False, "3 pages about x")


async def test_a_server_that_stops_answering_drops_out_and_comes_back(port: int) -> None:
    bus = await provisioned_bus()
    mcp = servers(port)
    try:
        async with bus.serve(mcp.router(), queue="sandbox"):
            async with serving_http(port):
                await mcp.refresh(bus)
                assert "docs__search" in await published(bus)
            # Down: the next refresh withdraws its tools, and a call says so, naming the server.
            await mcp.refresh(bus)
            assert not [name for name in await published(bus) if name.startswith("docs__")]
            assert "files__read_file" in await published(bus)
            assert mcp.info()["docs"].startswith("INACTIVE(")
            down = await call(bus, "docs", "docs__search", {"query": "x"})
            # Back on the same address: listed again at the next refresh, and called.
            async with serving_http(port):
                await mcp.refresh(bus)
                back = await call(bus, "docs", "docs__search", {"query": "x"})
            assert "docs__search" in await published(bus)
            assert mcp.info()["docs"] == "ACTIVE(3 tools)"
    finally:
        await mcp.close()
    assert down.is_error
    assert down.content.startswith("Error: the MCP server 'docs' is not answering (")
    assert "127.0.0.1" not in down.content  # where it is stays out of the model's text
    assert (back.is_error, back.content) == (False, "3 pages about x")


async def test_a_stdio_child_that_dies_is_started_again(port: int) -> None:
    bus = await provisioned_bus()
    mcp = servers(port)
    try:
        async with bus.serve(mcp.router(), queue="sandbox"):
            first = await call(bus, "files", "files__parent_pid")
            crashed = await call(bus, "files", "files__crash")
            again = await call(bus, "files", "files__read_file", {"path": "a"})
    finally:
        await mcp.close()
    assert first.content == str(os.getpid())
    assert crashed.is_error
    assert crashed.content.startswith("Error: the MCP server 'files' is not answering (")
    assert (again.is_error, again.content) == (False, "> contents of a")


async def test_withdrawing_deletes_what_this_sandbox_published(port: int) -> None:
    bus = await provisioned_bus()
    mcp = servers(port)
    try:
        async with serving_http(port):
            await mcp.refresh(bus)
        await mcp.withdraw(bus)
    finally:
        await mcp.close()
    assert await published(bus) == {}


WIRED_APP = "sandbox_mcp_wiring_app"
WIRED_SOURCE = """
import sys

from atmosphere.sdk import App, McpServer, agent

FILES = McpServer.stdio("files", [sys.executable, {server!r}])


@agent(name="reader", mcp_servers=[FILES], harness=[])
class Reader:
    '''Reads files over MCP.'''


app = App(agents=[Reader])
"""


@pytest.fixture
def wired_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "app"
    directory.mkdir()
    (directory / f"{WIRED_APP}.py").write_text(WIRED_SOURCE.format(server=str(STDIO_SERVER)))
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.delitem(sys.modules, WIRED_APP, raising=False)
    return directory


def wired_settings(app_dir: Path) -> SandboxSettings:
    options = SandboxOptions(tool_workers=0, mcp_connect_timeout_seconds=60, mcp_list_timeout_seconds=60)
    return SandboxSettings(
        app=f"{WIRED_APP}:app",
        app_dir=app_dir,
        data_dir=app_dir / "data",
        probe_host="127.0.0.1",
        probe_port=0,
        sandbox=options,
    )


async def test_serve_lists_the_apps_servers_before_ready_and_withdraws_them_at_stop(wired_app: Path) -> None:
    bus = await provisioned_bus()
    settings = wired_settings(wired_app)
    async with running_service("sandbox", functools.partial(serve, bus=bus), settings, bus=bus, start_timeout=60):
        listed = await published(bus)
        reply = await bus.request(subjects.service_info("sandbox"), ServiceInfoRequest(), ServiceInfoResponse)
        read = await call(bus, "files", "files__read_file", {"path": "x"})
    assert sorted(listed) == ["files__crash", "files__parent_pid", "files__read_file"]
    assert json.loads(reply.info_json)["sandbox"]["mcp"] == {"files": "ACTIVE(3 tools)"}
    assert (read.is_error, read.content) == (False, "contents of x")
    assert await published(bus) == {}  # stopped: nothing it no longer answers for stays listed


def test_without_the_sdk_declared_servers_are_reported_inactive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_hosting, "mcp_sdk_installed", lambda: False)
    files = McpServer.stdio("files", [sys.executable, str(STDIO_SERVER)])
    hosting = mcp_hosting.McpHosting({"files": files}, SandboxOptions())
    assert hosting.info() == {"files": "INACTIVE(no MCP client here: the sandbox's mcp extra is not installed)"}
    assert mcp_hosting.McpHosting({}, SandboxOptions()).info() == {}


async def test_a_server_that_never_opens_a_session_is_not_answering_within_the_bounds() -> None:
    # A child that never answers the handshake: the connect timeout, then the call's own, bound it.
    mute = [sys.executable, "-c", "import time; time.sleep(600)"]
    bus = await provisioned_bus()
    quick_connect = McpServers(
        {"mute": McpServer.stdio("mute", mute, timeout=30)}, timings=McpTimings(connect=0.3, listing=10)
    )
    quick_call = McpServers(
        {"mute": McpServer.stdio("mute", mute, timeout=0.3)}, timings=McpTimings(connect=30, listing=10)
    )
    try:
        await quick_connect.refresh(bus)
        async with bus.serve(quick_connect.router(), queue="sandbox"):
            unopened = await call(bus, "mute", "mute__anything")
        async with bus.serve(quick_call.router(), queue="sandbox"):
            slow = await call(bus, "mute", "mute__anything")
    finally:
        await quick_connect.close()
        await quick_call.close()
    assert quick_connect.info() == {"mute": "INACTIVE(no session within 0.3s)"}
    assert await published(bus) == {}
    assert unopened.content == (
        "Error: the MCP server 'mute' is not answering (no session within 0.3s); mute.anything did not run."
        " Try again later."
    )
    assert slow.content == "Error: the MCP server 'mute' did not finish mute.anything within 0.3s"
