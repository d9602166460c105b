"""A conversation's shared record in `ATMO_CONVERSATIONS`, and how one replica decides what it becomes.

`ConversationTracker` (`conversations.py`) does the I/O: it reads and compare-and-sets the
records and announces. What a record becomes given this replica's news is decided here, with
no I/O at all: `RecordRules` is handed the record read and answers the outcome and the record
to write, so that a compare-and-set retried on a newer record simply decides again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from atmosphere.contracts.common.v1.common_pb2 import Principal

Key = tuple[str, str]
"""(agent, conversation id)."""

Outcome = Literal["idle", "disconnect", "ended", "recorded", "unrecorded", "wait"]


def record_key(agent: str, conversation_id: str) -> str:
    """The conversation's key in the bucket (ids hold characters a KV key may not)."""
    return hashlib.sha256(f"{agent}\0{conversation_id}".encode()).hexdigest()[:32]


def ms(seconds: float) -> int:
    """Epoch seconds as the records hold them: whole milliseconds."""
    return int(seconds * 1000)


@dataclass(frozen=True, slots=True)
class Record:
    """One conversation as every replica sees it (stored as a `Struct`)."""

    agent: str
    conversation_id: str
    principal: Principal
    owner: str
    """The replica that saw the newest activity: it ends the conversation when it goes idle."""
    seen_ms: int
    """That activity (a prompt, a socket, a holder's refresh), epoch ms."""
    holders: dict[str, int] = field(default_factory=dict)
    """Replica → when it last said it holds a WebSocket of the conversation (epoch ms)."""
    closed_ms: int = 0
    """When the stretch was announced (0: open). Activity up to then is covered."""

    def to_struct(self) -> Struct:
        value = Struct()
        value.update(
            {
                "agent": self.agent,
                "conversation_id": self.conversation_id,
                "principal": json_format.MessageToDict(self.principal, preserving_proto_field_name=True),
                "owner": self.owner,
                "seen_ms": self.seen_ms,
                "holders": dict(self.holders),
                "closed_ms": self.closed_ms,
            }
        )
        return value

    @classmethod
    def of(cls, value: Struct | None) -> Record | None:
        """The record stored, or None when there is none or it cannot be read (then overwritten)."""
        if value is None:
            return None
        try:
            fields = json_format.MessageToDict(value)
            principal = json_format.ParseDict(fields["principal"], Principal(), ignore_unknown_fields=True)
            return cls(
                agent=str(fields["agent"]),
                conversation_id=str(fields["conversation_id"]),
                principal=principal,
                owner=str(fields["owner"]),
                seen_ms=int(fields["seen_ms"]),
                holders={str(k): int(v) for k, v in dict(fields["holders"]).items()},
                closed_ms=int(fields["closed_ms"]),
            )
        except (KeyError, TypeError, ValueError, json_format.ParseError):
            return None


@dataclass(eq=False)
class Conversation:
    """What this replica knows of one conversation it saw."""

    key: Key
    principal: Principal
    last_active: float
    """The last prompt here, or socket opened here (seconds of the tracker's clock)."""
    version: int = 0
    """Counts local events: a record decision made before the newest event is not final."""
    sockets: int = 0
    left: int = 0
    """The version at which the last socket here left, until the record took it (0: none)."""
    recorded: float = 0.0
    """The newest local activity the record already covers (0: this stretch is not in it)."""
    attempted: float | None = None
    """When this replica last wrote (or tried to write) the record, for the debounce."""
    refreshed: float = 0.0
    """When the record last took this replica's socket mark (0: not marked)."""
    due: float = 0.0
    """When the sweep next reads the record: the earliest this stretch can end."""
    reopens: bool = False
    """This replica announced the stretch before this activity: a tombstone found is older."""


@dataclass(frozen=True, slots=True)
class RecordRules:
    """What one replica (`instance`) makes of a conversation's record: its write, its check, its eviction."""

    instance: str
    idle_timeout: float
    grace: float
    """How much older than `idle_timeout` a record must be before a replica that is not its owner ends it."""
    refresh: float
    """How often a replica holding a socket rewrites its mark."""

    def written(
        self, entry: Conversation, record: Record | None, now: float, active: float, *, leaving: bool, holding: bool
    ) -> tuple[Outcome, Record | None]:
        """What the record becomes with this replica's news (`ended`: someone announced it already)."""
        me, now_ms, active_ms = self.instance, ms(now), ms(active)
        current = record if record is not None and not record.closed_ms else None
        if leaving and not self._other_holders(current, now_ms):
            seen = max(current.seen_ms if current else 0, active_ms)
            closed = self._tombstone(entry, current, seen, now_ms)
            return "disconnect", closed
        # In a tie the stretch stays open: one announcement too many beats one lost.
        covered = record is not None and active_ms < record.closed_ms and not entry.reopens
        if covered and not holding:
            return "ended", record  # announced (by any replica) after everything seen here
        holders = self._live_holders(current, now_ms)
        holders.pop(me, None)
        if holding:
            holders[me] = now_ms
        seen = max(current.seen_ms if current else 0, active_ms, now_ms if holding else 0)
        owner = me if current is None or seen > current.seen_ms else current.owner
        new = Record(entry.key[0], entry.key[1], entry.principal, owner, seen, holders)
        if current is not None and (current.owner, current.seen_ms, current.holders) == (owner, seen, holders):
            return "wait", current  # the record already says all this
        return "recorded", new

    def checked(
        self, entry: Conversation, record: Record | None, now: float, active: float
    ) -> tuple[Outcome, Record | None]:
        """Whether the stretch is over and this replica ends it (`idle`, with the tombstone)."""
        now_ms, active_ms = ms(now), ms(active)
        if record is None or record.closed_ms:
            return self._checked_closed(entry, record, now, active)
        # A socket held anywhere keeps `seen_ms` fresh (its holder refreshes it): no idle while it lives.
        if active_ms > record.seen_ms:
            return "unrecorded", None  # a prompt here the record does not have yet
        age = now_ms - record.seen_ms
        ends_it = record.owner == self.instance or age >= ms(self.idle_timeout + self.grace)
        if age >= ms(self.idle_timeout) and ends_it:
            return "idle", self._tombstone(entry, record, record.seen_ms, now_ms)
        return "wait", record

    def _checked_closed(
        self, entry: Conversation, record: Record | None, now: float, active: float
    ) -> tuple[Outcome, Record | None]:
        """`checked` when the record is a tombstone, or missing."""
        if record is not None:
            newer = ms(active) >= record.closed_ms or entry.reopens
            return ("unrecorded", None) if newer else ("ended", record)
        # Never recorded (the bucket was away) or expired: this replica's own view decides.
        if now - active >= self.idle_timeout:
            return "idle", self._tombstone(entry, None, ms(active), ms(now))
        return "unrecorded", None

    def let_go(self, entry: Conversation, record: Record | None, now: float) -> Record | None:
        """The tombstone of an evicted conversation when this replica is the one that would have ended it."""
        active_ms, now_ms = ms(entry.last_active), ms(now)
        if record is not None and record.closed_ms:
            ends_it = active_ms >= record.closed_ms
        elif record is not None:
            owns = record.owner == self.instance or active_ms > record.seen_ms
            ends_it = owns and not self._other_holders(record, now_ms)
        else:
            ends_it = True
        return self._tombstone(entry, record, active_ms, now_ms) if ends_it else None

    def _live_holders(self, record: Record | None, now_ms: int) -> dict[str, int]:
        """The replicas whose socket mark is recent enough to believe (a dead one stops refreshing)."""
        if record is None:
            return {}
        window = ms(self.refresh + self.grace)
        return {who: at for who, at in record.holders.items() if now_ms - at < window}

    def _other_holders(self, record: Record | None, now_ms: int) -> bool:
        """Whether another replica still holds a WebSocket of the conversation."""
        return any(who != self.instance for who in self._live_holders(record, now_ms))

    def _tombstone(self, entry: Conversation, record: Record | None, seen_ms: int, now_ms: int) -> Record:
        """The record of a stretch this replica announces."""
        principal = record.principal if record is not None else entry.principal
        return Record(entry.key[0], entry.key[1], principal, self.instance, seen_ms, {}, closed_ms=now_ms)

    def due(self, record: Record) -> float:
        """When the stretch can end at the earliest: this replica ends it later if it is not the owner."""
        late = 0.0 if record.owner == self.instance else self.grace
        return record.seen_ms / 1000 + self.idle_timeout + late
