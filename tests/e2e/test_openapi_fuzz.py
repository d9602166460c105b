"""Ingress's OpenAPI document against a live ingress: schemathesis, and CORS preflights."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from atmosphere.bus import NatsBus
from atmosphere.config import TokenGrant
from atmosphere.ingress.settings import IngressOptions
from atmosphere.testing import Stack, run_stack

from .conftest import service_map

TOKEN = "fuzz-token-123"
EXAMPLES_PER_OPERATION = 25
SEED = int(os.environ.get("ATMOSPHERE_FUZZ_SEED", "20261130"))
"""Fixed, so a failure here reproduces with the command the test prints; set the variable to explore other seeds."""


@pytest.fixture
async def stack(nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path) -> AsyncIterator[Stack]:
    ingress = {
        "ingress": IngressOptions(
            port=0,
            auth_tokens=(TokenGrant(token=TOKEN, user_id="fuzzer"),),
            cors_origins=("https://console.example",),
        ),
        "ai_openai_enabled": True,
        "ai_openai_default_agent": "echo",
        "admin_token": TOKEN,
    }
    services = service_map(nats_url, bus_namespace, tmp_path / "data", ingress=ingress)
    async with run_stack(services, bus=nats_bus) as running:
        yield running


async def test_schemathesis_passes_every_check(stack: Stack, tmp_path: Path) -> None:
    url = await stack.ingress_url()
    command = [
        str(Path(sys.executable).with_name("st")),
        "--config-file",
        str(Path(__file__).with_name("schemathesis.toml")),
        "run",
        f"{url}/openapi.json",
        "--max-examples",
        str(EXAMPLES_PER_OPERATION),
        "--seed",
        str(SEED),
        "--no-color",
        "-H",
        f"Authorization: Bearer {TOKEN}",
    ]
    # Its own process (the stack serves from this loop) and its own directory (it keeps a
    # `.schemathesis` example database where it runs).
    process = await asyncio.create_subprocess_exec(
        *command, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(process.communicate(), 600)
    report = output.decode(errors="replace")
    assert process.returncode == 0, f"{' '.join(command)}\n{report}"
    # Every operation in the document was exercised, none skipped.
    selected = re.search(r"Selected: (\d+)/(\d+)", report)
    tested = re.search(r"Tested: (\d+)", report)
    assert selected, report
    assert tested, report
    assert int(selected[2]) >= 29  # the governance admin routes included
    assert tested[1] == selected[1] == selected[2], report


async def test_cors_preflight_allows_configured_origins_only(stack: Stack) -> None:
    url = await stack.ingress_url()
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    async with httpx.AsyncClient(base_url=url) as client:
        allowed = await client.options(
            "/atmosphere/agent/echo", headers={"Origin": "https://console.example", **preflight}
        )
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "https://console.example"
        assert "POST" in allowed.headers["access-control-allow-methods"]

        refused = await client.options(
            "/atmosphere/agent/echo", headers={"Origin": "https://evil.example", **preflight}
        )
        assert refused.status_code == 400
        assert "access-control-allow-origin" not in refused.headers

        simple = await client.get("/api/console/info", headers={"Origin": "https://console.example"})
        assert simple.headers["access-control-allow-origin"] == "https://console.example"
        exposed = await client.post(
            "/atmosphere/agent/echo",
            content="hi",
            headers={"Origin": "https://console.example", "Authorization": f"Bearer {TOKEN}"},
        )
        assert exposed.status_code == 200
        assert "x-atmosphere-run-id" in exposed.headers["access-control-expose-headers"].lower()
