"""`Harness`: which deep-agent features complete an agent, and the app-wide switches over them.

Resolution follows Atmosphere's precedence, strongest first:

1. the kill switch (`atmosphere.ai.harness.enabled` set to anything but a literal `true`) → none;
2. an excluded path (`atmosphere.ai.harness.exclude-paths`) → none;
3. a non-empty `harness=` on the declaration (`@agent` and `@coordinator` default to `ALL`) → it;
4. app-wide `true` and a bare `@ai_endpoint` → everything (an empty `harness=[]` on an `@agent`
   or `@coordinator` is a deliberate opt-down and stays empty);
5. otherwise → none.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger("atmosphere.sdk")


class Harness(enum.StrEnum):
    """One harness feature, or `ALL` of them."""

    MEMORY = "memory"
    """Conversation memory, long-term memory (facts recalled across conversations), compaction."""
    CACHE = "cache"
    """A conservative prompt-cache hint for agents that did not choose one."""
    DELEGATION = "delegation"
    """On a coordinator: `delegate_task` (to a fleet member) and `task` (an ephemeral sub-agent)."""
    PLANNING = "planning"
    """The `write_todos` plan, persisted per conversation and streamed as `plan-update` events."""
    FILESYSTEM = "filesystem"
    """A bounded per-conversation file workspace and its eight file tools."""
    ALL = "all"
    """Every feature above."""

    @staticmethod
    def expand(values: Iterable[Harness] | None) -> frozenset[Harness]:
        """The concrete features named by `values` (`ALL` expands; never contains `ALL`)."""
        features: set[Harness] = set()
        for value in values or ():
            if value is Harness.ALL:
                features |= CONCRETE
            else:
                features.add(Harness(value))
        return frozenset(features)


CONCRETE = frozenset(h for h in Harness if h is not Harness.ALL)


class PromptCache(enum.StrEnum):
    """How eagerly a prompt prefix is marked for provider-side caching."""

    NONE = "none"
    CONSERVATIVE = "conservative"
    """One cache key per agent: the system prompt and tool prefix are shared by every conversation."""
    AGGRESSIVE = "aggressive"
    """One cache key per agent and conversation: the whole growing history is a cacheable prefix."""

    @staticmethod
    def parse(text: str | None) -> PromptCache | None:
        """`none`/`conservative`/`aggressive` (any case); None for blank; unknown values are refused."""
        if text is None or not text.strip():
            return None
        try:
            return PromptCache(text.strip().lower())
        except ValueError:
            msg = f"prompt-cache default must be none, conservative or aggressive, got {text!r}"
            raise ValueError(msg) from None


@dataclass(frozen=True, slots=True)
class HarnessSwitch:
    """The app-wide harness settings (`ATMOSPHERE_AI_HARNESS_*`)."""

    enabled: bool | None = None
    """Tri-state: None = unset (declarations decide), True = on, False = the kill switch."""
    exclude_paths: frozenset[str] = frozenset()

    @staticmethod
    def parse_enabled(text: str | None) -> bool | None:
        """Only a literal `true` (any case) is on; blank is unset; anything else is the kill switch."""
        if text is None or not text.strip():
            return None
        value = text.strip().lower()
        if value == "true":
            return True
        if value != "false":
            log.warning("harness enabled=%r is neither true nor false: treating it as the kill switch", text)
        return False

    @staticmethod
    def parse_paths(text: str | None) -> frozenset[str]:
        """Comma-separated exact endpoint paths; blanks dropped."""
        return frozenset(p.strip() for p in (text or "").split(",") if p.strip())

    def features_for(self, path: str | None, declared: Iterable[Harness] | None, *, kind: str) -> frozenset[Harness]:
        """The features an agent of `kind` at `path` declaring `declared` gets (see the module docstring)."""
        if self.enabled is False:
            return frozenset()
        if path is None or path in self.exclude_paths:
            return frozenset()
        features = Harness.expand(declared)
        if features:
            return features
        if self.enabled is True and kind == "ai_endpoint":
            return CONCRETE
        return frozenset()
