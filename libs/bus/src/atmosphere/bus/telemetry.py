"""What travels with a request besides its payload: the run it serves and its trace.

A run's calls to other services (governance's checks, memory's reads, a sandbox's tool call)
are requests; each carries the run's id and agent (`atmo-run`, `atmo-agent` headers) and, when
tracing is on, the W3C `traceparent` of the span that made it. The service that answers binds
both around its handler, so its log lines name the run and its spans join the run's trace.

Only requests carry them, never a run's events: the per-token path sends no header block it
did not send before. The bus itself knows nothing of OpenTelemetry or Prometheus — a service
installs a `BusTracer` and a `BusObserver` (`atmosphere.service.telemetry`); with none
installed, the cost is one context-variable read per request.
"""

from __future__ import annotations

import contextlib
import functools
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "BusObserver",
    "BusTracer",
    "RunTag",
    "bind_run",
    "current_run",
    "install_observer",
    "install_tracer",
    "observer",
    "subject_family",
    "tracer",
]


@dataclass(frozen=True, slots=True)
class RunTag:
    """The run a piece of work belongs to, as logs and requests name it."""

    run_id: str
    agent: str = ""


_current_run: ContextVar[RunTag | None] = ContextVar("atmosphere_run", default=None)


def current_run() -> RunTag | None:
    """The run the current task works for, if any."""
    return _current_run.get()


class bind_run:  # noqa: N801 - used as a function: `with bind_run(run_id, agent):`
    """Name `run_id` (of `agent`) as the current task's run while the block runs.

    An empty `run_id` leaves the current binding as it is. A class rather than a generator:
    every request a service handles enters one, and this costs a fraction of that.
    """

    __slots__ = ("_tag", "_token")

    def __init__(self, run_id: str, agent: str = "") -> None:
        """Bind `run_id` of `agent` on entering (nothing when `run_id` is empty)."""
        self._tag = RunTag(run_id, agent) if run_id else None
        self._token: Token[RunTag | None] | None = None

    def __enter__(self) -> RunTag | None:
        if self._tag is None:
            return _current_run.get()
        self._token = _current_run.set(self._tag)
        return self._tag

    def __exit__(self, *_: object) -> None:
        if self._token is not None:
            _current_run.reset(self._token)
            self._token = None


class BusTracer(Protocol):
    """Spans around the bus's requests and handlers (OpenTelemetry's, when tracing is on)."""

    def traceparent(self) -> str:
        """The current span's W3C `traceparent`, or "" when there is none."""
        ...

    def client_span(self, subject: str) -> contextlib.AbstractContextManager[None]:
        """A span around one request sent on `subject` (its reply included)."""
        ...

    def server_span(self, subject: str, traceparent: str) -> contextlib.AbstractContextManager[None]:
        """A span around handling one request on `subject`, continuing `traceparent`."""
        ...


class BusObserver(Protocol):
    """Counts the bus's requests (Prometheus's, in a service)."""

    def request_done(self, family: str, seconds: float, error: str) -> None:
        """One request of `family` took `seconds`; `error` is its error code, "" on success."""
        ...


_tracer: BusTracer | None = None
_observer: BusObserver | None = None


def install_tracer(value: BusTracer | None) -> None:
    """Use `value` for the bus's spans (None: no spans, no `traceparent` sent)."""
    global _tracer  # noqa: PLW0603 - one tracer per process, set at start-up
    _tracer = value


def tracer() -> BusTracer | None:
    """The installed tracer, if any."""
    return _tracer


def install_observer(value: BusObserver | None) -> None:
    """Report every request to `value` (None: nothing is counted)."""
    global _observer  # noqa: PLW0603 - one observer per process, set at start-up
    _observer = value


def observer() -> BusObserver | None:
    """The installed observer, if any."""
    return _observer


_FAMILY_TOKENS = {
    # The subject's first token after `atmo` → which of its tokens name the family; the others
    # are ids or names of the deployment (a run, a tool, a sandbox instance, a service).
    "run": (0, -1),  # run.<run_id>.ctl → run.ctl
    "sandbox": (0, 2),  # sandbox.<instance>.tool.<tool> → sandbox.tool
    "svc": (0, -1),  # svc.<service>.health → svc.health
    "tool": (0,),  # tool.<tool> → tool
    "submit": (0,),
    "journal": (0,),
}


@functools.lru_cache(maxsize=1024)  # the fixed subjects of services' requests, computed once each
def subject_family(subject: str) -> str:
    """`subject` without its ids and names: a label of bounded cardinality.

    `atmo.gov.check` → `gov.check`, `atmo.mem.tool.read_file` → `mem.tool`, `atmo.tool.weather`
    → `tool`, `atmo.run.<id>.ctl` → `run.ctl`, `atmo.sandbox.<instance>.tool.<t>` → `sandbox.tool`.
    A namespace prefix (`team.dev.atmo…`) is not part of the family.
    """
    tokens = subject.split(".")
    if "atmo" not in tokens[:-1]:
        return "other"
    tokens = tokens[tokens.index("atmo") + 1 :]
    picked = _FAMILY_TOKENS.get(tokens[0])
    if picked is None:
        # gov.<op>, gov.admin.<op>, mem.<op>, mem.tool.<tool>, tape.<op>: operations the code names.
        picked = (0, 1) if len(tokens) > 1 and tokens[1] == "tool" else (0, 1, 2)
    count = len(tokens)
    at = dict.fromkeys(i % count for i in picked if -count <= i < count)  # in order, each token once
    return ".".join(tokens[i] for i in at)


_ERROR_NAMES = {
    # The bus's own failures, by what an operator would alert on.
    "RequestTimeoutError": "timeout",
    "NoRespondersError": "no_responders",
    "PayloadTooLargeError": "too_large",
    "DecodeError": "decode",
    "ConnectionLostError": "connection_lost",
}


def error_label(exc: BaseException) -> str:
    """A bounded label for a failed request: the remote error's code, or the bus failure's kind."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code:
        return code
    return _ERROR_NAMES.get(type(exc).__name__, "bus_error")
