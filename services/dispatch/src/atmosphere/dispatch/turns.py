"""A run's conversation turns: each model exchange stored in conversation memory exactly once.

A turn is stored just before the run's terminal event goes out (so the next turn of the
conversation, or a fact extraction, finds it), or when its exchange ends without one. On
`complete` it is the user's message and the answer; otherwise the message only. A run another
worker took over, or a replay, stores nothing: that is the other worker's to do, or done.
"""

from __future__ import annotations

from dataclasses import dataclass

from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.dispatch.durability import Durability
from atmosphere.dispatch.event_output import EventOutput
from atmosphere.dispatch.run_scope import RunScope


@dataclass
class Turn:
    """The model exchange under way."""

    message: str
    model: str | None
    client_kept: bool
    """The client keeps the conversation: there is nothing to record."""
    answer_from: int
    """Where this exchange's answer starts in the run's answer text."""
    recorded: bool = False


class Turns:
    """The turn under way of one run, and its recording."""

    def __init__(self, scope: RunScope, durability: Durability, output: EventOutput) -> None:
        """Store `scope`'s turns, with the answer `output` captured."""
        self._scope = scope
        self._durability = durability
        self._output = output
        self.current: Turn | None = None

    def begin(self, message: str, *, model: str | None, client_kept: bool) -> Turn:
        """An exchange starts: its turn is the one under way."""
        self.current = Turn(message, model=model, client_kept=client_kept, answer_from=len(self._output.answer))
        return self.current

    async def before_terminal(self, terminal: RunEvent) -> None:
        """The run's terminal event is about to go out: the turn under way is stored first."""
        turn = self.current
        if turn is not None and not turn.recorded:
            await self.record(turn, terminal)

    async def record(self, turn: Turn, terminal: RunEvent | None) -> None:
        """Store `turn`: on complete the user message and the answer, otherwise the message only."""
        turn.recorded = True
        memory = self._scope.services.model_side.conversation
        if memory is None or not self._durability.reaches_services or self._durability.lost:
            return  # a run another worker took over is that worker's to record
        completed = terminal is not None and terminal.WhichOneof("kind") == "complete"
        if completed and terminal is not None and terminal.complete.client_tool_calls:
            # Not over: the caller runs its functions and continues this turn (that run records it whole).
            return
        await memory.record(
            self._scope.request,
            self._scope.agent.harness,
            user=turn.message,
            answer="".join(self._output.answer[turn.answer_from :]) if completed else None,
            model=turn.model,
            client_kept=turn.client_kept,
        )
