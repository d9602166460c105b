"""Fitting memory's answers in one bus message (budgets from `atmosphere.bus.sizes`)."""

from __future__ import annotations

from atmosphere.bus.sizes import clip, utf8_len
from atmosphere.contracts.tool.v1.tool_pb2 import ToolReply

ENTRY_OVERHEAD = 24
"""Protobuf framing of one `FileEntry` or fact in a reply (tags, lengths, the size varint)."""


def fit_tool_reply(result: ToolReply, tool_bytes: int) -> ToolReply:
    """`result` cut to `tool_bytes`: one bus message with room for dispatch's run event around it."""
    if result.ByteSize() <= tool_bytes:
        return result
    if result.events and sum(e.ByteSize() for e in result.events) > tool_bytes // 2:
        # A plan too large to stream; it is stored all the same, and the model is told.
        del result.events[:]
        result.content += "\n(The plan-update event was too large to send; the plan is stored.)"
    # The rest of the result, plus the `truncated` flag and a longer length prefix at most.
    room = tool_bytes - (result.ByteSize() - utf8_len(result.content)) - 8
    if utf8_len(result.content) > room:
        result.content = clip(result.content, room, "the output")
        result.truncated = True
    return result
