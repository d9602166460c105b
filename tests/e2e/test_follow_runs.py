"""The NATS follower example decodes a real run's events with nats-py and the contracts alone."""

from __future__ import annotations

import ast
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from atmosphere.bus import NatsBus
from atmosphere.testing import run_stack

from .wsclient import ask

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "followers" / "follow_runs.py"
PROMPT = "hello brave new world"


async def start_follower(nats_url: str, namespace: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE), "--server", nats_url, "--namespace", namespace, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def lines_until_exit(follower: asyncio.subprocess.Process) -> list[dict[str, Any]]:
    out, err = await asyncio.wait_for(follower.communicate(), 30)
    assert follower.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


def assert_decoded_echo_run(events: list[dict[str, Any]], frames: list[dict[str, Any]]) -> str:
    run_id = str(frames[0]["value"])
    assert {e["run"] for e in events} == {run_id}
    assert {e["agent"] for e in events} == {"echo"}
    assert [e["seq"] for e in events] == [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
    first, *texts, last = events
    assert first["kind"] == "metadata"
    assert first["data"] == {"key": "X-Atmosphere-Run-Id", "valueJson": json.dumps(run_id)}
    assert [e["kind"] for e in texts] == ["text_delta"] * len(PROMPT.split(" "))
    assert "".join(e["data"]["text"] for e in texts) == PROMPT
    assert last["kind"] == "complete"
    return run_id


async def test_the_follower_replays_a_finished_run_and_tails_a_live_one(
    services: dict[str, Any], nats_bus: NatsBus, nats_url: str, bus_namespace: str
) -> None:
    async with run_stack(services, bus=nats_bus) as stack:
        url = await stack.ingress_url()
        frames = await ask(url, "echo", PROMPT)
        run_id = str(frames[0]["value"])
        # A finished run is replayed from its first event; the follower exits at its end.
        replay = await start_follower(nats_url, bus_namespace, "--run", run_id)
        assert_decoded_echo_run(await lines_until_exit(replay), frames)

        # Following every run sees only what comes after it subscribed: the next run, whole.
        live = await start_follower(nats_url, bus_namespace, "--runs", "1")
        assert live.stderr is not None
        ready = await asyncio.wait_for(live.stderr.readline(), 30)
        assert ready.decode().startswith(f"following {bus_namespace}.atmo.run.*.evt")
        frames = await ask(url, "echo", PROMPT)
        assert assert_decoded_echo_run(await lines_until_exit(live), frames) != run_id


async def test_the_follower_refuses_a_run_id_that_is_not_a_subject_token(nats_url: str) -> None:
    follower = await start_follower(nats_url, "", "--run", "a.b")
    _, err = await asyncio.wait_for(follower.communicate(), 30)
    assert follower.returncode == 2
    assert "invalid run id 'a.b'" in err.decode()


async def test_the_follower_names_the_missing_stream(nats_url: str, bus_namespace: str) -> None:
    follower = await start_follower(nats_url, bus_namespace, "--run", "r1")
    _, err = await asyncio.wait_for(follower.communicate(), 30)
    assert follower.returncode == 2
    assert f"no stream {bus_namespace.upper()}_ATMO_EVENTS" in err.decode()


def test_the_follower_imports_nothing_of_atmosphere_but_the_contracts() -> None:
    tree = ast.parse(EXAMPLE.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    ours = {m for m in imported if m.startswith(("atmosphere", "examples"))}
    assert ours == {"atmosphere.contracts.run.v1.run_pb2"}
