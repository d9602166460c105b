"""`code_exec` end to end: a model writes code, the sandbox runs it in bubblewrap, the client sees each round.

The whole system on a real nats-server with `ATMOSPHERE_AI_CODE_ENABLED` on the sandbox: the agent
declares no code tool, yet it is offered (the sandbox published it); the model's first round writes
a file and an image artifact, the second reads the file back (the run's session persists between
rounds), and each round streams an `agent-step` frame. The run ends; its session is released.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from atmosphere.bus import NatsBus, subjects
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.sandbox.code.settings import CodeSettings
from atmosphere.testing import ModelRequest, ScriptedModel, ToolCallScript, Turn, run_stack

from .conftest import service_map
from .wsclient import ask

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.usefixtures("sandbox_user"),  # no other test process's sandbox meanwhile
]

APP = "examples.assistant:app"
FIRST = (
    "import os, base64\n"
    "open('notes.txt', 'w').write('kept between rounds')\n"
    "os.makedirs('artifacts', exist_ok=True)\n"
    "png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGA'\n"
    "    'WjR9awAAAABJRU5ErkJggg==')\n"
    "open('artifacts/dot.png', 'wb').write(png)\n"
    "print('wrote', 6 * 7)\n"
)
SECOND = "print(open('notes.txt').read())"


def respond(request: ModelRequest) -> Turn:
    """Round one writes, round two reads back, then the answer quotes what the code printed."""
    tools = [m for m in request["messages"] if m["role"] == "tool"]
    if not tools:
        return Turn.tool_calls(ToolCallScript("code_exec", {"language": "python", "code": FIRST}, call_id="c1"))
    if len(tools) == 1:
        return Turn.tool_calls(ToolCallScript("code_exec", {"language": "py", "code": SECOND}, call_id="c2"))
    return Turn.text("read: " + json.loads(tools[-1]["content"])["stdout"].strip())


@pytest.mark.timeout(180)
async def test_a_model_runs_code_over_two_rounds_in_one_sandbox_session(
    nats_url: str, bus_namespace: str, nats_bus: NatsBus, tmp_path: Path
) -> None:
    provider = ScriptedModel(function=respond)
    async with provider.serving():
        services = service_map(nats_url, bus_namespace, tmp_path / "data", app=APP, llm_base_url=provider.base_url)
        sandbox_settings = services["sandbox"][1].model_copy(update={"code": CodeSettings(enabled=True)})
        services["sandbox"] = (services["sandbox"][0], sandbox_settings)
        async with run_stack(services, bus=nats_bus) as stack:
            info = await nats_bus.request(subjects.service_info("sandbox"), ServiceInfoRequest(), ServiceInfoResponse)
            frames = await ask(await stack.ingress_url(), "assistant", "Run some code.")

    assert json.loads(info.info_json)["sandbox"]["code_exec"] == "ACTIVE(bwrap)"
    offered = [t["function"]["name"] for t in provider.requests[0]["tools"]]
    assert "code_exec" in offered
    steps = [f for f in frames if f.get("event") == "agent-step"]
    assert [s["data"]["stepName"] for s in steps] == ["code_exec", "code_exec"], steps
    assert [s["data"]["description"] for s in steps] == ["Ran python (exit 0)", "Ran python (exit 0)"]
    results = [json.loads(f["data"]["result"]) for f in frames if f.get("event") == "tool-result"]
    assert results[0]["stdout"].strip() == "wrote 42"
    assert results[0]["artifactCount"] == 1
    assert results[1]["stdout"].strip() == "kept between rounds"
    text = "".join(f["data"] for f in frames if f.get("type") == "streaming-text")
    assert "data:image/png;base64," in text  # the artifact, inline
    assert text.endswith("read: kept between rounds")
    assert frames[-1]["type"] == "complete"
