"""`GatedExecutor`: CrewAI's agent loop, with the two things the platform needs from it.

An agent's `executor_class` is CrewAI's supported way to vary its loop; this one changes no step:

- it names each native tool call to the tool being run (`CALL_ID`), which CrewAI hands only the
  call's arguments, so the choke point journals and reports the model's own call id;
- for an Atmosphere agent (a run that set `CONVERSATION`), the model is given the platform's
  conversation (its system prompt, the history, the user's message) instead of CrewAI's
  role-playing prompt: the agent's prompt is its system prompt, on every runtime alike.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any

from crewai.agents.agent_executor import AgentExecutor
from crewai.utilities.agent_utils import extract_tool_call_info
from typing_extensions import override

from atmosphere.runtimes.crewai._tools import CALL_ID
from atmosphere.sdk import ChatMessage

CONVERSATION: contextvars.ContextVar[tuple[ChatMessage, ...] | None] = contextvars.ContextVar(
    "atmosphere_crewai_conversation", default=None
)
"""The messages an Atmosphere agent's model is given, set for its run (None: a hosted crew's own prompts)."""


class GatedExecutor(AgentExecutor):
    """CrewAI's `AgentExecutor`, naming tool calls and, for Atmosphere agents, keeping the conversation."""

    @override
    def _execute_single_native_tool_call(self, tool_call: Any) -> dict[str, Any]:
        info = extract_tool_call_info(tool_call)
        token = CALL_ID.set(str(info[0]) if info else "")
        try:
            return super()._execute_single_native_tool_call(tool_call)
        finally:
            CALL_ID.reset(token)

    @override
    def _setup_messages(self, inputs: dict[str, Any]) -> None:
        conversation = CONVERSATION.get()
        if conversation is None:
            super()._setup_messages(inputs)
            return
        self.state.messages.extend(as_messages(conversation))


# A flow's steps are read from its own class's namespace (`crewai.flow.dsl._utils._iter_flow_methods`),
# so a subclass that adds no step would have none: it runs its parent's flow, whose steps it inherits.
GatedExecutor._flow_definition = AgentExecutor.flow_definition()


def as_messages(conversation: Sequence[ChatMessage]) -> list[Any]:
    """The platform's messages as CrewAI's, in order.

    A `tool` message of the history has no call to answer any more, so it is read as user text.
    """
    return [{"role": "user" if m.role == "tool" else m.role, "content": m.content} for m in conversation]
