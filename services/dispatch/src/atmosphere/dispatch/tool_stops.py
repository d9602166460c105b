"""How a stage of the tool choke point ends a call early: by raising one of these.

Each carries the text the model gets. Where it is raised says which frames the client sees:
`CallRefused` before `tool-start` (no frame at all), `CallFailed` anywhere (a `tool-error`,
and the call's journal record once its side effect started), `CallAnswered` when a reviewer
answered in the tool's place (a `tool-result`).
"""

from __future__ import annotations


class ToolCallStopped(Exception):  # noqa: N818 - a stop of the call, not a failure of dispatch
    """A stage ended the call before it ran to its result; `text` is what the model gets."""

    def __init__(self, text: str) -> None:
        """Stop the call with `text` for the model."""
        super().__init__(text)
        self.text = text


class CallRefused(ToolCallStopped):
    """Refused before `tool-start`, with no frame: an unknown tool, unusable arguments, a policy, the roles."""


class CallFailed(ToolCallStopped):
    """Ended with a `tool-error` frame: a refusal after `tool-start`, a failure to deliver or to run."""


class CallAnswered(ToolCallStopped):
    """A reviewer's `respond` stands in for the tool's result: the run owner's own text, not screened."""
