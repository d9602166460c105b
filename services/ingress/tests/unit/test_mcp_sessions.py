"""The MCP door's stateful sessions are bounded per ingress process (`ATMOSPHERE_MCP__MAX_SESSIONS`)."""

from __future__ import annotations

import httpx
import pytest

from atmosphere.ingress import protocol_doors
from atmosphere.ingress.settings import McpOptions

from .test_routes_testclient import ECHO, ingress, settings

pytestmark = pytest.mark.skipif(
    not protocol_doors.sdk_installed("mcp.server.lowlevel"), reason="the mcp SDK is ingress's `mcp` extra"
)

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"},
    },
}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


async def opened(http: httpx.AsyncClient) -> httpx.Response:
    return await http.post(protocol_doors.MCP_PATH, json=INITIALIZE, headers=HEADERS)


async def test_one_session_more_than_the_cap_is_a_503_and_the_others_keep_working() -> None:
    async with ingress(settings(mcp=McpOptions(max_sessions=2)), ECHO) as http:
        first, second = await opened(http), await opened(http)
        assert (first.status_code, second.status_code) == (200, 200)
        sessions = {first.headers["mcp-session-id"], second.headers["mcp-session-id"]}
        assert len(sessions) == 2
        refused = await opened(http)
        assert refused.status_code == 503
        assert refused.json()["error"]["message"] == "Too many open sessions"
        # An open session is unaffected: its id still answers.
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        headers = {**HEADERS, "mcp-session-id": first.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        answered = await http.post(protocol_doors.MCP_PATH, json=ping, headers=headers)
        assert answered.status_code == 200
        # Ending a session makes room for another.
        ended = await http.delete(protocol_doors.MCP_PATH, headers=headers)
        assert ended.status_code == 200
        assert (await opened(http)).status_code == 200
