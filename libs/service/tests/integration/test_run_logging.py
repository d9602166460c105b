"""A service process started by `atmosphere.service.run` logs as the issue asks, end to end.

A process of its own (`run` installs the root handler): every line names the service and the
replica (`host:pid`), a line logged inside a bound run names it, and a secret the process holds
in its settings or environment never shows, whoever logs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SECRET = "sk-live-0123456789abcdef"
GRANT = "grant-token-0123456"

SERVICE = textwrap.dedent(
    """
    import asyncio, logging, os, socket, sys

    from atmosphere.bus.telemetry import bind_run
    from atmosphere.config import AuthOptions, ServiceSettings
    from atmosphere.service import run


    class Settings(ServiceSettings):
        ingress: AuthOptions = AuthOptions()


    async def serve(settings, *, stop):
        log = logging.getLogger("atmosphere.probe")
        print(f"{socket.gethostname()}:{os.getpid()}", file=sys.stdout, flush=True)
        log.info("outside any run")
        with bind_run("run-42", "echo"):
            log.warning("inside the run; a careless line: %s and %s", os.environ["MY_PROVIDER_API_KEY"], "GRANT")


    sys.exit(run(serve, Settings, service="probe"))
    """
).replace("GRANT", GRANT)


def run_service(**env: str) -> tuple[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", SERVICE],
        env={
            **os.environ,
            "MY_PROVIDER_API_KEY": SECRET,
            "ATMOSPHERE_INGRESS__AUTH_TOKENS": json.dumps([{"token": GRANT, "user_id": "ada"}]),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr.splitlines()


@pytest.mark.timeout(60)
def test_text_lines_name_the_process_and_the_run_and_never_a_secret() -> None:
    replica, lines = run_service()
    outside, inside = (line for line in lines if "atmosphere.probe" in line)
    assert f" INFO    probe[{replica}] atmosphere.probe: outside any run" in outside
    assert "run=" not in outside
    assert f" WARNING probe[{replica}] atmosphere.probe: inside the run" in inside
    assert inside.endswith("a careless line: [redacted] and [redacted] run=run-42 agent=echo")
    assert all(f"probe[{replica}]" in line for line in lines)  # the runner's own lines too
    assert not any(SECRET in line or GRANT in line for line in lines)


@pytest.mark.timeout(60)
def test_json_lines_carry_the_same_fields() -> None:
    replica, lines = run_service(ATMOSPHERE_LOG__JSON="true")
    entries = [json.loads(line) for line in lines]
    assert all((e["service"], e["replica"]) == ("probe", replica) for e in entries)
    [inside] = [e for e in entries if e["message"].startswith("inside the run")]
    assert (inside["run_id"], inside["agent"], inside["level"]) == ("run-42", "echo", "WARNING")
    assert not any(SECRET in line or GRANT in line for line in lines)
