"""A service whose NATS client closes for good stops and exits non-zero; it never lingers as a zombie.

nats-py never reconnects from CLOSED (it closes on any `-ERR` from the server). Each service's
real `serve()` runs on a real nats-server; its client is then closed under it, as the server's
`-ERR` would, and the service must notice, fail its liveness probe and end with
`ConnectionLostError` (exit code 3 from the process runner), so its supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from atmosphere.bus import ConnectionLostError, NatsBus
from atmosphere.service import _runtime
from atmosphere.testing import running_service
from tests.e2e.conftest import SERVICES, service_map


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[NatsBus]:
    """The buses the services under test connect with (the real `connect`, recorded)."""
    buses: list[NatsBus] = []
    real_connect = _runtime.connect

    @contextlib.asynccontextmanager
    async def recording(*args: Any, **kwargs: Any) -> AsyncIterator[NatsBus]:
        async with real_connect(*args, **kwargs) as bus:
            buses.append(bus)
            yield bus

    monkeypatch.setattr(_runtime, "connect", recording)
    return buses


@pytest.mark.parametrize("name", list(SERVICES))
async def test_a_service_whose_connection_closed_for_good_exits(
    name: str, captured: list[NatsBus], nats_url: str, bus_namespace: str, tmp_path: Path, nats_bus: NatsBus
) -> None:
    serve, settings = service_map(nats_url, bus_namespace, tmp_path / "data", (name,))[name]
    # The error surfaces again when `running_service` collects the finished task.
    with pytest.raises(ConnectionLostError):  # noqa: PT012
        async with running_service(name, serve, settings, bus=nats_bus) as task:
            [service_bus] = captured
            await service_bus.client.close()  # as nats-py does after a server -ERR
            # It stops by itself: nobody sets its stop event before it is done.
            await asyncio.wait({task}, timeout=20)
            assert task.done()
            assert isinstance(task.exception(), ConnectionLostError)
