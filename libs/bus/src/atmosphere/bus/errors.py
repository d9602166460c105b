"""Typed errors of the bus, and the base class for services' own errors.

    BusError
     ├── ConnectError              the first connection to NATS did not succeed in time
     ├── RequestTimeoutError       no reply within the timeout (also a TimeoutError)
     ├── NoRespondersError         nobody subscribes to the subject
     ├── DecodeError               bytes that are not the expected protobuf (also a ValueError)
     ├── PayloadTooLargeError      payload + headers exceed the broker's `max_payload` (also a ValueError)
     ├── ConnectionLostError       the connection closed for good; the service must restart
     ├── NoStreamError             no JetStream stream captures the subject (a setup error: not retried)
     ├── StreamUnavailableError    the stream exists but has no leader right now (retried)
     └── RemoteError               the responder answered with an `Error`: `.error` is its class

    ServiceError                   the catalogue of wire codes (below): raised by a handler (the
     │                             router turns it into an `Error` reply) or ending a run
     ├── ServiceFailedError, UndecodableMessageError, ReplyTooLargeError, BadRequestError, NotFoundError
     └── RunError                  a run's terminal `error` event (dispatch, governance, budget,
                                   runtime, memory and the model provider's codes)

Handlers of JetStream work items may raise `Nak` (redeliver later) or `Term` (never redeliver);
the consumer runtime catches both, they never reach a caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from atmosphere.contracts.common.v1.common_pb2 import Error


class BusError(Exception):
    """Base class of every error raised by `atmosphere.bus`."""


class ConnectError(BusError):
    """The first connection to NATS did not succeed within the connect timeout."""


class RequestTimeoutError(BusError, TimeoutError):
    """No reply arrived within the request timeout."""

    def __init__(self, subject: str, timeout: float) -> None:
        self.subject = subject
        self.timeout = timeout
        super().__init__(f"no reply on {subject!r} within {timeout:g}s")


class NoRespondersError(BusError):
    """No service subscribes to the subject a request was sent to."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        super().__init__(f"no responders on {subject!r}")


class DecodeError(BusError, ValueError):
    """A payload could not be decoded as the expected protobuf message."""

    def __init__(self, expected: str, reason: str) -> None:
        self.expected = expected
        self.reason = reason
        super().__init__(f"cannot decode {expected}: {reason}")


class PayloadTooLargeError(BusError, ValueError):
    """A message would exceed the broker's `max_payload`, counted as the broker counts it.

    Raised before anything is sent: nats-server closes a connection that sends an oversized
    message (and nats-py then stays closed), so the check runs on this side, with the headers.
    """

    def __init__(self, subject: str, size: int, limit: int) -> None:
        self.subject = subject
        self.size = size
        self.limit = limit
        super().__init__(f"a message of {size} bytes on {subject!r} exceeds the broker's limit of {limit} bytes")


class ConnectionLostError(BusError):
    """The connection to NATS closed for good (not by us); only a new process can recover."""


class NoStreamError(BusError):
    """No JetStream stream captures the subject: the layout is not provisioned (never retried)."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        super().__init__(f"no stream captures {subject!r}")


class StreamUnavailableError(BusError):
    """The stream that captures the subject exists but did not answer: it has no leader right now.

    A cluster electing a stream's leader (its last one died or froze) answers nobody for a few
    seconds; unlike `NoStreamError` this is worth another try.
    """

    def __init__(self, subject: str) -> None:
        self.subject = subject
        super().__init__(f"the stream capturing {subject!r} did not answer (no leader right now)")


class WrongLastSequenceError(BusError):
    """A compare-and-set append lost: the subject's newest message is not the one expected.

    Another writer appended first (see `Headers.expected_last_subject_seq`).
    """

    def __init__(self, subject: str, expected: int) -> None:
        self.subject = subject
        self.expected = expected
        super().__init__(f"{subject!r} moved past sequence {expected}")


class RemoteError(BusError):
    """The responder answered with an `Error`; `error` is it as its catalogue class.

    Branch with `isinstance(exc.error, SomeServiceError)`, never on the code string.
    """

    def __init__(self, error: ServiceError) -> None:
        self.error = error
        super().__init__(f"{error.wire_code}: {error.message}")

    @property
    def code(self) -> str:
        """The wire code (for logs and metrics)."""
        return self.error.wire_code

    @property
    def message(self) -> str:
        """The responder's message."""
        return self.error.message

    @property
    def retryable(self) -> bool:
        """Whether the responder said the same request may succeed later."""
        return self.error.retryable

    @property
    def details(self) -> dict[str, str]:
        """The responder's machine-readable extras."""
        return self.error.details


# --- The error catalogue ---------------------------------------------------------------
#
# Every `Error.code` that crosses a process boundary is defined exactly once below, as a
# subclass of `ServiceError` with the code as a class attribute. Producers raise or emit the
# class (`GovernanceDeniedError(...).to_proto()`); consumers turn a received `Error` back into its
# class (`ServiceError.from_proto(error)`) and branch with `isinstance`. Codes that never leave
# one service live in that service's `errors.py`, subclassing `ServiceError` too, so the same
# registry knows them inside that process. An unregistered code comes back as
# `UnknownServiceError` with the code kept: an older reader never loses a newer writer's error.

_CATALOGUE: dict[str, type[ServiceError]] = {}


class ServiceError(Exception):
    """An error with a wire code: raised in-process, sent as an `Error`, read back as itself.

    A handler that raises one answers with a typed `Error` reply; a run that ends with one
    writes it as its terminal event. Subclasses set `code` (and `retryable`) as class
    attributes, e.g. `class UnknownAgentError(RunError): code = "dispatch.unknown_agent"`.
    """

    code: ClassVar[str] = "service.error"
    retryable: bool = False
    """Whether the same request may succeed if sent again (the proto's `retryable`)."""

    def __init__(
        self, message: str = "", *, details: Mapping[str, str] | None = None, retryable: bool | None = None
    ) -> None:
        """`message` is safe to show to a client; `details` are machine-readable extras."""
        self.message = message
        self.details = dict(details or {})
        if retryable is not None:
            self.retryable = retryable
        super().__init__(message)

    def __init_subclass__(cls, **kwargs: object) -> None:
        """Register every class that declares its own code.

        The first class of a code stays its class: a test's stand-in for another service's
        error (same code, defined in the test) does not replace the real one. That each code
        is defined once in the sources is checked by `tests/test_seams.py`.
        """
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            _CATALOGUE.setdefault(cls.code, cls)

    @property
    def wire_code(self) -> str:
        """The code this error goes out with (an unknown one keeps the code it came with)."""
        return self.code

    def to_proto(self) -> Error:
        """As the `Error` that goes on the wire."""
        return Error(code=self.wire_code, message=self.message, retryable=self.retryable, details=self.details)

    @staticmethod
    def from_proto(error: Error) -> ServiceError:
        """`error` as its catalogue class (`UnknownServiceError` when this process has none)."""
        cls = _CATALOGUE.get(error.code)
        if cls is None:
            return UnknownServiceError(error.code, error.message, retryable=error.retryable, details=error.details)
        return cls(error.message, details=error.details, retryable=error.retryable)


class UnknownServiceError(ServiceError):
    """An `Error` whose code this process has no class for; the code is kept as it arrived."""

    def __init__(
        self, wire_code: str, message: str = "", *, retryable: bool = False, details: Mapping[str, str] | None = None
    ) -> None:
        """Keep `wire_code` as it arrived."""
        super().__init__(message, details=details, retryable=retryable)
        self._wire_code = wire_code

    @property
    def wire_code(self) -> str:
        """The code as it arrived."""
        return self._wire_code


def plain_reason(exc: BusError) -> str:
    """What went wrong with the broker, in words a client may read (never a class name)."""
    reasons: tuple[tuple[type[BusError], str], ...] = (
        (RequestTimeoutError, "no answer in time"),
        (NoRespondersError, "nobody was there to answer"),
        (StreamUnavailableError, "a stream had no leader"),
        (NoStreamError, "a stream was missing"),
        (PayloadTooLargeError, "a message was too large"),
        (ConnectionLostError, "the connection was lost"),
        (DecodeError, "a message could not be read"),
        (RemoteError, "a service refused"),
    )
    return next((text for kind, text in reasons if isinstance(exc, kind)), "the broker did not answer")


def broker_failure(exc: BusError) -> BrokerUnavailableError:
    """The error a run ends with when the broker failed it: retryable, in plain words."""
    return BrokerUnavailableError(
        f"The message broker failed the run ({plain_reason(exc)}); resume it by its id, or send it again"
    )


def catalogue() -> Mapping[str, type[ServiceError]]:
    """Every code registered in this process, and its class (a copy)."""
    return dict(_CATALOGUE)


# The bus itself.


class ServiceFailedError(ServiceError):
    """A handler raised something it did not mean to; its text stays in the log."""

    code = "internal"
    retryable = True


class UndecodableMessageError(ServiceError):
    """A request or reply whose bytes are not the expected protobuf."""

    code = "bus.decode"


class ReplyTooLargeError(ServiceError):
    """An answer that would exceed the broker's `max_payload` (`PayloadTooLargeError` on this side)."""

    code = "bus.payload_too_large"


class BadRequestError(ServiceError):
    """A service refused a request it cannot use; each service has its own code."""


class NotFoundError(ServiceError):
    """A service has nothing under the key asked for; each service has its own code."""


class ReplicaBehindError(ServiceError):
    """A replica of a stateful service could not catch up with its stream in time.

    Answering then could miss writes acknowledged elsewhere, so it answers this instead; the
    same request succeeds once the replica caught up, or on another replica.
    """

    code = "replica.unavailable"
    retryable = True


# What the stateful services refuse. They cross a boundary (ingress's admin API reads them), so
# they are here and not only in each service's `errors.py`, which names them for its own code.


class MemoryBadRequestError(BadRequestError):
    """Memory refused a malformed id, scope, path, page token or offset."""

    code = "memory.bad_request"


class MemoryNotFoundError(NotFoundError):
    """Memory has no such plan, file or directory."""

    code = "memory.not_found"


class TapeBadRequestError(BadRequestError):
    """The tape refused a query it cannot answer as asked (an id too long, a seq out of range)."""

    code = "tape.bad_request"


class GovernanceBadRequestError(BadRequestError):
    """Governance refused a malformed request before deciding anything."""

    code = "governance.bad_request"


# Runs: a run's terminal `error` event. Every code here can reach a client.


class RunError(ServiceError):
    """An error a run ends with (`RunEvent.error`)."""


class UnknownAgentError(RunError):
    """No agent of that name is served."""

    code = "dispatch.unknown_agent"


class RunAbandonedError(RunError):
    """The poison-run guard stopped a run that failed on every delivery."""

    code = "dispatch.run_abandoned"


class RunInterruptedError(RunError):
    """A run's worker stopped after starting tool calls that must not run twice (durable runs off)."""

    code = "dispatch.run_interrupted"


class EffectLimitError(RunError):
    """A durable run reached its bound of journaled effects: it fails rather than dropping one."""

    code = "dispatch.effect_limit"


class ReplayDivergedError(RunError):
    """A replay of an ended run needed an effect its journal has no committed record of."""

    code = "dispatch.replay_diverged"


class RunCancelledError(RunError):
    """The client cancelled the run."""

    code = "run.cancelled"


class RunNotQueuedError(RunError):
    """The run was accepted (its run id announced) but could not be queued: nothing ran it."""

    code = "run.not_queued"
    retryable = True


class AgentFailedError(RunError):
    """The agent's own `@prompt` code raised; the message names the exception type only.

    A broker failure under it is `bus.unavailable` instead.
    """

    code = "agent.failed"


class InterceptorFailedError(RunError):
    """An interceptor's `pre_process` raised."""

    code = "interceptor.failed"


class GovernanceDeniedError(RunError):
    """A policy refused the run; `details` carry `policy` and `reason`."""

    code = "governance.denied"

    @property
    def policy(self) -> str:
        """The policy that denied (`default` when unnamed)."""
        return self.details.get("policy", "default")

    @property
    def reason(self) -> str:
        """Why the policy denied."""
        return self.details.get("reason", "")


class ResponseBlockedError(GovernanceDeniedError):
    """A policy stopped the answer while it streamed (`Response blocked: <reason>`); nothing after it was sent."""

    code = "governance.response_blocked"


class BrokerUnavailableError(RunError):
    """The message broker failed the run: resume it by its id, or send it again.

    It did not take or give what the run needed in time; nothing of the run that was stored is lost.
    """

    code = "bus.unavailable"
    retryable = True


class GovernanceUnavailableError(RunError):
    """Governance did not answer, so the run is refused (fail-closed)."""

    code = "governance.unavailable"


class BudgetExceededError(RunError):
    """The run exceeded its token, cost or wall-clock budget."""

    code = "budget.exceeded"


class RuntimeUnavailableError(RunError):
    """No model runtime is usable (none configured, or its URL is not http(s))."""

    code = "runtime.unavailable"


class RuntimeFailedError(RunError):
    """The model runtime raised something unexpected; what it was stays in dispatch's log."""

    code = "runtime.failed"


class ToolLoopExhaustedError(RunError):
    """The model kept calling tools past the round limit."""

    code = "runtime.tool_loop_exhausted"


class ToolCallRefusedError(RunError):
    """A run of one tool call (an app tool a door exposes) asked for no usable call; nothing ran.

    The tool is not one of its agent's own `@tool`s, the arguments are unreadable, or a policy
    rewrote the call's input.
    """

    code = "dispatch.tool_call_refused"


class ToolCallFailedError(RunError):
    """A run of one tool call (an app tool a door exposes) ended without a result.

    The tool failed, or the call was refused (its arguments, a policy, a role, a denied approval);
    the message is the text a model would have got.
    """

    code = "tool.failed"


class StructuredOutputInvalidError(RunError):
    """The model's structured answer did not validate after every retry."""

    code = "runtime.structured_output_invalid"


class HistoryUnavailableError(RunError):
    """The conversation's history could not be read: never answered as if it were new."""

    code = "memory.history_unavailable"


class HistoryChangedError(RunError):
    """The history moved on while a turn was being recorded (a concurrent turn of it)."""

    code = "memory.history_changed"


# The model provider (a run's terminal error when its model call fails for good).


OUT_OF_CREDIT = "insufficient_quota"
"""The provider error type of a 429 that is not a rate limit (the account has no credit): waiting
does not help, so it is not retried (the built-in runtime, the framework runtimes alike)."""


class ProviderError(RunError):
    """The model provider failed; the message is safe to show to the client."""

    code = "provider.error"


class ProviderRejectedError(ProviderError):
    """The provider refused the request (a 4xx other than those below)."""

    code = "provider.rejected"


class ProviderRateLimitedError(ProviderError):
    """The provider is rate limiting (429)."""

    code = "provider.rate_limited"


class ProviderUnavailableError(ProviderError):
    """The provider failed in a way a later request may not (unreachable, 408, 5xx, a broken stream).

    Always retryable: nothing of the answer reached the client, and the provider may be back.
    """

    code = "provider.unavailable"
    retryable = True


class ProviderMisconfiguredError(ProviderError):
    """The provider's URL, key or model is wrong."""

    code = "provider.misconfigured"


class ProviderTimeoutError(ProviderError):
    """The provider did not answer, or stalled, within its deadline."""

    code = "provider.timeout"


class ProviderMalformedError(ProviderError):
    """The provider's answer could not be decoded."""

    code = "provider.malformed"


class ProviderEmptyAnswerError(ProviderError):
    """The provider ended its answer without any content."""

    code = "provider.empty_answer"


class ProviderTooLargeError(ProviderError):
    """The provider's answer exceeded what the runtime accepts."""

    code = "provider.too_large"


class Nak(Exception):  # noqa: N818 - a control-flow signal, named for the JetStream verb
    """Raised by a work-item handler: redeliver the message after `delay` seconds."""

    def __init__(self, delay: float = 1.0) -> None:
        self.delay = delay
        super().__init__(f"nak, redeliver in {delay:g}s")


class Term(Exception):  # noqa: N818 - a control-flow signal, named for the JetStream verb
    """Raised by a work-item handler: the message is poison, never redeliver it."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"term: {reason}")
