"""The console's end-to-end app: `notes` (an approval before `delete_note`) and `coder` (plan and files)."""

from __future__ import annotations

from atmosphere.sdk import App
from examples.approvals import Notes
from examples.coding_agent import Coder

app = App(agents=[Coder, Notes])
