"""What a run taken over without durable runs must not do again: the tool calls its last worker started.

Without the journal of durable runs a redelivered run is re-driven from its prompt: the model
is asked again and would ask for its tools again. So first the new worker looks at what the
earlier ones started. Each tool call's start marker is in the run's journal (written just
before the call's side effect, `RunEffects(tools_only=True)`), and the run's stream holds each
call's `tool-start` (its name and arguments, from which the marker's key derives) and, once it
finished, its `tool-result` or `tool-error`.

- No call started, or only calls of tools declared safe to repeat (`idempotent=True`): the run
  is re-driven from its prompt, its stream going on after its last seq.
- Any other call started: the run ends with one `dispatch.run_interrupted` error naming those
  calls. Each ran, or may have; none runs again. (A durable run goes on instead: its journal
  replays the model's rounds, so the model never chooses its calls anew.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from atmosphere.bus.errors import RunInterruptedError
from atmosphere.contracts.journal.v1.journal_pb2 import EffectKind
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.dispatch.effects import tool_call_key
from atmosphere.dispatch.journal import RunJournal, canonical_json
from atmosphere.sdk.runtime import ToolSpec

MAX_OCCURRENCES = 64
"""Identical calls (one tool, the same arguments) of one run told apart when naming markers;
a marker beyond them is reported unnamed (and so never taken for safe to repeat)."""


@dataclass(frozen=True)
class StartedCall:
    """A tool call an earlier worker of the run started."""

    name: str
    """The tool; "" when its `tool-start` is not in the stream (lost with its worker)."""
    call_id: str
    finished: bool
    """Whether its outcome (`tool-result` or `tool-error`) is in the stream."""

    def may_repeat(self, tools: Mapping[str, ToolSpec]) -> bool:
        """Whether running it again is harmless: its tool is declared idempotent."""
        spec = tools.get(self.name)
        return spec is not None and spec.idempotent

    def described(self) -> str:
        name = self.name or "a tool whose name was lost"
        state = "finished" if self.finished else "may or may not have taken effect"
        return f"{name} (call {self.call_id}, {state})" if self.call_id else f"{name} ({state})"


def _own(event: RunEvent, kind: str) -> bool:
    """Whether `event` is the run's own `kind` event (a sub-run's forwarded ones are its own business)."""
    return event.WhichOneof("kind") == kind and not event.origin_run_id


def _arguments(arguments_json: str) -> str | None:
    """The canonical JSON of a `tool-start`'s arguments, as its marker's key was derived; None if unreadable."""
    try:
        arguments = json.loads(arguments_json or "{}")
    except (ValueError, RecursionError):
        return None
    return canonical_json(arguments) if isinstance(arguments, dict) else None


def started_calls(journal: RunJournal, stored: Iterable[RunEvent]) -> list[StartedCall]:
    """The tool calls with a start marker in `journal`, named after their `tool-start` in `stored`."""
    unmatched = {key for key, entry in journal.entries.items() if entry.kind == EffectKind.EFFECT_KIND_TOOL_CALL}
    if not unmatched:
        return []
    events = sorted(stored, key=lambda event: event.seq)
    finished = {e.tool_result.call_id for e in events if _own(e, "tool_result")}
    finished |= {e.tool_error.call_id for e in events if _own(e, "tool_error")}
    calls: list[StartedCall] = []
    for event in events:
        if not _own(event, "tool_start"):
            continue
        start = event.tool_start
        canonical = _arguments(start.arguments_json)
        if canonical is None:
            continue
        # The marker's occurrence counts calls refused before their `tool-start` too: the first
        # unmatched one of this call's identity is its.
        for occurrence in range(MAX_OCCURRENCES):
            key = tool_call_key(journal.run_id, start.tool_name, canonical, occurrence)
            if key in unmatched:
                unmatched.discard(key)
                calls.append(StartedCall(start.tool_name, start.call_id, finished=start.call_id in finished))
                break
    calls += [StartedCall("", "", finished=False) for _ in unmatched]
    return calls


def interrupted_error(calls: list[StartedCall]) -> RunInterruptedError:
    """The run's end when `calls` must not run again: each named, with whether it finished."""
    message = (
        "The run was interrupted: the worker running it stopped after starting "
        + "; ".join(call.described() for call in calls)
        + ". Nothing was run again: check what took effect before sending the prompt again."
    )
    details = {"tools": ",".join(call.name for call in calls), "calls": ",".join(call.call_id for call in calls)}
    return RunInterruptedError(message, details=details)
