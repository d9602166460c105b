"""Why a tool worker ended, and what each call it was running is told.

Every call in flight on a worker that ends gets an `Error: ...` text that names its own tool and
what happened: the model (and whoever reads the run) learns that the call was not completed,
never a silent hang. The call that caused the end (a deadline) is told so.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

_MIB = 1024 * 1024


class Stop:
    """Why a worker ended."""

    def what(self) -> str:
        """A few words for the log."""
        raise NotImplementedError

    def text(self, tool: str, call_id: int, in_flight: int) -> str:
        """What call `call_id` of `tool` answers (one of `in_flight` calls on the worker)."""
        return f"Error: the tool worker running {tool} {self.what()}; the call was not completed"


@dataclass(frozen=True, slots=True)
class Deadline(Stop):
    """A call did not finish by its hard deadline: the worker was wedged, and killed."""

    tool: str
    timeout: float
    call_id: int

    def what(self) -> str:
        """A few words for the log."""
        return f"was stopped ({self.tool} did not finish within {self.timeout:g}s)"

    def text(self, tool: str, call_id: int, in_flight: int) -> str:
        """The culprit is told its timeout; the others that the worker was stopped because of it."""
        if call_id == self.call_id:
            return f"Error: {tool} did not finish within {self.timeout:g}s; its worker was stopped"
        return super().text(tool, call_id, in_flight)


@dataclass(frozen=True, slots=True)
class OverMemory(Stop):
    """The worker went over its memory limit and was killed (by its cgroup or by the watchdog)."""

    limit_bytes: int

    def what(self) -> str:
        """A few words for the log."""
        return f"used more than {_mib(self.limit_bytes)} MiB and was stopped"

    def text(self, tool: str, call_id: int, in_flight: int) -> str:
        """Alone on the worker, the call is the one that used the memory."""
        if in_flight == 1:
            return f"Error: {tool} used more than {_mib(self.limit_bytes)} MiB; its worker was stopped"
        return super().text(tool, call_id, in_flight)


@dataclass(frozen=True, slots=True)
class Crashed(Stop):
    """The worker's process ended by itself: a signal (SIGSEGV, a kill from outside) or an exit."""

    returncode: int

    def what(self) -> str:
        """A few words for the log."""
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = str(-self.returncode)
            return f"crashed (signal {name})"
        return f"exited unexpectedly (exit status {self.returncode})"


@dataclass(frozen=True, slots=True)
class Protocol(Stop):
    """The worker sent something that is not a valid answer (too large, malformed) and was killed."""

    reason: str

    def what(self) -> str:
        """A few words for the log."""
        return f"was stopped (it answered with {self.reason})"


@dataclass(frozen=True, slots=True)
class Closing(Stop):
    """The sandbox is shutting down."""

    def what(self) -> str:
        """A few words for the log."""
        return "stopped (the sandbox is shutting down)"


@dataclass(frozen=True, slots=True)
class Retired(Stop):
    """The worker was replaced once its calls were done (a sync tool's thread was left running)."""

    def what(self) -> str:
        """A few words for the log."""
        return "stopped (it was recycled)"


def _mib(limit_bytes: int) -> str:
    return f"{limit_bytes / _MIB:g}"
