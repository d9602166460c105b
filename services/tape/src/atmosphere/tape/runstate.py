"""One run's recording state, and what each event does to it (no I/O: `recorder.py` loads and saves it).

Durable coalescing: nothing waits in memory between batches. A text piece is appended to the
run's open text step of its lane (the `text` step being coalesced, stored like any other and
updated in place), or starts a new one whose seq is the piece's own; a semantic boundary, a
piece of another lane, a gap in the seqs or the size cap (`max_text_chars`: that step then
says `truncated: true`) closes it. So a crash after a batch is acked loses nothing.

Seen events: `last_event_seq` is the highest seq seen; one at or below it is a redelivery and
is ignored, unless it falls in a gap, seqs the stream skipped (a resent event is stored behind
later ones): such a late event is recorded at its own seq, never coalesced, and fills its gap.

The terminal is write-once: the first one sets the status (`COMPLETED`, `ERROR`, or
`CANCELLED` for a client cancel), later events are dropped and counted in `dropped_steps`, as
are those past `max_steps_per_run` (the run is then marked truncated; its terminal step is
still stored). A run the idle sweep marked `ABANDONED` is reopened by its next event.
`text_complete` replaces the text of the round (recorded since the last one): only what was
not recorded yet is added, so nothing is counted twice (a late one adds nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from atmosphere.tape.steps import OWN_LANE, Entry, FullText, Lane, Piece, Record, Skip

OPEN = "OPEN"
ABANDONED = "ABANDONED"
COMPLETED = "COMPLETED"
INCOMPLETE = "INCOMPLETE"
"""A run that completed while some of its events are missing from the tape (its stream lost
them): never shown as `COMPLETED`, whose answer would read whole. Back to `COMPLETED` if the
missing events arrive late."""

MAX_GAPS = 256
"""Gaps remembered per run; past it the oldest are forgotten (their late events count as seen)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """How much one run may put on the tape."""

    max_steps_per_run: int = 5000
    max_text_chars: int = 262_144


@dataclass(slots=True)
class Segment:
    """A coalesced text step."""

    seq: int
    lane: Lane
    text: str
    ts: int
    truncated: bool = False
    stored_bytes: int = 0
    """Its payload's size in the database before this batch (0: not stored yet)."""


@dataclass(slots=True)
class NewStep:
    """A step of its own, to be inserted."""

    kind: str
    payload: str
    ts: int


@dataclass(slots=True)
class RunState:
    """A run as the batch being recorded changes it."""

    run_id: str
    started_at: int
    is_new: bool = True
    tape_id: str = ""
    session_id: str = ""
    agent: str = ""
    parent_run_id: str = ""
    model: str = ""
    runtime: str = ""
    endpoint: str = ""
    owner: str = ""
    """The user id of the principal that started the run: the first one an event names, then fixed."""
    status: str = OPEN
    ended_at: int | None = None
    step_count: int = 0
    dropped_steps: int = 0
    truncated: bool = False
    last_event_seq: int = 0
    round_seq: int = 0
    """The seq of the last `text_complete`: the round's text is in the own text steps after it."""
    terminal_seq: int = 0
    payload_bytes: int = 0
    touched_at: int = 0
    open: Segment | None = None
    gaps: list[tuple[int, int]] = field(default_factory=list)
    gaps_loaded: bool = False
    """Whether `gaps` holds the stored gaps too (else only the ones this batch found)."""
    gaps_changed: bool = False
    round_texts: dict[int, str] = field(default_factory=dict)
    """Stored own text by step seq after `round_seq` (loaded when a `text_complete` is in the batch)."""
    steps: dict[int, NewStep] = field(default_factory=dict)
    segments: dict[int, Segment] = field(default_factory=dict)
    """Text steps this batch created or changed."""
    changed: bool = False

    # -- one event ---------------------------------------------------------------------------

    def own(self, owner: str) -> None:
        """Take `owner` (an event's `RunEvent.owner`) unless the run already has one.

        Every event of a run names the same owner (its writer stamps them all), so the first
        one seen settles it; a run stored before owners were (`''`) takes the next one's.
        """
        if owner and not self.owner:
            self.owner = owner
            self.changed = True

    def apply(self, seq: int, ts: int, entry: Entry, *, rendered: str = "{}", now: int, limits: Limits) -> None:
        """Record the event `seq` (time `ts`); `rendered` is a `Record`'s payload as stored."""
        late = seq <= self.last_event_seq
        if late and not self._fill_gap(seq):
            return  # seen before: a redelivery
        contiguous = seq == self.last_event_seq + 1
        if not late:
            if not contiguous:
                self._add_gap(self.last_event_seq + 1, seq - 1)
            self.last_event_seq = seq
        self.changed = True
        self.touched_at = now
        self.started_at = min(self.started_at, ts) if self.started_at else ts
        if self.status == ABANDONED:
            self.status, self.ended_at = OPEN, None
        if self.status != OPEN and seq > self.terminal_seq:
            self.dropped_steps += 1
            return
        if isinstance(entry, Skip):
            return
        if isinstance(entry, Piece):
            # Every delta is appended, as a client appends it: two equal pieces in a row ("ha",
            # "ha") are two pieces of the answer, never one sent twice (the seed's re-send rule
            # would drop the second).
            if entry.text or entry.lane.redacted:
                self._piece(seq, ts, entry, late=late, join=contiguous and not late, limits=limits)
        elif isinstance(entry, FullText):
            # A late one would add its whole text after what its round already recorded.
            if not late:
                self._full_text(seq, ts, entry.text, contiguous=contiguous, limits=limits)
        else:
            self._record(seq, ts, entry, rendered, late=late, limits=limits)

    def _piece(self, seq: int, ts: int, piece: Piece, *, late: bool, join: bool, limits: Limits) -> None:
        segment = self.open
        if join and segment is not None and segment.lane == piece.lane:
            segment.text += piece.text
            self.segments[segment.seq] = segment
        else:
            if not late:
                self.open = None
            new = self._new_segment(seq, ts, piece.lane, piece.text, limits)
            if new is None:
                return
            segment = new
            if not late:
                self.open = segment
        self._cap(segment, limits)

    def _full_text(self, seq: int, ts: int, text: str, *, contiguous: bool, limits: Limits) -> None:
        """`text_complete`: the round's text becomes `text`, adding only what is not recorded."""
        own = self.open if self.open is not None and self.open.lane == OWN_LANE else None
        texts = dict(self.round_texts)
        texts.update({s.seq: s.text for s in self.segments.values() if s.lane == OWN_LANE})
        closed = "".join(t for s, t in sorted(texts.items()) if s > self.round_seq and (own is None or s != own.seq))
        recorded = closed + (own.text if own is not None else "")
        if text != recorded:
            if text.startswith(recorded):
                self._piece(seq, ts, Piece(OWN_LANE, text[len(recorded) :]), late=False, join=contiguous, limits=limits)
            elif own is not None:
                # What the round recorded is not how it ended: the open step takes the rest
                # of the full text (all of it when even the closed steps differ).
                own.text = text[len(closed) :] if text.startswith(closed) else text
                self.segments[own.seq] = own
                self._cap(own, limits)
            else:
                self.open = None
                self._piece(seq, ts, Piece(OWN_LANE, text), late=False, join=False, limits=limits)
        self.open = None
        self.round_seq = seq
        self.round_texts = {}

    def _record(self, seq: int, ts: int, entry: Record, rendered: str, *, late: bool, limits: Limits) -> None:
        if entry.model and not self.model:
            self.model = entry.model
        if (entry.boundary or entry.terminal_status) and not late:
            self.open = None
        if entry.terminal_status and self.status == OPEN:
            # A completed run still missing events is stored as `INCOMPLETE` (`recorded_status`).
            self.status, self.ended_at, self.terminal_seq = entry.terminal_status, ts, seq
            self._add_step(seq, entry.kind, rendered, ts)  # stored even past the step cap
            return
        if self._room(limits):
            self._add_step(seq, entry.kind, rendered, ts)

    # -- steps -------------------------------------------------------------------------------

    def _room(self, limits: Limits) -> bool:
        """Whether one more step may be stored; if not, the run is truncated and the step counted dropped."""
        if self.step_count < limits.max_steps_per_run:
            return True
        self.truncated = True
        self.dropped_steps += 1
        return False

    def _add_step(self, seq: int, kind: str, payload: str, ts: int) -> None:
        self.steps[seq] = NewStep(kind, payload, ts)
        self.step_count += 1

    def _new_segment(self, seq: int, ts: int, lane: Lane, text: str, limits: Limits) -> Segment | None:
        if not self._room(limits):
            return None
        segment = Segment(seq, lane, text, ts)
        self.segments[seq] = segment
        self.step_count += 1
        return segment

    def _cap(self, segment: Segment, limits: Limits) -> None:
        """Close `segment` once it holds `max_text_chars`: the text goes on in a new step."""
        if len(segment.text) >= limits.max_text_chars:
            segment.truncated = True
            if self.open is segment:
                self.open = None

    @property
    def recorded_status(self) -> str:
        """The status stored: `INCOMPLETE` for a completed run with seqs still missing."""
        if self.status in {COMPLETED, INCOMPLETE}:
            return INCOMPLETE if self.gaps else COMPLETED
        return self.status

    # -- gaps --------------------------------------------------------------------------------

    def _add_gap(self, first: int, last: int) -> None:
        self.gaps.append((first, last))
        del self.gaps[:-MAX_GAPS]
        self.gaps_changed = True

    def _fill_gap(self, seq: int) -> bool:
        """Whether `seq` was in a gap (it is then no longer)."""
        for i, (first, last) in enumerate(self.gaps):
            if first <= seq <= last:
                self.gaps[i : i + 1] = [(a, b) for a, b in ((first, seq - 1), (seq + 1, last)) if a <= b]
                self.gaps_changed = True
                return True
        return False
