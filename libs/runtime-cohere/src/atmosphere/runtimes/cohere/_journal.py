"""Durable runs: a round as the effect journal records it, and its replay without calling the model.

A round's `finish_reason` is recorded in Cohere's words (`COMPLETE`, `TOOL_CALL`, `MAX_TOKENS`,
...), as the provider said it; a replay reads it back the same way.
"""

from __future__ import annotations

from atmosphere.contracts.run.v1.run_pb2 import RunEvent, ToolCallDelta
from atmosphere.runtimes.cohere._stream import RoundResult, ToolCall
from atmosphere.sdk import StreamingSession
from atmosphere.sdk.runtime import RecordedRound, RecordedToolCall, StreamedPiece


def recorded(result: RoundResult, pieces: list[StreamedPiece]) -> RecordedRound:
    """`result` as the journal keeps it, with the pieces it streamed in."""
    calls = tuple(RecordedToolCall(c.call_id, c.name, c.arguments or "{}") for c in result.tool_calls)
    return RecordedRound(
        text=result.text,
        tool_calls=calls,
        finish_reason=result.finish_reason,
        usage=result.usage,
        pieces=tuple(pieces),
    )


async def replay(session: StreamingSession, round_: RecordedRound, *, forward_text: bool) -> RoundResult:
    """A committed round as if the model had just sent it: the same pieces, then its usage."""
    if round_.pieces:
        for piece in round_.pieces:
            if piece.call_id:
                delta = ToolCallDelta(call_id=piece.call_id, tool_name=piece.name, arguments_fragment=piece.fragment)
                await session.emit(RunEvent(tool_call_delta=delta))
            elif forward_text:
                await session.send(piece.text)
    elif forward_text and round_.text:
        await session.send(round_.text)
    if round_.usage is not None:
        await session.usage(round_.usage)
    calls = [ToolCall(call_id=c.call_id, name=c.name, arguments=c.arguments) for c in round_.tool_calls]
    return RoundResult(text=round_.text, tool_calls=calls, finish_reason=round_.finish_reason, usage=round_.usage)
