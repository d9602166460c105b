"""The traffic policies: a sliding-window rate limit, a concurrency limit, and a time window.

Each takes its clock as an argument (monotonic seconds, or an aware datetime) so tests drive
time. The subject they count is `PolicyContext.subject` (`user:<id>` → `session:<id>` →
`anonymous`). The counting ones also `observe` a request another governance replica admitted,
so that N replicas count one set of requests (`atmosphere.governance.replication`).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from datetime import time as clock_time
from typing import Final
from zoneinfo import ZoneInfo

from atmosphere.governance.policies.model import (
    ADMIT,
    BasePolicy,
    Decision,
    Deny,
    Phase,
    PolicyContext,
    PolicyIdentity,
    java_list,
)

DAY_NAMES: Final = ("MONDAY", "TUESDAY", "WEDNESDAY", "THURSDAY", "FRIDAY", "SATURDAY", "SUNDAY")
"""Java's `DayOfWeek` names, in `datetime.weekday()` order (the deny text quotes them)."""
WEEKDAYS: Final = frozenset(range(5))
TOOL_CALL_ACTION: Final = "call_tool"
"""The `action` metadata of a tool call's synthetic request (`PolicyContext.for_tool_call`)."""


class RateLimitPolicy(BasePolicy):
    """At most `limit` admitted requests per subject in any `window_seconds` (pre-admission only).

    A denied request is not counted. Subjects whose window empties are forgotten, so memory is
    O(active subjects x limit).
    """

    def __init__(
        self,
        identity: PolicyIdentity,
        limit: int,
        window_seconds: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit <= 0:
            raise ValueError("rate-limit requires a positive 'limit' under config")
        if window_seconds <= 0:
            raise ValueError("rate-limit requires a positive 'window-seconds' under config")
        super().__init__(identity)
        self.limit = limit
        self.window_seconds = window_seconds
        self._clock = clock
        self._hits: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase is Phase.POST_RESPONSE:
            return ADMIT
        subject = context.subject
        now = self._clock()
        with self._lock:
            hits = self._hits.setdefault(subject, deque())
            while hits and hits[0] < now - self.window_seconds:
                hits.popleft()
            if len(hits) >= self.limit:
                return Deny(f"rate-limited: {subject} exceeded {self.limit} requests per {self.window_seconds}s")
            hits.append(now)
            self._forget_idle(now)
        return ADMIT

    def observe(self, context: PolicyContext, *, age: float = 0.0) -> None:
        """Count a request that another replica admitted `age` seconds ago (by this policy's clock).

        Counted even past the limit (it was admitted: it counts against what comes next), never
        when it is already out of the window.
        """
        if context.phase is Phase.POST_RESPONSE or age >= self.window_seconds:
            return
        at = self._clock() - max(age, 0.0)
        with self._lock:
            # In time order: `evaluate` drops expired hits from the left.
            bisect.insort(self._hits.setdefault(context.subject, deque()), at)

    def hits(self, subject: str) -> int:
        """Requests of `subject` counted in the window now."""
        cutoff = self._clock() - self.window_seconds
        with self._lock:
            return sum(1 for hit in self._hits.get(subject, ()) if hit >= cutoff)

    def _forget_idle(self, now: float) -> None:
        # Amortised: only when the table has grown, drop subjects with nothing in the window.
        if len(self._hits) > 1024 and len(self._hits) & 1023 == 0:
            cutoff = now - self.window_seconds
            for key in [k for k, hits in self._hits.items() if not hits or hits[-1] < cutoff]:
                del self._hits[key]


class ConcurrencyLimitPolicy(BasePolicy):
    """At most `max_concurrent` in-flight requests per subject.

    A pre-admission admit takes a slot; the slot comes back on `release` (once per admitted
    request; never below zero). Unlike Atmosphere, a post-response evaluation does not release:
    here an answer is checked every 200 characters while it streams, so the run's end (governance's
    `run_ended`) is the one place a slot is given back. A tool call (`action` `call_tool`) runs
    inside a run that holds its slot already: it neither takes one nor is refused for want of one.
    """

    def __init__(self, identity: PolicyIdentity, max_concurrent: int) -> None:
        if max_concurrent <= 0:
            raise ValueError("concurrency-limit requires a positive 'max-concurrent' under config")
        super().__init__(identity)
        self.max_concurrent = max_concurrent
        self._in_flight: dict[str, int] = {}
        self._lock = threading.Lock()

    def in_flight(self, subject: str) -> int:
        """Slots the subject holds now."""
        with self._lock:
            return self._in_flight.get(subject, 0)

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase is Phase.POST_RESPONSE or context.metadata.get("action") == TOOL_CALL_ACTION:
            return ADMIT
        subject = context.subject
        with self._lock:
            held = self._in_flight.get(subject, 0)
            if held >= self.max_concurrent:
                return Deny(f"concurrency limit: {subject} already has {held} in-flight (max {self.max_concurrent})")
            self._in_flight[subject] = held + 1
        return ADMIT

    def observe(self, context: PolicyContext) -> None:
        """Take the slot of a run another replica admitted (even past the limit: the run is in flight)."""
        subject = context.subject
        with self._lock:
            self._in_flight[subject] = self._in_flight.get(subject, 0) + 1

    def release(self, context: PolicyContext) -> None:
        """Give back the subject's slot."""
        subject = context.subject
        with self._lock:
            held = self._in_flight.get(subject, 0)
            if held <= 1:
                self._in_flight.pop(subject, None)
            else:
                self._in_flight[subject] = held - 1


def parse_days(names: Iterable[str]) -> frozenset[int]:
    """Day names (`monday`, `MON` is not accepted: full names, any case) as `weekday()` numbers."""
    days = set()
    for name in names:
        upper = name.strip().upper()
        if upper not in DAY_NAMES:
            raise ValueError(f"unknown day-of-week: {name}")
        days.add(DAY_NAMES.index(upper))
    if not days:
        raise ValueError("time-window 'days' must be non-empty")
    return frozenset(days)


class TimeWindowPolicy(BasePolicy):
    """Admit only on the given days between `start` (inclusive) and `end` (exclusive), in `zone`.

    A window whose end is before its start wraps around midnight (22:00-06:00). Post-response
    always admits: time of day gates admission, not answers.
    """

    def __init__(
        self,
        identity: PolicyIdentity,
        start: clock_time,
        end: clock_time,
        zone: str = "UTC",
        days: frozenset[int] = WEEKDAYS,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if start == end:
            raise ValueError("start and end must differ")
        if not days:
            raise ValueError("time-window 'days' must be non-empty")
        super().__init__(identity)
        self.start, self.end, self.days = start, end, days
        self.zone_name = zone
        self._zone = ZoneInfo(zone)
        self._now = now

    def inside(self, moment: datetime) -> bool:
        """Whether `moment` (aware) falls in the window, judged in the policy's zone."""
        local = moment.astimezone(self._zone)
        if local.weekday() not in self.days:
            return False
        t = local.time().replace(tzinfo=None)
        if self.start < self.end:
            return self.start <= t < self.end
        return t >= self.start or t < self.end

    def evaluate(self, context: PolicyContext) -> Decision:
        if context.phase is Phase.POST_RESPONSE or self.inside(self._now()):
            return ADMIT
        days = java_list(DAY_NAMES[d] for d in sorted(self.days))
        return Deny(
            f"outside allowed window {_java_time(self.start)}-{_java_time(self.end)} ({self.zone_name}) on {days}"
        )


def _java_time(value: clock_time) -> str:
    """A time as Java's `LocalTime.toString` prints it: `09:00`, or `09:00:30` with seconds."""
    return value.strftime("%H:%M:%S" if value.second else "%H:%M")


def parse_clock_time(text: str) -> clock_time:
    """`HH:MM` or `HH:MM:SS` as a time (a `ValueError` otherwise)."""
    try:
        parsed = clock_time.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"expected a time of day like 09:00, got {text!r}") from None
    if parsed.tzinfo is not None:
        raise ValueError(f"a time of day carries no zone (use 'zone'), got {text!r}")
    return parsed
