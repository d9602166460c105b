"""ADK's artifacts on the platform's workspace: the ADK adapter's bridge against memory's own file tools.

The bridge (`atmosphere.runtimes.adk`) stores an artifact through the choke point as the harness's
file tools, and reads it back through them (their paging, their listing): this pins the two
sides together, the adapter's parsing and the memory service's formats, which neither library's
own tests can import both of. (The end-to-end test runs the same through real processes.)
"""

from __future__ import annotations

import json
from pathlib import Path

from google.adk.agents import LlmAgent
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from atmosphere.memory.vfs.file_tools import run_file_tool
from atmosphere.memory.vfs.filestore import WorkspaceFileSystem
from atmosphere.runtimes.adk import AdkAgentRuntime
from atmosphere.sdk import AiRequest
from atmosphere.sdk.builtin_tools import FILE_TOOLS
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner
from atmosphere.testing.model_turns import Turn
from atmosphere.testing.runtime_contract import GEMINI_WIRE, Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel


async def host(provider: ScriptedModel, agent: LlmAgent, recorder: Recorder, run_tool: ToolRunner) -> None:
    runtime = AdkAgentRuntime(GEMINI_WIRE.config(provider))
    try:
        ctx = context(
            recorder, AiRequest(message="Write the report."), native=agent, run_tool=run_tool, tools=FILE_TOOLS
        )
        await runtime.execute(ctx, recorder.session)
    finally:
        await runtime.aclose()


def workspace(root: Path, recorder: Recorder) -> ToolRunner:
    """The choke point of a run with the FILESYSTEM harness: the file tools run on a real workspace store."""
    store = WorkspaceFileSystem(root / "files")

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        if call.local is not None:
            return await call.local(call.arguments_json)
        return run_file_tool(store, call.name, json.loads(call.arguments_json))

    return run_tool


PIXEL = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


async def test_artifacts_are_kept_in_the_conversations_workspace(fake_provider: ScriptedModel, tmp_path: Path) -> None:
    loaded: list[types.Part | None] = []

    async def write_report(title: str, tool_context: ToolContext) -> str:
        """Save a report and a picture as artifacts, then read them back.

        Args:
            title: The report's title.
        """
        await tool_context.save_artifact("report.md", types.Part.from_text(text=f"# {title}"))
        version = await tool_context.save_artifact(
            "chart.png", types.Part.from_bytes(data=PIXEL, mime_type="image/png")
        )
        loaded.append(await tool_context.load_artifact("report.md"))
        loaded.append(await tool_context.load_artifact("chart.png"))
        listed = await tool_context.list_artifacts()
        return f"saved {listed} (chart version {version})"

    fake_provider.script(Turn.tool_call("write_report", title="Q3"), Turn.text("Done."))
    recorder = Recorder()
    agent = LlmAgent(name="writer", tools=[write_report])
    await host(fake_provider, agent, recorder, workspace(tmp_path, recorder))
    writes = [json.loads(c.arguments_json) for c in recorder.tool_calls if c.name == "write_file"]
    assert writes[0] == {"path": "artifacts/report.md", "content": "# Q3"}
    assert writes[1]["path"] == "artifacts/chart.png.base64"
    assert writes[1]["content"].startswith("data:image/png;base64,")
    assert all(c.local is None for c in recorder.tool_calls if c.name != "write_report")
    report, chart = loaded
    assert report is not None
    assert report.text == "# Q3"
    assert chart is not None
    assert chart.inline_data is not None
    assert (chart.inline_data.data, chart.inline_data.mime_type) == (PIXEL, "image/png")
    assert (
        GEMINI_WIRE.last_tool_result(fake_provider.requests[1])[1]
        == "saved ['chart.png', 'report.md'] (chart version 0)"
    )
    assert (tmp_path / "files" / "artifacts" / "report.md").read_text() == "# Q3"
