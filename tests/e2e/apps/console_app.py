"""The console's end-to-end app: `notes` (an approval before `delete_note`), `coder` (plan and files),
`concierge` (a coordinator whose `task` runs a sub-agent) and its crew."""

from __future__ import annotations

from atmosphere.sdk import App
from examples.approvals import Notes
from examples.coding_agent import Coder
from examples.personal_assistant import Concierge, Researcher, Writer

app = App(agents=[Coder, Notes, Concierge, Researcher, Writer])
