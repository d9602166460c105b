"""An ADK agent whose tool saves an artifact: ADK's artifact service is the conversation's workspace."""

from __future__ import annotations

from google.adk.agents import LlmAgent
from google.adk.tools.tool_context import ToolContext
from google.genai import types


async def save_report(title: str, tool_context: ToolContext) -> str:
    """Write a report and keep it as an artifact.

    Args:
        title: The report's title.
        tool_context: ADK's context of the call (its artifact service).
    """
    version = await tool_context.save_artifact("report.md", types.Part.from_text(text=f"# {title}\nAll clear."))
    return f"saved report.md (version {version})"


hosted = LlmAgent(name="reporter", instruction="You write reports.", tools=[save_report])
