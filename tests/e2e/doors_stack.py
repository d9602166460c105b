"""The stack the protocol doors' suites share: all six services' real `serve()` on a real
nats-server, a scripted model provider, token grants for two users, and a policy file (a denied
tool, PII kept out of answers). ATMOSPHERE_APP=tests.e2e.apps.doors_app:app.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from atmosphere.bus import NatsBus, connect
from atmosphere.config import TokenGrant
from atmosphere.ingress.settings import A2aOptions, IngressOptions, McpOptions
from atmosphere.testing import ScriptedModel, run_stack
from atmosphere.testing.pytest_plugin import delete_namespace_streams

from .apps.doors_app import CALLS_FILE_ENV
from .conftest import service_map

ADA = "token-ada-everything"
ADA_ECHO = "token-ada-echo-only"
BOB = "token-bob-everything"
GRANTS = (
    TokenGrant(token=ADA, user_id="ada"),
    TokenGrant(token=ADA_ECHO, user_id="ada", paths=("/atmosphere/agent/echo",)),
    TokenGrant(token=BOB, user_id="bob"),
)
POLICY_FILE = """\
version: "2026-12"
policies:
  - name: no-drops
    type: deny-list
    config:
      regex: ["^call_tool:drop_"]
  - name: no-pii
    type: pii-redaction
    config: {mode: redact}
"""
EMAIL = "jane.doe@example.com"
MESSAGE_LIMIT = 64 * 1024


@dataclass
class World:
    url: str
    bus: NatsBus
    provider: ScriptedModel
    calls: Path
    opened: list[openai.AsyncOpenAI | httpx.AsyncClient] = field(default_factory=list)
    """Clients a test opened on the stack (`openai`, `http`), closed by `close_clients`."""

    def openai(self, token: str = ADA) -> openai.AsyncOpenAI:
        """The official `openai` client on the stack's OpenAI API, as `token`'s user (closed after the test)."""
        client = openai.AsyncOpenAI(base_url=f"{self.url}/atmosphere/v1", api_key=token, max_retries=0)
        self.opened.append(client)
        return client

    def http(self) -> httpx.AsyncClient:
        """A plain HTTP client (closed after the test), for a framework that takes one."""
        client = httpx.AsyncClient()
        self.opened.append(client)
        return client

    async def close_clients(self) -> None:
        while self.opened:
            client = self.opened.pop()
            await (client.close() if isinstance(client, openai.AsyncOpenAI) else client.aclose())

    def ran(self) -> list[str]:
        """The tools that ran since the test began."""
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    @contextlib.contextmanager
    def fresh(self) -> Iterator[None]:
        """A test's scope: no script, no requests, no tool calls before it; its script used up after."""
        self.provider.turns.clear()
        self.provider.requests.clear()
        self.calls.unlink(missing_ok=True)
        yield
        assert not self.provider.turns, "the test left scripted replies unused"


@contextlib.asynccontextmanager
async def doors_world(
    nats_url: str, base: Path, *, mcp_tools: tuple[str, ...] = (), grants: tuple[TokenGrant, ...] = GRANTS
) -> AsyncIterator[World]:
    """The stack, serving until the context exits.

    `mcp_tools` is `ATMOSPHERE_MCP__TOOLS` (the app's `@tool`s the MCP door exposes; none by
    default), `grants` the token grants (by default ada's two tokens and bob's).
    """
    namespace = f"t{uuid.uuid4().hex[:12]}"
    calls = base / "calls.txt"
    policy = base / "policies.yaml"
    policy.write_text(POLICY_FILE)
    provider = ScriptedModel()
    with pytest.MonkeyPatch.context() as env:
        env.setenv(CALLS_FILE_ENV, str(calls))
        async with provider.serving(), connect(nats_url, name="doors", namespace=namespace) as bus:
            services = service_map(
                nats_url,
                namespace,
                base / "data",
                app="tests.e2e.apps.doors_app:app",
                llm_base_url=provider.base_url,
                ingress={
                    "ingress": IngressOptions(port=0, auth_tokens=grants, max_message_bytes=MESSAGE_LIMIT),
                    "a2a": A2aOptions(default_agent="echo"),
                    "mcp": McpOptions(tools=mcp_tools),
                    "ai_openai_enabled": True,
                },
                governance={"governance": {"policy_files": [policy]}},
            )
            try:
                async with run_stack(services, bus=bus) as stack:
                    yield World(await stack.ingress_url(), bus, provider, calls)
            finally:
                await delete_namespace_streams(bus, namespace)
