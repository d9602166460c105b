"""`atmo.mem.tool.<name>`: the harness tools; the writing ones go through the write log, the rest read here."""

from __future__ import annotations

from atmosphere.bus import MessageContext
from atmosphere.bus.sizes import DEFAULT_MAX_PAYLOAD, data_budget
from atmosphere.contracts.memory.v1.memory_pb2 import MemoryWrite
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply
from atmosphere.memory.replication import MemoryJournal, request_digest
from atmosphere.memory.responders.sizing import fit_tool_reply
from atmosphere.memory.tool_runner import WRITING_TOOLS


class ToolResponders:
    """Answers `write_todos` and the eight file tools within one message."""

    def __init__(self, journal: MemoryJournal, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        """Write through `journal`, read on its replica's workspaces; answers fit in `max_payload` bytes."""
        self._journal = journal
        self._tool_bytes = data_budget(max_payload)

    async def tool(self, call: ToolCall, _ctx: MessageContext) -> ToolReply:
        """`atmo.mem.tool.<name>`: `write_todos` and the eight file tools, answered within one message."""
        if call.name in WRITING_TOOLS:
            # A call sent again (the same bytes) is applied once; call ids come from the model and
            # may repeat within a run, so the content is part of the key.
            key = f"tool:{call.run_id}:{request_digest(call)}" if call.run_id else ""
            result: ToolReply = await self._journal.write(MemoryWrite(tool=call), key)
        else:
            await self._journal.caught_up()
            result = await self._journal.replica.tools.run(call)
        return fit_tool_reply(result, self._tool_bytes)
