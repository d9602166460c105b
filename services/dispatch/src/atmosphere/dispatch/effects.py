"""A run's effects, each under its journal key: inputs, model rounds, tool calls, approvals.

`RunEffects` derives each effect's idempotency key and request digest exactly as Atmosphere's
`EffectKeys` does and hands out one handle per effect. In a durable run the run consults a
handle before the effect (a committed one replays), marks it pending just before the side
effect and commits its result just before the result is reported — so a result the client saw
is always one the journal holds.

Without durable runs only tool calls are journaled, and only their start (`tools_only`): a
marker written just before the side effect, so that a worker taking the run over knows which
calls may have run and never runs one again (`interrupted.py`). A run that calls no tool
journals nothing.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from atmosphere.contracts.journal.v1.journal_pb2 import EffectKind
from atmosphere.dispatch.journal import Entry, RunJournal, canonical_json, effect_key
from atmosphere.sdk.runtime import JournaledRound, RecordedRound

_CURRENT: contextvars.ContextVar[ToolEffect | None] = contextvars.ContextVar("atmosphere_tool_effect", default=None)
"""The tool call a task is executing (one task per concurrent call)."""


def tool_call_key(run_id: str, name: str, canonical_arguments: str, occurrence: int) -> str:
    """The journal key of a run's `occurrence`-th call of `name` with these arguments (canonical JSON)."""
    return effect_key(run_id, "tool", name, canonical_arguments, occurrence)


def current_call_key() -> str:
    """The journal key of the tool call being executed in this task ("" outside a journaled call).

    A tool that starts something of its own (delegation's sub-run) derives that thing's id from
    it, so the resumed call finds what the interrupted one started.
    """
    effect = _CURRENT.get()
    return effect.key if effect is not None else ""


class CallEffect(Protocol):
    """What the tool choke point does with one call's journal record: a `ToolEffect`, or `UNJOURNALED`."""

    @property
    def replay(self) -> tuple[bool, str] | None:
        """The committed outcome `(is_error, text)` to replay, or None."""
        ...

    @property
    def interrupted(self) -> bool:
        """Whether an earlier worker started this call and died before it reported."""
        ...

    def enter(self) -> contextvars.Token[ToolEffect | None]:
        """Make this the current call of the task (see `current_call_key`)."""
        ...

    async def start(self) -> None:
        """Just before the side effect."""
        ...

    async def settle(self, *, error: bool, text: str) -> None:
        """Just before the outcome is reported."""
        ...

    async def settle_interrupted(self, text: str) -> None:
        """Report an interrupted call (`interrupted`) as settled with the error `text`."""
        ...


class _Unjournaled:
    """The record of a call of a run that journals nothing: there is nothing to replay or write."""

    replay = None
    interrupted = False

    def enter(self) -> contextvars.Token[ToolEffect | None]:
        """No call key for what the call starts (`current_call_key` is "")."""
        return _CURRENT.set(None)

    async def start(self) -> None:
        """Nothing to mark."""

    async def settle(self, *, error: bool, text: str) -> None:
        """Nothing to commit."""

    async def settle_interrupted(self, text: str) -> None:
        """Never interrupted."""


UNJOURNALED: CallEffect = _Unjournaled()
"""The journal record of every call of a run without a journal."""


@dataclass
class ToolEffect:
    """One tool call under the journal."""

    journal: RunJournal
    key: str
    digest: str
    started: bool = False
    marks_only: bool = False
    """Only the start is recorded (runs without durable runs): a takeover needs to know that the
    call may have run, not its result, which it never replays."""

    @property
    def replay(self) -> tuple[bool, str] | None:
        """The committed outcome `(is_error, text)` to replay, or None."""
        entry = self.journal.replayable(self.key, self.digest)
        if entry is None:
            return None
        outcome = json.loads(entry.payload)
        return bool(outcome["error"]), str(outcome["text"])

    @property
    def interrupted(self) -> bool:
        """Whether an earlier worker started this call and died before it reported."""
        return self.journal.interrupted(self.key)

    def enter(self) -> contextvars.Token[ToolEffect | None]:
        """Make this the current call of the task (see `current_call_key`)."""
        return _CURRENT.set(self)

    @staticmethod
    def leave(token: contextvars.Token[ToolEffect | None]) -> None:
        """Undo `enter`."""
        _CURRENT.reset(token)

    async def start(self) -> None:
        """Just before the side effect."""
        if not self.started:
            self.started = True
            await self.journal.pending(EffectKind.EFFECT_KIND_TOOL_CALL, self.key, self.digest)

    async def settle(self, *, error: bool, text: str) -> None:
        """Just before the outcome is reported (a call that never started records nothing)."""
        if self.started and not self.marks_only:
            await self.journal.commit(self.key, json.dumps({"error": error, "text": text}))

    async def settle_interrupted(self, text: str) -> None:
        """Commit the outcome of a call its earlier worker started and never reported: the error `text`."""
        self.started = True
        await self.settle(error=True, text=text)


@dataclass
class ApprovalEffect:
    """One approval decision under the journal."""

    journal: RunJournal
    key: str
    digest: str

    @property
    def decided(self) -> dict[str, Any] | None:
        """The committed decision `{action, payload}`, or None: ask (again)."""
        entry = self.journal.replayable(self.key, self.digest)
        return None if entry is None else dict(json.loads(entry.payload))

    async def ask(self) -> None:
        """The approval is being asked."""
        await self.journal.pending(EffectKind.EFFECT_KIND_APPROVAL, self.key, self.digest)

    async def decide(self, action: str, payload: str) -> None:
        """The reviewer decided: a resume replays it without asking again."""
        await self.journal.commit(self.key, json.dumps({"action": action, "payload": payload}))

    async def expire(self) -> None:
        """Nobody decided in time: not committed, so a resume asks again."""
        await self.journal.fail(self.key, "approval timed out")


@dataclass
class _Round:
    journal: RunJournal
    key: str
    digest: str
    replayed: RecordedRound | None

    @property
    def recorded(self) -> RecordedRound | None:
        return self.replayed

    async def commit(self, result: RecordedRound) -> None:
        """Record the round; one too large for a journal record is kept without its pieces, or not at all."""
        if not await self.journal.commit(self.key, result.to_json()):
            # Left pending if even this fails: a resume asks the model again (no side effect repeats).
            await self.journal.commit(self.key, result.without_pieces().to_json())


@dataclass
class RunEffects:
    """Keys, digests and handles for the effects of one run: all of them, or its tool calls' starts."""

    journal: RunJournal
    user_id: str
    model: str
    tool_names: Iterable[str]
    tools_only: bool = False
    """Journal only the start of each tool call (runs without durable runs): no input, round or
    approval, and no result. Whoever runs the inputs and rounds asks `tools_only` first."""
    _rounds: int = 0
    _inputs: int = 0
    _tools_digest: str = field(default="", init=False)

    def __post_init__(self) -> None:
        """Fix the run's tool set digest (Atmosphere's `toolsDigest`: sorted names)."""
        self._tools_digest = effect_key(*sorted(self.tool_names))

    @property
    def run_id(self) -> str:
        """The run the effects belong to."""
        return self.journal.run_id

    def input(self) -> tuple[str, str, Entry | None]:
        """The next model exchange's input: its key, digest and committed seed (or None)."""
        index = self._inputs
        self._inputs += 1
        key = effect_key(self.run_id, "input") if index == 0 else effect_key(self.run_id, "input", index)
        digest = effect_key(self.model, self._tools_digest, self.user_id)
        return key, digest, self.journal.replayable(key, digest)

    async def next_round(self) -> JournaledRound:
        """The run's next model round (`ModelRounds`): replayed if committed, else marked pending."""
        index = self._rounds
        self._rounds += 1
        key = effect_key(self.run_id, "llm", index)
        digest = effect_key(self.model, index)
        entry = self.journal.replayable(key, digest)
        if entry is not None:
            try:
                return _Round(self.journal, key, digest, RecordedRound.from_json(entry.payload))
            except ValueError:
                pass  # an unreadable record is run live again
        await self.journal.pending(EffectKind.EFFECT_KIND_LLM_ROUND, key, digest)
        return _Round(self.journal, key, digest, None)

    def tool_call(self, name: str, arguments: dict[str, Any]) -> ToolEffect:
        """The handle of one tool call (its occurrence counted now, on a first drive and a replay alike)."""
        canonical = canonical_json(arguments)
        occurrence = self.journal.occurrence("tool", name, canonical)
        key = tool_call_key(self.run_id, name, canonical, occurrence)
        digest = effect_key(name, canonical, self.user_id)
        return ToolEffect(self.journal, key, digest, marks_only=self.tools_only)

    def approval(self, name: str, arguments: dict[str, Any]) -> ApprovalEffect | None:
        """The handle of one approval of a call (approvals have their own occurrence counter).

        None when only tool calls are journaled: the approval is simply asked again on a takeover.
        """
        if self.tools_only:
            return None
        canonical = canonical_json(arguments)
        occurrence = self.journal.occurrence("approval", name, canonical)
        key = effect_key(self.run_id, "approval", name, canonical, occurrence)
        return ApprovalEffect(self.journal, key, effect_key("approval", name, canonical, self.user_id))
