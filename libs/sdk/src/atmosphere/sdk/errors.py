"""Errors of the SDK, and the exceptions a tool raises to steer its call.

SdkError
├── UserError          the SDK was used wrongly; raised at import/registration, not mid-run
└── ToolSignal         raised by a `@tool` function on purpose, to end or hold its call
    ├── ToolError          fail the call with a message: the model sees `Error: <message>`
    ├── ModelRetry         ask the model to call again, told what to fix (pydantic-ai's `ModelRetry`)
    └── ApprovalRequired   ask the user to approve the call first; it runs again once approved

Any other exception a tool raises fails the call too (`Error: <the exception's text>`); these
say what was meant, and the message is exactly what the model reads.
"""

from __future__ import annotations

AGENT_ERROR = "agent.error"
"""The code of `session.error()` when the agent names none."""

RETRY_SUFFIX = "Fix the errors and try again."
"""What the model reads after a `ModelRetry` message (pydantic-ai's wording)."""


class SdkError(Exception):
    """Base class of the SDK's errors."""


class UserError(SdkError):
    """The SDK was used wrongly (a bad decorator, a missing `@prompt`, a duplicate name)."""


class ToolSignal(SdkError):  # noqa: N818 - a signal the tool sends on purpose, not an error of its own
    """Base of the exceptions a tool raises to steer its own call; `message` is for the model."""

    def __init__(self, message: str) -> None:
        """Signal with `message` (what the model, or for an approval the user, reads)."""
        self.message = message
        super().__init__(message)

    def model_text(self) -> str:
        """The text the model receives as the call's result."""
        return f"Error: {self.message}"


class ToolError(ToolSignal):
    """Fail this call with `message`: the model gets `Error: <message>`, the client a `tool-error`.

    @tool
    def get_weather(city: str) -> str:
        if city not in KNOWN:
            raise ToolError(f"no weather station in {city}")
    """


class ModelRetry(ToolSignal):
    """Ask the model to call again, saying what to fix (the tool loop's cap bounds the retries).

    @tool
    def lookup(order_id: str) -> str:
        if not order_id.startswith("ord_"):
            raise ModelRetry("order ids look like ord_1234; ask the user for theirs")
    """

    def model_text(self) -> str:
        """`Error: <message>` and the instruction to fix it and call again."""
        return f"Error: {self.message}\n\n{RETRY_SUFFIX}"


class ApprovalRequired(ToolSignal):
    """Ask the user to approve this call before it goes on (a conditional `requires_approval`).

    The client receives an `approval-required` event with `message`; once approved, the tool
    is called again with the same (or the reviewer's edited) arguments and
    `tool_call_approved()` true, so it runs to the end. A denial ends the call with
    `Action cancelled by user`, as for a `requires_approval=True` tool.

        @tool
        def transfer(amount: int) -> str:
            if amount > 100 and not tool_call_approved():
                raise ApprovalRequired(f"Transfer {amount} EUR?")
            return do_transfer(amount)
    """

    def __init__(self, message: str = "") -> None:
        """Ask with `message` (default: the platform's "Allow <tool> to run with these arguments?")."""
        super().__init__(message)
