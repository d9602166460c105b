"""The policy SPI: what a policy sees (`PolicyContext`), what it answers (`Decision`), who it is.

Atmosphere's `GovernancePolicy` / `PolicyContext` / `PolicyDecision`, as plain frozen values. A
policy is anything with an `identity`, a synchronous `evaluate` and a `release` hook; most
built-ins derive from `BasePolicy`, which supplies the no-op `release`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

PREVIEW_CHARS: Final = 200
"""Characters of the tool arguments kept in `tool_args_preview` (then an ellipsis)."""
DEFAULT_TENANT: Final = "__default__"
"""The tenant bucket of a request without a `tenant` metadata entry."""
TENANT_METADATA_KEY: Final = "tenant"
PARTIAL_METADATA_KEY: Final = "partial"
"""Set (true) on a post-response context that holds only the part of an answer streamed so far."""
RESPONSE_CHARS_METADATA_KEY: Final = "response_chars"
"""The whole answer's length, when `response` holds only its tail (a long answer's check window)."""


class PolicyFileError(ValueError):
    """A policy document that cannot be installed; the message names the source and the line."""


class Phase(enum.StrEnum):
    """When a policy runs: before the model is called, or on (part of) its answer."""

    PRE_ADMISSION = "pre_admission"
    POST_RESPONSE = "post_response"


@dataclass(frozen=True)
class PolicyContext:
    """The request a policy judges, and in the post-response phase the answer so far."""

    phase: Phase
    message: str = ""
    system_prompt: str = ""
    model: str = ""
    user_id: str = ""
    session_id: str = ""
    agent_id: str = ""
    conversation_id: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    response: str = ""

    @classmethod
    def for_tool_call(
        cls,
        *,
        tool: str,
        arguments: dict[str, Any],
        user_id: str = "",
        agent_id: str = "",
        conversation_id: str = "",
        session_id: str = "",
        roles: Iterable[str] = (),
    ) -> PolicyContext:
        """The synthetic pre-admission request of a tool call (Atmosphere's `admitToolCall`).

        The message is `call_tool:<tool>`; metadata carries `tool_name`, `action` ("call_tool"),
        `tool_args_preview` (the arguments' repr, cut at 200 characters + "…"), the full
        `tool_args`, and `roles` when any are given.
        """
        metadata: dict[str, Any] = {
            "tool_name": tool,
            "action": "call_tool",
            "tool_args_preview": preview(repr(arguments)),
            "tool_args": dict(arguments),
        }
        held = list(roles)
        if held:
            metadata["roles"] = held
        return cls(
            phase=Phase.PRE_ADMISSION,
            message=f"call_tool:{tool}",
            user_id=user_id,
            session_id=session_id,
            agent_id=agent_id,
            conversation_id=conversation_id,
            metadata=metadata,
        )

    def with_message(self, message: str) -> PolicyContext:
        """This context with the request message replaced (what a rewriting policy returns)."""
        return dataclasses.replace(self, message=message)

    @property
    def tenant(self) -> str:
        """The tenant the request is accounted to: metadata `tenant`, else `__default__`."""
        raw = self.metadata.get(TENANT_METADATA_KEY)
        text = str(raw).strip() if raw is not None else ""
        return text or DEFAULT_TENANT

    @property
    def response_length(self) -> int:
        """The answer's length in characters: the whole answer's, even when `response` is only its tail."""
        declared = self.metadata.get(RESPONSE_CHARS_METADATA_KEY)
        if isinstance(declared, int) and not isinstance(declared, bool) and declared >= len(self.response):
            return declared
        return len(self.response)

    @property
    def subject(self) -> str:
        """Who a rate or concurrency limit counts: `user:<id>`, else `session:<id>`, else `anonymous`."""
        if self.user_id.strip():
            return f"user:{self.user_id}"
        if self.session_id.strip():
            return f"session:{self.session_id}"
        return "anonymous"


def preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """`text` cut at `limit` characters, with "…" when something was cut."""
    return text if len(text) <= limit else text[:limit] + "…"


def java_list(items: Iterable[object]) -> str:
    """Items rendered as Java prints a collection (`[a, b]`), which the deny texts quote."""
    return "[" + ", ".join(str(item) for item in items) + "]"


@dataclass(frozen=True)
class PolicyIdentity:
    """Who decided: the audit trail's name, source (`yaml:<path>`, `code:<qualname>`), version, digest."""

    name: str
    source: str
    version: str
    digest: str
    """`sha256:<hex>` of `name|source|version` and the policy's definition (YAML text or qualname)."""

    @classmethod
    def of(cls, name: str, source: str, version: str, definition: str) -> PolicyIdentity:
        """An identity whose digest binds `definition` to the name, source and version."""
        for label, value in (("name", name), ("source", source), ("version", version)):
            if not value.strip():
                raise ValueError(f"policy {label} must not be blank")
        material = f"{name}|{source}|{version}\n{definition}".encode()
        return cls(name, source, version, "sha256:" + hashlib.sha256(material).hexdigest())

    @classmethod
    def for_code(cls, name: str, kind: type, version: str = "1") -> PolicyIdentity:
        """The identity of a policy built in Python: source `code:<module.qualname>`."""
        qualname = f"{kind.__module__}.{kind.__qualname__}"
        return cls.of(name, f"code:{qualname}", version, qualname)


@dataclass(frozen=True)
class Admit:
    """Let the request through unchanged."""


@dataclass(frozen=True)
class Transform:
    """Let the request through rewritten; the next policy sees `context`."""

    context: PolicyContext


@dataclass(frozen=True)
class Deny:
    """Refuse the request; `reason` is shown to the caller and logged."""

    reason: str


@dataclass(frozen=True)
class Prefer:
    """Advice: admit unchanged, but record that `preferred` would be better, and why."""

    preferred: str
    reason: str


Decision = Admit | Transform | Deny | Prefer
ADMIT: Final = Admit()


@runtime_checkable
class Policy(Protocol):
    """A governance policy: decides on a context, synchronously. Raising means deny (fail-closed)."""

    identity: PolicyIdentity

    def evaluate(self, context: PolicyContext) -> Decision:
        """The decision on `context`."""
        ...

    def release(self, context: PolicyContext) -> None:
        """Give back what an admitted request held (a concurrency slot); most policies hold nothing."""
        ...


class BasePolicy:
    """A policy with an identity and nothing to release; subclasses write `evaluate`."""

    identity: PolicyIdentity

    def __init__(self, identity: PolicyIdentity) -> None:
        self.identity = identity

    def evaluate(self, context: PolicyContext) -> Decision:
        """The decision on `context` (subclasses override)."""
        raise NotImplementedError

    def release(self, context: PolicyContext) -> None:
        """Nothing to give back."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.identity.name!r}, source={self.identity.source!r})"
