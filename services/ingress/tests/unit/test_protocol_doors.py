"""Which protocol doors an ingress serves: enabled and its SDK installed, and the info says so."""

from __future__ import annotations

import pytest

from atmosphere.ingress import protocol_doors
from atmosphere.ingress.api import create_app
from atmosphere.ingress.app import surfaces
from atmosphere.ingress.settings import IngressSettings, McpOptions


def mcp_routes(settings: IngressSettings) -> list[str]:
    app = create_app(settings)
    return [route.path for route in app.router.routes if getattr(route, "path", "") == protocol_doors.MCP_PATH]


MCP_SDK = protocol_doors.sdk_installed("mcp.server.lowlevel")


@pytest.mark.skipif(not MCP_SDK, reason="the mcp SDK is ingress's `mcp` extra, absent in the floors' lane")
def test_the_mcp_door_is_served_and_listed_by_default() -> None:
    settings = IngressSettings()
    assert mcp_routes(settings) == ["/atmosphere/mcp"]
    assert surfaces(settings)["mcp"] == {"path": "/atmosphere/mcp", "transport": "streamable-http", "tools": "agents"}


def test_a_disabled_mcp_door_is_neither_routed_nor_listed() -> None:
    settings = IngressSettings(mcp=McpOptions(enabled=False))
    assert mcp_routes(settings) == []
    assert "mcp" not in surfaces(settings)


def test_without_the_sdks_no_door_is_routed_nor_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol_doors, "sdk_installed", lambda module: False)
    settings = IngressSettings()
    app = create_app(settings)
    paths = {getattr(route, "path", "") for route in app.router.routes}
    assert mcp_routes(settings) == []
    assert not {p for p in paths if p.startswith(("/atmosphere/a2a", "/atmosphere/ag-ui"))}
    assert not {"mcp", "a2a", "agUi"} & set(surfaces(settings))


def test_a_missing_parent_package_is_not_installed() -> None:
    assert protocol_doors.sdk_installed("no_such_package_here.sub") is False
    assert protocol_doors.sdk_installed("fastapi.responses") is True
