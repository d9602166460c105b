"""The whole stack on an authenticated bus: every service logs in as its own role, and runs work."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from atmosphere.bus import ConnectError, connect, subjects
from atmosphere.bus.permissions import Credential, Role, authorization_config, new_credentials
from atmosphere.bus.runs import follow_run, is_terminal
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.contracts.tape.v1.tape_pb2 import GetStepsRequest, GetStepsResponse
from atmosphere.testing import NatsServer, ScriptedModel, ToolCallScript, Turn, run_stack, wait_until

from .conftest import provision_first, service_map
from .wsclient import ask

FOLLOWER = Path(__file__).resolve().parents[2] / "examples" / "followers" / "follow_runs.py"
NAMESPACE = "secured"


@dataclass(frozen=True)
class SecuredNats:
    url: str
    credentials: dict[Role, Credential]
    harness_password: str
    """Of `harness`, a user without restrictions: the test's own checks (health, info)."""


@pytest.fixture
def secured_nats(tmp_path: Path) -> Iterator[SecuredNats]:
    credentials = new_credentials(namespace=NAMESPACE)
    harness_password = secrets.token_urlsafe(16)
    config = tmp_path / "auth.conf"
    config.write_text(
        authorization_config(
            credentials.values(),
            namespace=NAMESPACE,
            extra_users=[{"user": "harness", "password": harness_password}],
        )
    )
    server = NatsServer(tmp_path / "nats", extra_args=("-c", str(config))).start()
    try:
        yield SecuredNats(server.url, credentials, harness_password)
    finally:
        server.stop()


def logged_in(settings: Any, credential: Credential) -> Any:
    """`settings` with the role's login, as `ATMOSPHERE_NATS__USER` / `__PASSWORD` would set it."""
    nats = settings.nats.model_copy(update={"user": credential.user, "password": SecretStr(credential.password)})
    return settings.model_copy(update={"nats": nats})


def tool_run() -> list[Turn]:
    return [
        Turn.tool_calls(
            ToolCallScript("local_time", {"city": "Tokyo"}, call_id="call_time"),
            ToolCallScript("celsius_to_fahrenheit", {"celsius": 21}, call_id="call_temp"),
        ),
        Turn.text("In Tokyo it is evening, and 21C is 69.8F."),
    ]


async def test_a_run_with_tools_completes_with_every_service_on_its_own_credentials(
    secured_nats: SecuredNats, fake_provider: ScriptedModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="atmosphere.bus")
    services = {
        name: (serve, logged_in(settings, secured_nats.credentials[Role(name)]))
        for name, (serve, settings) in service_map(
            secured_nats.url,
            NAMESPACE,
            tmp_path / "data",
            app="examples.assistant:app",
            llm_base_url=fake_provider.base_url,
        ).items()
    }
    observer = secured_nats.credentials[Role.OBSERVER]
    # First the layout, by the provisioner's own login: no service's may make it.
    provisioner = secured_nats.credentials[Role.PROVISIONER]
    await provision_first(services, user=provisioner.user, password=provisioner.password)
    async with (
        connect(
            secured_nats.url,
            name="harness",
            namespace=NAMESPACE,
            user="harness",
            password=secured_nats.harness_password,
        ) as harness,
        run_stack(services, bus=harness) as stack,
        connect(
            secured_nats.url, name="observer", namespace=NAMESPACE, user=observer.user, password=observer.password
        ) as outside,
    ):
        fake_provider.script(*tool_run())
        frames = await ask(await stack.ingress_url(), "assistant", "Time in Tokyo, and 21C in F?")
        assert frames[0]["type"] == "metadata"
        assert frames[-1]["type"] == "complete"
        results = {f["data"]["toolName"]: f["data"]["result"] for f in frames if f.get("event") == "tool-result"}
        assert results["celsius_to_fahrenheit"] == "69.8"  # the sandbox ran it
        run_id = str(frames[0]["value"])

        # An outside reader with observer credentials replays the run and reads the tape.
        events = [event async for event in follow_run(outside, run_id)]
        assert events[0].seq == 1
        assert is_terminal(events[-1])
        # ... and so does the plain nats-py example follower, on the observer's login (it may
        # create no JetStream consumer: it reads by direct get).
        replay = await asyncio.create_subprocess_exec(
            sys.executable, str(FOLLOWER), "--server", secured_nats.url, "--namespace", NAMESPACE, "--run", run_id,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "ATMOSPHERE_NATS__USER": observer.user, "ATMOSPHERE_NATS__PASSWORD": observer.password},
        )  # fmt: skip
        out, err = await asyncio.wait_for(replay.communicate(), 30)
        assert replay.returncode == 0, err.decode()
        printed = [json.loads(line)["seq"] for line in out.decode().splitlines()]
        assert printed == [e.seq for e in events]

        async def recorded() -> bool:
            steps = await outside.request(subjects.tape("steps"), GetStepsRequest(run_id=run_id), GetStepsResponse)
            return steps.run.status == "COMPLETED"

        await wait_until(recorded, what="the tape to record the run")

        # Runtime truth: every service says who provisioned what it runs on, and that it did not.
        for name in services:
            reply = await harness.request(subjects.service_info(name), ServiceInfoRequest(), ServiceInfoResponse)
            layout = json.loads(reply.info_json)["jetstream"]
            assert layout == {"provisionedBy": provisioner.user, "provisionedHere": False}, name
    # Nothing any service did was refused: the permissions cover the whole system's use of the bus.
    refusals = [r.getMessage() for r in caplog.records if "violation" in r.getMessage().lower()]
    assert refusals == []


async def test_a_service_with_the_wrong_password_does_not_start(secured_nats: SecuredNats, tmp_path: Path) -> None:
    name, (serve, settings) = next(iter(service_map(secured_nats.url, NAMESPACE, tmp_path / "data").items()))
    wrong = Credential(Role(name), secured_nats.credentials[Role(name)].user, "not-the-password")
    stop = asyncio.Event()
    with pytest.raises(ConnectError, match=rf"refused user '{wrong.user}': authorization violation"):
        await serve(logged_in(settings, wrong), stop=stop)
