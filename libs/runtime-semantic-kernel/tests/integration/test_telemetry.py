"""In a fresh interpreter: discovering the runtime imports no framework, and running it keeps SK quiet."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, os, sys
from importlib.metadata import entry_points
[entry] = [e for e in entry_points(group="atmosphere.runtimes") if e.name == "semantic-kernel"]
runtime = entry.load()(__import__("atmosphere.sdk.runtime", fromlist=["RuntimeConfig"]).RuntimeConfig())
discovered = sorted(m for m in sys.modules if m == "semantic_kernel" or m.startswith(("semantic_kernel.", "openai")))
switches = {k: v for k, v in os.environ.items() if k.startswith(("SEMANTICKERNEL_", "AZURE_TELEMETRY"))}
runtime.engine
from semantic_kernel.utils.telemetry import user_agent
from semantic_kernel.utils.telemetry.model_diagnostics import decorators
print(json.dumps({
    "discovered": discovered,
    "version_headers": user_agent.IS_TELEMETRY_ENABLED,
    "diagnostics": decorators.are_model_diagnostics_enabled(),
    "environment": switches,
}))
"""
SWITCHES = ("SEMANTICKERNEL_", "AZURE_TELEMETRY")


def probe(**environment: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(SWITCHES)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**clean, **environment},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_discovering_it_imports_no_framework_and_turns_sk_telemetry_off_before_sk_loads() -> None:
    report = probe()
    assert report["discovered"] == []
    assert report["version_headers"] is False
    assert report["diagnostics"] is False
    assert report["environment"] == {
        "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS": "false",
        "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS_SENSITIVE": "false",
        "AZURE_TELEMETRY_DISABLED": "true",
    }


def test_an_operator_may_still_turn_sk_diagnostics_on() -> None:
    report = probe(SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS="true")
    assert report["diagnostics"] is True
