"""What a re-driven run must not send again (the events its clients already have), and replays.

A run whose worker died is re-driven by another worker, from its prompt. The journal replays
what the first worker committed, and a round or tool call that was under way runs again — so
the re-drive produces, in the same order, events the stream already holds. `DeliveredEvents`
holds them back: the stream continues from its last seq with only what is new.

- The run's own text is one growing string: of each re-driven text delta only the characters
  beyond what was already delivered go out. A round asked again may come out differently: then
  an `ai.run.answer_rewound` marker tells the client how many of the characters it has to drop,
  and the new text goes out from there (never a silent splice of two answers).
- Any other event goes out unless an identical one (same kind and payload, seq and timestamp
  aside) was delivered and not yet matched: a replayed `tool-start`, `tool-result` or `usage`
  is held back, a new one is sent.
- A re-prompted approval always goes out: the client's earlier answer may have died with the
  worker, and the approval is asked again only if it was never decided.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable

from atmosphere.bus.runs import (
    ANSWER_REWOUND_METADATA_KEY,
    EVENT_LOST_METADATA_KEY,
    RESUMED_METADATA_KEY,
    WORKER_FIRST_SEQ,
)
from atmosphere.contracts.run.v1.run_pb2 import Metadata, RunEvent, TextDelta

log = logging.getLogger("atmosphere.dispatch")

_MARKERS = frozenset({RESUMED_METADATA_KEY, EVENT_LOST_METADATA_KEY, ANSWER_REWOUND_METADATA_KEY})
"""Metadata a re-drive writes about itself: never matched against what came before."""
_ALWAYS_SENT = frozenset({"approval_required"})


def _identity(event: RunEvent) -> bytes:
    """`event` without the writer's stamps (it is matched before a re-driven copy is stamped)."""
    copy = RunEvent()
    copy.CopyFrom(event)
    # What the writer stamps on every event: the same for the whole run, or new in each copy.
    for stamp in ("run_id", "seq", "session_id", "conversation_id", "agent", "parent_run_id", "timestamp", "owner"):
        copy.ClearField(stamp)
    return copy.SerializeToString(deterministic=True)


def _own_text(event: RunEvent) -> str | None:
    """The run's own answer text in `event` (a sub-agent's forwarded text is not)."""
    if event.WhichOneof("kind") == "text_delta" and not event.origin_run_id:
        return event.text_delta.text
    return None


def _marker(event: RunEvent) -> bool:
    return event.WhichOneof("kind") == "metadata" and event.metadata.key in _MARKERS


class DeliveredEvents:
    """The events a run's stream already holds, matched off as the re-drive produces them again."""

    def __init__(self, run_id: str, stored: Iterable[RunEvent]) -> None:
        """Hold back re-driven copies of `stored` (the run's events before this delivery)."""
        self.run_id = run_id
        texts: list[str] = []
        self._others: Counter[bytes] = Counter()
        for event in sorted(stored, key=lambda e: e.seq):
            if event.seq < WORKER_FIRST_SEQ or _marker(event):
                continue
            text = _own_text(event)
            if text is not None:
                texts.append(text)
            else:
                self._others[_identity(event)] += 1
        self._text = "".join(texts)
        self._redriven = 0
        """How many characters of own text the re-drive produced so far."""
        self.held_back = 0
        self.diverged = False

    def admit(self, event: RunEvent) -> list[RunEvent]:
        """What of `event` still has to go out: itself, its unsent tail (text), or nothing."""
        text = _own_text(event)
        if text is not None:
            return self._admit_text(event, text)
        kind = event.WhichOneof("kind")
        if kind in _ALWAYS_SENT or _marker(event):
            return [event]
        identity = _identity(event)
        if self._others[identity] > 0:
            self._others[identity] -= 1
            self.held_back += 1
            return []
        return [event]

    def _admit_text(self, event: RunEvent, text: str) -> list[RunEvent]:
        if self.diverged:
            return [event]
        start = self._redriven
        self._redriven += len(text)
        delivered = self._text[start : self._redriven]
        if not text.startswith(delivered):
            # Everything sent from `start` on is not this answer: the client drops it, and the
            # new text goes out whole from here.
            self.diverged = True
            discard = len(self._text) - start
            log.warning(
                "run %s: the resumed answer differs from what was sent; rewinding %d chars", self.run_id, discard
            )
            rewound = Metadata(key=ANSWER_REWOUND_METADATA_KEY, value_json=json.dumps({"discard": discard}))
            return [RunEvent(metadata=rewound), event]
        if self._redriven <= len(self._text):
            self.held_back += 1
            return []
        if start >= len(self._text):
            return [event]
        tail = RunEvent()
        tail.CopyFrom(event)
        tail.text_delta.CopyFrom(TextDelta(text=text[len(self._text) - start :]))
        return [tail]


class CapturedEvents:
    """A replayed run's events, kept in memory instead of written to the run's stream."""

    def __init__(self) -> None:
        """Nothing captured yet; seqs count from the worker's first."""
        self.events: list[RunEvent] = []

    async def emit(self, event: RunEvent, *, durable: bool | None = None) -> RunEvent:
        """Keep `event`, numbered (the writer's interface)."""
        del durable
        kept = RunEvent()
        kept.CopyFrom(event)
        kept.seq = WORKER_FIRST_SEQ + len(self.events)
        self.events.append(kept)
        return kept

    async def close(self) -> None:
        """Nothing to flush."""


def same_events(first: Iterable[RunEvent], second: Iterable[RunEvent]) -> bool:
    """Whether two runs' streams carry the same events in the same order (stamps and markers aside).

    The run's own text between two other events is compared as one string: how it was cut into
    deltas depends on timing (`CoalescedEvents`), never its characters.
    """

    def content(events: Iterable[RunEvent]) -> list[bytes | str]:
        items: list[bytes | str] = []
        for event in sorted(events, key=lambda e: e.seq):
            if event.seq < WORKER_FIRST_SEQ or _marker(event):
                continue
            text = _own_text(event)
            if text is None:
                items.append(_identity(event))
            elif items and isinstance(items[-1], str):
                items[-1] += text
            else:
                items.append(text)
        return items

    return content(first) == content(second)
