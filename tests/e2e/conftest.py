"""The six services, each through its real `serve()`, on a real nats-server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from atmosphere.dispatch.app import serve as serve_dispatch
from atmosphere.dispatch.provision import provision
from atmosphere.dispatch.settings import DispatchOptions, DispatchSettings, LlmSettings
from atmosphere.governance.app import serve as serve_governance
from atmosphere.governance.settings import GovernanceSettings
from atmosphere.ingress.app import serve as serve_ingress
from atmosphere.ingress.settings import IngressOptions, IngressSettings
from atmosphere.memory.app import serve as serve_memory
from atmosphere.memory.settings import MemorySettings
from atmosphere.sandbox.app import serve as serve_sandbox
from atmosphere.sandbox.settings import SandboxSettings
from atmosphere.tape.app import serve as serve_tape
from atmosphere.tape.settings import TapeSettings
from atmosphere.testing import settings_for

ROOT = Path(__file__).resolve().parents[2]

SERVICES: dict[str, tuple[Any, type[Any]]] = {
    "governance": (serve_governance, GovernanceSettings),
    "memory": (serve_memory, MemorySettings),
    "tape": (serve_tape, TapeSettings),
    "sandbox": (serve_sandbox, SandboxSettings),
    "dispatch": (serve_dispatch, DispatchSettings),
    "ingress": (serve_ingress, IngressSettings),
}


def service_map(
    nats_url: str,
    namespace: str,
    data_dir: Path,
    names: tuple[str, ...] = tuple(SERVICES),
    *,
    app: str = "examples.echo:app",
    llm_base_url: str = "",
    llm_model: str = "fake-model",
    ingress: dict[str, Any] | None = None,
    dispatch: dict[str, Any] | None = None,
    llm: dict[str, Any] | None = None,
    governance: dict[str, Any] | None = None,
    sandbox: dict[str, Any] | None = None,
) -> dict[str, tuple[Any, Any]]:
    """name → (serve, settings) for the given services, in start order."""
    extra: dict[str, dict[str, Any]] = {
        "dispatch": {
            "app": app,
            "app_dir": ROOT,
            "dispatch": DispatchOptions(grpc_host="127.0.0.1", grpc_port=0, runtime="built-in"),
            "llm": LlmSettings(base_url=llm_base_url, model=llm_model, stall_timeout=10, **(llm or {})),
            **(dispatch or {}),
        },
        "sandbox": {"app": app, "app_dir": ROOT, **(sandbox or {})},
        "memory": {"workspace_root": data_dir / "workspace"},
        "ingress": {"ingress": IngressOptions(port=0), **(ingress or {})},
        "governance": governance or {},
    }
    return {
        name: (
            SERVICES[name][0],
            settings_for(
                SERVICES[name][1], nats_url=nats_url, namespace=namespace, data_dir=data_dir, **extra.get(name, {})
            ),
        )
        for name in names
    }


async def provision_first(services: dict[str, tuple[Any, Any]], *, user: str = "", password: str = "") -> None:
    """Make the layout before `services` start, as `atmosphere provision` does with the provisioner's login.

    With dispatch's settings from `services` (the run queue's consumers take them) and the login
    given; services with a login of their own only wait for it.
    """
    _, settings = services["dispatch"]
    login = settings.nats.model_copy(update={"user": user, "password": SecretStr(password)})
    await provision(settings.model_copy(update={"nats": login}))


@pytest.fixture
def services(nats_url: str, bus_namespace: str, tmp_path: Path) -> dict[str, tuple[Any, Any]]:
    return service_map(nats_url, bus_namespace, tmp_path / "data")
