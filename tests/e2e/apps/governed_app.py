"""An app for the governance end-to-end tests: a model agent with a destructive tool that records its calls."""

from __future__ import annotations

import os
from pathlib import Path

from atmosphere.sdk import App, ToolKind, agent, tool

CALLS_FILE_ENV = "GOVERNED_APP_CALLS"
"""Where `delete_record` appends each id it deletes (so a test sees whether it ever ran)."""


@tool(kind=ToolKind.DELETE)
def delete_record(record_id: str) -> str:
    """Delete a record for good.

    Args:
        record_id: The record to delete.
    """
    with Path(os.environ[CALLS_FILE_ENV]).open("a", encoding="utf-8") as calls:
        calls.write(record_id + "\n")
    return f"deleted {record_id}"


@tool(kind=ToolKind.READ)
def read_record(record_id: str) -> str:
    """Read a record.

    Args:
        record_id: The record to read.
    """
    return f"record {record_id}: status=active"


@agent(
    name="records",
    description="Manages records.",
    system_prompt="You manage records with your tools.",
    tools=[delete_record, read_record],
)
class Records:
    """The model decides; the tools act."""


app = App([Records])
