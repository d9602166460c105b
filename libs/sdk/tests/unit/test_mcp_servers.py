"""`McpServer` declarations: checked at declaration, named twice (model, governance), never leaking secrets."""

from __future__ import annotations

import pytest

from atmosphere.sdk import App, McpServer, UserError, agent
from atmosphere.sdk.host import mcp_governed_name, mcp_server_of, mcp_tool_name, spec_of


def test_an_agent_records_its_servers() -> None:
    docs = McpServer.http("docs", "https://docs.example.com/mcp", timeout=5)
    files = McpServer.stdio("file_store", ["python", "-m", "files"], env={"ROOT": "/srv"})

    @agent(name="reader", mcp_servers=[docs, files])
    class Reader:
        pass

    spec = spec_of(Reader)
    assert spec.mcp_servers == (docs, files)
    assert files.command == ("python", "-m", "files")
    assert files.env == (("ROOT", "/srv"),)
    assert docs.timeout == 5.0
    assert App(agents=[Reader]).mcp_servers == {"docs": docs, "file_store": files}


@pytest.mark.parametrize("name", ["", "1docs", "do cs", "docs__x", "docs_", "_docs", "a.b", "x" * 33, "dócs"])
def test_a_server_name_is_an_identifier_without_double_underscores(name: str) -> None:
    with pytest.raises(UserError, match="must be an identifier"):
        McpServer.http(name, "http://localhost/mcp")


@pytest.mark.parametrize("url", ["localhost/mcp", "ftp://host/mcp", "http:///mcp", "file:///tmp/x"])
def test_an_http_server_needs_an_http_url(url: str) -> None:
    with pytest.raises(UserError, match="http:// or https://"):
        McpServer.http("docs", url)


@pytest.mark.parametrize("command", [[], "python -m x", ["python", ""], [1]])
def test_a_stdio_server_needs_a_command_list(command: object) -> None:
    with pytest.raises(UserError, match="non-empty list of strings"):
        McpServer.stdio("files", command)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan"), 3601])
def test_the_timeout_is_bounded(timeout: float) -> None:
    with pytest.raises(UserError, match="timeout"):
        McpServer.http("docs", "http://localhost/mcp", timeout=timeout)


def test_no_secret_reaches_a_repr_or_description() -> None:
    server = McpServer.http("docs", "https://user:s3cret@docs.example.com:8443/mcp?token=s3cret")
    assert "s3cret" not in repr(server)
    assert server.describe() == "https://docs.example.com:8443/mcp"
    local = McpServer.stdio("files", ["/opt/bin/files-server", "--token", "s3cret"], env={"KEY": "s3cret"})
    assert "s3cret" not in repr(local)
    assert local.describe() == "stdio:files-server"


def test_two_servers_of_one_agent_cannot_share_a_name() -> None:
    with pytest.raises(UserError, match="share a name"):

        @agent(
            name="twice", mcp_servers=[McpServer.http("docs", "http://a/mcp"), McpServer.http("docs", "http://b/mcp")]
        )
        class Twice:
            pass


def test_two_agents_share_a_server_only_by_declaring_the_same_one() -> None:
    @agent(name="one", mcp_servers=[McpServer.http("docs", "http://a/mcp")])
    class One:
        pass

    @agent(name="same", mcp_servers=[McpServer.http("docs", "http://a/mcp")])
    class Same:
        pass

    @agent(name="other", mcp_servers=[McpServer.http("docs", "http://b/mcp")])
    class Other:
        pass

    assert list(App(agents=[One, Same]).mcp_servers) == ["docs"]
    with pytest.raises(UserError, match="two different MCP servers"):
        App(agents=[One, Other])


def test_not_a_server() -> None:
    with pytest.raises(UserError, match="mcp_servers must be"):

        @agent(name="wrong", mcp_servers=["http://a/mcp"])  # type: ignore[list-item]
        class Wrong:
            pass


def test_names_for_the_model_and_for_governance() -> None:
    assert mcp_tool_name("docs", "search") == "docs__search"
    assert mcp_tool_name("docs", "get-page_2") == "docs__get-page_2"
    assert mcp_tool_name("docs", "a.b") is None  # no function name the model could call
    assert mcp_tool_name("docs", "x" * 60) is None
    assert mcp_governed_name("docs__search") == "docs.search"
    assert mcp_governed_name("file_store__read__all") == "file_store.read__all"
    assert mcp_server_of("file_store__read__all") == "file_store"
