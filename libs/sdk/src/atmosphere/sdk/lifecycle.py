"""Model-lifecycle hooks: your own observers of every model call (the seed's `AgentLifecycleListener`).

Give `App(listeners=[...])` objects deriving from `AgentLifecycleListener` and override what
you need; the built-in runtime calls them around each model call it makes (a round replayed
from a durable run's journal is no call, and fires nothing):

| hook | called when |
|------|-------------|
| `on_model_start(call)` | a model request is about to be sent |
| `on_model_end(call, usage, duration_ms)` | its streamed answer was fully read |
| `on_model_error(call, error)` | the provider failed it for good (retries spent) |

Hooks are plain functions, called on the run's event loop: keep them quick (hand slow work to a
task or a queue). One that raises is logged and skipped; the run and the other listeners go on.
Framework runtimes have their own observability surfaces and do not call these hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from atmosphere.sdk._session import TokenUsage

__all__ = ["AgentLifecycleListener", "ModelCall", "notify_model_end", "notify_model_error", "notify_model_start"]

log = logging.getLogger("atmosphere.sdk.lifecycle")


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call: whose, to which model, with how much."""

    run_id: str
    agent: str
    model: str
    """The model asked for (the response may name another: `TokenUsage.model`)."""
    provider: str
    """The runtime that calls it (`built-in`)."""
    message_count: int
    tool_count: int


class AgentLifecycleListener:
    """An observer of model calls; each hook does nothing unless overridden."""

    def on_model_start(self, call: ModelCall) -> None:
        """`call` is about to be sent."""

    def on_model_end(self, call: ModelCall, usage: TokenUsage | None, duration_ms: float) -> None:
        """`call`'s answer was fully read in `duration_ms`; `usage` as the provider reported it (None: not)."""

    def on_model_error(self, call: ModelCall, error: BaseException) -> None:
        """`call` failed for good with `error`."""


def notify_model_start(listeners: Iterable[AgentLifecycleListener], call: ModelCall) -> None:
    """Call every listener's `on_model_start`; one that raises is logged and skipped."""
    for listener in listeners:
        try:
            listener.on_model_start(call)
        except Exception:
            log.exception("lifecycle listener %s failed in on_model_start", type(listener).__name__)


def notify_model_end(
    listeners: Iterable[AgentLifecycleListener], call: ModelCall, usage: TokenUsage | None, duration_ms: float
) -> None:
    """Call every listener's `on_model_end`; one that raises is logged and skipped."""
    for listener in listeners:
        try:
            listener.on_model_end(call, usage, duration_ms)
        except Exception:
            log.exception("lifecycle listener %s failed in on_model_end", type(listener).__name__)


def notify_model_error(listeners: Iterable[AgentLifecycleListener], call: ModelCall, error: BaseException) -> None:
    """Call every listener's `on_model_error`; one that raises is logged and skipped."""
    for listener in listeners:
        try:
            listener.on_model_error(call, error)
        except Exception:
            log.exception("lifecycle listener %s failed in on_model_error", type(listener).__name__)
