"""Dispatch, governance and sandbox import the app before they connect or answer a probe.

So `/readyz` cannot say ready for an app that is not loaded (the probe listener does not exist
yet), and an unloadable app ends the process with the fatal code, not a restart-worthy one.
"""

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from atmosphere.config import NatsSettings
from atmosphere.dispatch.app import serve as serve_dispatch
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.governance.app import serve as serve_governance
from atmosphere.governance.settings import GovernanceSettings
from atmosphere.sandbox.app import serve as serve_sandbox
from atmosphere.sandbox.settings import SandboxSettings
from atmosphere.service import AppLoadError, run

# Nothing listens on port 1: a service that tried to connect first would fail with ConnectError.
NOWHERE = NatsSettings(url="nats://127.0.0.1:1", connect_timeout=0.5)


@pytest.mark.parametrize(
    ("serve", "settings_type"),
    [(serve_dispatch, DispatchSettings), (serve_governance, GovernanceSettings), (serve_sandbox, SandboxSettings)],
)
async def test_the_app_is_loaded_before_anything_is_served(
    serve: Callable[..., Awaitable[None]],
    settings_type: type[DispatchSettings | GovernanceSettings | SandboxSettings],
    tmp_path: Path,
) -> None:
    settings = settings_type(app="does.not:exist", app_dir=tmp_path, nats=NOWHERE, probe_port=0)
    with pytest.raises(AppLoadError, match="No module named 'does'"):
        await serve(settings, stop=asyncio.Event())


def test_a_sandbox_process_with_an_unloadable_app_exits_with_the_fatal_code(tmp_path: Path) -> None:
    settings = SandboxSettings(app="does.not:exist", app_dir=tmp_path, nats=NOWHERE, probe_port=0)
    assert run(serve_sandbox, lambda: settings, service="sandbox") == 4
